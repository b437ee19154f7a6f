"""The writer's control socket (:mod:`meshtop.runner.session.control_socket`): a real Unix socket in a real
folder, a real client, the kernel's word on who connected."""

from __future__ import annotations

import json
import os
import shutil
import socket
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from meshtop.runner.job.control import JobControl
from meshtop.runner.session.control_socket import (
    ACTIONS_NAME,
    CONTROL_DIR,
    SOCKET_NAME,
    ControlRefused,
    ControlServer,
    ask,
)

Served = tuple[ControlServer, JobControl]


@pytest.fixture
def served(tmp_path: Path) -> Iterator[Served]:
    control = JobControl()
    server = ControlServer(tmp_path, control)
    assert server.start()
    try:
        yield server, control
    finally:
        server.close()


def actions(directory: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in (directory / CONTROL_DIR / ACTIONS_NAME).read_text().splitlines()]


def test_the_folder_is_its_owners_alone_and_the_socket_too(tmp_path: Path, served: Served) -> None:
    assert stat.S_IMODE((tmp_path / CONTROL_DIR).stat().st_mode) == 0o700
    assert stat.S_IMODE((tmp_path / CONTROL_DIR / SOCKET_NAME).stat().st_mode) == 0o600


def test_a_stop_from_the_owner_stops_the_job_and_is_kept_with_who_asked(tmp_path: Path, served: Served) -> None:
    _, control = served
    answer = ask(tmp_path, "stop")
    assert "stopping every rank" in answer
    assert control.stop.is_set()
    [kept] = actions(tmp_path)
    assert kept["action"] == "stop" and kept["done"] is True
    assert kept["uid"] == os.getuid() and kept["pid"] == os.getpid()  # the kernel's word: this process


def test_stacks_of_some_ranks_are_asked_of_those_ranks(tmp_path: Path, served: Served) -> None:
    _, control = served
    assert ask(tmp_path, "stacks", [1, 3]) == "stack dumps asked of ranks 1,3"
    assert control.take_stack_request({0: 100, 1: 101, 3: 103}) == {1: 101, 3: 103}
    assert not control.stop.is_set()
    assert ask(tmp_path, "stacks") == "stack dumps asked of every rank"
    assert control.take_stack_request({0: 100, 1: 101}) == {0: 100, 1: 101}


def test_another_uid_is_refused_by_the_kernels_word_and_nothing_is_done(tmp_path: Path, served: Served) -> None:
    server, control = served
    server.owner = os.getuid() + 1  # as if another user had started the job and this one reached its socket
    with pytest.raises(ControlRefused, match=rf"only uid {os.getuid() + 1}, who started this job, can act on it"):
        ask(tmp_path, "stop")
    assert not control.stop.is_set()
    [kept] = actions(tmp_path)
    assert kept["done"] is False and kept["uid"] == os.getuid()


NOBODY = 65534


def asked_as_another_user(directory: Path, action: str) -> str:
    """What :func:`ask` gives a process of another user (``nobody``, in a child forked from this one: the
    interpreter and meshtop are loaded already, where ``nobody`` could not read them): its answer, or the
    one line of its refusal."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never back into pytest
        try:
            os.setgid(NOBODY)
            os.setuid(NOBODY)
            try:
                said = "answered: " + ask(directory, action)
            except ControlRefused as refused:
                said = "refused: " + str(refused)
            os.write(write_end, said.encode())
        finally:
            os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as said:
        text = said.read().decode()
    os.waitpid(pid, 0)
    return text


needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="only root can become another user to ask")


@needs_root
def test_another_user_cannot_open_the_owners_socket_and_gets_one_line(tmp_path: Path) -> None:
    open_to_all = Path(tempfile.mkdtemp(prefix="meshtop-control-"))  # a recording everybody may read
    open_to_all.chmod(0o755)
    control = JobControl()
    server = ControlServer(open_to_all, control)
    assert server.start()
    try:
        said = asked_as_another_user(open_to_all, "stop")
    finally:
        server.close()
        shutil.rmtree(open_to_all)
    assert said == f"refused: only the owner of this job can act on it ({open_to_all}/control/socket is theirs)"
    assert not control.stop.is_set()


@needs_root
def test_another_user_past_loosened_modes_is_refused_by_the_kernels_word(tmp_path: Path) -> None:
    open_to_all = Path(tempfile.mkdtemp(prefix="meshtop-control-"))
    open_to_all.chmod(0o755)
    control = JobControl()
    server = ControlServer(open_to_all, control)
    assert server.start()
    try:
        (open_to_all / CONTROL_DIR).chmod(0o777)  # modes loosened by hand: the peer's uid still decides
        (open_to_all / CONTROL_DIR / SOCKET_NAME).chmod(0o666)
        said = asked_as_another_user(open_to_all, "stop")
        kept = actions(open_to_all)
    finally:
        server.close()
        shutil.rmtree(open_to_all)
    assert said == f"refused: only uid {os.getuid()}, who started this job, can act on it (you are uid {NOBODY})"
    assert not control.stop.is_set()
    assert [(k["uid"], k["done"], k["action"]) for k in kept] == [(NOBODY, False, "stop")]


def test_bad_requests_are_answered_and_refused(tmp_path: Path, served: Served) -> None:
    _, control = served
    with pytest.raises(ControlRefused, match="the action must be one of stop, stacks"):
        ask(tmp_path, "reboot")
    with pytest.raises(ControlRefused, match="ranks must be a list of ranks"):
        ask(tmp_path, "stacks", [-1])  # type: ignore[list-item]
    for raw in (b"not json\n", b"[1]\n", b"x" * 5000 + b"\n"):
        with socket.socket(socket.AF_UNIX) as connection:
            connection.connect(str(tmp_path / CONTROL_DIR / SOCKET_NAME))
            connection.sendall(raw)
            reply = json.loads(connection.makefile("rb").readline())
        assert reply["ok"] is False
    assert not control.stop.is_set()


def test_no_writer_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(ControlRefused, match="no writer answers for this recording"):
        ask(tmp_path, "stop")


def test_a_recording_deeper_than_a_sockets_path_allows_is_served(tmp_path: Path) -> None:
    deep = tmp_path / ("d" * 60) / ("e" * 60)
    deep.mkdir(parents=True)
    control = JobControl()
    server = ControlServer(deep, control)
    assert server.start()
    try:
        ask(deep, "stop")
    finally:
        server.close()
    assert control.stop.is_set()
    assert not (deep / CONTROL_DIR / SOCKET_NAME).exists()  # closed: the socket is gone, the actions stay
    assert (deep / CONTROL_DIR / ACTIONS_NAME).exists()
