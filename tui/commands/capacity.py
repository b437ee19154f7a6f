"""``meshtop sweep OUT --endpoint URL --slo ...`` on the command line: how many requests a second each
configuration of a server takes within its SLO (:mod:`meshtop.runner.planner.capacity` runs it,
:mod:`meshtop.recordings.capacity` judges it, :mod:`meshtop.tui.capacity_text` prints it). The ``sweep``
command's parser is :mod:`meshtop.tui.commands.planning`'s; with ``--endpoint`` it comes here."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

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
from meshtop.runner.serving.load import endpoint_load
from meshtop.runner.serving.server import DEFAULT_STARTUP_TIMEOUT_S
from meshtop.tui.endpoint_options import BUILTIN_ONLY, load_from_args, parse_slo
from meshtop.tui.options import exit_code, gpus_visible, node_probes_from_args


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
            last = f"sweep: {out} (meshtop replay {out} to browse it, meshtop summary {out} --json for the figures)"
            keep_and_print(out, {"capacity.txt": "\n".join(lines) + "\n"}, lines, last)
    return exit_code(status)


def capacity_from_args(args: argparse.Namespace) -> CapacitySweep:
    """What ``sweep OUT --endpoint URL`` asks, every option checked (one line when one is wrong)."""
    given = [name for name in PLAN_SWEEP_ONLY if getattr(args, name) is not None]
    defaults = args.builtin_defaults
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


def keep_and_print(out: Path, files: dict[str, str], lines: list[str], last: str) -> None:
    """A sweep's table: written into ``out`` (``files``: name -> text) and printed, then ``last``. A folder that
    cannot take the files is a warning: the runs' recordings are there, the tables only their index."""
    try:
        for name, text in files.items():
            (out / name).write_text(text)
    except OSError as error:
        print(f"meshtop: warning: cannot write the sweep's table in {out}: {error.strerror}", file=sys.stderr)
    print("\n" + "\n".join(lines), flush=True)
    print(last, flush=True)
