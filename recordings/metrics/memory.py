"""Memory per rank: what holds it, its peak, and the most loaded rank.

- A rank's **peak** is the CUDA allocator's peak over the run where the rank
  reported one; elsewhere (CPU) the largest resident set seen, from its
  memory snapshots and from the process sampler.
- The **most loaded rank** has the highest peak (the lowest rank on a tie):
  what a plan's headroom depends on is the tightest device, not the sum.
- The categories (weights, gradients, optimizer state, activations, KV cache)
  are the rank's last snapshot's: the one of the greatest (step, wall clock),
  the later to arrive on a tie.
- A rank's **headroom** is the device memory its GPU had left at the rank's
  peak: device total - the allocator's peak (CUDA only: the device total is
  ``torch.cuda.mem_get_info``'s, of the last snapshot; the peak
  ``torch.cuda.max_memory_allocated``). The run's headroom is its most loaded
  rank's. It is the one measure of headroom: the dashboard's bars draw it and
  its alert reads it. Memory outside torch's allocator (the CUDA context,
  NCCL's buffers, the allocator's cached but unused blocks) is not in it:
  NVML's used memory, in the Devices view, shows what the whole GPU holds.
- A rank's **accounted bytes** are what its snapshot names: weights +
  gradients + optimizer state + activations saved for backward + KV cache
  (the planner's categories). The **peak a plan is checked against**
  (:func:`plan_peak`) is, on CUDA, the allocator's peak of the most loaded
  rank; on CPU, where the resident set is mostly the interpreter and torch,
  the largest accounted bytes.
- A rank's **other bytes** are its peak less its accounted bytes (0 where the
  categories exceed the peak: a snapshot later than the peak's step): what the
  categories do not name (on CPU, the interpreter and torch themselves).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import pyarrow as pa

CATEGORIES = ("weights_bytes", "grads_bytes", "optimizer_bytes", "activations_bytes", "kv_cache_bytes")
"""What a memory snapshot names, in the planner's order."""
_new_tuple = tuple.__new__


class LastMemory(NamedTuple):
    """What the fold keeps of a rank's last snapshot: what orders it and what the figures read of it (a
    thousand ranks' whole snapshots a step, each a frozen dataclass of 14 fields, took 12 ms of a live fold a
    step)."""

    rank: int
    step: int
    wall_ns: int
    weights_bytes: int | None
    grads_bytes: int | None
    optimizer_bytes: int | None
    activations_bytes: int | None
    kv_cache_bytes: int | None
    device_total_bytes: int | None


_READ = slice(3, None)
"""What the figures read of a rank's last snapshot (a later one that says the same changes none)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class MemoryRow:
    """One rank's memory: its peak over the run, and what held it at its last snapshot."""

    rank: int
    peak_bytes: int | None
    weights_bytes: int | None
    grads_bytes: int | None
    optimizer_bytes: int | None
    activations_bytes: int | None
    kv_cache_bytes: int | None
    device_total_bytes: int | None
    """Its GPU's memory (CUDA), as its last snapshot said."""
    headroom_bytes: int | None
    """Device total - the allocator's peak (CUDA only)."""

    @property
    def headroom_share(self) -> float | None:
        """Headroom over the device total (CUDA only)."""
        if self.headroom_bytes is None or not self.device_total_bytes:
            return None
        return self.headroom_bytes / self.device_total_bytes


def most_loaded(peaks: dict[int, int]) -> int | None:
    """The rank of the highest peak, the lowest rank on a tie (``None`` for no peaks)."""
    return min(peaks, key=lambda rank: (-peaks[rank], rank)) if peaks else None


def accounted_bytes(row: MemoryRow) -> int | None:
    """Weights + gradients + optimizer state + activations + KV cache of the rank's last snapshot (a category
    not measured counts 0); ``None`` without a snapshot."""
    if row.weights_bytes is None:
        return None
    return sum(getattr(row, name) or 0 for name in CATEGORIES)


def other_bytes(row: MemoryRow) -> int | None:
    """The rank's peak less its :func:`accounted_bytes`, at least 0; its whole peak without a snapshot;
    ``None`` without a peak."""
    if row.peak_bytes is None:
        return None
    return max(0, row.peak_bytes - (accounted_bytes(row) or 0))


@dataclass(frozen=True, slots=True, kw_only=True)
class PlanPeak:
    """The memory peak a plan's prediction is checked against."""

    rank: int
    bytes: int
    kind: str
    """``allocator`` (CUDA: the allocator's peak) or ``accounted`` (CPU: :func:`accounted_bytes`)."""


def plan_peak(rows: Sequence[MemoryRow], *, cuda: bool) -> PlanPeak | None:
    """The most loaded rank and its peak: on CUDA by the allocator's peak, on CPU by its accounted bytes (the
    resident set is mostly the interpreter and torch there); ``None`` where no rank has one."""
    if cuda:
        peaks = {row.rank: row.peak_bytes for row in rows if row.peak_bytes is not None}
    else:
        peaks = {row.rank: value for row in rows if (value := accounted_bytes(row)) is not None}
    rank = most_loaded(peaks)
    return (
        PlanPeak(rank=rank, bytes=peaks[rank], kind="allocator" if cuda else "accounted") if rank is not None else None
    )


class MemoryFold:
    """Each rank's last snapshot and its peaks."""

    def __init__(self) -> None:
        self.last: dict[int, LastMemory] = {}
        self._allocator_peak: dict[int, int] = {}
        self._rss_peak: dict[int, int] = {}
        self.changes = 0
        """Grows when a rank's peak rises or its last snapshot is replaced (a sample under the peak changes
        nothing): what a reader's figures of memory are kept by."""

    def add(self, table: pa.Table) -> None:
        """Fold a ``memory`` table, its rows in the order they came."""
        last = table.take(_last_rows(table)).select(LastMemory._fields).to_pydict()  # one conversion a column
        for row in zip(*last.values(), strict=True):
            self._keep_last(_new_tuple(LastMemory, row))
        self.changes += _raise_all(self._allocator_peak, table, "peak_allocated_bytes")
        self.changes += _raise_all(self._rss_peak, table, "rss_bytes")

    def add_process(self, table: pa.Table) -> None:
        """Fold a ``process`` table: its resident sets raise the ranks' peaks."""
        self.changes += _raise_all(self._rss_peak, table, "rss_bytes")

    def _keep_last(self, snapshot: LastMemory) -> None:
        last = self.last.get(snapshot.rank)
        if last is None or (snapshot.step, snapshot.wall_ns) >= (last.step, last.wall_ns):
            self.last[snapshot.rank] = snapshot
            self.changes += last is None or last[_READ] != snapshot[_READ]

    def peak(self, rank: int) -> int | None:
        peak = self._allocator_peak.get(rank)
        return peak if peak is not None else self._rss_peak.get(rank)

    def peaks(self) -> dict[int, int]:
        ranks = sorted(set(self._allocator_peak) | set(self._rss_peak))
        return {rank: peak for rank in ranks if (peak := self.peak(rank)) is not None}

    def most_loaded_rank(self) -> int | None:
        return most_loaded(self.peaks())

    def headroom(self, rank: int) -> int | None:
        """Device total - the allocator's peak of ``rank`` (CUDA only)."""
        last = self.last.get(rank)
        if last is None or last.device_total_bytes is None or rank not in self._allocator_peak:
            return None
        return last.device_total_bytes - self._allocator_peak[rank]

    def headroom_bytes(self) -> int | None:
        """The most loaded rank's headroom."""
        rank = self.most_loaded_rank()
        return self.headroom(rank) if rank is not None else None

    def rows(self) -> list[MemoryRow]:
        rows = []
        for rank, peak in self.peaks().items():
            last = self.last.get(rank)
            rows.append(
                MemoryRow(
                    rank=rank,
                    peak_bytes=peak,
                    weights_bytes=last.weights_bytes if last else None,
                    grads_bytes=last.grads_bytes if last else None,
                    optimizer_bytes=last.optimizer_bytes if last else None,
                    activations_bytes=last.activations_bytes if last else None,
                    kv_cache_bytes=last.kv_cache_bytes if last else None,
                    device_total_bytes=last.device_total_bytes if last else None,
                    headroom_bytes=self.headroom(rank),
                )
            )
        return rows


def _raise(peaks: dict[int, int], rank: int, value: int | None) -> bool:
    """A rank's peak is the most it was seen to hold (a reading of nothing leaves it as it was); whether it
    rose (a first reading counts)."""
    if value is None:
        return False
    was = peaks.get(rank)
    peaks[rank] = max(was or 0, value)
    return was is None or peaks[rank] != was


def _raise_all(peaks: dict[int, int], table: pa.Table, column: str) -> int:
    """:func:`_raise` with each rank's largest reading of ``column`` in ``table``; how many peaks rose."""
    most = table.group_by("rank").aggregate([(column, "max")])
    ranks, values = most.column("rank").to_pylist(), most.column(f"{column}_max").to_pylist()
    return sum(_raise(peaks, rank, value) for rank, value in zip(ranks, values, strict=True))


def _last_rows(table: pa.Table) -> list[int]:
    """Each rank's last snapshot in ``table``: the row of the greatest (step, wall clock), the later row on a
    tie."""
    if not len(table):
        return []
    rank = table.column("rank").to_numpy()
    order = np.lexsort(
        (np.arange(len(table)), table.column("wall_ns").to_numpy(), table.column("step").to_numpy(), rank)
    )
    ends = np.r_[rank[order][1:] != rank[order][:-1], True]
    return order[ends].tolist()
