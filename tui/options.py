"""The command line's options, defined once, and what they mean: the argument groups that ``run``, ``record``,
``plan`` and ``sweep`` share, the checks of the values no other layer owns, and the exit codes.

The plan's own values (degrees, steps, batch, lengths, the model) are checked by
:func:`meshtop.runner.plan.resolve`; here are the command line's: which options a script after ``--`` may
take, the probes' sampling rates, the hang timeout, the ``/metrics`` port.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from dataclasses import fields
from typing import TYPE_CHECKING, Any, NoReturn

from meshtop.probes.errors import MeshtopError
from meshtop.probes.samplers import DEFAULT_GPU_HZ, DEFAULT_PROCESS_HZ
from meshtop.recordings.manifest import DEFAULT_OUTPUT_LEN, DEFAULT_PROMPT_LEN
from meshtop.runner.errors import PlanError
from meshtop.runner.job.supervise import NodeProbes
from meshtop.runner.load import DEFAULT_CONCURRENCY, DEFAULT_MAX_BATCH, DEFAULT_REQUESTS
from meshtop.runner.multinode.nodes import NODE_OPTIONS, Nodes
from meshtop.runner.multinode.scheduler import node_count, node_values, scheduled_nodes
from meshtop.runner.plan import (
    CHECKPOINTS,
    DEFAULT_MODEL,
    DEFAULT_STEPS,
    DEVICES,
    DTYPES,
    MODES,
    PRECISIONS,
    SCHEDULES,
    WATCH_LIMIT_S,
    ResolvedRun,
    RunSpec,
    check_hooks,
    option,
    resolve,
)
from meshtop.runner.presets import PRESETS
from meshtop.runner.script.command import resolve_script
from meshtop.tui.endpoint_options import ENDPOINT_ONLY, add_endpoint_options, endpoint_from_args

if TYPE_CHECKING:
    from meshtop.recordings.prometheus import MetricsServer, RunMetrics
    from meshtop.runner.session.session import Run, Work

EXIT_OK, EXIT_JOB_FAILED, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130


def exit_code(status: str) -> int:
    """The exit code of a job that ended with ``status``: 0 completed, 130 interrupted, else 1."""
    return {"completed": EXIT_OK, "interrupted": EXIT_INTERRUPTED}.get(status, EXIT_JOB_FAILED)


class OneLineParser(argparse.ArgumentParser):
    """An argument parser whose errors are one line and exit code 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"meshtop: error: {message} (see {self.prog} --help)\n")


def add_plan_options(parser: argparse.ArgumentParser) -> None:
    """Every option of ``run`` and ``record``: the built-in runner's (its plan, model and load), an endpoint's
    load, a script's, and the probes. ``plan`` and ``sweep`` take the groups they share
    (:mod:`meshtop.tui.commands.planning`)."""
    add_builtin_options(
        parser,
        degrees=True,
        steps=f"training steps (default: until q, {WATCH_LIMIT_S / 60:g} minutes at most; record, or on many "
        f"nodes: {DEFAULT_STEPS})",
        batch="4 per microbatch per replica",
        device=True,
    )
    add_endpoint_options(parser)
    script = parser.add_argument_group("your own script (after --)")
    script.add_argument(
        "--tokens-per-step",
        type=int,
        default=None,
        metavar="N",
        help="tokens the script's global batch holds per optimizer step: gives tokens/s (and, "
        "with --dtype, its compute dtype, MFU on a GPU)",
    )
    add_probe_options(parser, hooks=True)


def add_builtin_options(
    parser: argparse.ArgumentParser, *, degrees: bool, steps: str | None, batch: str, device: bool
) -> None:
    """The built-in runner's groups (:func:`add_parallel_options`, :func:`add_model_options`,
    :func:`add_load_options`), their defaults kept in ``args.builtin_defaults``: an option changed from its default
    is refused beside a script or an endpoint, which set up their own. A script's device and dtype (for its MFU)
    are not among them."""
    groups = [
        add_parallel_options(parser, degrees=degrees),
        add_model_options(parser, steps=steps, batch=batch, device=device),
        add_load_options(parser),
    ]
    builtin = [action for group in groups for action in group._group_actions if action.dest not in ("device", "dtype")]
    parser.set_defaults(builtin_defaults={action.dest: action.default for action in builtin})


def add_parallel_options(parser: argparse.ArgumentParser, *, degrees: bool) -> argparse._ArgumentGroup:
    """The parallel plan: its degrees where the user gives them (``degrees``; the planner chooses its own), FSDP,
    the pipeline's schedule and microbatches."""
    plan = parser.add_argument_group("parallel plan")
    if degrees:
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
    return plan


def add_model_options(
    parser: argparse.ArgumentParser, *, steps: str | None, batch: str, device: bool
) -> argparse._ArgumentGroup:
    """The model and its data. ``steps``: ``--steps``'s help where the command launches (with ``--seed``; ``None``:
    it only computes); ``batch``: the default global batch in words; ``device``: ``--device`` (the planner
    takes ``--gpus`` or ``--ranks`` instead)."""
    work = parser.add_argument_group("model and data")
    work.add_argument(
        "--model",
        default=None,
        metavar="NAME",
        help=f"model preset: {', '.join(PRESETS)} (default {DEFAULT_MODEL}); with --endpoint, the server's model "
        "(default: its only one)",
    )
    work.add_argument(
        "--model-config",
        default=None,
        metavar="PATH",
        help="a Hugging Face style config.json of a Llama-family decoder: plan and run that shape "
        "with random weights (instead of --model)",
    )
    work.add_argument("--dtype", choices=DTYPES, default=None, help="fp32 or bf16 (default fp32 on CPU, bf16 on CUDA)")
    work.add_argument(
        "--precision",
        choices=PRECISIONS,
        default=None,
        help="training: fp32, bf16, or mixed: bf16 compute over fp32 master weights and optimizer state "
        "(instead of --dtype)",
    )
    work.add_argument(
        "--checkpoint",
        choices=CHECKPOINTS,
        default=None,
        help="training's activation checkpointing: none (default), full (each block recomputed in backward) "
        "or selective (each block's feed-forward)",
    )
    if device:
        work.add_argument("--device", choices=DEVICES, default="auto", help="auto: cuda when a GPU is visible")
        work.add_argument(
            "--device-memory",
            default=None,
            metavar="SIZE",
            help="memory of one device, e.g. 80GiB: a plan predicted not to fit it is refused before launch "
            "(default: the smallest visible GPU's; CPU ranks: none, no check)",
        )
        work.add_argument(
            "--no-fit-check",
            dest="fit_check",
            action="store_false",
            help="launch even a plan the planner predicts does not fit the device's memory",
        )
    work.add_argument(
        "--mode", choices=MODES, default="train", help="train (default), or infer: serve a load of generation requests"
    )
    if steps is not None:
        work.add_argument("--steps", type=int, default=None, metavar="N", help=steps)
    work.add_argument(
        "--batch-size", type=int, default=None, metavar="N", help=f"global batch in sequences (default {batch})"
    )
    work.add_argument(
        "--seq-len", type=int, default=None, metavar="N", help="tokens per sequence (default: the model's)"
    )
    if steps is not None:
        work.add_argument("--seed", type=int, default=0, metavar="N", help="seed of weights and data (default 0)")
    return work


def add_load_options(parser: argparse.ArgumentParser) -> argparse._ArgumentGroup:
    """The built-in model's inference load (``--mode infer``), or the one sent to an endpoint."""
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
        "--input-len",
        dest="prompt_len",
        default=None,
        metavar="N|LO-HI",
        help=f"prompt tokens, fixed or a range LO-HI or LO:HI (default {DEFAULT_PROMPT_LEN[0]}; with --endpoint, "
        "words of a generated prompt)",
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
    return load


def add_probe_options(parser: argparse.ArgumentParser, *, hooks: bool) -> None:
    """The probes: the worker hooks, the hang timeout and the samplers' rates; with ``hooks``, the hooks a
    run may add (``--activations``) or leave out (a script's ``--no-loss``)."""
    probes = parser.add_argument_group("probes")
    if hooks:
        probes.add_argument(
            "--activations",
            action="store_true",
            help="measure the activations each step saves for backward (a hook on every saved "
            "tensor; not traced by torch.compile)",
        )
        probes.add_argument(
            "--no-loss",
            dest="loss",
            action="store_false",
            help="a script's: do not read the loss it calls backward() on (read by default, never a device sync)",
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


def add_node_options(parser: argparse.ArgumentParser) -> None:
    """torchrun's multi-node options, for the built-in runner (a script gives them to torchrun after --)."""
    nodes = parser.add_argument_group(
        "many nodes (torchrun's options: the same command on every node; under SLURM or a PyTorchJob, "
        "read from the environment where not given)"
    )
    nodes.add_argument(
        "--nnodes", default=None, metavar="N", help="nodes of the job (default $PET_NNODES, $SLURM_NNODES, or 1)"
    )
    nodes.add_argument(
        "--node-rank",
        type=int,
        default=None,
        metavar="I",
        help="this node: 0 is the head, which records and shows the dashboard; the others run "
        "their ranks and stream to it (default $PET_NODE_RANK, $SLURM_NODEID)",
    )
    nodes.add_argument(
        "--rdzv-endpoint",
        default=None,
        metavar="HOST:PORT",
        help="torchrun's c10d rendezvous endpoint, the same on every node (the head's address, say; default "
        "$PET_RDZV_ENDPOINT, $MASTER_ADDR:$MASTER_PORT, or SLURM's first node, port 29400)",
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
    """``--metrics-port`` and ``--metrics-bind``, for the commands that can serve ``/metrics``."""
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
    metrics.add_argument(
        "--metrics-per-rank",
        action="store_true",
        help="the collectives' series per rank too, not per node alone (a 1024-rank job's scrape grows "
        "by about the ranks' count)",
    )


def serve_metrics(args: argparse.Namespace, metrics: Callable[[], RunMetrics] | None) -> MetricsServer | None:
    """The ``/metrics`` server that ``--metrics-port`` asks for, started; ``None`` without one."""
    from meshtop.recordings.prometheus import DEFAULT_BIND, MetricsServer

    if args.metrics_port is None:
        if args.metrics_bind is not None or args.metrics_per_rank:
            flag = "--metrics-bind" if args.metrics_bind is not None else "--metrics-per-rank"
            raise PlanError(f"{flag} needs --metrics-port PORT")
        return None
    if not 0 <= args.metrics_port <= 65535:
        raise PlanError(f"--metrics-port must be a port from 0 to 65535, got {args.metrics_port}")
    assert metrics is not None
    return MetricsServer(metrics, port=args.metrics_port, bind=args.metrics_bind or DEFAULT_BIND).start()


def nodes_from_args(args: argparse.Namespace) -> Nodes | None:
    """The built-in runner's nodes: meshtop's own node options, and what they leave out from the scheduler's
    environment (:mod:`meshtop.runner.multinode.scheduler`)."""
    values = node_values(nnodes=args.nnodes, node_rank=args.node_rank, endpoint=args.rdzv_endpoint, env=os.environ)
    return scheduled_nodes(values, run_id=args.rdzv_id, collector_bind=args.collector_bind, head_node=args.head_node)


def spec_from_args(args: argparse.Namespace) -> RunSpec:
    """The built-in runner's spec as typed; :func:`meshtop.runner.plan.resolve` checks it. Each ``RunSpec`` field
    is the option of its name (:func:`meshtop.runner.plan.option`), so that a new field needs only its option;
    two are worked out here: the model (the default preset where neither ``--model`` nor ``--model-config`` names
    one) and the time limit (:func:`watching`). ``--model`` given beside ``--model-config`` is refused even as the
    default preset's name: both were asked for."""
    if args.model is not None and args.model_config is not None:
        raise PlanError(
            f"--model {args.model} and --model-config {args.model_config} each name the model: give one of them"
        )
    worked_out: dict[str, Any] = {
        "model": args.model or DEFAULT_MODEL,
        "time_limit_s": WATCH_LIMIT_S if watching(args) else None,
    }
    given = {field.name: getattr(args, field.name) for field in fields(RunSpec) if field.name not in worked_out}
    return RunSpec(**given, **worked_out)


def watching(args: argparse.Namespace) -> bool:
    """``meshtop run`` training the built-in model on one node without ``--steps``: until q, ``WATCH_LIMIT_S``
    at most. On many nodes (a scheduler's too) every node must run the same steps, whichever command each was
    given: 20."""
    on_one_node = args.command == "run" and args.nnodes is None and node_count(None, os.environ) == 1
    return on_one_node and args.mode == "train" and args.steps is None


def hang_timeout_from_args(args: argparse.Namespace) -> float | None:
    """``--hang-timeout`` in seconds, checked; ``None``: the session's own rule."""
    timeout = args.hang_timeout
    if timeout is not None and not 0 < timeout <= 86_400:
        raise PlanError(f"--hang-timeout must be above 0 and at most 86400 seconds, got {timeout:g}")
    return timeout


def node_probes_from_args(args: argparse.Namespace) -> NodeProbes:
    """The node samplers' rates, checked."""
    for flag, rate in (("--gpu-sample-hz", args.gpu_sample_hz), ("--process-sample-hz", args.process_sample_hz)):
        if not rate > 0 or rate > 1000:
            raise PlanError(f"{flag} must be above 0 and at most 1000, got {rate:g}")
    return NodeProbes(gpu_hz=args.gpu_sample_hz, process_hz=args.process_sample_hz)


GPU_DEVICE_FILES = ("/dev/nvidiactl", "/dev/dxg", "/dev/kfd")
"""A driver's device files (NVIDIA's, WSL's GPU bridge, ROCm's): without one of them no process sees a GPU."""


def gpus_visible() -> int:
    """CUDA GPUs this process sees: 0 without a GPU driver's device file, else torch's count.

    torch is imported only where a driver is there: its import costs about 2 s of CPU before the job can
    launch, on every run of a machine without a GPU."""
    if not any(os.path.exists(path) for path in GPU_DEVICE_FILES):
        return 0
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def resolve_args(args: argparse.Namespace) -> Run:
    """The built-in runner's plan, or the user's script given after ``--``."""
    if getattr(args, "endpoint", None) is not None:
        return endpoint_from_args(args)
    given = [name for name in ENDPOINT_ONLY if getattr(args, name, None) not in (None, False)]
    if given:
        raise PlanError(f"{option(given[0])} shapes the load sent to a serving endpoint: give --endpoint URL")
    wants_gpu = args.device != "cpu"
    if args.script is None:
        if args.tokens_per_step is not None:
            raise PlanError("--tokens-per-step is for a script given after -- (the built-in model counts its own)")
        if not args.loss:
            raise PlanError("--no-loss is for a script given after -- (the built-in model computes its own loss)")
        nodes = nodes_from_args(args)
        run = resolve(
            spec_from_args(args),
            gpus_visible=gpus_visible() if wants_gpu else 0,
            nodes=nodes.count if nodes is not None else 1,
        )
        if args.fit_check:
            refuse_misfit(run, args.device_memory)
        return run
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
        loss=args.loss,
        collector_bind=args.collector_bind,
        head_node=args.head_node,
    )


def refuse_misfit(run: ResolvedRun, device_memory: str | None) -> None:
    """Refuse, before anything launches, a built-in plan whose most loaded rank the planner predicts does not fit
    one device's memory (``device_memory``, ``--device-memory``'s size; else on GPUs the smallest visible one's,
    as every rank must fit its own; CPU ranks have none unless given): ``blocker: fit``, the figures and what
    to try, in one line, exit 2. A job out of memory fails only after its launch and its model's build on every
    rank, minutes on many GPUs, and says less then; ``--no-fit-check`` launches it anyway, for where the
    prediction overstates (an allocator setting or an offload the planner does not model)."""
    from meshtop.recordings.metrics.blocker import SUGGESTIONS
    from meshtop.runner.planner.plans import predict
    from meshtop.runner.planner.report import misfit, parse_size

    memory = parse_size(device_memory) if device_memory is not None else None
    if memory is None and run.device == "cuda":
        from meshtop.probes.nvml import Nvml

        nvml = Nvml()
        totals = [nvml.sample(index, read_pcie=False).memory_total_bytes for index in range(len(nvml.handles))]
        nvml.close()
        memory = min((total for total in totals if total), default=None)
    if (evidence := misfit(predict(run), memory)) is not None:
        raise PlanError(f"blocker: fit: {evidence}; try: {SUGGESTIONS['fit']} (--no-fit-check launches it anyway)")


def work_nodes(args: argparse.Namespace, work: Work) -> Nodes | None:
    """The nodes ``work`` runs on (a script's from its torchrun options)."""
    return work.on_nodes(lambda: nodes_from_args(args))


def require_terminal(what: str, instead: str) -> None:
    """Refuse, in one line naming ``instead``, to draw a dashboard where standard output is not a terminal."""
    if not sys.stdout.isatty():
        raise MeshtopError(f"{what} draws a dashboard, but standard output is not a terminal: {instead}")
