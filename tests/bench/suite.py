"""The whole benchmark suite in one command: one table of ratios and rates, each with its target.

``python -m tests.bench.suite [--json PATH] [--full] [--only overhead,ingest,...] [--device cuda]``

Every figure is a ratio or a rate measured side by side in the same run (the
machine is noisy): hooks on / off inside one job, meshtop / a plain loop in
alternation, samplers on / off in alternating windows. Each row says how many
repetitions it rests on and their spread, its target and whether it is met.
The default suite is sized to run in under 10 minutes on 2 CPU cores (the
training overhead jobs are 40 % of ``tests.bench.overhead``'s length,
the TUI dwells 1 s per view); ``--full`` adds a 10 M-event recording and the
1024-rank, 1-hour one (about 11 minutes and 13 GiB of memory more, docs/benchmarks.md).

The figures, and where each is measured:

- overhead: step time hooks on / off, every 4 steps (:mod:`tests.bench.overhead`),
  for DDP, TP, PP and 3D training and for serving (decode ops, the TPOT), and
  what each collective kernel adds to one operation (:mod:`tests.bench.kernel_cost`);
- efficiency: tokens / s of a one-rank meshtop run / a plain PyTorch loop
  (:mod:`tests.bench.efficiency`);
- ingest: events / s that meshtop records from 8 processes (:mod:`tests.bench.ingest`);
- samplers: CPU share of the NVML and psutil samplers (:mod:`tests.bench.sampler_cost`);
- tui: dashboard frame time at 8, 64, 1024 ranks and 10,000 events / s (:mod:`tests.bench.tui_frames`);
- recordings: bytes / event, write rate, load and summary time (:mod:`tests.bench.recording_io`; with
  ``--full``, ``summary`` of a 1024-rank, 1-hour recording, :mod:`tests.bench.summary_scale`);
- fleet: events / s the head of 1024 ranks on 16 nodes sustains, nothing lost (:mod:`tests.bench.fleet`);
- accuracy: bubble / (p-1)/(m+p-1), hook busbw / a timing loop (:mod:`tests.bench.accuracy`).

``--device cuda`` runs the GPU figures instead (:mod:`tests.bench.gpu`):
samplers on real GPUs, overhead on nccl, and MFU.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.bench import (
    accuracy,
    efficiency,
    fleet,
    ingest,
    kernel_cost,
    overhead,
    recording_io,
    sampler_cost,
    summary_scale,
    tui_frames,
)
from tests.bench.accuracy import BELOW, SLOWEST_ABOVE
from tests.bench.figures import NO_TARGET, Row, Spread, Target, median

OVERHEAD_CONFIGS = {"ddp": "DDP dp2", "tp": "TP tp2", "pp": "PP pp2 1F1B 4 mb", "3d": "3D dp2 x tp2 x pp2"}
STEPS_SCALE = 0.4
"""The suite's share of each overhead job's steps (the full lengths take about 6 minutes)."""
INFER_PLAN: dict[str, object] = {"dp": 1, "tp": 2}
TUI_RANKS = (8, 64, 1024)
TUI_SECONDS = 7.0
"""Measured seconds per rank count and terminal size: 1 s on each of the 7 views."""
BUBBLE_CASES = (("1f1b", 2), ("1f1b", 4), ("1f1b", 8), ("gpipe", 4))
BUSBW_RUNS = 3
BUSBW_TARGET = Target(0.98, 1.02)
BUSBW_TARGET_FROM = 8 << 20
"""Below this the loop also times the Python call around the collective (docs/probes.md): reported only."""


def overhead_rows() -> list[Row]:
    rows = kernel_cost.rows()
    for name, label in OVERHEAD_CONFIGS.items():
        result = overhead.measure_config(name, STEPS_SCALE)
        rows.append(overhead.overhead_row(f"train {label}", result, "step", "steps"))
    result = overhead.measure_inference(INFER_PLAN, overhead.INFER_REQUESTS)
    rows.append(overhead.overhead_row("infer tp2 TPOT (decode ops)", result, "decode op", "ops"))
    return rows


def tui_rows() -> list[Row]:
    return [tui_row(ranks, size) for ranks in TUI_RANKS for size in tui_frames.SIZES]


def tui_row(ranks: int, size: tuple[int, int]) -> Row:
    result = asyncio.run(tui_frames.measure(ranks, size, TUI_SECONDS, tui_frames.RATE, tui_frames.SCREEN_BACKLOG, None))
    full = result["full_ms"]
    limit = tui_frames.TARGETS_MS.get((ranks, size))
    target = Target(high=limit) if limit is not None else NO_TARGET
    return Row(
        "tui",
        f"frame p99, {ranks} ranks {result['size']}",
        full["p99"],
        "ms",
        Spread(int(result["frames"]), full["p50"], full["max"], "frames p50-max"),
        target,
        note=f"applied {result['applied_per_s']:,.0f}/s, dropped {result['dropped']:,}, "
        f"worst view {result['worst_view']}, view switch {result['switch_ms']['p50']:.0f} ms (p50, left out)",
        details=result,
    )


def bubble_row(schedule: str, microbatches: int) -> Row:
    result = accuracy.measure_bubble(schedule, microbatches)
    theory = float(result["theory"])
    ratios = [value / theory for value in result["slowest_by_step"]]
    return Row(
        "accuracy",
        f"bubble {schedule} pp2 m={microbatches} / theory {theory:.3f}",
        float(result["measured_slowest"]) / theory,
        "ratio",
        Spread.of(ratios),
        Target((theory - BELOW) / theory, (theory + SLOWEST_ABOVE) / theory),  # the test's bounds
        note=f"slowest stage {result['slowest_stage']}, median of steps 1-9",
        details=result,
    )


def busbw_rows() -> list[Row]:
    runs = [accuracy.measure_busbw() for _ in range(BUSBW_RUNS)]
    rows = []
    for index, first in enumerate(runs[0]):
        size = int(first["bytes"])
        ratios = [run[index]["hook_busbw_gbps"] / run[index]["loop_busbw_gbps"] for run in runs]
        small = size < BUSBW_TARGET_FROM
        gap_ms = median([(run[index]["loop_median_s"] - run[index]["hook_median_s"]) * 1e3 for run in runs])
        rows.append(
            Row(
                "accuracy",
                f"busbw all_reduce {size >> 10:,} KiB, hooks / loop",
                median(ratios),
                "ratio",
                Spread.of(ratios),
                NO_TARGET if small else BUSBW_TARGET,
                note=f"{median([run[index]['hook_busbw_gbps'] for run in runs]):.2f} GB/s; loop - hooks "
                f"{gap_ms:.2f} ms" + (" (the loop times the Python call too)" if small else ""),
                details={"runs": [run[index] for run in runs]},
            )
        )
    return rows


def accuracy_rows() -> list[Row]:
    return [bubble_row(schedule, m) for schedule, m in BUBBLE_CASES] + busbw_rows()


def figures(full: bool) -> dict[str, Callable[[], list[Row]]]:
    """Every figure of the suite, in the order it runs (cheap and sensitive to leftovers first)."""
    return {
        "samplers": sampler_cost.rows,
        "ingest": ingest.rows,
        "efficiency": efficiency.rows,
        "overhead": overhead_rows,
        "accuracy": accuracy_rows,
        "recordings": lambda: recording_io.rows(full=full) + (summary_scale.rows() if full else []),
        "tui": tui_rows,
        "fleet": fleet.rows,
    }


def format_value(value: float) -> str:
    if abs(value) >= 1000:
        return f"{value:,.0f}"
    return f"{value:.3f}" if abs(value) < 10 else f"{value:.1f}"


def table(rows: list[Row]) -> str:
    """The suite's one table."""
    header = (
        f"{'figure':<10} {'case':<44} {'value':>10} {'unit':<14} {'n':>5} {'spread':<24} {'target':<12} {'met':<4} note"
    )
    lines = [header, "-" * len(header)]
    for row in rows:
        spread = f"{format_value(row.spread.low)}..{format_value(row.spread.high)} {row.spread.kind}"
        met = "-" if row.met is None else ("yes" if row.met else "NO")
        lines.append(
            f"{row.figure:<10} {row.case:<44} {format_value(row.value):>10} {row.unit:<14} "
            f"{row.spread.reps:>5} {spread:<24} {row.target!s:<12} {met:<4} {row.note}"
        )
    return "\n".join(lines)


def machine() -> dict[str, Any]:
    import torch

    return {
        "cpus": os.cpu_count(),
        "affinity": len(os.sched_getaffinity(0)),
        "platform": platform.platform(),
        "processor": platform.processor(),
        "python": platform.python_version(),
        "torch": torch.__version__,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, help="also write the table (and every figure's details) as JSON")
    parser.add_argument("--full", action="store_true", help="also measure a 10 M-event recording")
    parser.add_argument("--only", help="comma-separated figures to run (default: all)")
    parser.add_argument(
        "--device",
        choices=("cpu", "cuda"),
        default="cpu",
        help="cuda: the GPU figures (tests/bench/gpu.py) instead of the CPU ones",
    )
    args = parser.parse_args(argv)
    if args.device == "cuda":
        from tests.bench import gpu

        if gpu.gpus_visible() == 0:
            parser.error("--device cuda: no CUDA GPU is visible")
        chosen = gpu.figures()
    else:
        chosen = figures(args.full)
    names = args.only.split(",") if args.only else list(chosen)
    unknown = set(names) - set(chosen)
    if unknown:
        parser.error(f"unknown figures {sorted(unknown)}; choose from {', '.join(chosen)}")
    rows: list[Row] = []
    seconds: dict[str, float] = {}
    started = time.perf_counter()
    described = machine()
    if args.device == "cuda":
        described.update(gpu.machine())

    def write_json(complete: bool) -> None:
        """The figures so far, written after each one: a run cut short (a device call's time limit) keeps them."""
        if args.json:
            tmp = args.json.with_suffix(".tmp")
            tmp.write_text(
                json.dumps(
                    {
                        "machine": described,
                        "full": args.full,
                        "complete": complete,
                        "seconds": seconds,
                        "total_s": time.perf_counter() - started,
                        "rows": [row.to_json() for row in rows],
                    },
                    indent=2,
                )
                + "\n"
            )
            tmp.replace(args.json)

    for name in names:
        print(f"suite: {name} ...", file=sys.stderr, flush=True)
        began = time.perf_counter()
        measured = chosen[name]()
        rows.extend(measured)
        seconds[name] = time.perf_counter() - began
        print(table(measured), file=sys.stderr, flush=True)
        print(f"suite: {name} done in {seconds[name]:.0f} s", file=sys.stderr, flush=True)
        write_json(complete=False)
    total = time.perf_counter() - started
    print(table(rows))
    met = [row for row in rows if row.met is not None]
    print(
        f"\n{sum(bool(row.met) for row in met)} of {len(met)} targets met; {total:.0f} s in all "
        f"({', '.join(f'{name} {s:.0f} s' for name, s in seconds.items())})"
    )
    write_json(complete=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
