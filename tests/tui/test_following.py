"""``meshtop watch``'s source (:mod:`meshtop.tui.following`) against a recording written as it follows it: the
shipped 40-step sample's events appended in two parts, as a writer appends them, then its end."""

from __future__ import annotations

import dataclasses
import json
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pyarrow.compute as pc

from meshtop.recordings.events_log import EventWriter
from meshtop.recordings.manifest import write_manifest
from meshtop.recordings.reader import open_recording
from meshtop.recordings.samples import SAMPLE
from meshtop.recordings.schema import events_of
from meshtop.recordings.writers import WRITER_NAME, claim_recording
from meshtop.tui.following import WatchSource, writer_note
from meshtop.tui.state import DashboardState

SAMPLE_STEPS = 40
"""The shipped dp2 x pp2 sample's steps."""


def until(check: Callable[[], bool], what: str, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, f"no {what} after {timeout_s:.0f} s"
        time.sleep(0.05)


def test_a_viewer_shows_what_is_written_as_it_is_written_and_ends_with_its_writer(tmp_path: Path) -> None:
    sample = open_recording(SAMPLE)
    write_manifest(tmp_path, dataclasses.replace(sample.manifest, status="running"))
    writer = EventWriter(tmp_path)
    stepped = {kind: sample.arrow(kind) for kind in sample.kinds()}
    first_half = [
        (kind, table.filter(pc.less(table.column("step"), 20)) if "step" in table.column_names else table)
        for kind, table in stepped.items()
    ]
    for kind, table in first_half:
        writer.write(events_of(kind, table))

    source = WatchSource(open_recording(tmp_path), follow_s=0.05)
    state = DashboardState(source.description, session=source.session)
    source.start()
    try:
        until(lambda: source.poll(state).steps_done == 20, "20 steps shown")
        assert source.status == "watching" and not source.finished
        for kind, table in stepped.items():
            if "step" in table.column_names:
                writer.write(events_of(kind, table.filter(pc.greater_equal(table.column("step"), 20))))
        until(lambda: source.poll(state).steps_done == SAMPLE_STEPS, "every step shown")
        assert not source.finished  # the manifest still says running: more may come
        writer.close()
        write_manifest(tmp_path, sample.manifest)  # the writer's end: completed
        until(lambda: source.finished, "the writer's end seen")
        assert source.poll(state).final
    finally:
        source.stop()
    assert source.status == "completed"
    assert state.steps_done == SAMPLE_STEPS
    assert source.tail.lost == 0
    assert source.ask_stop() == "the job has ended: nothing to act on"


def test_a_viewer_is_told_why_a_recording_that_says_running_is_not_live(tmp_path: Path) -> None:
    claim_recording(tmp_path)
    assert writer_note(tmp_path) is None  # this process writes it: live
    gone = subprocess.Popen(["true"])  # a process that has come and gone
    gone.wait()
    writer = json.loads((tmp_path / WRITER_NAME).read_text())
    (tmp_path / WRITER_NAME).write_text(json.dumps({**writer, "pid": gone.pid, "process_start": None}))
    assert writer_note(tmp_path) == f"writer gone (pid {gone.pid} on {socket.gethostname()}): what it wrote"
    (tmp_path / WRITER_NAME).unlink()
    assert writer_note(tmp_path) == "no writer named (an older meshtop's recording, cut short): what it wrote"
