"""``meshtop plan`` and ``meshtop sweep`` on the command line: which plan for this model on these devices
(:mod:`meshtop.runner.planner.plans`, :mod:`meshtop.runner.planner.report`, :mod:`meshtop.runner.planner.sweep`).
``replay`` of a sweep's folder is in :mod:`meshtop.tui.commands.recordings`."""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

from meshtop.recordings.manifest import Load
from meshtop.recordings.metrics.blocker import ATTAINMENT
from meshtop.runner.errors import PlanError
from meshtop.runner.plan import option
from meshtop.runner.planner.capacity import (
    DEFAULT_DURATION_S,
    DEFAULT_MAX_RUNS,
    DEFAULT_START_RATE,
    CapacitySweep,
    configurations,
    parse_rates,
    run_capacity_sweep,
)
from meshtop.runner.planner.plans import SWEEP_STEPS, Question, candidates, check_counts
from meshtop.runner.planner.report import Budget, check_budget, parse_size, report
from meshtop.runner.serving.load import endpoint_load
from meshtop.runner.serving.server import DEFAULT_STARTUP_TIMEOUT_S
from meshtop.tui.endpoint_options import (
    BUILTIN_ONLY,
    ENDPOINT_ONLY,
    add_endpoint_options,
    load_from_args,
    parse_slo,
)
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
        parser.set_defaults(**PLAN_DEFAULTS)
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


def add_capacity_options(sweep: argparse.ArgumentParser) -> None:
    """A capacity sweep's own options (``sweep OUT --endpoint URL``)."""
    capacity = sweep.add_argument_group("a capacity sweep (with --endpoint URL)")
    capacity.add_argument(
        "--rates",
        default=None,
        metavar="auto|R1,R2,...",
        help="rates to run, requests/s, ascending, stopping once one saturates; auto (the default): double from "
        "--start-rate until a run does not pass, then bisect to within 10 %%",
    )
    capacity.add_argument(
        "--concurrencies",
        default=None,
        metavar="C1,C2,...",
        help="search closed-loop concurrency instead of rate: these, ascending, stopping once one saturates",
    )
    capacity.add_argument(
        "--attainment",
        type=float,
        default=None,
        metavar="SHARE",
        help=f"the share of requests that must meet the SLO for a run to pass (default {ATTAINMENT:g})",
    )
    capacity.add_argument(
        "--start-rate",
        type=float,
        default=None,
        metavar="R",
        help=f"--rates auto's first rate, requests/s (default {DEFAULT_START_RATE:g})",
    )
    capacity.add_argument(
        "--max-runs",
        type=int,
        default=None,
        metavar="N",
        help=f"--rates auto's runs per configuration, at most (default {DEFAULT_MAX_RUNS})",
    )
    capacity.add_argument(
        "--vary",
        action="append",
        default=None,
        metavar="NAME=V1,V2",
        help="fill {NAME} in the server command after -- with each value (repeatable: every combination); "
        "replicas=N starts it N times, each on its own {port}",
    )
    capacity.add_argument(
        "--gpus-per-config",
        type=int,
        default=None,
        metavar="N",
        help="GPUs one server holds, where --vary names no tp or pp (default 1)",
    )
    capacity.add_argument(
        "--users", type=int, default=None, metavar="N", help="with --rate-per-user: how many of each configuration"
    )
    capacity.add_argument(
        "--rate-per-user",
        type=float,
        default=None,
        metavar="R",
        help="requests/s one user sends: the offered load is --users x R",
    )


CAPACITY_ONLY = (
    "rates", "concurrencies", "attainment", "start_rate", "max_runs", "vary", "gpus_per_config", "users",
    "rate_per_user",
)  # fmt: skip
PLAN_SWEEP_ONLY = ("gpus", "ranks", "device_memory", "gpus_per_node", "plans", "steps")
"""A plan sweep's options, which a capacity sweep (``--endpoint``) refuses."""


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
            try:
                (out / "ranking.json").write_text(json.dumps(ranked, indent=1))
                (out / "ranking.txt").write_text("\n".join(lines) + "\n")
            except OSError as error:  # the plans' recordings are there: the tables are only their index
                print(f"meshtop: warning: cannot write the sweep's ranking in {out}: {error.strerror}", file=sys.stderr)
            print("\n" + "\n".join(lines), flush=True)
            print(f"sweep: {out} (meshtop replay {out} to browse the plans)", flush=True)
    return exit_code(status)


def command_capacity(args: argparse.Namespace) -> int:
    """``sweep OUT --endpoint URL``: each configuration's capacity within the SLO, one recording per run, then
    the ranked table (also after an interruption)."""
    from meshtop.recordings.capacity import capacity_report, is_capacity_sweep
    from meshtop.tui.capacity_text import capacity_lines

    sweep = capacity_from_args(args)
    out: Path = args.out
    ours = not is_capacity_sweep(out)  # never rewrite the table of a sweep that was there
    status = "interrupted"
    try:
        status = run_capacity_sweep(
            sweep, stream=sys.stdout, command_line=args.argv, node_probes=node_probes_from_args(args)
        )
    finally:
        if ours and is_capacity_sweep(out):
            lines = capacity_lines(capacity_report(out))
            try:
                (out / "capacity.txt").write_text("\n".join(lines) + "\n")
            except OSError as error:  # the runs' recordings are there: the table is only their index
                print(f"meshtop: warning: cannot write the table in {out}: {error.strerror}", file=sys.stderr)
            print("\n" + "\n".join(lines), flush=True)
            print(f"sweep: {out} (meshtop summary {out} --json for the figures)", flush=True)
    return exit_code(status)


def capacity_from_args(args: argparse.Namespace) -> CapacitySweep:
    """What ``sweep OUT --endpoint URL`` asks, every option checked (one line when one is wrong)."""
    given = [name for name in PLAN_SWEEP_ONLY if getattr(args, name) is not None]
    defaults = {**args.builtin_defaults, **PLAN_DEFAULTS}
    given += [name for name in BUILTIN_ONLY if getattr(args, name, None) != defaults.get(name)]
    given += [name for name in ("same_load", "request_rate", "concurrency") if getattr(args, name) is not None]
    if given or args.mode != "train":
        name = given[0] if given else "mode"
        instead = {"request_rate": " (give --rates)", "concurrency": " (give --concurrencies)"}.get(name, "")
        raise PlanError(f"{option(name)} is not for a capacity sweep (--endpoint){instead}")
    if args.slo is None:
        raise PlanError("a capacity sweep needs the SLO a run must meet: give --slo ttft=500ms,tpot=50ms")
    slo_ttft, slo_tpot = parse_slo(args.slo)
    if args.rates is not None and args.concurrencies is not None:
        raise PlanError("--rates and --concurrencies each name the search: give one of them")
    search = "concurrency" if args.concurrencies is not None else "rate"
    fixed = None
    if args.concurrencies is not None:
        fixed = parse_rates(args.concurrencies, "--concurrencies", whole=True)
    elif args.rates not in (None, "auto"):
        fixed = parse_rates(args.rates, "--rates")
    auto_only = [name for name in ("start_rate", "max_runs") if getattr(args, name) is not None]
    if fixed is not None and auto_only:
        raise PlanError(f"{option(auto_only[0])} is for --rates auto; the rates are given")
    start = args.start_rate if args.start_rate is not None else DEFAULT_START_RATE
    max_runs = args.max_runs if args.max_runs is not None else DEFAULT_MAX_RUNS
    attainment = args.attainment if args.attainment is not None else ATTAINMENT
    if not 0 < start < float("inf") or max_runs < 1 or not 0 < attainment <= 1:
        raise PlanError("--start-rate must be above 0, --max-runs 1 or more, --attainment above 0 and at most 1")
    users = None
    if (args.users is None) != (args.rate_per_user is None):
        raise PlanError("--users and --rate-per-user go together: the offered load is their product")
    if args.users is not None:
        if args.users < 1 or not 0 < args.rate_per_user < float("inf"):
            raise PlanError("--users must be 1 or more and --rate-per-user above 0")
        offered = args.users * args.rate_per_user
        users = {"users": args.users, "rate_per_user": args.rate_per_user, "offered_per_s": offered}
    gpus_per_config = args.gpus_per_config if args.gpus_per_config is not None else 1
    if gpus_per_config < 1:
        raise PlanError(f"--gpus-per-config must be 1 or more, got {gpus_per_config}")
    if args.script is None and "{" in args.endpoint:
        raise PlanError(f"--endpoint {args.endpoint}: {{port}} is filled only for a server command after --")
    if args.script is None and args.startup_timeout is not None:
        raise PlanError("--startup-timeout is for a server meshtop starts: give its command after --")
    startup = args.startup_timeout if args.startup_timeout is not None else DEFAULT_STARTUP_TIMEOUT_S
    if not 0 < startup <= 86_400:
        raise PlanError(f"--startup-timeout must be above 0 and at most 86400 seconds, got {startup:g}")
    if args.requests is None and args.duration is None:
        args.duration = DEFAULT_DURATION_S
    configs = configurations(args.vary or (), args.script, args.endpoint, gpus_per_config=gpus_per_config)
    args.slo_ttft_ms = args.slo_tpot_ms = None  # --slo gives them

    def load_at(rate: float | None, concurrency: int | None) -> Load:
        return load_from_args(args, request_rate=rate, concurrency=concurrency)

    for value in fixed or (start,):  # every load checked before anything starts
        endpoint_load(load_at(*((value, None) if search == "rate" else (None, int(value)))))
    gpus: tuple[str, ...] = ()
    if any(config.replicas > 1 for config in configs):  # each copy gets its share of the GPUs
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        gpus = tuple(visible.split(",")) if visible else tuple(str(i) for i in range(gpus_visible()))
    return CapacitySweep(
        out=args.out,
        endpoint=args.endpoint,
        api=args.api or "completions",
        model=args.model,
        load_at=load_at,
        slo=(slo_ttft and slo_ttft / 1e3, slo_tpot and slo_tpot / 1e3),
        attainment=attainment,
        fixed=fixed,
        search=search,
        start_rate=start,
        max_runs=max_runs,
        configurations=configs,
        command=tuple(args.script) if args.script is not None else None,
        startup_timeout_s=startup,
        visible_gpus=gpus,
        users=users,
        server_metrics=args.server_metrics,
    )
