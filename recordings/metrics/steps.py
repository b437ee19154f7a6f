"""Steps: per-rank step timings folded into the job's steps, and the step figures.

- A job step (training) is complete once every rank has reported it; its
  time is the slowest rank's, its loss the mean over the ranks that compute
  one (each data-parallel replica has as many such ranks, so this is the mean
  over replicas), its throughput the step's tokens over its time.
- An inference run's job steps are rank 0's engine iterations: iterations of
  different replicas are unrelated (each replica counts its own).
- Step time: p50, p90 and mean of the complete job steps; throughput: the
  p50 of their tokens/s; loss: the first and the last job step's.
- A user's script's loss on a rank is the sum of the losses it differentiated
  in the step, the loss whose gradient its optimizer applies (a pipeline
  schedule's microbatches each weigh 1 / microbatches; :mod:`meshtop.probes.losses`):
  the run says how many a step (the most any rank's step had: gradient
  accumulation's micro steps, a pipeline's microbatches), and of how many ranks
  the loss came (a pipeline's first stages have none).
- A loss that is NaN or infinite is kept: a job step with one reads NaN or
  infinite (the mean takes it in), and the run says from which step.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from meshtop.recordings.metrics.stats import Distribution

Nanoseconds = npt.NDArray[np.int64]
_new_tuple = tuple.__new__
"""A named tuple made from a tuple of its fields: a C call, where calling the class runs its ``__new__``, a
Python function. A thousand ranks' windows a step: 1.4 against 1.8 ms, their reports 0.4 against 0.7 ms
(py-spy had put those calls at 17 % of the head's time holding the interpreter's lock at a million events a
second)."""


class Windows(NamedTuple):
    """One rank's step phases as it measured them (:class:`~meshtop.probes.events.StepTiming`'s). A tuple: a
    thousand ranks' steps make a thousand a step, which a frozen dataclass makes at a third of the speed."""

    phases: str
    start_ns: Sequence[int] | Nanoseconds
    end_ns: Sequence[int] | Nanoseconds
    pipeline_wait_s: float | None


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
    loss_ranks: int = 0
    """How many ranks had a loss (of ``ranks``)."""
    ranks: int = 0
    losses_per_step: int | None = None
    """A script's: the most losses a rank's loss was made of (``None``: the built-in runner's)."""


def job_step(
    step: int,
    *,
    durations_s: Sequence[float],
    losses: Sequence[float | None],
    tokens: int,
    loss_counts: Sequence[int | None] = (),
) -> JobStep:
    """The job's step from its ranks' reports, in the order they came: time = max(durations), loss =
    sum(losses) / count over the ranks that have one (summed in that order), tokens the last report's,
    tokens/s = tokens / time (0 for a step of no time); ``loss_counts``: each report's count of losses its
    loss is made of (a script's), the most of them kept."""
    duration = max(durations_s)
    present = [loss for loss in losses if loss is not None]
    counts = [count for count in loss_counts if count is not None]
    return JobStep(
        step=step,
        loss=sum(present) / len(present) if present else None,
        duration_s=duration,
        tokens=tokens,
        tokens_per_s=tokens / duration if duration > 0 else 0.0,
        loss_ranks=len(present),
        ranks=len(durations_s),
        losses_per_step=max(counts) if counts else None,
    )


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


def step_end_ns(start_ns: int, duration_s: float) -> int:
    """When a rank's step that started at ``start_ns`` and took ``duration_s`` ended: start + duration,
    rounded to the nanosecond."""
    return start_ns + round(duration_s * 1e9)


class StepSpans:
    """Each rank's part of one step: when it started and ended (wall clock), and its forward + backward time;
    a rank's later report replaces its earlier one. Kept as columns: a recording's whole step table makes
    lists of numbers, not an object a row for the garbage collector to walk."""

    __slots__ = ("_at", "end_ns", "forward_backward_s", "ranks", "start_ns", "windows")

    def __init__(self) -> None:
        self.ranks: list[int] = []
        self.start_ns: list[int] = []
        self.end_ns: list[int] = []
        self.forward_backward_s: list[float | None] = []
        self._at: dict[int, int] = {}
        """Each rank's position in the columns."""
        self.windows: dict[int, Windows] = {}
        """The ranks that measured their step's phases: their windows."""

    def add(
        self,
        rank: int,
        start_ns: int,
        duration_s: float,
        forward_backward_s: float | None,
        windows: Windows | None = None,
    ) -> None:
        """One rank's report of the step."""
        if windows is not None:
            self.windows[rank] = windows
        end_ns, at = step_end_ns(start_ns, duration_s), self._at.get(rank)
        if at is None:
            self._at[rank] = len(self.ranks)
            self.ranks.append(rank)
            self.start_ns.append(start_ns)
            self.end_ns.append(end_ns)
            self.forward_backward_s.append(forward_backward_s)
        else:
            self.start_ns[at], self.end_ns[at], self.forward_backward_s[at] = start_ns, end_ns, forward_backward_s

    def extend(
        self,
        ranks: list[int],
        start_ns: list[int],
        durations_s: list[float],
        forward_backward_s: list[float | None],
        windows: list[Windows | None],
    ) -> None:
        """Reports of several ranks, as :meth:`add` of each in order."""
        if len(set(ranks)) < len(ranks) or not self._at.keys().isdisjoint(ranks):
            for report in zip(ranks, start_ns, durations_s, forward_backward_s, windows, strict=True):
                self.add(*report)
            return
        self.windows.update((rank, found) for rank, found in zip(ranks, windows, strict=True) if found is not None)
        self._at.update(zip(ranks, range(len(self.ranks), len(self.ranks) + len(ranks)), strict=False))
        self.ranks += ranks
        self.start_ns += start_ns
        self.end_ns += map(step_end_ns, start_ns, durations_s)
        self.forward_backward_s += forward_backward_s

    def rows(self, ranks: Sequence[int]) -> list[int]:
        """Where the reports of ``ranks`` are in the columns."""
        return [self._at[rank] for rank in ranks]

    def forward_backward_max_s(self) -> float | None:
        """The pipeline's step: the slowest rank's forward + backward (``None`` where no rank measured one)."""
        return max((seconds for seconds in self.forward_backward_s if seconds is not None), default=None)

    def durations_s(self) -> dict[int, float]:
        """Each rank's step time."""
        return {
            rank: (end - start) / 1e9 for rank, start, end in zip(self.ranks, self.start_ns, self.end_ns, strict=True)
        }


STEP_COLUMNS = (
    "rank", "step", "start_ns", "duration_s", "tokens", "loss", "losses", "forward_backward_s",
    "pipeline_wait_s", "phases", "phase_start_ns", "phase_end_ns",
)  # fmt: skip
"""The ``step`` columns the fold reads."""
PHASE_TIMES = ("phase_start_ns", "phase_end_ns")


class PhaseTimes:
    """A ``step`` table's list column of phase times (``phase_start_ns`` or ``phase_end_ns``) as one array and
    where each row's list starts in it: a thousand ranks' steps make 36,000 numbers a step, which as Python
    lists cost 3 ms of the head's fold a step, as an array 0.1 ms."""

    __slots__ = ("at", "values")
    values: Nanoseconds
    at: list[int]
    """Row ``i``'s times are ``values[at[i]:at[i + 1]]`` (none for a null list)."""

    def __init__(self, column: pa.ChunkedArray | None) -> None:
        """``None``: a table read without the column, every row's list empty."""
        if column is None:
            self.values, self.at = np.empty(0, dtype=np.int64), []
            return
        self.values = pc.list_flatten(column).to_numpy().astype(np.int64, copy=False)
        lengths = pc.fill_null(pc.list_value_length(column), 0).to_numpy()
        self.at = [0, *np.cumsum(lengths, dtype=np.int64).tolist()]


@dataclass(frozen=True, slots=True)
class StepRows:
    """The columns of a ``step`` table the fold reads, as Python lists (one conversion a table, no event object
    a row), the phase times as arrays."""

    rank: list[int]
    step: list[int]
    start_ns: list[int]
    duration_s: list[float]
    tokens: list[int]
    loss: list[float | None]
    losses: list[int | None]
    forward_backward_s: list[float | None]
    pipeline_wait_s: list[float | None]
    phases: list[str | None]
    phase_start_ns: PhaseTimes
    phase_end_ns: PhaseTimes
    by_step: dict[int, list[int]]
    """Each step's rows, in the order they came (steps in the order they first came)."""

    @classmethod
    def of(cls, table: pa.Table) -> StepRows:
        """``table``'s rows; read without its phase times (a live fold's, behind), as rows that measured no
        phases."""
        columns = table.select([name for name in STEP_COLUMNS if name not in PHASE_TIMES]).to_pydict()
        by_step: dict[int, list[int]] = {}
        for index, step in enumerate(columns["step"]):
            by_step.setdefault(step, []).append(index)
        read = set(PHASE_TIMES) <= set(table.column_names)
        starts, ends = (PhaseTimes(table.column(name) if read else None) for name in PHASE_TIMES)
        if not read:
            columns["phases"] = [None] * len(table)
        return cls(**columns, phase_start_ns=starts, phase_end_ns=ends, by_step=by_step)

    def reports(self, indexes: Sequence[int]) -> list[Report]:
        """Rows ``indexes`` as what a step still waiting for ranks keeps of each."""
        rank, duration, loss, tokens, losses = self.rank, self.duration_s, self.loss, self.tokens, self.losses
        return [_new_tuple(Report, (rank[i], duration[i], loss[i], tokens[i], losses[i])) for i in indexes]

    def add_spans(self, spans: StepSpans, indexes: list[int]) -> None:
        """The reports of rows ``indexes`` (of one step) into its spans."""
        spans.extend(
            [self.rank[i] for i in indexes],
            [self.start_ns[i] for i in indexes],
            [self.duration_s[i] for i in indexes],
            [self.forward_backward_s[i] for i in indexes],
            self.windows(indexes),
        )

    def windows(self, indexes: list[int]) -> list[Windows | None]:
        """Rows ``indexes``' phase windows, where they measured them (views of the phase times' arrays)."""
        phases, waits = self.phases, self.pipeline_wait_s
        starts, start_at = self.phase_start_ns.values, self.phase_start_ns.at
        ends, end_at = self.phase_end_ns.values, self.phase_end_ns.at
        return [
            None
            if (phase := phases[i]) is None
            else _new_tuple(
                Windows, (phase, starts[start_at[i] : start_at[i + 1]], ends[end_at[i] : end_at[i + 1]], waits[i])
            )
            for i in indexes
        ]


class Report(NamedTuple):
    """What a job step waiting for its other ranks keeps of a rank's report (a whole :class:`StepTiming` of a
    thousand ranks' steps, its phases and all, was 12 % of the head's fold at 500,000 events a second)."""

    rank: int
    duration_s: float
    loss: float | None
    tokens: int
    losses: int | None


class StepFolder:
    """Collects :class:`StepTiming` of ``ranks`` ranks; yields each step when the last of them reports it.

    A job whose ranks started again (:mod:`meshtop.runner.job.rounds`) may have another number of them from the step
    its new start's steps are numbered from: :meth:`started` says so."""

    def __init__(self, ranks: int) -> None:
        self.ranks = ranks
        self.pending: dict[int, dict[int, Report]] = {}
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

    def started(self, world_size: int, first_step: int = 0) -> list[JobStep]:
        """The ranks started, ``world_size`` of them (an elastic job's), their steps numbered from
        ``first_step``: the steps that completes (0 ranks: not said)."""
        if world_size <= 0 or (first_step, world_size) in self._starts:
            return []
        self._starts = sorted(
            {(first, count) for first, count in self._starts if first != first_step} | {(first_step, world_size)}
        )
        return [self._fold(step) for step in sorted(self.pending) if len(self.pending[step]) >= self.expected(step)]

    def _fold(self, step: int) -> JobStep:
        reports = list(self.pending.pop(step).values())
        return job_step(
            step,
            durations_s=[r.duration_s for r in reports],
            losses=[r.loss for r in reports],
            tokens=reports[-1].tokens,
            loss_counts=[r.losses for r in reports],
        )

    def add(self, rows: StepRows) -> list[JobStep]:
        """Take a table's reports, in the order they came: the job steps they complete, each at the report that
        makes its ranks' reports as many as its ranks (a rank's later report of a step replaces its earlier one),
        in that order."""
        completing = []
        for step, indexes in rows.by_step.items():
            earlier, expected = self.pending.get(step, {}), self.expected(step)
            ranks = {rows.rank[i] for i in indexes} | earlier.keys()
            if len(ranks) < len(indexes) + len(earlier) or len(ranks) > expected:  # a rank twice, or too many
                return self._add_each(rows)
            if len(ranks) == expected:
                completing.append((indexes[-1], step))
        done = []
        for _, step in sorted(completing):  # in the order their last reports came
            reported = list(self.pending.pop(step, {}).values())
            indexes = rows.by_step[step]
            done.append(
                job_step(
                    step,
                    durations_s=[*(r.duration_s for r in reported), *(rows.duration_s[i] for i in indexes)],
                    losses=[*(r.loss for r in reported), *(rows.loss[i] for i in indexes)],
                    tokens=rows.tokens[indexes[-1]],
                    loss_counts=[*(r.losses for r in reported), *(rows.losses[i] for i in indexes)],
                )
            )
        completed = {job.step for job in done}
        for step, indexes in rows.by_step.items():  # still waiting for ranks
            if step not in completed:
                reports = self.pending.setdefault(step, {})
                for report in rows.reports(indexes):
                    reports[report.rank] = report
        return done

    def _add_each(self, rows: StepRows) -> list[JobStep]:
        """:meth:`add` a report at a time: where a rank reports a step twice, or a step gets more reports than
        its ranks (all at once, a step would not complete at its last report)."""
        done = []
        for index, report in enumerate(rows.reports(range(len(rows.rank)))):
            step = rows.step[index]
            reports = self.pending.setdefault(step, {})
            reports[report.rank] = report
            if len(reports) >= self.expected(step):
                done.append(self._fold(step))
        return done


@dataclass(frozen=True, slots=True, kw_only=True)
class StepFigures:
    count: int
    time_s: dict[str, float | None]
    """p50, p90 and mean of the job's step (inference: rank 0's iteration) time."""
    tokens_per_s: float | None
    """p50 of the steps' tokens/s (inference: the requests' output tokens/s)."""
    first_loss: float | None
    last_loss: float | None
    """NaN or infinite where that step's loss was (a run that diverged)."""
    losses_per_step: int | None = None
    """A script's: how many losses a rank's step loss is made of (the most seen)."""
    loss_ranks: int | None = None
    """How many of ``ranks`` had a loss (the most in any step), where any had one."""
    ranks: int | None = None
    not_finite_from: int | None = None
    """The first job step whose loss was NaN or infinite, where one was."""

    def to_json(self) -> dict[str, object]:
        """JSON's values: a loss that is not a number is ``null`` there, and ``not_finite_from`` says from which
        step."""
        return {
            "count": self.count,
            "time_s": self.time_s,
            "tokens_per_s": {"p50": self.tokens_per_s},
            "loss": {
                "first": _finite_or_none(self.first_loss),
                "last": _finite_or_none(self.last_loss),
                "not_finite_from": self.not_finite_from,
                "per_step": self.losses_per_step,
                "ranks": self.loss_ranks,
                "of_ranks": self.ranks,
            },
        }


def _finite_or_none(value: float | None) -> float | None:
    return value if value is not None and math.isfinite(value) else None


class StepStats:
    """The job steps' figures, folded as steps complete (in any order)."""

    def __init__(self) -> None:
        self.durations_s = Distribution()
        self.tokens_per_s = Distribution()
        self.count = 0
        self._first: tuple[int, float] | None = None
        self._last: tuple[int, float] | None = None
        self._losses_per_step: int | None = None
        self._loss_ranks: tuple[int, int] | None = None
        """(ranks with a loss, ranks) of the step with the most ranks with one."""
        self._not_finite_from: int | None = None

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
            if self._loss_ranks is None or step.loss_ranks > self._loss_ranks[0]:
                self._loss_ranks = (step.loss_ranks, step.ranks)
            if not math.isfinite(step.loss) and (self._not_finite_from is None or step.step < self._not_finite_from):
                self._not_finite_from = step.step
        if step.losses_per_step is not None:
            self._losses_per_step = max(self._losses_per_step or 0, step.losses_per_step)

    def figures(self, *, tokens_per_s: float | None = None) -> StepFigures:
        """The figures; ``tokens_per_s`` stands in for the steps' own rate where given (inference)."""
        return StepFigures(
            count=self.count,
            time_s={**self.durations_s.quantiles("p50", "p90"), "mean": self.durations_s.mean()},
            tokens_per_s=tokens_per_s if tokens_per_s is not None else self.tokens_per_s.quantile(0.5),
            first_loss=self._first[1] if self._first else None,
            last_loss=self._last[1] if self._last else None,
            losses_per_step=self._losses_per_step,
            loss_ranks=self._loss_ranks[0] if self._loss_ranks else None,
            ranks=self._loss_ranks[1] if self._loss_ranks else None,
            not_finite_from=self._not_finite_from,
        )
