"""``meshtop watch``: the live dashboard of a job that another meshtop (``run`` or ``record``) records, from any
terminal, without owning it: q leaves the viewer and nothing else."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from meshtop.runner.errors import PlanError
from meshtop.tui.commands.live import runs_directory
from meshtop.tui.options import EXIT_OK, require_terminal
from meshtop.tui.terminal import TerminalGuard


def add_watch_command(commands: Any) -> None:
    watch = commands.add_parser(
        "watch",
        help="watch a job that another meshtop records, from any terminal",
        description="Open the live dashboard on a recording that `meshtop run` or `meshtop record` is writing "
        "on this machine, with its history from the start. q leaves the viewer and the job goes on; "
        "k stops the job (its owner only). With no REC, the newest live session in the runs folder. "
        "A finished recording opens as a replay.",
    )
    watch.add_argument("recording", type=Path, nargs="?", default=None, metavar="REC", help="a recording directory")
    watch.add_argument(
        "--runs-dir",
        type=Path,
        default=None,
        metavar="DIR",
        help="where to look for a live session without REC (default $MESHTOP_RUNS_DIR or ./meshtop-runs)",
    )
    watch.set_defaults(handler=command_watch)


def command_watch(args: argparse.Namespace) -> int:
    """Follow a live recording in the dashboard until q; an ended one (or one whose writer is gone) replays."""
    from meshtop.recordings.reader import open_recording
    from meshtop.tui.app import MeshtopApp
    from meshtop.tui.following import WatchSource, writer_note
    from meshtop.tui.sources import ReplaySource, Source

    path: Path = args.recording
    others: list[Path] = []
    if args.recording is None:
        path, others = newest_live(runs_directory(args))
    recording = open_recording(path)
    require_terminal("meshtop watch", f"use `meshtop summary {path}` for its figures as text")
    gone = writer_note(path) if recording.status == "running" else None
    source: Source
    if recording.status == "running" and gone is None:
        source = WatchSource(recording)
        notice = "watching: q leaves the viewer, the job goes on"
        if others:  # the newest is watched; the others are named, to watch one of them instead
            notice += f"; also live: {', '.join(path.name for path in others[:3])}{' …' if len(others) > 3 else ''}"
    else:
        source = ReplaySource(recording)
        if gone is not None:
            source.playback.to_end()
        notice = gone or f"the session has ended ({recording.status}): replaying it"
    MeshtopApp(source, quit_on_signals=True, terminal=TerminalGuard(), notice=notice).run()
    if source.error is not None:
        raise source.error
    return EXIT_OK


def newest_live(runs: Path) -> tuple[Path, list[Path]]:
    """The newest session of ``runs`` whose writer is alive, and the other live ones; a one-line error when
    there is none."""
    from meshtop.recordings.sessions import list_sessions

    if not runs.is_dir():
        raise PlanError(f"no runs folder at {runs}: name a recording, or the folder with --runs-dir")
    live = [Path(entry.path) for entry in list_sessions(runs) if entry.status == "running"]
    if not live:
        raise PlanError(f"no live session in {runs} (`meshtop ls {runs}` lists its sessions)")
    return live[0], live[1:]
