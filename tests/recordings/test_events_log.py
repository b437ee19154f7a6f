"""The recording's event files are appended by ``writev`` (:func:`meshtop.recordings.events_log.write_all`)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from meshtop.recordings import events_log
from meshtop.recordings.events_log import IOV_MAX, write_all


def test_more_blocks_than_one_writev_takes_are_appended_whole_and_in_order(tmp_path: Path) -> None:
    blocks = [f"{index}:{'x' * (index % 7)}\n".encode() for index in range(3 * IOV_MAX + 5)] + [b""]
    path = tmp_path / "kind.jsonl"
    path.write_bytes(b"before\n")
    with path.open("ab", buffering=0) as file:
        write_all(file.fileno(), blocks)
    assert path.read_bytes() == b"before\n" + b"".join(blocks)


def test_a_writev_that_takes_part_of_the_bytes_goes_on_from_where_it_stopped(tmp_path: Path, monkeypatch) -> None:
    """The kernel may take fewer bytes than given (a signal, a full pipe): here at most 1,000 a call, so
    calls end inside a block and between blocks."""
    real = os.writev
    calls = []

    def partly(fd: int, buffers: list[memoryview]) -> int:
        taken, room = [], 1_000
        for buffer in buffers:
            taken.append(buffer[:room])
            room -= len(taken[-1])
            if not room:
                break
        calls.append(sum(len(buffer) for buffer in taken))
        return real(fd, taken)

    monkeypatch.setattr(events_log.os, "writev", partly)
    blocks = [bytes([65 + index % 26]) * (150 + 37 * index) for index in range(40)]
    path = tmp_path / "node1.frames"
    with path.open("ab", buffering=0) as file:
        write_all(file.fileno(), blocks)
    assert path.read_bytes() == b"".join(blocks)
    assert len(calls) > 20 and all(taken <= 1_000 for taken in calls)


def test_a_file_that_takes_nothing_is_an_error_not_a_loop(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(events_log.os, "writev", lambda fd, buffers: 0)
    with (tmp_path / "kind.jsonl").open("ab", buffering=0) as file, pytest.raises(OSError):
        write_all(file.fileno(), [b"line\n"])
