"""The ``meshtop`` command line: ``run``, ``record``, ``replay``, ``summary``, ``compare`` and ``export``.

Every error the user can fix is one line on stderr and exit code 2; a job
whose rank failed exits 1 naming the rank; an interrupted job exits 130.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any, NoReturn

from meshtop.probes.errors import MeshtopError
from meshtop.probes.samplers import DEFAULT_GPU_HZ, DEFAULT_PROCESS_HZ
from meshtop.runner.job.launch import NodeProbes
from meshtop.runner.load import (
    DEFAULT_CONCURRENCY,
    DEFAULT_MAX_BATCH,
    DEFAULT_OUTPUT_LEN,
    DEFAULT_PROMPT_LEN,
    DEFAULT_REQUESTS,
)
from meshtop.runner.multinode.nodes import Nodes, nodes_from_options
from meshtop.runner.plan import (
    DEFAULT_MODEL,
    DEFAULT_STEPS,
    DEVICES,
    DTYPES,
    MODES,
    SCHEDULES,
    WATCH_LIMIT_S,
    PlanError,
    RunSpec,
    check_hooks,
    option,
    resolve,
)
from meshtop.runner.planner.plans import SWEEP_STEPS
from meshtop.runner.presets import PRESETS
from meshtop.runner.script.command import ScriptRun, resolve_script
from meshtop.tui.terminal import TerminalGuard, go_on_headless

if TYPE_CHECKING:
    from meshtop.recordings.manifest import Manifest
    from meshtop.recordings.prometheus import MetricsServer, RunMetrics
    from meshtop.runner.job.session import Work

EXIT_OK, EXIT_JOB_FAILED, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130
RUNS_DIR_ENV = "MESHTOP_RUNS_DIR"
DEFAULT_RUNS_DIR = "meshtop-runs"


class OneLineParser(argparse.ArgumentParser):
    """An argument parser whose errors are one line and exit code 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"meshtop: error: {message} (see {self.prog} --help)\n")


def add_plan_options(parser: argparse.ArgumentParser, *, command: str = "run") -> None:
    """The plan options shared by ``run`` and ``record``, defined once; ``plan`` and ``sweep`` choose the
    degrees themselves (``sweep`` launches, ``plan`` only computes)."""
    plan = parser.add_argument_group("parallel plan")
    if command == "run":
        plan.add_argument(
            "--dp",
            type=int,
            default=None,
            metavar="N",
            help="data-parallel degree (default: every GPU, or 2 CPU ranks, when no other degree is given)",
        )
        plan.add_argument("--tp", type=int, default=1, metavar="N", help="tensor-parallel degree (default 1)")
        plan.add_argument("--pp", type=int, default=1, metavar="N", help="pipeline-parallel degree (default 1)")
        plan.add_argument("--fsdp", action="store_true", help="shard over dp with FSDP2 instead of replicating")
    else:
        plan.add_argument(
            "--fsdp",
            action="store_true",
            help="also each plan with dp 2 or more sharded by FSDP2 (fsdp2xtp2 beside dp2xtp2)",
        )
    plan.add_argument("--schedule", choices=SCHEDULES, default=None, help="pipeline schedule (default 1f1b)")
    plan.add_argument(
        "--microbatches", type=int, default=None, metavar="M", help="pipeline microbatches per step (default 2 x pp)"
    )
    work = parser.add_argument_group("model and data")
    work.add_argument(
        "--model",
        default=DEFAULT_MODEL,
        metavar="NAME",
        help=f"model preset: {', '.join(PRESETS)} (default {DEFAULT_MODEL})",
    )
    work.add_argument(
        "--model-config",
        default=None,
        metavar="PATH",
        help="a Hugging Face style config.json of a Llama-family decoder: plan and run that shape "
        "with random weights (instead of --model)",
    )
    work.add_argument("--dtype", choices=DTYPES, default=None, help="fp32 or bf16 (default fp32 on CPU, bf16 on CUDA)")
    if command == "run":  # plan and sweep: --gpus or --ranks
        work.add_argument("--device", choices=DEVICES, default="auto", help="auto: cuda when a GPU is visible")
    work.add_argument(
        "--mode", choices=MODES, default="train", help="train (default), or infer: serve a load of generation requests"
    )
    if command != "plan":
        work.add_argument(
            "--steps",
            type=int,
            default=None,
            metavar="N",
            help=(
                f"training steps (default: until q, {WATCH_LIMIT_S / 60:g} minutes at most; "
                f"record, or on many nodes: {DEFAULT_STEPS})"
                if command == "run"
                else f"training steps (default {SWEEP_STEPS})"
            ),
        )
    batch = "4 per microbatch per replica" if command == "run" else "4 per rank, the same for every plan"
    work.add_argument(
        "--batch-size", type=int, default=None, metavar="N", help=f"global batch in sequences (default {batch})"
    )
    work.add_argument(
        "--seq-len", type=int, default=None, metavar="N", help="tokens per sequence (default: the model's)"
    )
    if command != "plan":
        work.add_argument("--seed", type=int, default=0, metavar="N", help="seed of weights and data (default 0)")
    load = parser.add_argument_group("inference load (--mode infer)")
    load.add_argument(
        "--requests", type=int, default=None, metavar="N", help=f"requests to serve (default {DEFAULT_REQUESTS})"
    )
    load.add_argument(
        "--concurrency",
        type=int,
        default=None,
        metavar="C",
        help=f"closed loop: requests in flight at once (default {DEFAULT_CONCURRENCY})",
    )
    load.add_argument(
        "--request-rate",
        type=float,
        default=None,
        metavar="R",
        help="open loop: Poisson arrivals, R requests per second",
    )
    load.add_argument(
        "--prompt-len",
        default=None,
        metavar="N|LO-HI",
        help=f"prompt tokens, fixed or a range (default {DEFAULT_PROMPT_LEN[0]})",
    )
    load.add_argument(
        "--output-len",
        default=None,
        metavar="N|LO-HI",
        help=f"tokens to generate, fixed or a range (default {DEFAULT_OUTPUT_LEN[0]})",
    )
    load.add_argument(
        "--max-batch",
        type=int,
        default=None,
        metavar="B",
        help=f"requests one replica decodes together, at most (default {DEFAULT_MAX_BATCH})",
    )
    load.add_argument(
        "--slo-ttft-ms", type=float, default=None, metavar="MS", help="goodput: time to first token at most MS"
    )
    load.add_argument(
        "--slo-tpot-ms", type=float, default=None, metavar="MS", help="goodput: time per output token at most MS"
    )
    builtin = [
        action
        for group in (plan, work, load)
        for action in group._group_actions
        if action.dest not in ("device", "dtype")
    ]  # a script's device, and its dtype for MFU
    parser.set_defaults(builtin_defaults={action.dest: action.default for action in builtin})
    if command == "plan":
        return
    if command == "run":
        script = parser.add_argument_group("your own script (after --)")
        script.add_argument(
            "--tokens-per-step",
            type=int,
            default=None,
            metavar="N",
            help="tokens the script's global batch holds per optimizer step: gives tokens/s (and, "
            "with --dtype, its compute dtype, MFU on a GPU)",
        )
    probes = parser.add_argument_group("probes")
    if command == "run":
        probes.add_argument(
            "--activations",
            action="store_true",
            help="measure the activations each step saves for backward (a hook on every saved "
            "tensor; not traced by torch.compile)",
        )
    probes.add_argument(
        "--no-instrument",
        dest="instrument",
        action="store_false",
        help="no worker hooks (step timing stays), to measure their overhead",
    )
    probes.add_argument(
        "--hang-timeout",
        type=float,
        default=None,
        metavar="S",
        help="report a hang (where every rank is, and its stack) after S seconds without progress "
        "(default: 20 median steps, at least 30 s; before the first step max(S, 60 s), "
        "or 600 s)",
    )
    probes.add_argument(
        "--gpu-sample-hz",
        type=float,
        default=DEFAULT_GPU_HZ,
        metavar="HZ",
        help=f"NVML samples per second per GPU (default {DEFAULT_GPU_HZ:g})",
    )
    probes.add_argument(
        "--process-sample-hz",
        type=float,
        default=DEFAULT_PROCESS_HZ,
        metavar="HZ",
        help=f"psutil samples per second per rank (default {DEFAULT_PROCESS_HZ:g})",
    )


NODE_OPTIONS = ("nnodes", "node_rank", "rdzv_endpoint", "rdzv_id")
"""torchrun's own node options: a script's go to torchrun, after --."""


def add_node_options(parser: argparse.ArgumentParser) -> None:
    """torchrun's multi-node options, for the built-in runner (a script gives them to torchrun after --)."""
    nodes = parser.add_argument_group("many nodes (torchrun's options: the same command on every node)")
    nodes.add_argument("--nnodes", default=None, metavar="N", help="nodes of the job (default 1)")
    nodes.add_argument(
        "--node-rank",
        type=int,
        default=None,
        metavar="I",
        help="this node: 0 is the head, which records and shows the dashboard; the others run "
        "their ranks and stream to it",
    )
    nodes.add_argument(
        "--rdzv-endpoint",
        default=None,
        metavar="HOST:PORT",
        help="torchrun's c10d rendezvous endpoint, the same on every node (the head's address, say)",
    )
    nodes.add_argument("--rdzv-id", default=None, metavar="ID", help="the job's rendezvous id (default none)")
    nodes.add_argument(
        "--head-node",
        type=int,
        default=None,
        metavar="I",
        help="the node that records and shows the job (default 0), the same on every node; with a script too",
    )
    nodes.add_argument(
        "--collector-bind",
        default=None,
        metavar="ADDR[:PORT]",
        help="where the head listens for the other nodes (only with the session's token); default: "
        "the address it reaches the rendezvous endpoint from, on a free port",
    )


def add_metrics_options(parser: argparse.ArgumentParser) -> None:
    metrics = parser.add_argument_group("Prometheus")
    metrics.add_argument(
        "--metrics-port",
        type=int,
        default=None,
        metavar="PORT",
        help="serve /metrics (Prometheus / OpenMetrics) on PORT while meshtop runs (0: a free port)",
    )
    metrics.add_argument(
        "--metrics-bind", default=None, metavar="ADDR", help="the address /metrics listens on (default 127.0.0.1)"
    )


def serve_metrics(args: argparse.Namespace, metrics: Callable[[], RunMetrics] | None) -> MetricsServer | None:
    """The ``/metrics`` server that ``--metrics-port`` asks for, started; ``None`` without one."""
    from meshtop.recordings.prometheus import DEFAULT_BIND, MetricsServer

    if args.metrics_port is None:
        if args.metrics_bind is not None:
            raise PlanError("--metrics-bind needs --metrics-port PORT")
        return None
    if not 0 <= args.metrics_port <= 65535:
        raise PlanError(f"--metrics-port must be a port from 0 to 65535, got {args.metrics_port}")
    assert metrics is not None
    return MetricsServer(metrics, port=args.metrics_port, bind=args.metrics_bind or DEFAULT_BIND).start()


def live_metrics(args: argparse.Namespace, run: Work) -> tuple[RunMetrics | None, MetricsServer | None]:
    """The series a live session feeds and the server of ``--metrics-port``, started (``None`` without)."""
    from meshtop.recordings.prometheus import RunMetrics
    from meshtop.runner.job.session import describe

    metrics = RunMetrics(describe(run)) if args.metrics_port is not None else None
    return metrics, serve_metrics(args, (lambda: metrics) if metrics is not None else None)  # type: ignore[return-value]


def metrics_line(server: MetricsServer) -> str:
    host, port = server.address
    return f"metrics: http://{host}:{port}/metrics"


def nodes_from_args(args: argparse.Namespace) -> Nodes | None:
    """The built-in runner's nodes, from meshtop's own node options."""
    return nodes_from_options(
        nnodes=args.nnodes,
        node_rank=args.node_rank,
        endpoint=args.rdzv_endpoint,
        run_id=args.rdzv_id,
        collector_bind=args.collector_bind,
        head_node=args.head_node,
    )


def spec_from_args(args: argparse.Namespace) -> RunSpec:
    """The built-in runner's spec as typed; :func:`meshtop.runner.plan.resolve` checks it."""
    return RunSpec(
        dp=args.dp,
        tp=args.tp,
        pp=args.pp,
        fsdp=args.fsdp,
        schedule=args.schedule,
        microbatches=args.microbatches,
        model=args.model,
        model_config=args.model_config,
        dtype=args.dtype,
        device=args.device,
        steps=args.steps,
        time_limit_s=WATCH_LIMIT_S if watching(args) else None,
        batch_size=args.batch_size,
        seq_len=args.seq_len,
        seed=args.seed,
        instrument=args.instrument,
        activations=getattr(args, "activations", False),
        mode=args.mode,
        requests=args.requests,
        concurrency=args.concurrency,
        request_rate=args.request_rate,
        prompt_len=args.prompt_len,
        output_len=args.output_len,
        max_batch=args.max_batch,
        slo_ttft_ms=args.slo_ttft_ms,
        slo_tpot_ms=args.slo_tpot_ms,
    )


def watching(args: argparse.Namespace) -> bool:
    """``meshtop run`` training the built-in model on one node without ``--steps``: until q, ``WATCH_LIMIT_S``
    at most. On many nodes every node must run the same steps, whichever command each was given: 20."""
    return args.command == "run" and args.mode == "train" and args.steps is None and args.nnodes is None


def hang_timeout_from_args(args: argparse.Namespace) -> float | None:
    timeout = args.hang_timeout
    if timeout is not None and not 0 < timeout <= 86_400:
        raise PlanError(f"--hang-timeout must be above 0 and at most 86400 seconds, got {timeout:g}")
    return timeout


def node_probes_from_args(args: argparse.Namespace) -> NodeProbes:
    for flag, rate in (("--gpu-sample-hz", args.gpu_sample_hz), ("--process-sample-hz", args.process_sample_hz)):
        if not rate > 0 or rate > 1000:
            raise PlanError(f"{flag} must be above 0 and at most 1000, got {rate:g}")
    return NodeProbes(gpu_hz=args.gpu_sample_hz, process_hz=args.process_sample_hz)


def gpus_visible() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def resolve_args(args: argparse.Namespace) -> Work:
    """The built-in runner's plan, or the user's script given after ``--``."""
    wants_gpu = args.device != "cpu"
    if args.script is None:
        if args.tokens_per_step is not None:
            raise PlanError("--tokens-per-step is for a script given after -- (the built-in model counts its own)")
        nodes = nodes_from_args(args)
        return resolve(
            spec_from_args(args),
            gpus_visible=gpus_visible() if wants_gpu else 0,
            nodes=nodes.count if nodes is not None else 1,
        )
    check_hooks(instrument=args.instrument, activations=args.activations)
    if given := [name for name in NODE_OPTIONS if getattr(args, name) is not None]:
        raise PlanError(
            f"{option(given[0])} is torchrun's: give it to torchrun after -- "
            "(`-- torchrun --nnodes 2 --node-rank I --rdzv-backend c10d --rdzv-endpoint HOST:PORT ...`)"
        )
    given = [dest for dest, default in args.builtin_defaults.items() if getattr(args, dest) != default]
    if given:
        raise PlanError(
            f"{option(given[0])} sets up the built-in model; a script given after -- runs its own "
            "(leave it out, or pass it to the script)"
        )
    if args.device == "cuda" and not gpus_visible():
        raise PlanError("--device cuda: no CUDA GPU is visible")
    return resolve_script(
        args.script,
        gpus_visible=gpus_visible() if wants_gpu else 0,
        instrument=args.instrument,
        tokens_per_step=args.tokens_per_step,
        dtype=args.dtype,
        activations=args.activations,
        collector_bind=args.collector_bind,
        head_node=args.head_node,
    )


def work_nodes(args: argparse.Namespace, work: Work) -> Nodes | None:
    """The nodes ``work`` runs on (a script's from its torchrun options)."""
    return work.nodes if isinstance(work, ScriptRun) else nodes_from_args(args)


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="meshtop", description="A terminal dashboard and profiler for distributed PyTorch LLM jobs."
    )
    commands = parser.add_subparsers(dest="command", required=True, parser_class=OneLineParser)
    run = commands.add_parser(
        "run",
        help="launch a job and watch it in the live dashboard",
        usage="meshtop run [options] [-- torchrun [torchrun options] SCRIPT [ARGS...]]",
        description="Launch a training job (or, with --mode infer, a served load of "
        "requests) with the given parallel plan and watch it live; "
        "the session is recorded into the runs folder unless --no-record. "
        "After --, your own script instead: `torchrun [options] SCRIPT`, "
        "`python -m torch.distributed.run ...`, `SCRIPT.py` or `-m MODULE`.",
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
        usage="meshtop record OUT [options] [-- torchrun [torchrun options] SCRIPT [ARGS...]]",
        description="Launch a training job (or, with --mode infer, a served load of "
        "requests) headless and record it into a new directory. "
        "After --, your own script instead: `torchrun [options] SCRIPT`, "
        "`python -m torch.distributed.run ...`, `SCRIPT.py` or `-m MODULE`.",
    )
    record.add_argument("out", type=Path, metavar="OUT", help="new directory for the recording")
    add_plan_options(record)
    add_node_options(record)
    add_metrics_options(record)
    record.set_defaults(handler=command_record)
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
    export.set_defaults(handler=command_export)
    from meshtop.tui.plan_commands import add_plan_commands  # they use this module's option groups

    add_plan_commands(commands)
    return parser


def require_terminal(what: str, instead: str) -> None:
    if not sys.stdout.isatty():
        raise MeshtopError(f"{what} draws a dashboard, but standard output is not a terminal: {instead}")


def runs_directory(args: argparse.Namespace) -> Path:
    return args.runs_dir or Path(os.environ.get(RUNS_DIR_ENV) or DEFAULT_RUNS_DIR)


def new_session_path(runs: Path, run: Work) -> Path:
    """``RUNS/20261129-154501-dp2-tp1-pp1`` (a script: ``RUNS/20261129-154501-train``), with a suffix if
    that exists already."""
    if isinstance(run, ScriptRun):
        stem = f"{time.strftime('%Y%m%d-%H%M%S')}-{run.script.stem if run.script else run.module}"
    else:
        stem = f"{time.strftime('%Y%m%d-%H%M%S')}-{'fsdp' if run.fsdp else 'dp'}{run.dp}-tp{run.tp}-pp{run.pp}"
        if run.mode == "infer":
            stem += "-infer"
    path, n = runs / stem, 1
    while path.exists():
        n += 1
        path = runs / f"{stem}-{n}"
    return path


def command_run(args: argparse.Namespace) -> int:
    from meshtop.recordings.manifest import note_terminal_lost
    from meshtop.runner.job.console import verdict
    from meshtop.runner.job.session import start_recording
    from meshtop.tui.app import MeshtopApp
    from meshtop.tui.sources import LiveSource

    run = resolve_args(args)
    probes = node_probes_from_args(args)
    hang_timeout = hang_timeout_from_args(args)
    nodes = work_nodes(args, run)
    if nodes is not None and not nodes.head:
        return command_node(run, nodes, probes)
    require_terminal("meshtop run", "use `meshtop record OUT` to record a job headless")
    metrics, server = live_metrics(args, run)
    manifest: Manifest | None = None
    if args.record:
        directory = new_session_path(runs_directory(args), run)
        manifest = start_recording(directory, run, probes, args.argv)
    else:
        directory = Path(tempfile.mkdtemp(prefix="meshtop-run-"))
    source = LiveSource(
        run,
        directory=directory,
        manifest=manifest,
        node_probes=probes,
        hang_timeout_s=hang_timeout,
        nodes=nodes,
        metrics=metrics,
    )
    app = MeshtopApp(source, quit_on_signals=True, terminal=TerminalGuard())
    try:
        app.run()
        if app.terminal is not None and app.terminal.lost:
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
    elif source.result.status == "completed":
        shutil.rmtree(directory, ignore_errors=True)
    if source.result.status == "failed":
        print(f"launcher log kept in {source.result.log_path}", file=sys.stderr)
    return exit_code(source.result.status)


def command_node(run: Work, nodes: Nodes, probes: NodeProbes) -> int:
    """A node other than the head: run its ranks and stream to the head, which records and shows the job;
    exit as the whole job ended. Its launcher log stays in a temporary folder where the job did not complete
    (the head's recording folder may be shared with this node: it is never written here)."""
    from meshtop.runner.job.session import launch_of
    from meshtop.runner.multinode.relay import serve_as_node

    directory = Path(tempfile.mkdtemp(prefix=f"meshtop-node{nodes.rank}-"))
    status = serve_as_node(
        launch_of(run, directory, nodes), nodes, session_dir=directory, out=sys.stdout, node_probes=probes
    )
    if status == "completed":
        shutil.rmtree(directory, ignore_errors=True)
    else:
        print(f"launcher log of node {nodes.rank} kept in {directory / 'launcher.log'}", file=sys.stderr)
    return exit_code(status)


def sample_recording() -> Path:
    from meshtop.recordings.samples import SAMPLE

    return SAMPLE


def command_replay(args: argparse.Namespace) -> int:
    from meshtop.recordings.reader import open_recording
    from meshtop.tui.app import MeshtopApp
    from meshtop.tui.sources import ReplaySource

    if not 0 < args.speed <= 1000:
        raise PlanError(f"--speed must be above 0 and at most 1000, got {args.speed:g}")
    from meshtop.recordings.sweep import is_sweep

    if args.recording is not None and is_sweep(args.recording):
        from meshtop.tui.plan_commands import replay_sweep

        return replay_sweep(args)
    recording = open_recording(args.recording or sample_recording())
    source = ReplaySource(recording, metrics=args.metrics_port is not None)
    server = serve_metrics(args, lambda: source.metrics)  # type: ignore[arg-type,return-value]
    source.playback.speed = args.speed
    if args.paused_at is not None:
        source.playback.seek_step(args.paused_at - 1)
        source.playback.paused = True
    try:
        require_terminal("meshtop replay", "use `meshtop summary REC` for the figures as text")
        MeshtopApp(source, quit_on_signals=True, terminal=TerminalGuard()).run()
    finally:
        if server is not None:
            server.stop()
    for problem in source.problems:
        print(f"meshtop: warning: {problem}", file=sys.stderr)
    return EXIT_OK


def command_record(args: argparse.Namespace) -> int:
    from meshtop.recordings.reader import open_recording
    from meshtop.recordings.summary import summarize
    from meshtop.runner.job.console import follow_job
    from meshtop.runner.job.session import start_recording
    from meshtop.tui.summary_text import summary_lines

    run = resolve_args(args)
    probes = node_probes_from_args(args)
    hang_timeout = hang_timeout_from_args(args)
    nodes = work_nodes(args, run)
    if nodes is not None and not nodes.head:
        return command_node(run, nodes, probes)
    out: Path = args.out
    metrics, server = live_metrics(args, run)
    if server is not None:
        print(metrics_line(server), flush=True)
    try:
        manifest = start_recording(out, run, probes, args.argv)
        result = follow_job(
            run,
            session_dir=out,
            out=sys.stdout,
            manifest=manifest,
            node_probes=probes,
            hang_timeout_s=hang_timeout,
            nodes=nodes,
            metrics=metrics,
        )
    finally:
        if server is not None:
            server.stop()
    print("\n".join(summary_lines(summarize(open_recording(out)))[1:]))
    print(f"recording: {out}")
    return exit_code(result.status)


def print_report(report: dict[str, Any], *, as_json: bool, lines: Callable[[dict[str, Any]], list[str]]) -> int:
    """A report as JSON or text on stdout; what could not be read as warnings on stderr."""
    print(json.dumps(report, indent=2) if as_json else "\n".join(lines(report)))
    for problem in report["problems"]:
        print(f"meshtop: warning: {problem}", file=sys.stderr)
    return EXIT_OK


def command_summary(args: argparse.Namespace) -> int:
    from meshtop.recordings.reader import open_recording
    from meshtop.recordings.summary import summarize
    from meshtop.tui.summary_text import summary_lines

    return print_report(summarize(open_recording(args.recording)), as_json=args.json, lines=summary_lines)


def command_compare(args: argparse.Namespace) -> int:
    from meshtop.recordings.compare import compare
    from meshtop.recordings.reader import open_recording
    from meshtop.tui.summary_text import comparison_lines

    before, after = open_recording(args.before), open_recording(args.after)
    comparison = compare(before, after)
    if args.tui:
        from meshtop.recordings.summary import summarize
        from meshtop.tui.compare_app import CompareApp

        require_terminal("meshtop compare --tui", "leave out --tui for the comparison as text")
        CompareApp(comparison, summarize(before), summarize(after)).run()
        return EXIT_OK
    return print_report(comparison, as_json=args.json, lines=comparison_lines)


def command_export(args: argparse.Namespace) -> int:
    from meshtop.recordings.export import export_csv, export_perfetto
    from meshtop.recordings.manifest import RecordingError
    from meshtop.recordings.reader import open_recording

    recording = open_recording(args.recording)
    output: Path = args.output
    if output.exists():
        raise RecordingError(f"{output} exists: give export a new path (nothing was overwritten)")
    if args.format == "perfetto":
        count = export_perfetto(recording, output)
        print(f"{output}: {count:,} trace events; open it at https://ui.perfetto.dev")
    else:
        written = export_csv(recording, output)
        print(f"{output}: {len(written)} CSV tables and manifest.json")
    return EXIT_OK


def exit_code(status: str) -> int:
    return {"completed": EXIT_OK, "interrupted": EXIT_INTERRUPTED}.get(status, EXIT_JOB_FAILED)


def _interrupt_on_sigterm(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def split_script(argv: list[str]) -> tuple[list[str], list[str] | None]:
    """meshtop's own arguments, and the script command after the first ``--`` (``None`` without one)."""
    if "--" not in argv:
        return argv, None
    at = argv.index("--")
    return argv[:at], argv[at + 1 :]


def main(argv: Sequence[str] | None = None) -> int:
    every = list(sys.argv[1:] if argv is None else argv)
    own, script = split_script(every)
    parser = build_parser()
    args = parser.parse_args(own)
    if script is not None and args.command not in ("run", "record"):
        parser.error(f"only run and record take a command after -- ({args.command} does not)")
    args.script, args.argv = script, every
    signal.signal(signal.SIGTERM, _interrupt_on_sigterm)
    try:
        return int(args.handler(args))
    except MeshtopError as error:
        print(f"meshtop: error: {error}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("meshtop: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:  # output piped into `head` and the like: not an error
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
