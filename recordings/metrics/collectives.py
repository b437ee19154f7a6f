"""Collective figures per (process group, op), folded a table at a time.

Of the operations issued inside a step (set-up and tear-down traffic, step
``None``, is left out):

- **count** and **bytes** (S of nccl-tests, summed);
- **in-flight time**: issue to completion (``end_ns - start_ns``); its total,
  p50 and p99. An asynchronous operation is in flight while the rank does
  other work, so in-flight times of one step can add up to more than the step;
- **busbw**: p50 of :func:`~meshtop.recordings.metrics.bandwidth.busbw_gbps` over the
  operations that ran alone on their group (``overlapped`` not true): one
  queued behind another would count its wait as transfer;
- **exposed time**: what the rank's thread waited. Per rank, step and (group,
  op): the sum of ``waited_ns`` where the probe saw a wait on any of them
  (those it saw none on completed before anyone waited: 0); where it saw no
  wait at all (DDP's reducer and functional collectives wait in C++), the
  time at least one of them was in flight, an upper bound. Either is clipped
  to the rank's step. The job's exposed time in a step is the most any rank
  had (the slowest rank makes the step). Per (group, op): the mean per step,
  and the **share** of step time, sum over steps over the sum of the job's
  step times; ``measured`` says whether no bound was needed.

Over the rows: the **communication share** of a run (the rows' shares
summed, at most 1: :func:`communication_share`), the **typical busbw** (the
median of the rows' busbw p50: :func:`typical_busbw_gbps`, what the planner
predicts with), and the **traffic** of one step per (rank, group, op): its bytes and its count of
operations (:func:`step_traffic`: what the planner's predicted bytes and counts are checked on).

Exposed time is decided when a step closes (two job steps after it completes,
or at the end), so operations that arrive a little after their step still
count; an operation of an already closed step counts in the totals only.
Steps closing together are decided in one pass (a whole recording's, for
``summary``); each step's figure is the same as if it closed alone.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from itertools import chain, pairwise

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from meshtop.recordings.metrics.bandwidth import bus_factor, busbw_column
from meshtop.recordings.metrics.stats import Distribution, factorize, quantile
from meshtop.recordings.metrics.steps import ClosedSteps, StepSpans

_NO_SPAN = (np.iinfo(np.int64).min, np.iinfo(np.int64).max)
"""The span of a rank whose step time is not known: its operations are not clipped."""
CELLS_AT_ONCE = 1 << 20
"""Cells (step, op, rank) decided in one pass at most: bounds the memory of closing a long run at once."""


@dataclass(slots=True)
class OpStats:
    """One (group, op) over the run."""

    group: str
    op: str
    count: int = 0
    bytes: int = 0
    in_flight_ns: int = 0
    """Their in-flight times added up (whole nanoseconds: exact, whatever the order)."""
    in_flight_s: Distribution = field(default_factory=Distribution)
    busbw_gbps: Distribution = field(default_factory=Distribution)
    """Of the operations that ran alone."""
    exposed_s: Distribution = field(default_factory=Distribution)
    """Per closed step: the job's exposed time in this op."""
    bounded_steps: int = 0
    """Closed steps where some rank's exposed time is the in-flight bound (no wait seen)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class CollectiveRow:
    """One (group, op)'s figures."""

    group: str
    op: str
    count: int
    bytes: int
    in_flight_total_s: float
    in_flight_p50_s: float | None
    in_flight_p99_s: float | None
    busbw_p50_gbps: float | None
    busbw_ops: int
    """Operations busbw is taken over (those that ran alone)."""
    exposed_per_step_s: float | None
    """Mean over the closed steps it appears in (``None`` before one closes, or for inference)."""
    exposed_share: float | None
    """Of the job's step time, over the closed steps."""
    exposed_measured: bool | None
    """True: waits seen in every step; False: some steps' figure is the in-flight bound."""

    def to_json(self) -> dict[str, object]:
        return {
            "group": self.group,
            "op": self.op,
            "count": self.count,
            "bytes": self.bytes,
            "in_flight_s": {"total": self.in_flight_total_s, "p50": self.in_flight_p50_s, "p99": self.in_flight_p99_s},
            "busbw_gbps": {"p50": self.busbw_p50_gbps, "ops": self.busbw_ops},
            "exposed_s": {
                "per_step": self.exposed_per_step_s,
                "share": self.exposed_share,
                "measured": self.exposed_measured,
            },
        }


@dataclass(frozen=True, slots=True)
class Waits:
    """A closed step's exposed intervals (:func:`exposed_intervals`), as columns: each operation's rank, the
    [start, end) wall ns it was exposed, and whether it was a pipeline send or receive."""

    rank: npt.NDArray[np.int64]
    start_ns: npt.NDArray[np.int64]
    end_ns: npt.NDArray[np.int64]
    pipeline: npt.NDArray[np.bool_]

    @classmethod
    def none(cls) -> Waits:
        nothing = np.zeros(0, dtype=np.int64)
        return cls(nothing, nothing, nothing, np.zeros(0, dtype=bool))


Exposure = tuple[dict[tuple[str, str], float], dict[int, float], Waits]
"""A closed step's exposed seconds per (group, op) (the job's: the most any rank had) and per rank (all ops),
and each rank's exposed intervals (:func:`exposed_intervals`: the step breakdown's)."""
PIPELINE_OPS = frozenset({"send", "recv"})
"""A pipelined rank's waits in these are its bubble, not its communication (:mod:`.breakdown`)."""
Closing = tuple[int, float, StepSpans]
"""A job step to close: its number, its time, and each rank's span."""


@dataclass(slots=True)
class _Chunk:
    rank: np.ndarray
    key: np.ndarray
    start_ns: np.ndarray
    end_ns: np.ndarray
    waited_ns: np.ndarray
    waited: np.ndarray
    """Whether ``waited_ns`` is known."""


class CollectiveFold:
    """Folds ``collective`` tables; with ``per_step`` (training), also each step's exposed time."""

    def __init__(self, *, per_step: bool) -> None:
        self.per_step = per_step
        self.stats: list[OpStats] = []
        self._keys: dict[tuple[str, str], int] = {}
        self._open: dict[int, list[_Chunk]] = {}
        self._closed = ClosedSteps()
        self.step_time_s = Distribution()
        """The job's time of each closed step: the share's denominator."""

    def _key(self, group: str, op: str) -> int:
        index = self._keys.get((group, op))
        if index is None:
            index = self._keys[(group, op)] = len(self.stats)
            self.stats.append(OpStats(group=group, op=op))
        return index

    def add(self, table: pa.Table) -> None:
        """Fold a ``collective`` table (any number of rows, any order)."""
        if not len(table):
            return
        in_step = pc.is_valid(table.column("step"))
        if not pc.all(in_step).as_py():
            table = table.filter(in_step)
            if not len(table):
                return
        key = self._keys_of(table)
        start = table.column("start_ns").to_numpy()
        end = table.column("end_ns").to_numpy()
        nbytes = table.column("bytes").to_numpy()
        seconds = (end - start) / 1e9
        alone = ~pc.fill_null(table.column("overlapped"), False).to_numpy(zero_copy_only=False)
        busbw = busbw_column(nbytes, seconds, self._factors(key, table.column("group_size").to_numpy()))
        usable = alone & (nbytes > 0) & np.isfinite(busbw)
        for index, rows in _groups(key):
            stats = self.stats[index]
            stats.count += len(rows)
            stats.bytes += int(nbytes[rows].sum())
            stats.in_flight_ns += int((end[rows] - start[rows]).sum())
            stats.in_flight_s.extend(seconds[rows])
            stats.busbw_gbps.extend(busbw[rows][usable[rows]])
        if self.per_step:
            self._keep_for_steps(table, key, start, end)

    def _keys_of(self, table: pa.Table) -> np.ndarray:
        """Each row's (group, op) index (a pair not seen before gets the next one, in the order they come)."""
        groups = pc.dictionary_encode(table.column("group")).combine_chunks()
        ops = pc.dictionary_encode(table.column("op")).combine_chunks()
        width = len(ops.dictionary)
        rows, pairs = factorize(
            groups.indices.to_numpy(zero_copy_only=False).astype(np.int64) * width
            + ops.indices.to_numpy(zero_copy_only=False)
        )
        group_names, op_names = groups.dictionary.to_pylist(), ops.dictionary.to_pylist()
        mapping = [self._key(group_names[pair // width], op_names[pair % width]) for pair in pairs.tolist()]
        return np.array(mapping, dtype=np.int64)[rows]

    def _factors(self, key: np.ndarray, sizes: np.ndarray) -> np.ndarray:
        """Each operation's bus factor (NaN where bandwidth means nothing), by its op and group size."""
        width = int(sizes.max()) + 1
        rows, pairs = factorize(key * width + sizes)
        factors = []
        for value in pairs.tolist():
            index, size = divmod(value, width)
            factor = bus_factor(self.stats[index].op, size)
            factors.append(np.nan if factor is None else factor)
        return np.array(factors, dtype=float)[rows]

    def _keep_for_steps(self, table: pa.Table, key: np.ndarray, start: np.ndarray, end: np.ndarray) -> None:
        steps = table.column("step").to_numpy()
        rank = table.column("rank").to_numpy()
        waited_column = table.column("waited_ns")
        waited = pc.is_valid(waited_column).to_numpy(zero_copy_only=False)
        waited_ns = pc.fill_null(waited_column, 0).to_numpy()
        order, runs = _sorted_runs(steps)
        columns = [column[order] for column in (rank, key, start, end, waited_ns, waited)]
        for step, rows in runs:
            if step in self._closed:
                continue  # late: counted above, but its step's exposed time is decided
            self._open.setdefault(step, []).append(_Chunk(*(column[rows] for column in columns)))

    def close(self, step: int, duration_s: float, spans: StepSpans) -> Exposure:
        """Decide the exposed time of job step ``step`` (``duration_s`` long; each rank's span)."""
        return self.close_steps([(step, duration_s, spans)])[0]

    def close_steps(self, closing: list[Closing]) -> list[Exposure]:
        """Decide the exposed time of job steps at once, in order: each one's exposure."""
        chunks = []
        for step, duration_s, _ in closing:
            self._closed.add(step)
            self.step_time_s.add(duration_s)
            chunks.append(self._open.pop(step, []))
        with_ops = [index for index, found in enumerate(chunks) if found]
        exposures: list[Exposure] = [({}, {}, Waits.none()) for _ in closing]
        if not with_ops:
            return exposures
        ranks = max(int(chunk.rank.max()) for index in with_ops for chunk in chunks[index]) + 1
        at_once = max(1, CELLS_AT_ONCE // (len(self.stats) * ranks))
        for first in range(0, len(with_ops), at_once):
            batch = with_ops[first : first + at_once]
            decided = self._exposed([chunks[i] for i in batch], [closing[i][2] for i in batch], ranks)
            for index, exposure in zip(batch, decided, strict=True):
                exposures[index] = exposure
        return exposures

    def drop(self, step: int) -> None:
        """Forget an open step that will never complete (the job ended first)."""
        self._open.pop(step, None)

    def open_steps(self) -> list[int]:
        return sorted(self._open)

    def _exposed(self, chunks: list[list[_Chunk]], spans: list[StepSpans], ranks: int) -> list[Exposure]:
        """Each step's exposure (``chunks``: its operations, of ranks below ``ranks``; ``spans``: its ranks'
        spans). A cell is one (step, op, rank): a rank's operations of one (group, op) in one step."""
        rows = [chunk for step in chunks for chunk in step]
        step = np.repeat(np.arange(len(chunks)), [sum(len(c.rank) for c in step) for step in chunks])
        rank = np.concatenate([c.rank for c in rows])
        key = np.concatenate([c.key for c in rows])
        waited_ns = np.concatenate([c.waited_ns for c in rows]).astype(float)
        waited = np.concatenate([c.waited for c in rows])
        steps, ops = len(chunks), len(self.stats)
        # Each rank's step: clip the intervals to it, and the waits to its length.
        span_start, span_end = _span_grid(spans, ranks)
        at = step * ranks + rank
        start = np.maximum(np.concatenate([c.start_ns for c in rows]), span_start.ravel()[at])
        end = np.maximum(np.minimum(np.concatenate([c.end_ns for c in rows]), span_end.ravel()[at]), start)
        cell = (step * ops + key) * ranks + rank
        cells = steps * ops * ranks
        waited_sum = np.bincount(cell, weights=np.where(waited, waited_ns, 0.0), minlength=cells)
        seen: npt.NDArray[np.bool_] = np.bincount(cell, weights=waited.astype(float), minlength=cells) > 0
        present: npt.NDArray[np.bool_] = np.bincount(cell, minlength=cells) > 0
        union = _union_lengths(cell, start, end, cells)
        pipeline = np.array([stats.op in PIPELINE_OPS for stats in self.stats])[key]
        phased = np.zeros(steps * ranks, dtype=bool)  # the breakdown's ranks: only theirs are asked for
        for index, step_spans in enumerate(spans):
            phased[[index * ranks + r for r in step_spans.windows if r < ranks]] = True
        wanted = phased[at]
        waits = exposed_intervals(
            step[wanted], rank[wanted], start[wanted], end[wanted], waited_ns[wanted], waited[wanted],
            seen[cell][wanted], pipeline[wanted], steps,
        )  # fmt: skip
        step_ns = np.where(span_end < _NO_SPAN[1], span_end - span_start, np.inf).astype(float)
        limit = np.broadcast_to(step_ns[:, None, :], (steps, ops, ranks)).ravel()
        exposed_ns = np.where(seen, np.minimum(waited_sum, limit), union).reshape(steps, ops, ranks)
        present, seen = present.reshape(steps, ops, ranks), seen.reshape(steps, ops, ranks)
        most = exposed_ns.max(axis=2, where=present, initial=-np.inf).tolist()
        # np.asarray: numpy's stubs type a reduction along an axis as maybe a scalar
        has_op = np.asarray(present.any(axis=2)).tolist()
        bounded = np.asarray((present & ~seen).any(axis=2)).tolist()
        per_rank = exposed_ns.sum(axis=1, where=present).tolist()
        has_rank = np.asarray(present.any(axis=1))
        exposures = []
        for index in range(steps):
            by_op = {}
            for op, stats in enumerate(self.stats):
                if not has_op[index][op]:
                    continue
                value = most[index][op] / 1e9
                stats.exposed_s.add(value)
                if bounded[index][op]:
                    stats.bounded_steps += 1
                by_op[(stats.group, stats.op)] = value
            by_rank = {r: per_rank[index][r] / 1e9 for r in np.flatnonzero(has_rank[index]).tolist()}
            exposures.append((by_op, by_rank, waits[index]))
        return exposures

    def rows(self) -> list[CollectiveRow]:
        """Per (group, op), the most in-flight time first."""
        step_total = self.step_time_s.total()
        rows = []
        for stats in self.stats:
            closed = stats.exposed_s.count
            in_flight = stats.in_flight_s.quantiles("p50", "p99")
            rows.append(
                CollectiveRow(
                    group=stats.group,
                    op=stats.op,
                    count=stats.count,
                    bytes=stats.bytes,
                    in_flight_total_s=stats.in_flight_ns / 1e9,
                    in_flight_p50_s=in_flight["p50"],
                    in_flight_p99_s=in_flight["p99"],
                    busbw_p50_gbps=stats.busbw_gbps.quantile(0.5),
                    busbw_ops=stats.busbw_gbps.count,
                    exposed_per_step_s=stats.exposed_s.mean() if closed else None,
                    exposed_share=stats.exposed_s.total() / step_total if closed and step_total > 0 else None,
                    exposed_measured=stats.bounded_steps == 0 if closed else None,
                )
            )
        return sorted(rows, key=lambda row: (-row.in_flight_total_s, row.group, row.op))


def communication_share(rows: Iterable[CollectiveRow]) -> float | None:
    """The step's share spent in exposed communication, every (group, op): the sum of the rows' exposed
    shares, at most 1 (operations of different groups that overlap count in each: an upper bound);
    ``None`` where no row has a share."""
    shares = [row.exposed_share for row in rows if row.exposed_share is not None]
    return min(1.0, sum(shares)) if shares else None


def typical_busbw_gbps(rows: Iterable[CollectiveRow]) -> float | None:
    """The bus bandwidth a run's collectives reached: the median over (group, op) of each one's busbw p50 (of
    the operations that ran alone); ``None`` where none has one."""
    return quantile(np.asarray([row.busbw_p50_gbps for row in rows if row.busbw_p50_gbps is not None]), 0.5)


def last_full_step(completed_steps: int) -> int | None:
    """The step whose traffic a run is checked on: the last one every rank completed (steps numbered from 0;
    a short run's last is its steadiest: step 0 holds FSDP's lazy initialisation, step 1 DDP's bucket
    rebuild); ``None`` before one completed."""
    return completed_steps - 1 if completed_steps > 0 else None


def step_traffic(table: pa.Table, step: int) -> dict[tuple[int, str, str], tuple[int, int]]:
    """What each (rank, group, op) moved in ``step``: (the sum of ``bytes``, the number of operations) of the
    collectives of a ``collective`` table issued in that step."""
    issued = table.filter(pc.equal(table["step"], step)).group_by(["rank", "group", "op"])
    rows = issued.aggregate([("bytes", "sum"), ("bytes", "count")])
    columns = (rows[name].to_pylist() for name in ("rank", "group", "op", "bytes_sum", "bytes_count"))
    return {(rank, group, op): (total, count) for rank, group, op, total, count in zip(*columns, strict=True)}


def _groups(values: np.ndarray) -> list[tuple[int, np.ndarray]]:
    """(value, the rows that hold it) for each distinct value."""
    order, runs = _sorted_runs(values)
    return [(value, order[rows]) for value, rows in runs]


def _sorted_runs(values: np.ndarray) -> tuple[np.ndarray, list[tuple[int, slice]]]:
    """The order that sorts ``values`` (stably), and each distinct value with its run in that order."""
    low, high = int(values.min()), int(values.max())
    if low == high:
        return np.arange(len(values)), [(low, slice(0, len(values)))]
    # numpy sorts 16-bit integers by radix, in linear time: (group, op) indexes and a table's steps fit
    keys = (values - low).astype(np.uint16) if high - low < 1 << 16 else values
    order = np.argsort(keys, kind="stable")
    ordered = values[order]
    edges = [*np.flatnonzero(np.r_[True, ordered[1:] != ordered[:-1]]).tolist(), len(values)]
    return order, [(int(ordered[first]), slice(first, after)) for first, after in pairwise(edges)]


def _span_grid(spans: list[StepSpans], ranks: int) -> tuple[np.ndarray, np.ndarray]:
    """(start, end) of each step's (row) ranks' spans (column), :data:`_NO_SPAN` where not known."""
    start = np.full((len(spans), ranks), _NO_SPAN[0], dtype=np.int64)
    end = np.full((len(spans), ranks), _NO_SPAN[1], dtype=np.int64)
    counts = [len(step.ranks) for step in spans]

    def column(name: str) -> np.ndarray:
        values = chain.from_iterable(getattr(step, name) for step in spans)
        return np.fromiter(values, dtype=np.int64, count=sum(counts))

    row, rank = np.repeat(np.arange(len(spans)), counts), column("ranks")
    known = rank < ranks
    start[row[known], rank[known]] = column("start_ns")[known]
    end[row[known], rank[known]] = column("end_ns")[known]
    return start, end


def exposed_intervals(
    step: np.ndarray,
    rank: np.ndarray,
    start: np.ndarray,
    end: np.ndarray,
    waited_ns: np.ndarray,
    waited: np.ndarray,
    seen: np.ndarray,
    pipeline: np.ndarray,
    steps: int,
) -> list[Waits]:
    """Each operation's exposed interval, by the exposed time's rule: where a wait was seen in its cell, its
    own wait [end - waited, end] (none where it was not waited on); where none was, its whole in-flight time
    [start, end]. Per step index, its operations' :class:`Waits`: the breakdown's input, so
    :meth:`CollectiveFold._exposed` passes only the operations of ranks that measured their step's phases."""
    begin = np.where(seen, np.maximum(start, end - waited_ns.astype(np.int64)), start)
    keep = np.where(seen, waited, True) & (end > begin)
    kept = step[keep]
    order = np.argsort(kept, kind="stable")
    ranks, begins, ends, pipelines = (column[keep][order] for column in (rank, begin, end, pipeline))
    bounds = np.searchsorted(kept[order], np.arange(steps + 1)).tolist()
    return [Waits(ranks[a:b], begins[a:b], ends[a:b], pipelines[a:b]) for a, b in pairwise(bounds)]


def _union_lengths(cell: np.ndarray, start: np.ndarray, end: np.ndarray, cells: int) -> np.ndarray:
    """Per cell, the length (ns) of the union of its intervals [start, end) (``end`` no earlier than ``start``)."""
    if not len(cell):
        return np.zeros(cells)
    # Lay the cells one after another on one line, each just past the one before it ends: then sorting the
    # starts sorts by (cell, start), and one running maximum of the ends tells how far each row's own cell
    # was covered before it.
    origin = np.full(cells, np.iinfo(np.int64).max)
    np.minimum.at(origin, cell, start)
    reach = np.full(cells, np.iinfo(np.int64).min)
    np.maximum.at(reach, cell, end)
    extent = np.where(reach >= origin, reach - origin, 0) + 1
    shift = (np.cumsum(extent) - extent - origin)[cell]
    order = np.argsort(start + shift)
    start, end = start[order] + shift[order], end[order] + shift[order]
    before = np.r_[np.iinfo(np.int64).min, np.maximum.accumulate(end)[:-1]]
    covered = np.maximum(0, end - np.maximum(start, before))
    return np.bincount(cell[order], weights=covered.astype(float), minlength=cells)
