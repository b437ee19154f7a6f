"""Collective figures per (process group, op), folded a table at a time.

Of the operations issued inside a step (set-up and tear-down traffic, step
``None``, is left out):

- **count** and **bytes** (S of nccl-tests, summed);
- **in-flight time**: issue to completion (``end_ns - start_ns``); its total,
  p50 and p99. An asynchronous operation is in flight while the rank does
  other work, so in-flight times of one step can add up to more than the step;
- **busbw**: p50 of :func:`~recordings.metrics.bandwidth.busbw_gbps` over the
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

Exposed time is decided when a step closes (two job steps after it completes,
or at the end), so operations that arrive a little after their step still
count; an operation of an already closed step counts in the totals only.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from recordings.metrics.bandwidth import bus_factor, busbw_column
from recordings.metrics.stats import Distribution
from recordings.metrics.steps import ClosedSteps, RankSpan

_SEGMENT = 1 << 44
"""Room per cell (about 4.9 hours of ns) when folding intervals of many cells in one pass."""


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
            "group": self.group, "op": self.op, "count": self.count, "bytes": self.bytes,
            "in_flight_s": {"total": self.in_flight_total_s, "p50": self.in_flight_p50_s,
                            "p99": self.in_flight_p99_s},
            "busbw_gbps": {"p50": self.busbw_p50_gbps, "ops": self.busbw_ops},
            "exposed_s": {"per_step": self.exposed_per_step_s, "share": self.exposed_share,
                          "measured": self.exposed_measured},
        }


Exposure = tuple[dict[tuple[str, str], float], dict[int, float]]
"""A closed step's exposed seconds per (group, op) (the job's: the most any rank had) and per rank (all ops)."""


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
        joined = pc.binary_join_element_wise(table.column("group"), table.column("op"), "\x00")
        encoded = pc.dictionary_encode(joined).combine_chunks()
        names = [value.split("\x00", 1) for value in encoded.dictionary.to_pylist()]
        mapping = np.array([self._key(group, op) for group, op in names], dtype=np.int64)
        key = mapping[encoded.indices.to_numpy(zero_copy_only=False)]
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

    def _factors(self, key: np.ndarray, sizes: np.ndarray) -> np.ndarray:
        """Each operation's bus factor (NaN where bandwidth means nothing), by its op and group size."""
        code = key * (int(sizes.max()) + 1) + sizes
        pairs, inverse = np.unique(code, return_inverse=True)
        factors = []
        for value in pairs.tolist():
            index, size = divmod(value, int(sizes.max()) + 1)
            factor = bus_factor(self.stats[index].op, size)
            factors.append(np.nan if factor is None else factor)
        return np.array(factors, dtype=float)[inverse.reshape(-1)]

    def _keep_for_steps(self, table: pa.Table, key: np.ndarray, start: np.ndarray, end: np.ndarray) -> None:
        steps = table.column("step").to_numpy()
        rank = table.column("rank").to_numpy()
        waited_column = table.column("waited_ns")
        waited = pc.is_valid(waited_column).to_numpy(zero_copy_only=False)
        waited_ns = pc.fill_null(waited_column, 0).to_numpy()
        for step, rows in _groups(steps):
            if step in self._closed:
                continue  # late: counted above, but its step's exposed time is decided
            self._open.setdefault(step, []).append(
                _Chunk(rank[rows], key[rows], start[rows], end[rows], waited_ns[rows], waited[rows]))

    def close(self, step: int, duration_s: float, spans: dict[int, RankSpan]) -> Exposure:
        """Decide the exposed time of job step ``step`` (``duration_s`` long; each rank's span)."""
        self._closed.add(step)
        chunks = self._open.pop(step, [])
        self.step_time_s.add(duration_s)
        return self._exposed(chunks, spans) if chunks else ({}, {})

    def drop(self, step: int) -> None:
        """Forget an open step that will never complete (the job ended first)."""
        self._open.pop(step, None)

    def open_steps(self) -> list[int]:
        return sorted(self._open)

    def _exposed(self, chunks: list[_Chunk], spans: dict[int, RankSpan]) -> Exposure:
        rank = np.concatenate([c.rank for c in chunks])
        key = np.concatenate([c.key for c in chunks])
        start = np.concatenate([c.start_ns for c in chunks])
        end = np.concatenate([c.end_ns for c in chunks])
        waited_ns = np.concatenate([c.waited_ns for c in chunks]).astype(float)
        waited = np.concatenate([c.waited for c in chunks])
        ranks = int(rank.max()) + 1
        # Each rank's step: clip the intervals to it, and the waits to its length.
        span_start = np.full(ranks, np.iinfo(np.int64).min, dtype=np.int64)
        span_end = np.full(ranks, np.iinfo(np.int64).max, dtype=np.int64)
        for r, span in spans.items():
            if r < ranks:
                span_start[r], span_end[r] = span.start_ns, span.end_ns
        start = np.maximum(start, span_start[rank])
        end = np.maximum(np.minimum(end, span_end[rank]), start)
        cell = key * ranks + rank
        cells = len(self.stats) * ranks
        waited_sum = np.bincount(cell, weights=np.where(waited, waited_ns, 0.0), minlength=cells)
        seen = np.bincount(cell, weights=waited.astype(float), minlength=cells) > 0
        present = np.bincount(cell, minlength=cells) > 0
        union = _union_lengths(cell, start, end, cells)
        step_ns = np.where(span_end < np.iinfo(np.int64).max, span_end - span_start, np.inf).astype(float)
        limit = np.tile(step_ns, len(self.stats))
        exposed_ns = np.where(seen, np.minimum(waited_sum, limit), union)
        by_op, by_rank = {}, {}
        for index, stats in enumerate(self.stats):
            part = slice(index * ranks, (index + 1) * ranks)
            if not present[part].any():
                continue
            value = float(exposed_ns[part][present[part]].max()) / 1e9
            stats.exposed_s.add(value)
            if not seen[part][present[part]].all():
                stats.bounded_steps += 1
            by_op[(stats.group, stats.op)] = value
        per_rank = exposed_ns.reshape(len(self.stats), ranks).sum(axis=0, where=present.reshape(len(self.stats), ranks))
        for r in np.flatnonzero(present.reshape(len(self.stats), ranks).any(axis=0)).tolist():
            by_rank[r] = float(per_rank[r]) / 1e9
        return by_op, by_rank

    def rows(self) -> list[CollectiveRow]:
        """Per (group, op), the most in-flight time first."""
        step_total = self.step_time_s.total()
        rows = []
        for stats in self.stats:
            closed = stats.exposed_s.count
            in_flight = stats.in_flight_s.quantiles("p50", "p99")
            rows.append(CollectiveRow(
                group=stats.group, op=stats.op, count=stats.count, bytes=stats.bytes,
                in_flight_total_s=stats.in_flight_ns / 1e9, in_flight_p50_s=in_flight["p50"],
                in_flight_p99_s=in_flight["p99"], busbw_p50_gbps=stats.busbw_gbps.quantile(0.5),
                busbw_ops=stats.busbw_gbps.count,
                exposed_per_step_s=stats.exposed_s.mean() if closed else None,
                exposed_share=stats.exposed_s.total() / step_total if closed and step_total > 0 else None,
                exposed_measured=stats.bounded_steps == 0 if closed else None))
        return sorted(rows, key=lambda row: (-row.in_flight_total_s, row.group, row.op))


def _groups(values: np.ndarray) -> list[tuple[int, np.ndarray]]:
    """(value, the rows that hold it) for each distinct value (no sort where there is only one)."""
    if values.min() == values.max():
        return [(int(values[0]), np.arange(len(values)))]
    order = np.argsort(values, kind="stable")
    present, first = np.unique(values[order], return_index=True)
    return list(zip(present.tolist(), np.split(order, first[1:]), strict=True))


def _union_lengths(cell: np.ndarray, start: np.ndarray, end: np.ndarray, cells: int) -> np.ndarray:
    """Per cell, the length (ns) of the union of its intervals [start, end)."""
    if not len(cell):
        return np.zeros(cells)
    order = np.lexsort((start, cell))
    cell, start, end = cell[order], start[order], end[order]
    origin = start.min()
    start_rel, end_rel = start - origin, end - origin
    segment = np.cumsum(np.r_[True, cell[1:] != cell[:-1]]).astype(np.int64)
    # A running maximum of the ends that starts afresh at each cell: later cells sit _SEGMENT higher.
    reach = np.maximum.accumulate(end_rel + segment * _SEGMENT) - segment * _SEGMENT
    before = np.r_[np.int64(-1), reach[:-1]]
    before[np.r_[True, cell[1:] != cell[:-1]]] = -1
    covered = np.maximum(0, end_rel - np.maximum(start_rel, before))
    return np.bincount(cell, weights=covered.astype(float), minlength=cells)
