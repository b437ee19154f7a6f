"""``meshtop run`` and ``meshtop record``: launch a job (the built-in model, or a script after ``--``) and watch
it in the live dashboard, or record it headless; a node other than the head runs its ranks for either."""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from meshtop.runner.job.allocator import keep_buffer_pages
from meshtop.runner.job.supervise import NodeProbes
from meshtop.runner.multinode.nodes import Nodes
from meshtop.tui.options import (
    add_metrics_options,
    add_node_options,
    add_plan_options,
    exit_code,
    hang_timeout_from_args,
    node_probes_from_args,
    require_terminal,
    resolve_args,
    serve_metrics,
    work_nodes,
)
from meshtop.tui.terminal import TerminalGuard, go_on_headless

if TYPE_CHECKING:
    from meshtop.recordings.manifest import Manifest
    from meshtop.recordings.prometheus import MetricsServer
    from meshtop.runner.session.session import SessionOptions, Work

RUNS_DIR_ENV = "MESHTOP_RUNS_DIR"
DEFAULT_RUNS_DIR = "meshtop-runs"


def add_live_commands(commands: Any) -> None:
    """``run`` (live dashboard) and ``record`` (headless): the same options, defined once."""
    run = commands.add_parser(
        "run",
        help="launch a job and watch it in the live dashboard",
        usage="meshtop run [options] [-- torchrun [torchrun options] SCRIPT [ARGS...]]\n"
        "       meshtop run --endpoint URL [load options] [-- SERVER COMMAND...]",
        description="Launch a training job (or, with --mode infer, a served load of "
        "requests) with the given parallel plan and watch it live; "
        "the session is recorded into the runs folder unless --no-record. "
        "After --, your own script instead: `torchrun [options] SCRIPT`, "
        "`python -m torch.distributed.run ...`, `SCRIPT.py` or `-m MODULE`. "
        "With --endpoint URL, a load sent to a serving engine (docs/serving.md); after --, the server to start.",
    )
    add_plan_options(run)
    add_node_options(run)
    add_metrics_options(run)
    session = run.add_argument_group("session")
    session.add_argument("--no-record", dest="record", action="store_false", help="do not keep a recording")
    session.add_argument(
        "--runs-dir",
        type=Path,
        default=None,
        metavar="DIR",
        help=f"where sessions are recorded (default ${RUNS_DIR_ENV} or ./{DEFAULT_RUNS_DIR})",
    )
    run.set_defaults(handler=command_run)
    record = commands.add_parser(
        "record",
        help="launch a job headless and record it into OUT",
        usage="meshtop record OUT [options] [-- torchrun [torchrun options] SCRIPT [ARGS...]]\n"
        "       meshtop record OUT --endpoint URL [load options] [-- SERVER COMMAND...]",
        description="Launch a training job (or, with --mode infer, a served load of "
        "requests) headless and record it into a new directory. "
        "After --, your own script instead: `torchrun [options] SCRIPT`, "
        "`python -m torch.distributed.run ...`, `SCRIPT.py` or `-m MODULE`. "
        "With --endpoint URL, a load sent to a serving engine (docs/serving.md); after --, the server to start.",
    )
    record.add_argument("out", type=Path, metavar="OUT", help="new directory for the recording")
    add_plan_options(record)
    add_node_options(record)
    add_metrics_options(record)
    record.set_defaults(handler=command_record)


def session_of(args: argparse.Namespace) -> tuple[Work, SessionOptions]:
    """The work ``run`` and ``record`` launch and how its session runs, from their options (``--metrics-port``'s
    series are made once the command knows it goes on: :func:`live_metrics`)."""
    from meshtop.runner.session.session import SessionOptions, work_of

    work = work_of(resolve_args(args))
    keep_buffer_pages()  # this process only: the ranks it starts are the user's
    nodes = work_nodes(args, work)
    if nodes is not None and nodes.note is not None:
        print(nodes.note, flush=True)  # where the scheduler's environment placed this node
    return work, SessionOptions(
        node_probes=node_probes_from_args(args), hang_timeout_s=hang_timeout_from_args(args), nodes=nodes
    )


def live_metrics(
    args: argparse.Namespace, work: Work, options: SessionOptions
) -> tuple[SessionOptions, MetricsServer | None]:
    """``options`` with the series a live session feeds, and the server of ``--metrics-port``, started (``None``
    without)."""
    from meshtop.recordings.prometheus import RunMetrics

    metrics = RunMetrics(work.describe(), per_rank=args.metrics_per_rank) if args.metrics_port is not None else None
    return replace(options, metrics=metrics), serve_metrics(args, (lambda: metrics) if metrics is not None else None)


def metrics_line(server: MetricsServer) -> str:
    """Where ``/metrics`` is served, as a line for the console."""
    host, port = server.address
    return f"metrics: http://{host}:{port}/metrics"


def runs_directory(args: argparse.Namespace) -> Path:
    """Where ``run`` keeps its sessions: ``--runs-dir``, else ``$MESHTOP_RUNS_DIR``, else ``./meshtop-runs``."""
    return args.runs_dir or Path(os.environ.get(RUNS_DIR_ENV) or DEFAULT_RUNS_DIR)


def new_session_path(runs: Path, run: Work) -> Path:
    """``RUNS/20261129-154501-dp2-tp1-pp1`` (a script: ``RUNS/20261129-154501-train``; an endpoint:
    ``RUNS/20261129-154501-endpoint-MODEL``), with a suffix if that exists already."""
    stem = f"{time.strftime('%Y%m%d-%H%M%S')}-{run.folder_name()}"
    path, n = runs / stem, 1
    while path.exists():
        n += 1
        path = runs / f"{stem}-{n}"
    return path


def command_run(args: argparse.Namespace) -> int:
    """Launch the job and show it live; once it ends, its verdict and where it was recorded."""
    from meshtop.recordings.manifest import note_terminal_lost
    from meshtop.runner.session.console import verdict
    from meshtop.runner.session.session import start_recording
    from meshtop.tui.app import MeshtopApp
    from meshtop.tui.detach import CONSOLE_LOG, detachable
    from meshtop.tui.sources import LiveSource

    run, options = session_of(args)
    if options.nodes is not None and not options.nodes.head:
        return command_node(run, options.nodes, options.node_probes)
    require_terminal("meshtop run", "use `meshtop record OUT` to record a job headless")
    detacher = detachable() if args.record else None  # before any thread: d can then give the shell back
    options, server = live_metrics(args, run, options)
    manifest: Manifest | None = None
    if args.record:
        directory = new_session_path(runs_directory(args), run)
        manifest = start_recording(directory, run, options.node_probes, args.argv)
    else:
        directory = Path(tempfile.mkdtemp(prefix="meshtop-run-"))
    source = LiveSource(run, directory=directory, manifest=manifest, options=options)
    app = MeshtopApp(source, quit_on_signals=True, terminal=TerminalGuard(), can_detach=detacher is not None)
    try:
        app.run()
        if app.detached and detacher is not None:
            print(f"detached: the job goes on headless (pid {os.getpid()}), recording into {directory}")
            print(f"  meshtop watch {directory}   comes back to it; its progress: {directory / CONSOLE_LOG}")
            detacher.detach(directory / CONSOLE_LOG)
            go_on_headless(source, recording=True, console=sys.stdout)
        elif app.terminal is not None and app.terminal.lost:
            go_on_headless(source, recording=manifest is not None)
    finally:
        source.stop()
        source.wait()
        if server is not None:
            server.stop()
    if app.terminal is not None and app.terminal.lost and manifest is not None:
        note_terminal_lost(directory, app.terminal.note())
    if source.error is not None:
        raise source.error
    assert source.result is not None, "the session thread ended without a result"
    state = source.poll(app.state)  # what arrived after the last frame
    state.finish(source.result.status)
    figures = state.figures()
    for line in verdict(source.result, figures.steps, figures.requests):
        print(line)
    if server is not None:
        print(metrics_line(server).replace("metrics:", "metrics were served at"))
    if manifest is not None:
        print(f"recording: {directory}")
    if source.result.status == "failed":
        print(f"launcher log kept in {source.result.log_path}", file=sys.stderr)
    elif manifest is None:  # completed, or stopped by the user: nothing in the scratch folder is asked for again
        shutil.rmtree(directory, ignore_errors=True)
    return exit_code(source.result.status)


def command_record(args: argparse.Namespace) -> int:
    """Launch the job headless into ``OUT``, its progress as lines, then the recording's summary."""
    from meshtop.recordings.reader import open_recording
    from meshtop.recordings.summary import summarize
    from meshtop.runner.session.console import follow_job
    from meshtop.runner.session.session import start_recording
    from meshtop.tui.summary_text import summary_lines

    run, options = session_of(args)
    if options.nodes is not None and not options.nodes.head:
        return command_node(run, options.nodes, options.node_probes)
    out: Path = args.out
    options, server = live_metrics(args, run, options)
    if server is not None:
        print(metrics_line(server), flush=True)
    try:
        manifest = start_recording(out, run, options.node_probes, args.argv)
        result = follow_job(run, session_dir=out, out=sys.stdout, manifest=manifest, options=options)
    finally:
        if server is not None:
            server.stop()
    print("\n".join(summary_lines(summarize(open_recording(out)))[1:]))
    print(f"recording: {out}")
    return exit_code(result.status)


def command_node(run: Work, nodes: Nodes, probes: NodeProbes) -> int:
    """A node other than the head: run its ranks and stream to the head, which records and shows the job;
    exit as the whole job ended. Its launcher log stays in a temporary folder where the job did not complete
    (the head's recording folder may be shared with this node: it is never written here)."""
    from meshtop.runner.session.relay import serve_as_node

    directory = Path(tempfile.mkdtemp(prefix=f"meshtop-node{nodes.rank}-"))
    status = serve_as_node(
        run.launch(directory, nodes), nodes, session_dir=directory, out=sys.stdout, node_probes=probes
    )
    if status == "completed":
        shutil.rmtree(directory, ignore_errors=True)
    else:
        print(f"launcher log of node {nodes.rank} kept in {directory / 'launcher.log'}", file=sys.stderr)
    return exit_code(status)
