"""Steps: per-rank step timings folded into the job's steps, and the step figures.

- A job step (training) is complete once every rank has reported it; its
  time is the slowest rank's, its loss the mean over the ranks that compute
  one (each data-parallel replica has as many such ranks, so this is the mean
  over replicas), its throughput the step's tokens over its time.
- An inference run's job steps are rank 0's engine iterations: iterations of
  different replicas are unrelated (each replica counts its own).
- Step time: p50, p90 and mean of the complete job steps; throughput: the
  p50 of their tokens/s; loss: the first and the last job step's.
"""

from __future__ import annotations

from dataclasses import dataclass

from probes.events import StepTiming
from recordings.metrics.stats import Distribution


@dataclass(frozen=True, slots=True, kw_only=True)
class JobStep:
    """One step of the whole job, once every rank has reported it."""

    step: int
    loss: float | None
    """Mean over the ranks that compute a loss (each data-parallel replica weighs the same)."""
    duration_s: float
    """The slowest rank's step time: the job's step time."""
    tokens: int
    tokens_per_s: float


class ClosedSteps:
    """The steps whose per-step figures are decided, so an operation arriving after its step closed is not
    folded into it: the latest :data:`KEPT` by number, and everything older than those taken as closed
    too (a run of any length keeps a bounded set)."""

    KEPT = 4096

    def __init__(self) -> None:
        self._numbers: set[int] = set()
        self._below = -1
        """Every step below this is closed."""

    def add(self, step: int) -> None:
        self._numbers.add(step)
        if len(self._numbers) > 2 * self.KEPT:
            self._below = sorted(self._numbers)[-self.KEPT]
            self._numbers = {n for n in self._numbers if n >= self._below}

    def __contains__(self, step: object) -> bool:
        return isinstance(step, int) and (step < self._below or step in self._numbers)


@dataclass(frozen=True, slots=True)
class RankSpan:
    """One rank's part of a step: when it started and ended (wall clock), and its forward + backward time."""

    start_ns: int
    end_ns: int
    forward_backward_s: float | None


class StepFolder:
    """Collects :class:`StepTiming` of ``ranks`` ranks; yields each step when the last of them reports it.

    A job whose ranks started again (:mod:`runner.rounds`) may have another number of them from the step
    its new start's steps are numbered from: :meth:`started` says so."""

    def __init__(self, ranks: int) -> None:
        self.ranks = ranks
        self.pending: dict[int, dict[int, StepTiming]] = {}
        self._starts: list[tuple[int, int]] = []
        """(first step, ranks) of each start, by first step."""

    def expected(self, step: int) -> int:
        """The ranks that report ``step``: those of the latest start at or before it."""
        ranks = self.ranks
        for first, count in self._starts:
            if first > step:
                break
            ranks = count
        return ranks

    def add(self, timing: StepTiming) -> JobStep | None:
        """Take one rank's timing; the job's step if this was the last rank missing."""
        reports = self.pending.setdefault(timing.step, {})
        reports[timing.rank] = timing
        if len(reports) < self.expected(timing.step):
            return None
        return self._fold(timing.step)

    def started(self, world_size: int, first_step: int = 0) -> list[JobStep]:
        """The ranks started, ``world_size`` of them (an elastic job's), their steps numbered from
        ``first_step``: the steps that completes (0 ranks: not said)."""
        if world_size <= 0 or (first_step, world_size) in self._starts:
            return []
        self._starts = sorted({(first, count) for first, count in self._starts if first != first_step}
                              | {(first_step, world_size)})
        return [self._fold(step) for step in sorted(self.pending)
                if len(self.pending[step]) >= self.expected(step)]

    def _fold(self, step: int) -> JobStep:
        reports = self.pending.pop(step)
        losses = [r.loss for r in reports.values() if r.loss is not None]
        duration = max(r.duration_s for r in reports.values())
        tokens = next(reversed(reports.values())).tokens  # the last report's, as it came
        return JobStep(step=step, loss=sum(losses) / len(losses) if losses else None, duration_s=duration,
                       tokens=tokens, tokens_per_s=tokens / duration if duration > 0 else 0.0)


@dataclass(frozen=True, slots=True, kw_only=True)
class StepFigures:
    count: int
    time_s: dict[str, float | None]
    """p50, p90 and mean of the job's step (inference: rank 0's iteration) time."""
    tokens_per_s: float | None
    """p50 of the steps' tokens/s (inference: the requests' output tokens/s)."""
    first_loss: float | None
    last_loss: float | None

    def to_json(self) -> dict[str, object]:
        return {"count": self.count, "time_s": self.time_s, "tokens_per_s": {"p50": self.tokens_per_s},
                "loss": {"first": self.first_loss, "last": self.last_loss}}


class StepStats:
    """The job steps' figures, folded as steps complete (in any order)."""

    def __init__(self) -> None:
        self.durations_s = Distribution()
        self.tokens_per_s = Distribution()
        self.count = 0
        self._first: tuple[int, float] | None = None
        self._last: tuple[int, float] | None = None

    def add(self, step: JobStep) -> None:
        self.count += 1
        self.durations_s.add(step.duration_s)
        if step.duration_s > 0 and step.tokens > 0:  # 0 tokens: not known (a script without --tokens-per-step)
            self.tokens_per_s.add(step.tokens_per_s)
        if step.loss is not None:
            if self._first is None or step.step < self._first[0]:
                self._first = (step.step, step.loss)
            if self._last is None or step.step > self._last[0]:
                self._last = (step.step, step.loss)

    def figures(self, *, tokens_per_s: float | None = None) -> StepFigures:
        """The figures; ``tokens_per_s`` stands in for the steps' own rate where given (inference)."""
        return StepFigures(
            count=self.count, time_s={**self.durations_s.quantiles("p50", "p90"), "mean": self.durations_s.mean()},
            tokens_per_s=tokens_per_s if tokens_per_s is not None else self.tokens_per_s.quantile(0.5),
            first_loss=self._first[1] if self._first else None, last_loss=self._last[1] if self._last else None)
