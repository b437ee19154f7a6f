"""Pipeline stages: busy, idle and the bubble, for training and for inference.

**Training**, per job step: a rank is busy for the sum of its stage actions
in the step (forward, backward, backward-weight of each microbatch); a stage
is busy for the mean over its copies (its dp and tp ranks); the step's span is
the slowest rank's forward + backward time (the schedule's step: the
optimizer is no pipeline work), or the busiest stage's time if that is
longer. A stage is idle for span - busy; its bubble in the step is idle / span.
Over the run, a stage's **bubble fraction** is sum(idle) / sum(span) over the
closed steps, and busy / idle are the means per step. For balanced stages,
GPipe and 1F1B give (p - 1) / (m + p - 1). The run's **mean bubble** is the
mean of its stages' fractions (:func:`mean_bubble`).

**Inference**, per engine iteration of each rank of a stage that measured its
pipeline wait: idle is the wait, busy the iteration less the wait. A stage's
bubble fraction is sum(wait) / sum(iteration time) over those iterations.

A stage action says which stage it ran (``stage``), so a rank's pipeline rank
is ``stage mod pp`` (an interleaved rank holds stages r, r + pp, ...), known
even when the rank's start event was not.
"""

from __future__ import annotations

import math
from collections import defaultdict, deque
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from meshtop.recordings.metrics.stats import Distribution, factorize
from meshtop.recordings.metrics.steps import ClosedSteps

HISTORY = 240
"""Per-step bubbles kept per stage for the dashboard's sparklines."""


def theoretical_bubble(p: int, m: int, virtual_stages: int = 1) -> float:
    """(p - 1) / (v m + p - 1): the idle share of a balanced GPipe / 1F1B (v = 1) or interleaved step."""
    return (p - 1) / (virtual_stages * m + p - 1)


def step_bubbles(busy_by_stage: dict[int, float], forward_backward_s: float | None) -> tuple[float, dict[int, float]]:
    """One step's span and each stage's bubble (idle / span), from each stage's busy seconds."""
    span = max(forward_backward_s or 0.0, max(busy_by_stage.values(), default=0.0))
    if span <= 0:
        return span, {}
    return span, {stage: (span - busy) / span for stage, busy in sorted(busy_by_stage.items())}


@dataclass(frozen=True, slots=True, kw_only=True)
class StageRow:
    stage: int
    busy_s: float
    """Mean per step (iteration)."""
    idle_s: float
    bubble_fraction: float


def mean_bubble(rows: Sequence[StageRow]) -> float | None:
    """A run's bubble in one figure: the mean over its stages of their bubble fractions (what the planner's
    (p - 1) / (v m + p - 1) is checked against); ``None`` without stages."""
    return sum(row.bubble_fraction for row in rows) / len(rows) if rows else None


@dataclass(slots=True)
class StageStats:
    """One stage over the run: its per-step (per-iteration) busy and idle time and bubble."""

    busy_s: Distribution = field(default_factory=Distribution)
    idle_s: Distribution = field(default_factory=Distribution)
    span_s: Distribution = field(default_factory=Distribution)
    bubble: Distribution = field(default_factory=Distribution)
    """Per step: idle / span (per iteration: wait / iteration), the values ``compare`` tests."""
    recent: deque[float] = field(default_factory=lambda: deque(maxlen=HISTORY))

    def row(self, stage: int) -> StageRow:
        span = self.span_s.total()
        return StageRow(
            stage=stage,
            busy_s=self.busy_s.mean() or 0.0,
            idle_s=self.idle_s.mean() or 0.0,
            bubble_fraction=self.idle_s.total() / span if span > 0 else 0.0,
        )


class StageFold:
    """Folds stage actions (training) or iterations' pipeline waits (inference) into :class:`StageStats`."""

    def __init__(self, *, pp: int | None) -> None:
        self.pp = max(1, pp) if pp is not None else None
        """A stage's pipeline rank is its index modulo this; ``None``: the index itself."""
        self.stages: dict[int, StageStats] = defaultdict(StageStats)
        self._busy: dict[int, dict[int, tuple[int, int]]] = {}
        """Open steps: rank -> (busy nanoseconds, pipeline rank)."""
        self._closed = ClosedSteps()

    def add_actions(self, table: pa.Table) -> None:
        """Fold a ``stage_action`` table (training)."""
        in_step = pc.is_valid(table.column("step"))
        if not len(table) or not pc.any(in_step).as_py():
            return
        table = table.filter(in_step)
        step = table.column("step").to_numpy()
        rank = table.column("rank").to_numpy()
        # Busy time is summed in whole nanoseconds, so it is the same however the actions were batched.
        busy_ns = (table.column("end_ns").to_numpy() - table.column("start_ns").to_numpy()).astype(float)
        stage = table.column("stage").to_numpy()
        pipeline_rank = stage % self.pp if self.pp is not None else stage
        ranks = int(rank.max()) + 1
        inverse, pairs = factorize(step * ranks + rank)  # pairs in the order they first come
        first = np.flatnonzero(np.r_[True, inverse[1:] > np.maximum.accumulate(inverse)[:-1]])
        sums = np.bincount(inverse, weights=busy_ns, minlength=len(pairs))
        for pair, busy, first_stage in zip(pairs.tolist(), sums.tolist(), pipeline_rank[first].tolist(), strict=True):
            s, r = divmod(pair, ranks)
            if s in self._closed:
                continue
            step_busy = self._busy.setdefault(s, {})
            before, kept_stage = step_busy.get(r, (0, first_stage))  # a rank's stage: its first action's
            step_busy[r] = (before + int(busy), kept_stage)

    def busy_by_stage(self, step: int) -> dict[int, float]:
        """Each stage's busy seconds in ``step`` so far (mean over its copies)."""
        per_stage: dict[int, list[float]] = defaultdict(list)
        for busy_ns, stage in self._busy.get(step, {}).values():
            per_stage[stage].append(busy_ns / 1e9)
        return {stage: math.fsum(values) / len(values) for stage, values in per_stage.items()}

    def close(self, step: int, forward_backward_s: float | None) -> tuple[float, dict[int, float]]:
        """Decide the bubbles of job step ``step`` (training); its span and each stage's bubble."""
        self._closed.add(step)
        busy = self.busy_by_stage(step)
        self._busy.pop(step, None)
        span, bubbles = step_bubbles(busy, forward_backward_s)
        for stage, bubble in bubbles.items():
            stats = self.stages[stage]
            stats.busy_s.add(busy[stage])
            stats.idle_s.add(span - busy[stage])
            stats.span_s.add(span)
            stats.bubble.add(bubble)
            stats.recent.append(bubble)
        return span, bubbles

    def drop(self, step: int) -> None:
        """Forget an open step that will never complete (the job ended first)."""
        self._busy.pop(step, None)

    def open_steps(self) -> list[int]:
        return sorted(self._busy)

    def add_iteration(self, stage: int, duration_s: float, wait_s: float, *, shown: bool) -> None:
        """One inference iteration of a rank of ``stage``; ``shown``: its fraction goes on the sparkline
        (the dashboard draws one replica's first rank per stage)."""
        stats = self.stages[stage]
        stats.busy_s.add(duration_s - wait_s)
        stats.idle_s.add(wait_s)
        stats.span_s.add(duration_s)
        if duration_s > 0:
            stats.bubble.add(wait_s / duration_s)
            if shown:
                stats.recent.append(wait_s / duration_s)

    def rows(self) -> list[StageRow]:
        return [self.stages[stage].row(stage) for stage in sorted(self.stages)]
