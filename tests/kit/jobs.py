"""Launch a real multi-rank job on CPU and collect what it reported (shared by tests and benchmarks)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import pytest

from meshtop.probes import native
from meshtop.probes.events import Event, RankStarted, StepTiming
from meshtop.recordings.metrics.run import RunFold
from meshtop.recordings.metrics.steps import JobStep, StepFolder
from meshtop.runner.job.control import JobControl
from meshtop.runner.job.environment import builtin_launch
from meshtop.runner.job.launch import run_job
from meshtop.runner.plan import ResolvedRun, RunSpec, resolve
from meshtop.runner.results import JobResult
from meshtop.runner.session.session import describe
from meshtop.tui.options import gpus_visible
from tests.kit.events import fold_events, reported

RTOL = 2e-5
"""How close a parallel plan's per-step losses are to one process's: float32 reductions in another order
differ by ~1e-7 relative here; a wrong gradient average (seen while building DDP + PP) moves step 2 by
~5e-4."""


@dataclass
class LaunchedRun:
    run: ResolvedRun
    result: JobResult
    events: list[Event]

    @property
    def steps(self) -> list[JobStep]:
        folder = StepFolder(self.run.plan.world_size)
        done = reported(folder, *(e for e in self.events if isinstance(e, StepTiming)))
        return sorted(done, key=lambda s: s.step)

    @property
    def losses(self) -> list[float]:
        return [s.loss for s in self.steps if s.loss is not None]

    @property
    def started(self) -> list[RankStarted]:
        return sorted((e for e in self.events if isinstance(e, RankStarted)), key=lambda e: e.rank)

    def of_kind(self, kind: str) -> list[Event]:
        return [e for e in self.events if e.kind == kind]

    def breakdown(self) -> dict[str, Any] | None:
        """Where its steps went, as ``summary --json`` says it (its events folded by the metrics core)."""
        fold = RunFold(describe(self.run))
        fold_events(fold, self.events)
        fold.finish(self.result.status)
        figures = fold.figures().breakdown
        return figures.to_json() if figures is not None else None


@contextmanager
def environment(**variables: str) -> Iterator[None]:
    saved = {name: os.environ.get(name) for name in variables}
    os.environ.update(variables)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def launch(
    session_dir: Path,
    env: dict[str, str] | None = None,
    device: str = "cpu",
    control: JobControl | None = None,
    on_events: Callable[[list[Event]], None] | None = None,
    **spec: object,
) -> LaunchedRun:
    """Resolve ``spec`` for ``device`` (CPU by default) and run it to the end under torchrun (``control``: the
    requests a dashboard would make while it runs, ``on_events``: told of each delivery as it comes)."""
    gpus = gpus_visible() if device != "cpu" else 0
    run = resolve(RunSpec(device=device, **spec), gpus_visible=gpus)  # type: ignore[arg-type]
    events: list[Event] = []

    def deliver(delivered: list[Event]) -> None:
        events.extend(delivered)
        if on_events is not None:
            on_events(delivered)

    with environment(**(env or {})):
        result = run_job(
            builtin_launch(run, session_dir / "session"),
            session_dir=session_dir / "session",
            on_events=lambda arrivals: deliver(arrivals.events()),
            control=control,
        )
    return LaunchedRun(run=run, result=result, events=events)


def alive(pids: list[int]) -> list[int]:
    """The pids among ``pids`` that still run (zombies count as gone)."""
    running = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                running.append(pid)
        except psutil.NoSuchProcess:
            pass
    return running


def assert_parts_add_up(breakdown: dict[str, Any] | None, ranks: int, *, pipelined: bool = False) -> None:
    """Every rank measured its step's phases, and its parts (``summary --json``'s ``breakdown``) add up to its
    step within 1 %; a pipelined run's ranks idle in their bubble."""
    assert breakdown is not None
    assert sorted(breakdown["per_rank"], key=int) == [str(rank) for rank in range(ranks)], breakdown["per_rank"]
    for rank, parts in breakdown["per_rank"].items():
        assert sum(row["share"] for row in parts.values()) == pytest.approx(1.0, abs=0.01), (rank, parts)
        assert parts["forward"]["share"] > 0 and parts["backward"]["share"] > 0, (rank, parts)
        assert (parts["bubble"]["share"] > 0) == pipelined, (rank, parts)


def two_rank_reports(module: str, out: Path, native_env: str) -> list[dict[str, Any]]:
    """Run ``python -m module OUT`` as two gloo ranks under torchrun, with the collective kernel ``native_env``
    names (:data:`meshtop.probes.native.NATIVE_ENV`), and read each rank's ``OUT/rank-R.json``."""
    done = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", "-m", module, str(out)],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "OMP_NUM_THREADS": "1", native.NATIVE_ENV: native_env},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return [json.loads((out / f"rank-{rank}.json").read_text()) for rank in range(2)]
