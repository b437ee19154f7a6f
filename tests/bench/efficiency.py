"""Runner efficiency: tokens / s of a meshtop single-rank training run against a plain PyTorch loop.

The loop below is the reference: the same model, weights, data, optimizer,
batch and sequence length as ``runner/rank/train.py`` (resolved from the same
``RunSpec``), written without meshtop, run in its own process. Both sides
are timed the same way: the period between the starts of consecutive
steps, so whatever meshtop does between steps (events, memory snapshots,
the shipper thread) counts.

The two run at the same time and take turns: a meshtop job of one rank and
the loop's process both start, warm up, and then one runs for ``WINDOW_S``
while the other is stopped (SIGSTOP / SIGCONT), in the order M L L M M L ...
so that a drift in the machine's speed cancels. Each pair of neighbouring
windows gives one ratio, the loop's median period over meshtop's. Only the
periods wholly inside a window count, less the first ``COLD_PERIODS`` after
a resume (cold caches). Whole runs one after the other (this benchmark's
first design) compared runs some ten seconds apart, each behind a start-up
of several seconds, on a machine where other jobs come and go; neighbouring
windows see the same load, and many more pairs fit in the same time. The
figure is the median of the pairs' ratios, with a bootstrap 95 %
confidence interval; its target asks both for the median and for the
interval's low end. The note says how long each window's training thread
waited for a CPU that other jobs held (``/proc/PID/schedstat``): where that
is far from 0 % the pairs spread wide, and the interval says so. Linux only
(``/proc``, ``prctl``), as the rest of the suite.

While the loop runs, meshtop's rank is stopped but its launcher (this
process: the collector and the samplers) and torchrun idle on the other
core, as they do beside any job.

Both sides run one compute thread (``OMP_NUM_THREADS=1``), which leaves the
second core to meshtop's own process and the launcher, as a GPU node leaves
them a core of their own. With two threads on this 2-core VM a run's step
time settles at random in one of two states far apart, whole runs at a
time, with or without meshtop (docs/benchmarks.md).

Run alone (the loop's process): ``python -m tests.bench.efficiency MODEL BATCH OUT_JSON``; it trains until
SIGTERM, says ``ready`` on stdout after its warm-up, then writes the wall time of each step's start.
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from itertools import count, pairwise
from pathlib import Path

from meshtop.probes.events import Event, RankStarted, StepTiming
from meshtop.runner.job.control import JobControl
from meshtop.runner.plan import ResolvedRun, RunSpec, resolve
from tests.bench.figures import Row, Spread, Target, median, median_interval, quantile
from tests.kit.jobs import LaunchedRun, launch

WARMUP_STEPS = 5
"""Steps each side runs before the first window."""
COLD_PERIODS = 2
"""Periods dropped after each resume: the caches are the other side's."""
MIN_PERIODS = 5
"""A pair counts only where each of its windows holds this many periods (a window much slowed by other jobs
may not)."""
WINDOW_S = 1.0
PAIRS = 40
"""Window pairs: 2 x 40 x 1 s of turns, after the start-up of both (a few seconds, side by side)."""
MAX_STEPS = 100_000
"""The meshtop job's steps: more than the turns take; it is stopped after the last one."""
TARGET = Target(low=0.98)
CI_LOW_ABOVE = 0.97
"""The target is met only where the confidence interval of the median ratio lies above this too."""
CONFIDENCE = 0.95
CASES = ("tiny",)
"""Model presets. The tiny model's steps take milliseconds, so what meshtop adds per step (events, memory
snapshots, the shipper) shows most."""
THREADS = {"OMP_NUM_THREADS": "1"}
BATCH = 8
TAIL_S = 1.0
"""meshtop runs this long after its last window, so the shipper sends that window's steps before the stop."""
START_TIMEOUT_S = 300.0
PR_SET_PDEATHSIG = 1
"""prctl(2): the signal a process gets when its parent dies."""


def single_rank(model: str, steps: int, batch_size: int) -> ResolvedRun:
    return resolve(RunSpec(device="cpu", dp=1, model=model, steps=steps, batch_size=batch_size), gpus_visible=0)


@dataclass(frozen=True, slots=True)
class Window:
    """A turn of one side: from just after it was resumed to just before it was stopped (wall ns)."""

    side: str
    """``meshtop`` or ``loop``."""
    start_ns: int
    end_ns: int
    waited_s: float
    """Seconds the side's training thread spent ready to run but waiting for a CPU (its run-queue delay,
    ``/proc/PID/schedstat``): other jobs on the machine."""


def window_periods(starts_ns: list[int], window: Window) -> list[float]:
    """Seconds between consecutive step starts wholly inside ``window``, less the first :data:`COLD_PERIODS`."""
    inside = [t for t in sorted(starts_ns) if window.start_ns <= t <= window.end_ns]
    return [(b - a) / 1e9 for a, b in pairwise(inside)][COLD_PERIODS:]


def turn_order(pairs: int) -> list[str]:
    """M L, L M, M L, ...: each pair's two windows, meshtop first in every other pair."""
    order = []
    for index in range(pairs):
        order += ["meshtop", "loop"] if index % 2 == 0 else ["loop", "meshtop"]
    return order


def plain_loop(run: ResolvedRun, *, going: Callable[[], bool], warm: Callable[[], None]) -> list[int]:
    """Train ``run`` with nothing but PyTorch while ``going()``; the wall time at the start of each step.

    ``warm`` is called once, after :data:`WARMUP_STEPS` steps."""
    import torch

    from meshtop.runner.rank.data import synthetic_tokens
    from meshtop.runner.rank.model import Transformer, next_token_loss
    from meshtop.runner.rank.weights import init_weights

    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))  # as runner/rank/worker.py does
    device = torch.device("cpu")
    model = Transformer(run.shape)
    init_weights(model, model=run.shape, seed=run.seed, device=device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.0)
    starts = []
    for step in count():
        if step == WARMUP_STEPS:
            warm()
        if not going():
            break
        starts.append(time.time_ns())
        tokens = synthetic_tokens(
            step=step, seed=run.seed, batch_size=run.batch_size, seq_len=run.seq_len, vocab_size=run.shape.vocab_size
        )
        inputs, targets = tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()
        optimizer.zero_grad(set_to_none=True)
        loss = next_token_loss(model(inputs), targets)
        loss.backward()
        loss.item()
        optimizer.step()
    starts.append(time.time_ns())
    return starts


def pause(pid: int) -> None:
    """SIGSTOP ``pid`` and wait until it is stopped (its counters then hold still)."""
    os.kill(pid, signal.SIGSTOP)
    deadline = time.monotonic() + 5.0
    while Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] not in "tT":
        assert time.monotonic() < deadline, f"process {pid} did not stop"
        time.sleep(0.0005)


def waited_s(pid: int) -> float:
    """Seconds the main thread of ``pid`` has waited for a CPU so far."""
    _ran_ns, waited_ns, _slices = Path(f"/proc/{pid}/schedstat").read_text().split()
    return int(waited_ns) / 1e9


def resume(pid: int) -> None:
    os.kill(pid, signal.SIGCONT)


class LoopProcess:
    """:func:`plain_loop` in a fresh process (a meshtop rank is one too), trained until :meth:`finish`."""

    def __init__(self, model: str, out: Path) -> None:
        self.out = out
        self.process = subprocess.Popen(
            [sys.executable, "-m", "tests.bench.efficiency", model, str(BATCH), str(out)],
            stdout=subprocess.PIPE,
            text=True,
            env={**os.environ, **THREADS},
            start_new_session=True,
        )  # as the launcher starts torchrun: each side in a session (autogroup) of its own

    @property
    def pid(self) -> int:
        return self.process.pid

    def wait_warm(self) -> None:
        assert self.process.stdout is not None
        line = self.process.stdout.readline()  # "ready" after the warm-up, "" if it died
        assert line.strip() == "ready", f"the plain loop ended before its warm-up (exit {self.process.wait()})"

    def finish(self) -> list[int]:
        """Stop training (SIGTERM, then SIGCONT should it be stopped); the start of each step."""
        self.process.terminate()
        resume(self.pid)
        self.process.wait(timeout=60)
        return json.loads(self.out.read_text())

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()


class MeshtopJob:
    """A real ``meshtop record``-style job of one rank (hooks on, events shipped to the collector), launched on a
    thread of this process; it learns the rank's pid and the start of each step as the events arrive."""

    def __init__(self, session_dir: Path, model: str) -> None:
        self.control = JobControl()
        self.starts_ns: list[int] = []
        self.pid: int | None = None
        self.warm = threading.Event()
        self.launched: LaunchedRun | None = None
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(session_dir, model), name="efficiency-job")
        self._thread.start()

    def _run(self, session_dir: Path, model: str) -> None:
        try:
            self.launched = launch(
                session_dir,
                env=THREADS,
                control=self.control,
                on_events=self._on_events,
                dp=1,
                model=model,
                steps=MAX_STEPS,
                batch_size=BATCH,
            )
        except BaseException as error:  # said by wait_warm / finish, on the measuring thread
            self.error = error
        finally:
            self.warm.set()

    def _on_events(self, events: list[Event]) -> None:
        for event in events:
            if isinstance(event, RankStarted):
                self.pid = event.pid
            elif isinstance(event, StepTiming):
                self.starts_ns.append(event.start_ns)
                if event.step >= WARMUP_STEPS:
                    self.warm.set()

    def wait_warm(self) -> int:
        """The rank's pid, once it ran its warm-up steps."""
        self.warm.wait(START_TIMEOUT_S)
        if self.error is not None:
            raise self.error
        assert self.pid is not None and self.warm.is_set(), f"the meshtop job did not warm up: {self.launched}"
        return self.pid

    def finish(self) -> list[int]:
        """Stop the job; the start of each step it reported."""
        if self.pid is not None:
            resume(self.pid)
        self.control.stop.set()
        self._thread.join()
        if self.error is not None:
            raise self.error
        assert self.launched is not None
        assert self.launched.result.status in ("interrupted", "completed"), self.launched.result
        return self.starts_ns


def take_turns(pids: dict[str, int], pairs: int, window_s: float) -> list[Window]:
    """Run each side alone for ``window_s`` in :func:`turn_order`; the loop starts paused, meshtop running."""
    windows = []
    pause(pids["meshtop"])
    for side in turn_order(pairs):
        waited_before = waited_s(pids[side])
        resume(pids[side])
        started = time.time_ns()
        time.sleep(window_s)
        ended = time.time_ns()
        pause(pids[side])
        windows.append(Window(side, started, ended, waited_s(pids[side]) - waited_before))
    return windows


def pair_ratios(windows: list[Window], starts_ns: dict[str, list[int]]) -> tuple[list[float], list[float], list[float]]:
    """Per pair of neighbouring windows: meshtop's median period, the loop's, and the loop's over meshtop's
    (the ratio of tokens / s). A pair with a window of fewer than :data:`MIN_PERIODS` periods is left out."""
    meshtop_s, loop_s, ratios = [], [], []
    for first, second in zip(windows[::2], windows[1::2], strict=False):
        periods = {w.side: window_periods(starts_ns[w.side], w) for w in (first, second)}
        if min(len(p) for p in periods.values()) < MIN_PERIODS:
            continue
        meshtop_s.append(median(periods["meshtop"]))
        loop_s.append(median(periods["loop"]))
        ratios.append(loop_s[-1] / meshtop_s[-1])
    return meshtop_s, loop_s, ratios


def measure(model: str, pairs: int, window_s: float = WINDOW_S) -> Row:
    """``pairs`` of neighbouring meshtop / loop windows; per pair, the ratio of their median periods."""
    run = single_rank(model, MAX_STEPS, BATCH)
    with tempfile.TemporaryDirectory() as tmp:
        loop = LoopProcess(model, Path(tmp) / "starts.json")
        try:
            job = MeshtopJob(Path(tmp), model)  # both start up side by side
            try:
                loop.wait_warm()
                pause(loop.pid)
                windows = take_turns({"meshtop": job.wait_warm(), "loop": loop.pid}, pairs, window_s)
                resume(job.wait_warm())
                time.sleep(TAIL_S)
            finally:
                meshtop_starts = job.finish()
            loop_starts = loop.finish()
        finally:
            loop.kill()
    starts = {"meshtop": meshtop_starts, "loop": loop_starts}
    meshtop_s, loop_s, ratios = pair_ratios(windows, starts)
    low, high = median_interval(ratios, CONFIDENCE)
    value = median(ratios)
    periods = [len(window_periods(starts[w.side], w)) for w in windows]
    waited = [w.waited_s * 1e9 / (w.end_ns - w.start_ns) for w in windows]  # other jobs held the CPU
    tokens = run.batch_size * run.seq_len
    return Row(
        "efficiency",
        f"train {model} dp1 1 thread, {BATCH}x{run.seq_len} tok",
        value,
        "tok/s ratio",
        Spread(len(ratios), low, high, f"{CONFIDENCE:.0%} CI"),
        TARGET,
        met=bool(TARGET.met(value)) and low > CI_LOW_ABOVE,
        note=f"meshtop {tokens / median(meshtop_s):,.0f} vs loop {tokens / median(loop_s):,.0f} tok/s; "
        f"pairs p25-p75 {quantile(ratios, 0.25):.3f}..{quantile(ratios, 0.75):.3f}; "
        f"{window_s:g} s windows, {median(periods):.0f} periods each, waiting for a CPU "
        f"{median(waited):.0%} of each (p50)",
        details={
            "window_s": window_s,
            "cold_periods": COLD_PERIODS,
            "warmup_steps": WARMUP_STEPS,
            "meshtop_median_step_s": meshtop_s,
            "loop_median_step_s": loop_s,
            "pair_ratios": ratios,
            "periods_per_window": periods,
            "waited_fraction": [round(w, 3) for w in waited],
            "window_sides": [w.side for w in windows],
            "ci_low": low,
            "ci_high": high,
        },
    )


def rows(pairs: int = PAIRS, cases: tuple[str, ...] = CASES) -> list[Row]:
    return [measure(model, pairs) for model in cases]


def main(argv: list[str]) -> None:
    """The loop's process: train until SIGTERM, then write the step starts to ``OUT_JSON``."""
    model_name, batch, out_path = argv
    # Killed with the harness, even while stopped (a stopped process could not watch for it itself).
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    stopping = threading.Event()
    signal.signal(signal.SIGTERM, lambda _signum, _frame: stopping.set())

    def warm() -> None:
        print("ready", flush=True)

    starts = plain_loop(single_rank(model_name, MAX_STEPS, int(batch)), going=lambda: not stopping.is_set(), warm=warm)
    Path(out_path).write_text(json.dumps(starts))


if __name__ == "__main__":
    main(sys.argv[1:])
