"""``meshtop plan`` and ``meshtop sweep`` on the command line: which plan for this model on these devices
(:mod:`meshtop.runner.planner.plans`, :mod:`meshtop.runner.planner.report`, :mod:`meshtop.runner.planner.sweep`).
``sweep OUT --endpoint URL`` (a server's capacity) goes on in :mod:`meshtop.tui.commands.capacity`; ``replay``
of a sweep's folder is in :mod:`meshtop.tui.commands.recordings`."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

from meshtop.runner.errors import PlanError
from meshtop.runner.plan import option
from meshtop.runner.planner.plans import SWEEP_STEPS, Question, candidates, check_counts
from meshtop.runner.planner.report import Budget, check_budget, parse_size, report
from meshtop.tui.commands.capacity import CAPACITY_ONLY, add_capacity_options, command_capacity, keep_and_print
from meshtop.tui.endpoint_options import ENDPOINT_ONLY, add_endpoint_options
from meshtop.tui.options import (
    EXIT_OK,
    add_builtin_options,
    add_probe_options,
    exit_code,
    gpus_visible,
    hang_timeout_from_args,
    node_probes_from_args,
    spec_from_args,
)

PLAN_DEFAULTS: dict[str, Any] = {
    "dp": None, "tp": 1, "pp": 1, "device": "auto", "steps": None, "seed": 0, "instrument": True,
    "activations": False, "tokens_per_step": None,
}  # fmt: skip
"""What ``plan`` and ``sweep`` set beside the built-in options' own defaults (the planner chooses the degrees)."""


def add_plan_commands(commands: Any) -> None:
    """``plan`` (arithmetic only) and ``sweep`` (runs the plans): the same question, the same options."""
    plan = commands.add_parser(
        "plan",
        help="predict every parallel plan's memory and traffic (no launch)",
        usage="meshtop plan [--model NAME | --model-config PATH] [--gpus N | --ranks N] [options]",
        description="List every dp x tp x pp plan of N GPUs (or CPU ranks) with the "
        "predicted memory of its most loaded rank by category, whether it "
        "fits, and the bytes each group's collectives move per step. Nothing "
        "is launched; docs/planner.md gives the formulas.",
    )
    sweep = commands.add_parser(
        "sweep",
        help="run each plan that fits, record each, rank them; with --endpoint, a server's capacity",
        usage="meshtop sweep OUT [--model NAME | --model-config PATH] [--gpus N | --ranks N] "
        "[--plans dp2,tp2,...] [options]\n"
        "       meshtop sweep OUT --endpoint URL --slo ttft=500ms,tpot=50ms [--rates auto|R1,R2,...] "
        "[--vary NAME=V1,V2 ...] [load options] [-- SERVER COMMAND...]",
        description="Run each plan that fits (or those --plans names) for a short window "
        "with the same load, one recording per plan under OUT, then print "
        "the plans ranked by tokens/s (training) or goodput (serving), with "
        "each prediction's error. `meshtop replay OUT` browses them. "
        "With --endpoint URL, a capacity sweep: the same seeded load at each rate, one recording per "
        "run, the highest rate that meets the SLO for each configuration of the server command after -- "
        "(docs/serving.md).",
    )
    sweep.add_argument("out", type=Path, metavar="OUT", help="new directory for the sweep")
    for parser, command in ((plan, "plan"), (sweep, "sweep")):
        where = parser.add_argument_group("where")
        devices = where.add_mutually_exclusive_group()
        devices.add_argument(
            "--gpus", type=int, default=None, metavar="N", help="plan for N GPUs (default: the visible ones)"
        )
        devices.add_argument("--ranks", type=int, default=None, metavar="N", help="plan for N CPU ranks (gloo)")
        where.add_argument(
            "--device-memory",
            default=None,
            metavar="SIZE",
            help="memory of one device, e.g. 80GiB (default: the visible GPU's, else none)",
        )
        where.add_argument(
            "--gpus-per-node",
            type=int,
            default=None,
            metavar="N",
            help="GPUs of one node, to place groups across nodes (default: all on one)",
        )
        where.add_argument(
            "--plans",
            default=None,
            metavar="LIST",
            help="only these plans, comma-separated: dp4,fsdp4,tp2xpp2,dp2xtp2 ...",
        )
        steps = f"training steps (default {SWEEP_STEPS})" if command == "sweep" else None  # plan launches nothing
        add_builtin_options(
            parser, degrees=False, steps=steps, batch="4 per rank, the same for every plan", device=False
        )
        if command == "sweep":
            add_probe_options(parser, hooks=False)
        # the plan's own defaults are the defaults a given option is told from (a capacity sweep refuses those)
        builtin = {**parser.get_default("builtin_defaults"), **PLAN_DEFAULTS}
        parser.set_defaults(**PLAN_DEFAULTS, builtin_defaults=builtin)
    plan.add_argument(
        "--busbw",
        type=float,
        default=None,
        metavar="GB/S",
        help="bus bandwidth of the links, for each plan's communication seconds per step",
    )
    plan.add_argument(
        "--tflops",
        type=float,
        default=None,
        metavar="TFLOP/S",
        help="achieved TFLOP/s of one device, for the step-time share of communication",
    )
    plan.add_argument(
        "--from",
        dest="from_recording",
        type=Path,
        default=None,
        metavar="REC",
        help="take --busbw (the median busbw of its collectives) and --tflops (its tokens/s x FLOPs "
        "per token per rank) from a recording of these devices",
    )
    add_endpoint_options(sweep)
    add_capacity_options(sweep)
    plan.add_argument("--json", action="store_true", help="print the report as JSON")
    plan.set_defaults(handler=command_plan)
    sweep.set_defaults(handler=command_sweep)


def plan_question(args: argparse.Namespace, *, launching: bool) -> tuple[Question, Budget]:
    """What ``plan`` and ``sweep`` are asked, and the device budget the plans are held to."""
    from meshtop.probes.nvml import Nvml

    check_counts(gpus=args.gpus, ranks=args.ranks, gpus_per_node=args.gpus_per_node)
    nvml = Nvml() if args.ranks is None else None
    visible = len(nvml.handles) if nvml is not None and nvml.state == "ok" else 0
    if launching and args.gpus is not None:
        visible = gpus_visible()
        if args.gpus > visible:
            raise PlanError(
                f"--gpus {args.gpus}: {visible} GPU(s) are visible here; a sweep runs its plans, "
                f"so use --gpus {visible} or fewer (or `meshtop plan` to predict without them)"
            )
    gpus = args.gpus if args.gpus is not None else (None if args.ranks is not None else visible or None)
    if gpus is None and args.ranks is None:
        raise PlanError("no GPU is visible: give --ranks N to plan for CPU ranks, or --gpus N to plan for N GPUs")
    ranks = gpus if gpus is not None else args.ranks
    memory = parse_size(args.device_memory) if args.device_memory is not None else None
    slow: tuple[tuple[int, int], ...] = ()
    if gpus is not None and nvml is not None and visible:
        if memory is None:
            memory = nvml.sample(0).memory_total_bytes
        slow = tuple((link.gpu_a, link.gpu_b) for link in nvml.topology() if link.path not in ("NVLink", "unknown"))
    if nvml is not None:
        nvml.close()
    base = replace(spec_from_args(args), device="cuda" if gpus is not None else "cpu")
    plans = tuple(key for key in (args.plans or "").split(",") if key.strip())
    question = Question(base=base, ranks=ranks, gpus=gpus is not None, with_fsdp=args.fsdp, plans=plans)
    busbw = getattr(args, "busbw", None)
    flops = getattr(args, "tflops", None) and args.tflops * 1e12
    if getattr(args, "from_recording", None) is not None:
        from meshtop.recordings.reader import open_recording
        from meshtop.recordings.summary import measured_rates

        measured_busbw, measured_flops = measured_rates(open_recording(args.from_recording))
        busbw, flops = busbw or measured_busbw, flops or measured_flops
    budget = Budget(
        device_memory_bytes=memory,
        ranks_per_node=args.gpus_per_node,
        slow_pairs=slow,
        busbw_bytes_per_s=busbw and busbw * 1e9,
        flops_per_s=flops,
    )
    check_budget(budget, mode=question.base.mode)
    return question, budget


def command_plan(args: argparse.Namespace) -> int:
    """Every plan's predicted memory and traffic, as a table or JSON; nothing is launched."""
    from meshtop.tui.plan_text import plan_lines

    question, budget = plan_question(args, launching=False)
    found = candidates(question)
    result = report(question, found, budget)
    print(json.dumps(result, indent=1) if args.json else "\n".join(plan_lines(result)))
    return EXIT_OK


def command_sweep(args: argparse.Namespace) -> int:
    """Run each plan that fits into a recording under ``OUT``, then rank them (also after an interruption)."""
    from meshtop.recordings.sweep import SWEEP_FILE, ranking
    from meshtop.runner.planner.sweep import run_sweep, sweep_question
    from meshtop.tui.plan_text import sweep_lines

    if args.endpoint is not None:
        return command_capacity(args)
    given = [name for name in (*CAPACITY_ONLY, *ENDPOINT_ONLY) if getattr(args, name) not in (None, False)]
    if given:
        raise PlanError(f"{option(given[0])} is for a capacity sweep: give --endpoint URL")
    if args.script is not None:
        raise PlanError("a plan sweep runs the built-in model: a server command after -- needs --endpoint URL")
    question, budget = plan_question(args, launching=True)
    question = sweep_question(question, steps=args.steps)
    found = candidates(question)
    probes = node_probes_from_args(args)
    hang_timeout = hang_timeout_from_args(args)
    out: Path = args.out
    ours = not (out / SWEEP_FILE).exists()  # never rank (and rewrite the tables of) a sweep that was there
    status = "interrupted"
    try:
        status = run_sweep(
            question,
            found,
            budget,
            out=out,
            stream=sys.stdout,
            command_line=args.argv,
            node_probes=probes,
            hang_timeout_s=hang_timeout,
        )
    finally:
        if ours and (out / SWEEP_FILE).exists():
            ranked = ranking(out)
            lines = sweep_lines(ranked)
            files = {"ranking.json": json.dumps(ranked, indent=1), "ranking.txt": "\n".join(lines) + "\n"}
            keep_and_print(out, files, lines, f"sweep: {out} (meshtop replay {out} to browse the plans)")
    return exit_code(status)
