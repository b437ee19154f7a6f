"""Instrumentation overhead: step time with the worker hooks on / off, in the same job.

``python -m tests.bench.overhead [--json PATH] [--configs ddp,fsdp,...] [--steps-scale 1.0] [--scripts ddp,...]``

``--scripts`` measures the scripts of ``examples/`` the same way, each
unmodified under ``meshtop record OUT -- torchrun ...`` (the attachment's
instrumentation switches its hooks as the worker's does).

Each configuration runs once; the worker's instrumentation switches the hooks
on and off every BLOCK steps (``MESHTOP_OVERHEAD_BLOCK``, read by
``meshtop.probes.instrument``), so both halves share processes, caches and the
machine's noise. The first step of each block and the first
two blocks are dropped. The job's step time is the slowest rank's.

Each on block and the off block after it make a pair, whose ratio is the
on block's median step over the off block's: neighbours in time, so a drift
in the machine's speed cancels within a pair. The figure is the median of
the pairs' ratios, with its bootstrap 95 % confidence interval (fixed seed)
and the number of pairs it rests on: the interval, not the pairs' own
spread, says whether the figure resolves its 1.02 target (an interval that
holds 1.02 does not). The pooled median(on) / median(off) and the pairs'
p25-p75 follow in the note.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from meshtop.probes.events import StepTiming
from meshtop.probes.instrument import OVERHEAD_BLOCK_ENV
from meshtop.recordings.reader import open_recording
from meshtop.recordings.schema import events_of
from tests.bench.figures import Row, Spread, Target, median_interval, quantile
from tests.kit.commands import run_meshtop
from tests.kit.jobs import launch

BLOCK = 4
TARGET = Target(high=1.02)
INFER_REQUESTS = 64
CONFIGS: dict[str, tuple[dict[str, object], int]] = {
    # name: (plan, steps): about a minute each on 2 cores
    "ddp": (dict(dp=2), 2000),
    "fsdp": (dict(dp=2, fsdp=True), 800),
    "tp": (dict(tp=2), 480),
    "pp": (dict(pp=2, microbatches=4), 600),
    "3d": (dict(dp=2, tp=2, pp=2, microbatches=2), 160),
}


SCRIPTS: dict[str, tuple[int, int, tuple[str, ...]]] = {
    # example: (ranks, steps, its arguments): about a minute each on 2 cores
    "ddp": (2, 1200, ("--dim", "256")),
    "fsdp2": (2, 600, ("--dim", "256")),
    "tp": (2, 600, ("--dim", "256")),
}
REPO = Path(__file__).resolve().parents[2]


def measure_script(name: str, steps_scale: float = 1.0, block: int = BLOCK) -> dict[str, object]:
    """One of :data:`SCRIPTS`, recorded by meshtop with the hooks switched every ``block`` optimizer steps."""
    ranks, steps, arguments = SCRIPTS[name]
    steps = max(4 * block, round(steps * steps_scale))
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "rec"
        done = run_meshtop(
            "record",
            str(out),
            "--",
            "torchrun",
            "--standalone",
            f"--nproc-per-node={ranks}",
            str(REPO / "examples" / f"{name}.py"),
            "--steps",
            str(steps),
            *arguments,
            env={OVERHEAD_BLOCK_ENV: str(block), "CUDA_VISIBLE_DEVICES": ""},
            cwd=REPO,
            timeout_s=None,
        )
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
        timings = [e for e in events_of("step", open_recording(out).arrow("step")) if isinstance(e, StepTiming)]
    return {
        "config": f"script {name}",
        "plan": f"torchrun {name}.py ({ranks} ranks) {' '.join(arguments)}",
        **compare_blocks(timings, block),
    }


def measure_config(name: str, steps_scale: float = 1.0) -> dict[str, object]:
    """One of :data:`CONFIGS`, with ``steps_scale`` of its steps (the suite runs shorter jobs)."""
    plan, steps = CONFIGS[name]
    return measure(name, plan, max(4 * BLOCK, round(steps * steps_scale)))


def measure(name: str, plan: dict[str, object], steps: int, block: int = BLOCK) -> dict[str, object]:
    with tempfile.TemporaryDirectory() as tmp:
        launched = launch(Path(tmp), env={OVERHEAD_BLOCK_ENV: str(block)}, steps=steps, batch_size=8, **plan)
    assert launched.result.status == "completed", launched.result
    timings = [e for e in launched.events if isinstance(e, StepTiming)]
    return {"config": name, "plan": launched.run.plan.label, **compare_blocks(timings, block)}


def measure_inference(plan: dict[str, object], requests: int, block: int = BLOCK) -> dict[str, object]:
    """The same on a serving job: decode ops (more than one request's token) with the hooks on and off.

    Each op of a replica is a step, timed from the end of the previous op, so a
    decode op's time is the time per output token its requests saw (TPOT).
    Prefills and single-request decodes are left out: their time depends on
    the prompt or the load, not on the hooks.
    """
    with tempfile.TemporaryDirectory() as tmp:
        launched = launch(
            Path(tmp),
            env={OVERHEAD_BLOCK_ENV: str(block)},
            mode="infer",
            requests=requests,
            concurrency=8,
            output_len="32",
            **plan,
        )
    assert launched.result.status == "completed", launched.result
    timings = [e for e in launched.events if isinstance(e, StepTiming)]
    decodes = {t.step for t in timings if t.tokens > 1}
    return {
        "config": "infer",
        "plan": launched.run.plan.label,
        **compare_blocks(timings, block, keep=lambda step: step in decodes),
    }


def compare_blocks(
    timings: list[StepTiming], block: int, keep: Callable[[int], bool] = lambda step: True
) -> dict[str, object]:
    """median(on) / median(off) over the steps ``keep`` accepts, and the ratios of neighbouring blocks.

    The job's step time is the slowest rank's; the first step of each block
    (the switch) and the first two blocks (warm-up) are dropped. Where the
    steps carry their CPU time, the same comparison of the job's CPU per step
    (every rank's process, summed) follows as ``cpu_*``: it leaves out the
    waiting for a core that makes wall time noisy on a machine with fewer cores
    than ranks, and keeps everything the probes run, on every thread.
    """
    job_time: dict[int, float] = {}
    on_flag: dict[int, bool] = {}
    for timing in timings:
        job_time[timing.step] = max(job_time.get(timing.step, 0.0), timing.duration_s)
        on_flag[timing.step] = timing.instrumented
    result = block_ratios(job_time, on_flag, block, keep)
    if all(timing.cpu_s is not None for timing in timings):
        job_cpu: dict[int, float] = {}
        for timing in timings:
            job_cpu[timing.step] = job_cpu.get(timing.step, 0.0) + (timing.cpu_s or 0.0)
        cpu = block_ratios(job_cpu, on_flag, block, keep)
        result.update({f"cpu_{name}": value for name, value in cpu.items() if not name.startswith("steps_")})
    return result


def block_ratios(
    job_time: dict[int, float], on_flag: dict[int, bool], block: int, keep: Callable[[int], bool]
) -> dict[str, Any]:
    """:func:`compare_blocks` for one per-step figure of the job."""
    blocks: dict[int, list[float]] = {}
    for step, duration in job_time.items():
        if step < 2 * block or step % block == 0 or not keep(step):
            continue
        blocks.setdefault(step // block, []).append(duration)
    on = [d for b, ds in blocks.items() if on_flag[b * block] for d in ds]
    off = [d for b, ds in blocks.items() if not on_flag[b * block] for d in ds]
    pair_ratios = [
        statistics.median(blocks[b]) / statistics.median(blocks[b + 1])
        for b in blocks
        if on_flag[b * block] and b + 1 in blocks
    ]
    ci_low, ci_high = median_interval(pair_ratios)
    return {
        "steps_on": len(on),
        "steps_off": len(off),
        "median_on_ms": statistics.median(on) * 1e3,
        "median_off_ms": statistics.median(off) * 1e3,
        "ratio": statistics.median(on) / statistics.median(off),
        "pair_ratio_median": statistics.median(pair_ratios) if pair_ratios else float("nan"),
        "pair_ratio_ci_low": ci_low,
        "pair_ratio_ci_high": ci_high,
        "pair_ratio_p25": quantile(pair_ratios, 0.25),
        "pair_ratio_p75": quantile(pair_ratios, 0.75),
        "pairs": len(pair_ratios),
    }


def overhead_row(case: str, result: dict[str, Any], what: str, unit: str) -> Row:
    """A suite row of :func:`measure` or :func:`measure_inference`'s result: ``what`` is timed, in ``unit``."""
    cpu = (
        f"; CPU pairs {result['cpu_pair_ratio_median']:.3f} "
        f"(95% CI {result['cpu_pair_ratio_ci_low']:.3f}..{result['cpu_pair_ratio_ci_high']:.3f})"
        if "cpu_ratio" in result
        else ""
    )
    return Row(
        "overhead",
        case,
        float(result["pair_ratio_median"]),
        "on/off",
        Spread(
            int(result["pairs"]),
            float(result["pair_ratio_ci_low"]),
            float(result["pair_ratio_ci_high"]),
            "block pairs' median 95% CI",
        ),
        TARGET,
        details=result,
        note=f"{what} {result['median_off_ms']:.1f} ms, {result['steps_on']}+{result['steps_off']} {unit}; "
        f"pooled {result['ratio']:.3f}; pairs p25-p75 {result['pair_ratio_p25']:.3f}..{result['pair_ratio_p75']:.3f}"
        f"{cpu}",
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, help="also write the rows as JSON")
    parser.add_argument("--configs", default=",".join(CONFIGS))
    parser.add_argument("--steps-scale", type=float, default=1.0, help="run this share of each config's steps")
    parser.add_argument("--scripts", default="", help=f"examples/ scripts to measure too: {','.join(SCRIPTS)}")
    args = parser.parse_args()
    rows = []
    jobs: list[tuple[str, Callable[[], dict[str, Any]]]] = [
        *((name, lambda name=name: measure_config(name, args.steps_scale)) for name in args.configs.split(",") if name),
        *(
            (f"s:{name}", lambda name=name: measure_script(name, args.steps_scale))
            for name in args.scripts.split(",")
            if name
        ),
    ]
    print(
        f"{'config':<6} {'plan':<32} {'on ms':>8} {'off ms':>8} {'pooled':>7}  {'pairs: median [95% CI]':>24} "
        f"{'n':>4}  {'p25..p75':>13}  {'steps':>9}  CPU pairs: median [95% CI]"
    )
    for name, measured in jobs:
        row = measured()
        rows.append(row)
        print(
            f"{name:<6} {row['plan']:<32} {row['median_on_ms']:>8.2f} {row['median_off_ms']:>8.2f} "
            f"{row['ratio']:>7.3f}  {row['pair_ratio_median']:>7.3f} [{row['pair_ratio_ci_low']:.3f}.."
            f"{row['pair_ratio_ci_high']:.3f}] {row['pairs']:>4}  "
            f"{row['pair_ratio_p25']:.3f}..{row['pair_ratio_p75']:.3f}  {row['steps_on']:>4}+{row['steps_off']:<4}  "
            f"{row['cpu_pair_ratio_median']:.3f} "
            f"[{row['cpu_pair_ratio_ci_low']:.3f}..{row['cpu_pair_ratio_ci_high']:.3f}]",
            flush=True,
        )
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
