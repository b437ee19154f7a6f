"""Runner efficiency: tokens / s of a meshtop single-rank training run against a plain PyTorch loop.

The loop below is the reference: the same model, weights, data, optimizer,
batch and sequence length as ``runner/train.py`` (resolved from the same
``RunSpec``), written without meshtop, run in its own process. Both sides
are timed the same way: the period between the starts of consecutive
steps, so whatever meshtop does between steps (events, memory snapshots,
the shipper thread) counts. Warm-up steps are dropped; meshtop and the loop
alternate, and each pair gives one ratio.

Both sides run one compute thread (``OMP_NUM_THREADS=1``), which leaves the
second core to meshtop's own process and the launcher, as a GPU node leaves
them a core of their own. With two threads on this 2-core VM a run's step
time settles at random in one of two states 40 % apart (19 or 27 ms for
tiny, whole runs at a time, with or without meshtop), which no pairing of
runs averages out; with one it varies by about 1 %.

Run alone (the loop's process): ``python -m tests.bench.efficiency MODEL STEPS BATCH OUT_JSON``.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from itertools import pairwise
from pathlib import Path

from probes.events import StepTiming
from runner.plan import ResolvedRun, RunSpec, resolve
from tests.bench.figures import Row, Spread, Target, median
from tests.jobs import launch

WARMUP_STEPS = 5
TARGET = Target(low=0.97)
CASES = {"tiny": 200}
"""Model preset: steps per run. The tiny model's steps take milliseconds, so what meshtop adds per step
(events, memory snapshots, the shipper) shows most."""
THREADS = {"OMP_NUM_THREADS": "1"}
BATCH = 8


def single_rank(model: str, steps: int, batch_size: int) -> ResolvedRun:
    return resolve(RunSpec(device="cpu", dp=1, model=model, steps=steps, batch_size=batch_size), gpus_visible=0)


def periods_s(starts_ns: list[int]) -> list[float]:
    """Seconds between consecutive step starts, after the warm-up."""
    starts = sorted(starts_ns)[WARMUP_STEPS:]
    return [(b - a) / 1e9 for a, b in pairwise(starts)]


def plain_loop(run: ResolvedRun) -> list[int]:
    """Train ``run`` with nothing but PyTorch; the wall time at the start of each step."""
    import torch

    from runner.data import synthetic_tokens
    from runner.model import Transformer, next_token_loss
    from runner.weights import init_weights

    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))  # as runner/worker.py does
    device = torch.device("cpu")
    model = Transformer(run.shape)
    init_weights(model, model=run.shape, seed=run.seed, device=device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.0)
    starts = []
    for step in range(run.steps):
        starts.append(time.time_ns())
        tokens = synthetic_tokens(step=step, seed=run.seed, batch_size=run.batch_size, seq_len=run.seq_len,
                                  vocab_size=run.shape.vocab_size)
        inputs, targets = tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()
        optimizer.zero_grad(set_to_none=True)
        loss = next_token_loss(model(inputs), targets)
        loss.backward()
        loss.item()
        optimizer.step()
    starts.append(time.time_ns())
    return starts


def loop_periods(model: str, steps: int, batch_size: int) -> list[float]:
    """:func:`plain_loop` in a fresh process (a meshtop rank is one too)."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "starts.json"
        subprocess.run([sys.executable, "-m", "tests.bench.efficiency", model, str(steps), str(batch_size), str(out)],
                       check=True, env={**os.environ, **THREADS}, timeout=600)
        return periods_s(json.loads(out.read_text()))


def meshtop_periods(model: str, steps: int, batch_size: int) -> list[float]:
    """A real ``meshtop record``-style job of one rank (hooks on, events shipped to the collector)."""
    with tempfile.TemporaryDirectory() as tmp:
        launched = launch(Path(tmp), env=THREADS, dp=1, model=model, steps=steps, batch_size=batch_size)
    assert launched.result.status == "completed", launched.result
    starts = [e.start_ns for e in launched.events if isinstance(e, StepTiming)]
    ends = [e.start_ns + round(e.duration_s * 1e9) for e in launched.events if isinstance(e, StepTiming)]
    return periods_s(starts + [max(ends)])


def measure(model: str, steps: int, pairs: int) -> Row:
    """``pairs`` alternating meshtop / plain runs; the ratio of their median periods, per pair."""
    run = single_rank(model, steps, BATCH)
    ratios, meshtop_s, loop_s = [], [], []
    for _ in range(pairs):
        mine, plain = meshtop_periods(model, steps, BATCH), loop_periods(model, steps, BATCH)
        meshtop_s.append(statistics.median(mine))
        loop_s.append(statistics.median(plain))
        ratios.append(loop_s[-1] / meshtop_s[-1])
    tokens = run.batch_size * run.seq_len
    return Row("efficiency", f"train {model} dp1 1 thread, {BATCH}x{run.seq_len} tok", median(ratios), "tok/s ratio",
               Spread.of(ratios), TARGET,
               note=f"meshtop {tokens / median(meshtop_s):,.0f} vs loop {tokens / median(loop_s):,.0f} tok/s",
               details={"steps": steps, "warmup_steps": WARMUP_STEPS, "meshtop_median_step_s": meshtop_s,
                        "loop_median_step_s": loop_s, "pair_ratios": ratios})


def rows(pairs: int = 4, cases: dict[str, int] = CASES) -> list[Row]:
    return [measure(model, steps, pairs) for model, steps in cases.items()]


if __name__ == "__main__":
    model_name, step_count, batch, out_path = sys.argv[1:5]
    Path(out_path).write_text(json.dumps(plain_loop(single_rank(model_name, int(step_count), int(batch)))))
