"""``meshtop ls``: the sessions in the runs folder (or any folder), live ones first, from their manifests and
their writers' ``writer.json`` and ``progress.json`` (:mod:`meshtop.recordings.sessions`)."""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from meshtop.recordings.typed_json import RecordingError
from meshtop.tui.commands.live import DEFAULT_RUNS_DIR, RUNS_DIR_ENV, runs_directory
from meshtop.tui.options import EXIT_OK

if TYPE_CHECKING:
    from meshtop.recordings.sessions import SessionEntry

COLUMNS = ("path", "status", "done", "elapsed", "pid", "host", "run")
"""The text's columns; the widest, what runs (or an unreadable recording's problem), last."""


def add_session_commands(commands: Any) -> None:
    """``ls``: the sessions a folder holds."""
    ls = commands.add_parser(
        "ls",
        help="list the sessions in the runs folder, live ones first",
        description="List the recorded sessions in DIR (its recordings, and those one folder deeper, a "
        "sweep's): path, status (running, completed, failed, interrupted, or stale: its writer is gone "
        "without closing it), steps or requests done, elapsed time, the writer's pid and host, and what runs. "
        "Running sessions first, newest first.",
    )
    ls.add_argument(
        "runs_dir",
        type=Path,
        nargs="?",
        default=None,
        metavar="DIR",
        help=f"the folder to list (default ${RUNS_DIR_ENV} or ./{DEFAULT_RUNS_DIR}, where run records)",
    )
    ls.add_argument("--json", action="store_true", help="print a list of objects, one a session")
    ls.set_defaults(handler=command_ls)


def command_ls(args: argparse.Namespace) -> int:
    """Print the sessions in the folder; a folder that is not one is a one-line error."""
    from meshtop.recordings.sessions import list_sessions

    directory = runs_directory(args)
    if not directory.is_dir():
        default = "" if args.runs_dir is not None else f" (the runs folder: give DIR, or set ${RUNS_DIR_ENV})"
        raise RecordingError(
            (f"{directory} is not a folder" if directory.exists() else f"no folder {directory}") + default
        )
    entries = list_sessions(directory)
    if args.json:
        print(json.dumps([asdict(entry) for entry in entries], indent=2))
    elif not entries:
        print(f"no recordings in {directory}")
    else:
        print("\n".join(session_lines(entries)))
    return EXIT_OK


def session_lines(entries: list[SessionEntry]) -> list[str]:
    """The sessions as a table under its header, columns two spaces apart."""
    rows = [list(COLUMNS)] + [list(cells(entry)) for entry in entries]
    widths = [max(len(row[column]) for row in rows) for column in range(len(COLUMNS) - 1)]
    return [
        "  ".join([*(cell.ljust(width) for cell, width in zip(row, widths, strict=False)), row[-1]]) for row in rows
    ]


def cells(entry: SessionEntry) -> tuple[str, ...]:
    """One session's cells, in :data:`COLUMNS`' order (``-``: not known)."""
    return (
        entry.path,
        entry.status,
        done_text(entry),
        elapsed_text(entry.elapsed_s),
        str(entry.pid) if entry.pid is not None else "-",
        entry.host or "-",
        entry.problem or entry.run or "-",
    )


def done_text(entry: SessionEntry) -> str:
    """``42/150 steps``, ``12/64 requests`` (an inference load), ``42 steps`` (no total), ``-``."""
    if entry.requests is not None or entry.requests_total is not None:
        done, total, unit = entry.requests, entry.requests_total, "requests"
    else:
        done, total, unit = entry.steps, entry.steps_total, "steps"
    if done is None:
        return "-"
    return f"{done}/{total} {unit}" if total is not None else f"{done} {unit}"


def elapsed_text(seconds: float | None) -> str:
    """``12.3 s``, ``4:05``, ``26:04:05`` (a run of days stays in hours)."""
    if seconds is None:
        return "-"
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"
