"""A recording's writer and its progress: who writes it (alive, gone, a reused pid, another host), the status a
reader makes of its manifest and writer, a hostile or torn file read as absent, and progress written at most
once a second."""

from __future__ import annotations

import dataclasses
import json
import os
import shlex
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from meshtop.recordings.manifest import Manifest, write_manifest
from meshtop.recordings.typed_json import RecordingError
from meshtop.recordings.writers import (
    PROGRESS_NAME,
    WRITER_NAME,
    Progress,
    ProgressWriter,
    Writer,
    claim_recording,
    process_start,
    read_progress,
    read_writer,
    session_status,
    writer_state,
)
from tests.kit.recordings import description


def this_process() -> Writer:
    return Writer(
        pid=os.getpid(),
        host=socket.gethostname(),
        uid=os.getuid(),
        started_unix_s=time.time(),
        process_start=process_start(os.getpid()),
        command="pytest",
    )


def ended_child() -> Writer:
    """The writer identity of a child process, taken while it ran; the child has exited and been reaped."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        writer = dataclasses.replace(this_process(), pid=child.pid, process_start=process_start(child.pid))
    finally:
        child.kill()
        child.wait()
    return writer


def test_a_claimed_recording_names_this_process_and_it_is_alive(tmp_path: Path) -> None:
    claimed = claim_recording(tmp_path)
    assert read_writer(tmp_path) == claimed
    assert (claimed.pid, claimed.host, claimed.uid) == (os.getpid(), socket.gethostname(), os.getuid())
    assert claimed.process_start is not None and claimed.process_start > 0
    assert shlex.split(claimed.command) == sys.orig_argv
    assert abs(claimed.started_unix_s - time.time()) < 60
    assert sorted(path.name for path in tmp_path.iterdir()) == [WRITER_NAME]  # its temporary file renamed
    assert writer_state(claimed) == "alive"


def test_a_child_that_has_exited_is_gone() -> None:
    assert writer_state(ended_child()) == "gone"


def test_a_child_that_has_exited_but_is_not_reaped_is_gone() -> None:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    writer = dataclasses.replace(this_process(), pid=child.pid, process_start=process_start(child.pid))
    try:
        deadline = time.monotonic() + 30
        while Path(f"/proc/{child.pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
            assert time.monotonic() < deadline, "the child never exited"
            time.sleep(0.05)
        assert writer_state(writer) == "gone"
    finally:
        child.wait()


def test_a_pid_given_to_another_process_is_gone() -> None:
    """This process stands for the later one: its pid, but not the start time the writer had."""
    reused = dataclasses.replace(this_process(), process_start=(process_start(os.getpid()) or 0) + 1)
    assert writer_state(reused) == "gone"
    assert writer_state(dataclasses.replace(reused, process_start=None)) == "alive"  # the pid alone: alive


def test_a_writer_on_another_host_cannot_be_told_and_is_elsewhere() -> None:
    assert writer_state(dataclasses.replace(ended_child(), host=socket.gethostname() + "-other")) == "elsewhere"


@pytest.mark.parametrize("pid", [0, -1, -os.getpgid(0), 1 << 40])
def test_a_pid_that_no_process_can_have_is_gone(pid: int) -> None:
    """0 and negative pids would signal a process group (or every process): never taken as this one."""
    assert writer_state(dataclasses.replace(this_process(), pid=pid)) == "gone"


def recording(directory: Path, status: str, writer: Writer | None) -> Path:
    directory.mkdir()
    write_manifest(directory, Manifest(run=description(dp=2, steps=10), status=status))
    if writer is not None:
        (directory / WRITER_NAME).write_text(json.dumps(dataclasses.asdict(writer)))
    return directory


@pytest.mark.parametrize("status", ["completed", "failed", "interrupted"])
def test_an_ended_session_has_its_manifests_status_whatever_its_writer(tmp_path: Path, status: str) -> None:
    assert session_status(recording(tmp_path / "alive", status, this_process())) == status
    assert session_status(recording(tmp_path / "gone", status, ended_child())) == status


def test_a_running_manifest_is_running_while_its_writer_lives_and_stale_once_it_is_gone(tmp_path: Path) -> None:
    assert session_status(recording(tmp_path / "alive", "running", this_process())) == "running"
    assert session_status(recording(tmp_path / "gone", "running", ended_child())) == "stale"
    elsewhere = dataclasses.replace(ended_child(), host="another-host")
    assert session_status(recording(tmp_path / "elsewhere", "running", elsewhere)) == "running"
    assert session_status(recording(tmp_path / "before", "running", None)) == "stale"  # from before writers


def test_a_folder_without_a_readable_manifest_is_a_one_line_error(tmp_path: Path) -> None:
    with pytest.raises(RecordingError, match="not a meshtop recording"):
        session_status(tmp_path)


HOSTILE = {
    "torn": '{"pid": 12, "host": "vm", "ui',
    "not an object": "[1, 2, 3]",
    "a pid of the wrong type": '{"pid": "12", "host": "vm", "uid": 0, "started_unix_s": 1.0, '
    '"process_start": null, "command": ""}',
    "a field missing": '{"pid": 12, "host": "vm"}',
    "an unknown field": '{"pid": 12, "host": "vm", "uid": 0, "started_unix_s": 1.0, "process_start": null, '
    '"command": "", "steps": 1, "requests": null, "updated_unix_s": 1.0, "evil": 1}',
    "nested past the parser's depth": "[" * 100_000 + "]" * 100_000,
    "not UTF-8": b"\xff\xfe{}",
    "too large": '{"pid": 12, "command": "' + "x" * 100_000 + '"}',
}


@pytest.mark.parametrize("content", HOSTILE.values(), ids=HOSTILE.keys())
def test_a_hostile_or_torn_file_reads_as_no_writer_and_no_progress(tmp_path: Path, content: str | bytes) -> None:
    for name in (WRITER_NAME, PROGRESS_NAME):
        path = tmp_path / name
        path.write_bytes(content if isinstance(content, bytes) else content.encode())
    assert read_writer(tmp_path) is None
    assert read_progress(tmp_path) is None


def test_no_file_or_a_folder_in_its_place_reads_as_none(tmp_path: Path) -> None:
    assert read_writer(tmp_path) is None and read_progress(tmp_path) is None
    (tmp_path / WRITER_NAME).mkdir()
    assert read_writer(tmp_path) is None


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_progress_is_written_at_once_then_at_most_once_a_second(tmp_path: Path) -> None:
    clock, reads = Clock(), []

    def read() -> Progress:
        reads.append(clock.now)
        return Progress(steps=len(reads), requests=None, updated_unix_s=clock.now)

    progress = ProgressWriter(tmp_path, read, clock=clock)
    written = []
    for now in (100.0, 100.2, 100.999, 101.0, 101.5, 101.99, 103.5, 103.6):
        clock.now = now
        written.append(progress.offer())
    assert written == [True, False, False, True, False, False, True, False]
    assert reads == [100.0, 101.0, 103.5]  # the progress is read only when it is written
    assert read_progress(tmp_path) == Progress(steps=3, requests=None, updated_unix_s=103.5)
    progress.write()  # the session's end: written whenever the last write was
    assert read_progress(tmp_path) == Progress(steps=4, requests=None, updated_unix_s=103.6)
    assert sorted(path.name for path in tmp_path.iterdir()) == [PROGRESS_NAME]


def test_an_offer_between_writes_costs_a_clock_read_and_nothing_more(tmp_path: Path) -> None:
    progress = ProgressWriter(tmp_path, lambda: Progress(steps=1, requests=None, updated_unix_s=0.0))
    assert progress.offer()
    started = time.perf_counter()
    for _ in range(100_000):
        progress.offer()
    assert (time.perf_counter() - started) / 100_000 < 5e-6  # a batch takes milliseconds: this is nothing


def test_progress_that_cannot_be_written_is_skipped(tmp_path: Path) -> None:
    progress = ProgressWriter(tmp_path / "gone", lambda: Progress(steps=1, requests=2, updated_unix_s=0.0))
    assert progress.offer()
    progress.write()
    assert not (tmp_path / "gone").exists()
