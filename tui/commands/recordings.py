"""``meshtop replay``, ``summary``, ``compare`` and ``export``: read a recording (or a sweep's folder) that a
live session, ``record`` or ``sweep`` wrote."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from meshtop.runner.errors import PlanError
from meshtop.tui.options import EXIT_OK, add_metrics_options, require_terminal, serve_metrics
from meshtop.tui.terminal import TerminalGuard

if TYPE_CHECKING:
    from meshtop.tui.sources import ReplaySource


def add_recording_commands(commands: Any) -> None:
    """``replay``, ``summary``, ``compare`` and ``export``: each takes recordings by their folders."""
    replay = commands.add_parser(
        "replay",
        help="replay a recording (or browse a sweep) in the dashboard",
        description="Open a recording in the dashboard and play it back "
        "(with no REC, a sample recording shipped with meshtop); a sweep's "
        "folder opens its ranked plans, each replayed with Enter.",
    )
    replay.add_argument(
        "recording",
        type=Path,
        nargs="?",
        default=None,
        metavar="REC",
        help="a recording directory (default: the shipped sample)",
    )
    replay.add_argument("--speed", type=float, default=1.0, metavar="X", help="playback speed (default 1)")
    replay.add_argument("--paused-at", type=int, default=None, metavar="STEP", help="open paused at the end of STEP")
    add_metrics_options(replay)
    replay.set_defaults(handler=command_replay)
    summary = commands.add_parser(
        "summary",
        help="summarise a recording",
        description="Summarise a recording: steps, collectives, stages, memory, ranks.",
    )
    summary.add_argument("recording", type=Path, metavar="REC", help="a recording directory")
    summary.add_argument("--json", action="store_true", help="print the analysis as JSON")
    summary.set_defaults(handler=command_summary)
    compare = commands.add_parser(
        "compare",
        help="compare two recordings, before and after",
        description="Compare two recordings of the same work: each metric side by side, "
        "the change, and whether it is beyond run-to-run noise.",
    )
    compare.add_argument("before", type=Path, metavar="A", help="the recording before the change")
    compare.add_argument("after", type=Path, metavar="B", help="the recording after the change")
    compare.add_argument("--json", action="store_true", help="print the comparison as JSON")
    compare.add_argument("--tui", action="store_true", help="show the two runs side by side in the terminal UI")
    compare.set_defaults(handler=command_compare)
    export = commands.add_parser(
        "export",
        help="export a recording as a Perfetto trace or CSV",
        description="Export a recording: a trace ui.perfetto.dev opens, or one CSV per table.",
    )
    export.add_argument("recording", type=Path, metavar="REC", help="a recording directory")
    export.add_argument("--format", choices=("perfetto", "csv"), required=True)
    export.add_argument(
        "-o",
        "--output",
        type=Path,
        required=True,
        metavar="PATH",
        help="the trace file (perfetto) or a new directory (csv)",
    )
    export.add_argument(
        "--ranks", default=None, metavar="LIST", help="perfetto: these ranks only (0-7,512), for a large job"
    )
    export.add_argument(
        "--steps", default=None, metavar="A-B", help="perfetto: these steps only (100-120), and the counters over them"
    )
    export.set_defaults(handler=command_export)


def command_replay(args: argparse.Namespace) -> int:
    """Play a recording back in the dashboard; a sweep's folder opens its ranked plans, a capacity sweep's its
    configurations and runs."""
    from meshtop.recordings.capacity import capacity_report, is_capacity_sweep
    from meshtop.recordings.reader import open_recording
    from meshtop.recordings.samples import SAMPLE
    from meshtop.recordings.sweep import is_sweep
    from meshtop.tui.sources import ReplaySource

    if not 0 < args.speed <= 1000:
        raise PlanError(f"--speed must be above 0 and at most 1000, got {args.speed:g}")

    capacity = args.recording is not None and is_capacity_sweep(args.recording)
    if args.recording is not None and (capacity or is_sweep(args.recording)):
        for flag, given in (
            ("--metrics-port", args.metrics_port),
            ("--metrics-bind", args.metrics_bind),
            ("--metrics-per-rank", args.metrics_per_rank or None),
        ):
            if given is not None:
                raise PlanError(f"{flag} serves one recording, not a sweep: replay one of the sweep's runs")
        if args.paused_at is not None:
            raise PlanError("--paused-at is a step of one recording, not of a sweep: replay one of its runs")
        return replay_capacity(args, capacity_report(args.recording)) if capacity else replay_sweep(args)
    recording = open_recording(args.recording or SAMPLE)  # no REC: the recording shipped with meshtop
    source = ReplaySource(recording, metrics=args.metrics_port is not None, metrics_per_rank=args.metrics_per_rank)
    server = serve_metrics(args, lambda: source.metrics)  # type: ignore[arg-type,return-value]
    if args.paused_at is not None:
        source.playback.seek_step(args.paused_at - 1)
        source.playback.paused = True
    try:
        require_terminal("meshtop replay", "use `meshtop summary REC` for the figures as text")
        replay_in_dashboard(source, args.speed)
    finally:
        if server is not None:
            server.stop()
    return EXIT_OK


def replay_in_dashboard(source: ReplaySource, speed: float) -> TerminalGuard:
    """Play ``source`` back in the dashboard at ``speed`` until it is closed; what could not be read, as warnings
    on stderr. The terminal's guard says whether the terminal was lost."""
    from meshtop.tui.app import MeshtopApp

    source.playback.speed = speed
    terminal = TerminalGuard()
    MeshtopApp(source, quit_on_signals=True, terminal=terminal).run()
    for problem in source.problems:
        print(f"meshtop: warning: {problem}", file=sys.stderr)
    return terminal


def replay_sweep(args: argparse.Namespace) -> int:
    """The sweep's ranked plans; Enter replays one in the dashboard, and closing it comes back to the list."""
    from meshtop.recordings.reader import open_recording
    from meshtop.recordings.sweep import ranking
    from meshtop.tui.sources import ReplaySource
    from meshtop.tui.sweep_app import SweepApp

    ranked = ranking(args.recording)
    require_terminal("meshtop replay", f"the sweep's table is in {args.recording / 'ranking.txt'}")
    cursor = 0
    while True:
        app = SweepApp(ranked, cursor=cursor)
        chosen = app.run()
        if chosen is None:
            return EXIT_OK
        cursor = next((i for i, row in enumerate(app.openable) if args.recording / row["recording"] == chosen), 0)
        if replay_in_dashboard(ReplaySource(open_recording(chosen)), args.speed).lost:
            return EXIT_OK


def replay_capacity(args: argparse.Namespace, report: dict[str, Any]) -> int:
    """A capacity sweep's configurations, the latency-versus-rate charts and the runs (``report``: the
    capacity report of ``args.recording``); Enter replays a run in the dashboard, and closing it comes back here,
    on that run."""
    from meshtop.recordings.reader import open_recording
    from meshtop.tui.capacity_app import CapacityApp, run_index
    from meshtop.tui.sources import ReplaySource

    require_terminal("meshtop replay", f"use `meshtop summary {args.recording}` for the sweep as text")
    cursor = None
    while True:
        chosen = CapacityApp(report, cursor=cursor).run()
        if chosen is None:
            return EXIT_OK
        cursor = run_index(report, chosen)
        if replay_in_dashboard(ReplaySource(open_recording(chosen)), args.speed).lost:
            return EXIT_OK


def print_report(report: dict[str, Any], *, as_json: bool, lines: Callable[[dict[str, Any]], list[str]]) -> int:
    """A report as JSON or text on stdout; what could not be read as warnings on stderr."""
    print(json.dumps(report, indent=2) if as_json else "\n".join(lines(report)))
    for problem in report["problems"]:
        print(f"meshtop: warning: {problem}", file=sys.stderr)
    return EXIT_OK


def command_summary(args: argparse.Namespace) -> int:
    """A recording's figures, as text or JSON; a capacity sweep's table (its JSON under ``sweep``)."""
    from meshtop.recordings.capacity import capacity_report, is_capacity_sweep
    from meshtop.recordings.reader import open_recording
    from meshtop.recordings.summary import summarize
    from meshtop.tui.summary_text import summary_lines

    if is_capacity_sweep(args.recording):
        from meshtop.tui.capacity_text import capacity_lines

        report = capacity_report(args.recording)
        print(json.dumps({"sweep": report}, indent=2) if args.json else "\n".join(capacity_lines(report)))
        return EXIT_OK
    return print_report(summarize(open_recording(args.recording)), as_json=args.json, lines=summary_lines)


def command_compare(args: argparse.Namespace) -> int:
    """Two recordings' figures side by side, as text, JSON or in the terminal UI."""
    from meshtop.recordings.compare import compare
    from meshtop.recordings.reader import open_recording
    from meshtop.recordings.summary import fold_recording
    from meshtop.tui.summary_text import comparison_lines

    before, after = open_recording(args.before), open_recording(args.after)
    folds = fold_recording(before), fold_recording(after)
    comparison = compare(before, after, folds)
    if args.tui:
        from meshtop.recordings.summary import summarize
        from meshtop.tui.compare_app import CompareApp, RunGrid

        require_terminal("meshtop compare --tui", "leave out --tui for the comparison as text")
        grids = RunGrid.of(folds[0]), RunGrid.of(folds[1])
        CompareApp(comparison, summarize(before), summarize(after), grids).run()
        return EXIT_OK
    return print_report(comparison, as_json=args.json, lines=comparison_lines)


def command_export(args: argparse.Namespace) -> int:
    """A recording as a Perfetto trace or as CSV tables, at a new path."""
    from meshtop.recordings.export import (
        PERFETTO_UI_BYTES,
        TracePart,
        estimated_bytes,
        export_csv,
        export_perfetto,
        trace_part,
    )
    from meshtop.recordings.manifest import RecordingError
    from meshtop.recordings.reader import open_recording

    recording = open_recording(args.recording)
    output: Path = args.output
    if output.exists():
        raise RecordingError(f"{output} exists: give export a new path (nothing was overwritten)")
    if args.format == "perfetto":
        part = trace_part(args.ranks, args.steps)
        if part != TracePart() and (size := estimated_bytes(recording, part)) > PERFETTO_UI_BYTES:
            print(
                f"meshtop: warning: this part's trace is about {size / 2**30:.1f} GiB: Perfetto's UI may not "
                "open it (take fewer ranks or steps)",
                file=sys.stderr,
            )
        count = export_perfetto(recording, output, part)
        print(f"{output}: {count:,} trace events; open it at https://ui.perfetto.dev")
    else:
        if args.ranks is not None or args.steps is not None:
            raise RecordingError("--ranks and --steps take a part of a trace: give them with --format perfetto")
        written = export_csv(recording, output)
        print(f"{output}: {len(written)} CSV tables and manifest.json")
    return EXIT_OK
