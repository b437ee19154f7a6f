"""A recording's tables in the order things happened: what a replay plays, a slice at a time.

Each table is sorted once by its rows' event time (:func:`event_times_ns`);
a replay then takes, frame by frame, every kind's rows up to the playback
position, as typed tables, and folds them into the same state as a live
job's batches (``DashboardState.apply``). :meth:`Timeline.time_within` bounds
how many rows one frame folds, so a seek far ahead is spread over frames.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from meshtop.probes.kinds import FOLD_ORDER
from meshtop.recordings.reader import Recording


def in_kind_order(batches: Iterable[tuple[str, pa.Table]]) -> list[tuple[str, pa.Table]]:
    """(kind, table) batches as one table per kind, in the fold's order (:data:`~meshtop.probes.kinds.FOLD_ORDER`):
    a slice of time (a replay's, or a live frame's) folded kind by kind, each fold called once per kind. A kind's
    tables may differ in columns (a live fold behind reads steps without their phase times): the one table has
    them all, null where a table had not read them."""
    tables: dict[str, list[pa.Table]] = {}
    for kind, table in batches:
        tables.setdefault(kind, []).append(table)
    return [
        (kind, parts[0] if len(parts) == 1 else pa.concat_tables(parts, promote_options="default"))
        for kind, parts in sorted(tables.items(), key=lambda item: FOLD_ORDER.get(item[0], 0))
    ]


def event_times_ns(kind: str, table: pa.Table) -> np.ndarray:
    """When each row became known: the end of a timed span, else its sample time (0 for timeless facts)."""
    names = table.column_names
    if kind == "step":
        ends = pc.add(
            table.column("start_ns"), pc.cast(pc.round(pc.multiply(table.column("duration_s"), 1e9)), pa.int64())
        )
        return ends.to_numpy()
    for name in ("end_ns", "wall_ns", "start_ns"):
        if name in names:
            return pc.fill_null(table.column(name), 0).to_numpy()
    return np.zeros(len(table), dtype=np.int64)


@dataclass(frozen=True, slots=True)
class KindRows:
    """One kind's rows, sorted by event time."""

    kind: str
    table: pa.Table
    times_ns: np.ndarray


@dataclass(frozen=True, slots=True)
class Timeline:
    """Every table of a recording, each in time order."""

    kinds: tuple[KindRows, ...]
    start_ns: int
    """The first timed event (timeless facts such as GPU links sort before it at 0)."""
    end_ns: int
    rows: int

    def rows_until(self, time_ns: int) -> int:
        """Rows whose time is at or before ``time_ns``."""
        return sum(int(np.searchsorted(k.times_ns, time_ns, side="right")) for k in self.kinds)

    def time_within(self, after_ns: int, target_ns: int, budget: int) -> int:
        """The latest time up to ``target_ns`` whose rows after ``after_ns`` number at most ``budget`` (but at
        least the next event's time, so playback always moves)."""
        before = self.rows_until(after_ns)
        if self.rows_until(target_ns) - before <= budget:
            return target_ns
        low, high = after_ns, target_ns
        while high - low > 1:
            middle = (low + high) // 2
            if self.rows_until(middle) - before <= budget:
                low = middle
            else:
                high = middle
        if low == after_ns:  # even the next instant holds more than the budget: take it whole
            return min(
                int(k.times_ns[np.searchsorted(k.times_ns, after_ns, side="right")])
                for k in self.kinds
                if np.searchsorted(k.times_ns, after_ns, side="right") < len(k.times_ns)
            )
        return low

    def between(self, after_ns: int | None, until_ns: int) -> list[tuple[str, pa.Table]]:
        """Each kind's rows with a time in (``after_ns``, ``until_ns``] (from the first row for ``None``)."""
        out = []
        for k in self.kinds:
            first = 0 if after_ns is None else int(np.searchsorted(k.times_ns, after_ns, side="right"))
            last = int(np.searchsorted(k.times_ns, until_ns, side="right"))
            if last > first:
                out.append((k.kind, k.table.slice(first, last - first)))
        return out

    def data_start_ns(self) -> int:
        """Where the job's own data starts: its first rank's start (the samplers run from the launch, seconds
        before any rank has imported torch); the first timed event where no rank started."""
        for k in self.kinds:
            if k.kind == "rank_started" and len(k.times_ns):
                first = int(k.times_ns.min())
                if first > 0:
                    return max(self.start_ns, first)
        return self.start_ns

    def step_ends(self) -> list[tuple[int, int]]:
        """(end time, step) of each step, once its last rank finished it."""
        for k in self.kinds:
            if k.kind == "step" and len(k.table):
                table = pa.table({"step": k.table.column("step"), "end": k.times_ns})
                grouped = table.group_by("step").aggregate([("end", "max")])
                return sorted(
                    zip(grouped.column("end_max").to_pylist(), grouped.column("step").to_pylist(), strict=True)
                )
        return []


def load_timeline(recording: Recording) -> Timeline:
    """Every table the recording holds, each sorted by event time, but a node's clock measurements: taken when
    a node connects, before its ranks start, they are no moment of the job (the recorder keeps them)."""
    kinds = []
    present = set(recording.kinds()) - {"node_clock"}
    for kind in (k for k in FOLD_ORDER if k in present):
        table = recording.arrow(kind)
        if not len(table):
            continue
        times = event_times_ns(kind, table)
        order = np.argsort(times, kind="stable")
        kinds.append(KindRows(kind, table.take(pa.array(order)), times[order]))
    timed = [k.times_ns[k.times_ns > 0] for k in kinds]
    starts = [int(t[0]) for t in timed if len(t)]
    ends = [int(k.times_ns[-1]) for k in kinds if len(k.times_ns)]
    return Timeline(
        kinds=tuple(kinds),
        start_ns=min(starts, default=0),
        end_ns=max(ends, default=0),
        rows=sum(len(k.table) for k in kinds),
    )
