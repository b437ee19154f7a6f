"""``meshtop watch`` without REC: which live session of the runs folder it takes, and the one line when none."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from meshtop.recordings.manifest import write_manifest
from meshtop.recordings.reader import open_recording
from meshtop.recordings.samples import SAMPLE
from meshtop.recordings.writers import claim_recording
from meshtop.runner.errors import PlanError
from meshtop.tui.commands.watching import newest_live


def session(runs: Path, name: str, *, started_at: str, status: str = "running") -> Path:
    """A recording of the shipped sample's manifest, started at ``started_at``, whose writer is this process."""
    path = runs / name
    path.mkdir(parents=True)
    claim_recording(path)
    manifest = dataclasses.replace(open_recording(SAMPLE).manifest, status=status, started_at=started_at)
    write_manifest(path, manifest)
    return path


def test_the_newest_live_session_is_taken_and_the_other_live_ones_named(tmp_path: Path) -> None:
    older = session(tmp_path, "c", started_at="2026-12-06T01:00:00+0000")  # claimed first: the writer's start
    middle = session(tmp_path, "a", started_at="2026-12-06T02:00:00+0000")
    newest = session(tmp_path, "b", started_at="2026-12-06T03:00:00+0000")
    session(tmp_path, "d", started_at="2026-12-06T04:00:00+0000", status="completed")  # newer, but ended
    assert newest_live(tmp_path) == (newest, [middle, older])


def test_no_live_session_is_one_line(tmp_path: Path) -> None:
    session(tmp_path, "done", started_at="2026-12-06T04:00:00+0000", status="completed")
    with pytest.raises(PlanError, match=rf"^no live session in {tmp_path} \(`meshtop ls {tmp_path}` lists"):
        newest_live(tmp_path)
    with pytest.raises(PlanError, match="no runs folder at"):
        newest_live(tmp_path / "missing")
