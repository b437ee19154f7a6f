"""``meshtop ls``: the sessions of a folder of hand-made recordings (completed, failed, interrupted, running,
stale, unreadable, one a sweep holds), live ones first, newest first, as text and as JSON; a folder that is
not one; the runs folder by default; and a real headless ``record`` listed running, completed, and stale once
its writer is killed."""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from meshtop.recordings.manifest import Manifest, write_manifest
from meshtop.recordings.sessions import SessionEntry
from meshtop.recordings.writers import PROGRESS_NAME, WRITER_NAME, Progress, Writer, process_start
from meshtop.tui.cli import main
from tests.kit.commands import meshtop, one_line_error
from tests.kit.docs import ROOT
from tests.kit.recordings import description

NOW = time.time()


def writer(pid: int, started_unix_s: float) -> Writer:
    return Writer(
        pid=pid,
        host=socket.gethostname(),
        uid=os.getuid(),
        started_unix_s=started_unix_s,
        process_start=process_start(pid),
        command="meshtop record OUT",
    )


def dead_pid() -> int:
    """The pid of a child that has exited and been reaped."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def made(
    directory: Path,
    manifest: Manifest,
    *,
    by: Writer | None = None,
    progress: Progress | None = None,
) -> Path:
    directory.mkdir(parents=True)
    write_manifest(directory, manifest)
    for name, content in ((WRITER_NAME, by), (PROGRESS_NAME, progress)):
        if content is not None:
            (directory / name).write_text(json.dumps(dataclasses.asdict(content)))
    return directory


@pytest.fixture
def runs(tmp_path: Path) -> Path:
    """A runs folder: each kind of session, its start in this order (oldest first): the sweep's plan, completed,
    failed, interrupted (an inference load), stale, running; and an unreadable one."""
    runs = tmp_path / "runs"
    gone = writer(dead_pid(), NOW - 500)
    made(
        runs / "sweep" / "dp2",
        Manifest(run=description(dp=2, steps=6), status="completed", started_at="2026-12-01T09:00:00+0000"),
    )
    (runs / "sweep" / "sweep.json").write_text("{}")
    made(
        runs / "completed",
        Manifest(
            run=description(dp=2, steps=40),
            status="completed",
            started_at="2026-12-01T10:00:00+0000",
            duration_s=75.5,
            steps_completed=40,
        ),
        by=dataclasses.replace(gone, started_unix_s=1796119200.0),
        progress=Progress(steps=40, requests=None, updated_unix_s=1796119275.0),
    )
    made(  # a recording from before writers: no writer.json
        runs / "failed",
        Manifest(
            run=description(dp=1, tp=2, steps=10),
            status="failed",
            started_at="2026-12-01T11:00:00+0000",
            duration_s=4.25,
            steps_completed=3,
        ),
    )
    made(
        runs / "interrupted",
        Manifest(
            run=description(dp=2, mode="infer", requests=64),
            status="interrupted",
            started_at="2026-12-01T12:00:00+0000",
            duration_s=3725.0,
            steps_completed=90,
        ),
        by=dataclasses.replace(gone, started_unix_s=1796126400.0),
        progress=Progress(steps=90, requests=20, updated_unix_s=1796130125.0),
    )
    made(
        runs / "stale",
        Manifest(run=description(dp=2, steps=100), status="running", started_at="2026-12-01T13:00:00+0000"),
        by=dataclasses.replace(gone, started_unix_s=NOW - 500),
        progress=Progress(steps=7, requests=None, updated_unix_s=NOW - 480),
    )
    made(
        runs / "running",
        Manifest(run=description(dp=2, steps=100), status="running", started_at="2026-12-01T14:00:00+0000"),
        by=writer(os.getpid(), time.time() - 30),  # started 30 s before the test, whenever the module was read
        progress=Progress(steps=12, requests=None, updated_unix_s=NOW),
    )
    (runs / "unreadable").mkdir()
    (runs / "unreadable" / "manifest.json").write_text('{"schema_version": 3, "status": "runn')
    (runs / "not a recording").mkdir()
    (runs / "not a recording" / "notes.txt").write_text("nothing here")
    return runs


def ls(*args: str | Path, cwd: Path | None = None) -> str:
    out = io.StringIO()
    previous = Path.cwd()
    try:
        if cwd is not None:
            os.chdir(cwd)
        with contextlib.redirect_stdout(out):
            assert main(["ls", *map(str, args)]) == 0
    finally:
        os.chdir(previous)
    return out.getvalue()


def ls_json(*args: str | Path, cwd: Path | None = None) -> list[dict[str, Any]]:
    listed = json.loads(ls(*args, "--json", cwd=cwd))
    assert isinstance(listed, list)
    return listed


def test_the_running_session_comes_first_then_the_rest_newest_first(runs: Path) -> None:
    listed = ls_json(runs)
    assert [Path(entry["path"]).relative_to(runs).as_posix() for entry in listed] == [
        "running",
        "unreadable",  # by its manifest file's time: just written
        "stale",
        "interrupted",
        "failed",
        "completed",
        "sweep/dp2",
    ]
    assert [entry["status"] for entry in listed] == [
        "running",
        "unreadable",
        "stale",
        "interrupted",
        "failed",
        "completed",
        "completed",
    ]


def test_the_json_says_each_sessions_progress_elapsed_time_and_writer(runs: Path) -> None:
    listed = {Path(entry["path"]).name: entry for entry in ls_json(runs)}
    running, stale = listed["running"], listed["stale"]
    assert running["pid"] == os.getpid() and running["host"] == socket.gethostname()
    assert (running["steps"], running["steps_total"], running["requests"]) == (12, 100, None)
    assert 30 <= running["elapsed_s"] < 30 + 120  # since the writer's start, now
    assert running["run"] == "dp2 x tp1 x pp1 · tiny"
    assert (stale["steps"], stale["elapsed_s"]) == (7, 20.0)  # up to its last progress
    assert stale["pid"] != os.getpid() and stale["problem"] is None
    assert listed["completed"] | {"path": None, "pid": None} == {
        "path": None,
        "run": "dp2 x tp1 x pp1 · tiny",
        "status": "completed",
        "steps": 40,
        "steps_total": 40,
        "requests": None,
        "requests_total": None,
        "started_at": "2026-12-01T10:00:00+0000",
        "started_unix_s": 1796119200.0,
        "elapsed_s": 75.5,
        "pid": None,
        "host": socket.gethostname(),
        "problem": None,
    }
    failed = listed["failed"]
    assert (failed["steps"], failed["elapsed_s"], failed["pid"], failed["host"]) == (3, 4.25, None, None)
    assert failed["run"] == "dp1 x tp2 x pp1 · tiny"
    interrupted = listed["interrupted"]
    assert (interrupted["requests"], interrupted["requests_total"], interrupted["steps_total"]) == (20, 64, None)
    assert interrupted["run"] == "dp2 x tp1 x pp1 (serving) · tiny"
    unreadable = listed["unreadable"]
    assert unreadable["status"] == "unreadable" and unreadable["run"] is None
    assert "manifest.json is damaged" in unreadable["problem"] and "\n" not in unreadable["problem"]
    assert set(unreadable) == {field.name for field in dataclasses.fields(SessionEntry)}


def test_the_text_is_a_table_of_the_same_sessions(runs: Path) -> None:
    lines = ls(runs).splitlines()
    assert lines[0].split() == ["path", "status", "done", "elapsed", "pid", "host", "run"]
    rows = {Path(line.split()[0]).relative_to(runs).as_posix(): line for line in lines[1:]}
    assert list(rows) == ["running", "unreadable", "stale", "interrupted", "failed", "completed", "sweep/dp2"]
    host = socket.gethostname()
    assert re.fullmatch(
        rf"\S+running\s+running\s+12/100 steps\s+(3\d|[4-9]\d)\.\d s\s+{os.getpid()}\s+{host}\s+"
        r"dp2 x tp1 x pp1 · tiny",
        rows["running"],
    ), rows["running"]
    assert rows["stale"].split()[1:5] == ["stale", "7/100", "steps", "20.0"]
    assert rows["completed"].split()[1:5] == ["completed", "40/40", "steps", "1:15"]
    assert rows["failed"].split()[1:9] == ["failed", "3/10", "steps", "4.2", "s", "-", "-", "dp1"]
    assert rows["interrupted"].split()[1:5] == ["interrupted", "20/64", "requests", "1:02:05"]
    assert rows["unreadable"].split()[1:5] == ["unreadable", "-", "-", "-"]
    assert "manifest.json is damaged" in rows["unreadable"]
    at = {column: lines[0].index(column) for column in ("status", "done", "pid")}
    for line, status in zip(lines[1:], [row.split()[1] for row in lines[1:]], strict=True):  # columns line up
        assert line[at["status"] :].split()[0] == status and line[at["status"] - 2 : at["status"]] == "  "
        assert line[at["done"] - 2 : at["done"]] == "  " and line[at["pid"] - 2 : at["pid"]] == "  "
    assert rows["running"][at["pid"] :].split()[0] == str(os.getpid())


def test_a_manifest_nested_past_the_parsers_depth_is_listed_unreadable(tmp_path: Path) -> None:
    (tmp_path / "deep").mkdir()
    (tmp_path / "deep" / "manifest.json").write_text("[" * 100_000 + "]" * 100_000)
    (entry,) = ls_json(tmp_path)
    assert (entry["status"], entry["run"]) == ("unreadable", None)
    assert entry["problem"].endswith("manifest.json: nested too deep to be one")


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads a folder whatever its mode")
def test_a_folder_it_may_not_read_is_listed_unreadable(tmp_path: Path) -> None:
    locked = made(tmp_path / "locked", Manifest(run=description(dp=2, steps=4), status="completed"))
    (locked / "manifest.json").chmod(0)
    try:
        (entry,) = ls_json(tmp_path)
    finally:
        (locked / "manifest.json").chmod(0o644)
    assert entry["status"] == "unreadable" and "Permission denied" in entry["problem"]


def test_a_folder_that_is_a_recording_lists_itself(runs: Path) -> None:
    assert [entry["status"] for entry in ls_json(runs / "completed")] == ["completed"]


def test_an_empty_folder_lists_nothing(tmp_path: Path) -> None:
    assert ls_json(tmp_path) == []
    assert ls(tmp_path).strip() == f"no recordings in {tmp_path}"


def test_a_folder_that_is_missing_or_a_file_is_a_one_line_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert one_line_error(["ls", str(tmp_path / "missing")], capsys).endswith(f"no folder {tmp_path / 'missing'}")
    (tmp_path / "file").write_text("")
    assert "is not a folder" in one_line_error(["ls", str(tmp_path / "file"), "--json"], capsys)


def test_without_a_folder_it_lists_the_runs_folder_as_run_records_into(
    runs: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("MESHTOP_RUNS_DIR", str(runs))
    assert len(ls_json()) == 7
    monkeypatch.setenv("MESHTOP_RUNS_DIR", str(tmp_path / "none"))
    assert "(the runs folder: give DIR, or set $MESHTOP_RUNS_DIR)" in one_line_error(["ls"], capsys)
    monkeypatch.delenv("MESHTOP_RUNS_DIR")
    (tmp_path / "meshtop-runs").mkdir()
    (runs / "running").rename(tmp_path / "meshtop-runs" / "running")
    assert [entry["path"] for entry in ls_json(cwd=tmp_path)] == ["meshtop-runs/running"]


def test_the_json_keys_are_the_ones_the_docs_name() -> None:
    text = (ROOT / "docs" / "tui.md").read_text()
    start = text.index("`meshtop ls --json` prints")
    named = set(re.findall(r"`([a-z_]+)`", text[start : text.index("\n#", start)])) - {"null", "unreadable"}
    assert named == {field.name for field in dataclasses.fields(SessionEntry)}


# A real session -------------------------------------------------------------------------------------------


def entry_of(runs: Path, name: str) -> dict[str, Any]:
    (entry,) = [entry for entry in ls_json(runs) if Path(entry["path"]).name == name]
    return entry


def until(check: Callable[[], dict[str, Any] | None], what: str, timeout_s: float = 120) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if (found := check()) is not None:
            return found
        time.sleep(0.2)
    raise AssertionError(f"no {what} within {timeout_s:.0f} s")


def record(out: Path, steps: int) -> subprocess.Popen[str]:
    return subprocess.Popen(
        meshtop("record", out, "--model", "tiny", "--device", "cpu", "--steps", str(steps)),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its ranks in its group, to be cleaned up once it is killed
    )


@pytest.mark.slow
def test_a_headless_record_is_listed_running_with_its_steps_growing_then_completed(tmp_path: Path) -> None:
    process = record(tmp_path / "job", 150)
    try:

        def running_with_steps(least: int) -> Callable[[], dict[str, Any] | None]:
            def check() -> dict[str, Any] | None:
                if not (tmp_path / "job" / "manifest.json").exists():
                    return None
                entry = entry_of(tmp_path, "job")
                assert entry["status"] in ("running", "completed"), entry
                return entry if entry["status"] == "running" and (entry["steps"] or 0) >= least else None

            return check

        first = until(running_with_steps(1), "step while running")
        assert first["pid"] == process.pid and first["steps_total"] == 150
        later = until(running_with_steps(first["steps"] + 1), "more steps while running")
        assert later["steps"] < 150 and later["elapsed_s"] > first["elapsed_s"]
        _, stderr = process.communicate(timeout=300)
        assert process.returncode == 0, stderr
    finally:
        if process.poll() is None:
            process.kill()
    done = entry_of(tmp_path, "job")
    assert (done["status"], done["steps"], done["pid"]) == ("completed", 150, process.pid)


@pytest.mark.slow
def test_a_writer_killed_with_sigkill_leaves_its_session_stale(tmp_path: Path) -> None:
    process = record(tmp_path / "job", 100_000)
    try:
        until(
            lambda: (
                entry
                if (tmp_path / "job" / "manifest.json").exists()
                and (entry := entry_of(tmp_path, "job"))["status"] == "running"
                and entry["steps"]
                else None
            ),
            "step while running",
        )
        process.kill()
        process.wait(timeout=30)
        stale = entry_of(tmp_path, "job")
        assert (stale["status"], stale["pid"]) == ("stale", process.pid)
        assert stale["steps"] >= 1 and stale["elapsed_s"] is not None
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)  # the ranks, which the killed writer could not stop
        process.wait(timeout=30)
