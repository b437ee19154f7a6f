"""Each GPU of the run over its NVML samples: each figure once.

Rules:

- a GPU is its (node, index) pair (indexes repeat from one node to the next);
- peak memory used = the largest ``memory_used_bytes`` sampled: NVML's count of the whole device, every
  process on it (a serving engine's own, the KV cache it reserves up front, included), not only the
  allocator of one rank;
- utilisation = the mean of ``utilization_pct`` over the samples that read it (NVML's share of the last
  sample period in which a kernel ran: busy, not efficient);
- a sample that could not read a value (``None``) counts for none of its figures.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc


def first_sample_of_each_gpu(table: pa.Table, names: Sequence[str]) -> dict[tuple[int, int], tuple[Any, ...]]:
    """Each GPU's first row of a ``gpu`` table (rows in arrival order), by (node, index): its ``names`` columns.
    A column at a time: one Python object a sample cost the head 25 us a sample on many nodes."""
    return _sample_of_each_gpu(table, names, "min")


def _sample_of_each_gpu(table: pa.Table, names: Sequence[str], which: str) -> dict[tuple[int, int], tuple[Any, ...]]:
    """Each GPU's first (``which`` ``min``) or last (``max``) row of a ``gpu`` table: its ``names`` columns."""
    rows = pa.array(np.arange(len(table)))
    keyed = table.select(["node", "gpu"]).append_column("row", rows)
    chosen = keyed.group_by(["node", "gpu"]).aggregate([("row", which)]).column(f"row_{which}")
    taken = table.take(chosen).select(["node", "gpu", *names]).to_pydict()
    return {(node, gpu): tuple(rest) for node, gpu, *rest in zip(*taken.values(), strict=True)}


LAST_READ = ("uuid", "utilization_pct", "memory_used_bytes", "power_w", "temperature_c", "sm_clock_mhz")
"""What is kept of each GPU's last sample: what a reader shows of the GPU now (``/metrics``'s gauges)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class GpuRow:
    node: int
    gpu: int
    name: str | None
    samples: int
    peak_used_bytes: int | None
    total_bytes: int | None
    utilization_mean_pct: float | None


@dataclass(slots=True)
class _Gpu:
    name: str | None = None
    samples: int = 0
    peak: int | None = None
    total: int | None = None
    busy_sum: float = 0.0
    busy_count: int = 0


class GpuFold:
    """The GPUs' samples, folded a table at a time as they come."""

    def __init__(self) -> None:
        self._gpus: dict[tuple[int, int], _Gpu] = {}
        self.last: dict[tuple[int, int], dict[str, Any]] = {}
        """Each GPU's last sample, by (node, index): its :data:`LAST_READ` (a reading it could not take: ``None``)."""

    def add(self, table: pa.Table) -> None:
        """Fold a ``gpu`` table, its rows in the order they came: per GPU at once (a fleet's hour is tens of
        millions of samples)."""
        if not len(table):
            return
        for key, values in _sample_of_each_gpu(table, LAST_READ, "max").items():
            self.last[key] = dict(zip(LAST_READ, values, strict=True))
        name = table.column("name")
        per_gpu = (
            table.select(["node", "gpu", "memory_used_bytes", "memory_total_bytes", "utilization_pct"])
            .append_column("name", pc.if_else(pc.equal(name, ""), pa.scalar(None, name.type), name))
            .group_by(["node", "gpu"], use_threads=False)  # one thread: "last" is the last in row order
            .aggregate(
                [
                    ([], "count_all"),
                    ("name", "last"),
                    ("memory_used_bytes", "max"),
                    ("memory_total_bytes", "last"),
                    ("utilization_pct", "sum"),
                    ("utilization_pct", "count"),
                ]
            )
        )
        for node, gpu, samples, name_, peak, total, busy_sum, busy_count in zip(
            *per_gpu.to_pydict().values(), strict=True
        ):
            state = self._gpus.setdefault((node, gpu), _Gpu())
            state.samples += samples
            state.name = name_ or state.name
            if peak is not None:
                state.peak = peak if state.peak is None else max(state.peak, peak)
            if total is not None:
                state.total = total
            state.busy_sum += busy_sum or 0.0
            state.busy_count += busy_count

    def rows(self) -> list[GpuRow]:
        return [
            GpuRow(
                node=node,
                gpu=gpu,
                name=state.name,
                samples=state.samples,
                peak_used_bytes=state.peak,
                total_bytes=state.total,
                utilization_mean_pct=state.busy_sum / state.busy_count if state.busy_count else None,
            )
            for (node, gpu), state in sorted(self._gpus.items())
        ]
