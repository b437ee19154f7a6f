"""Each GPU of the run over its NVML samples: each figure once.

Rules:

- a GPU is its (node, index) pair (indexes repeat from one node to the next);
- peak memory used = the largest ``memory_used_bytes`` sampled: NVML's count of the whole device, every
  process on it (a serving engine's own, the KV cache it reserves up front, included), not only the
  allocator of one rank;
- utilisation = the mean of ``utilization_pct`` over the samples that read it (NVML's share of the last
  sample period in which a kernel ran: busy, not efficient);
- link rates (PCIe and NVLink, each tx and rx, in bytes/s: :mod:`meshtop.probes.nvml` says what NVML gives):
  per GPU the mean over the samples that read the rate and the peak, the largest of them. A PCIe reading is
  NVML's 20 ms window, read once a second and repeated by the samples between, so its mean weighs each reading
  by the time it stood for and its peak is a 20 ms burst; an NVLink rate is the mean between two samples;
- the samples the link rates are over: a serving run's (:attr:`GpuFold.keeps_samples`), those of the load's
  window, from the first request's arrival to the last completed request's end (the window the request rates
  are over, so bytes/s sit beside requests/s); before it the engine loads its weights over PCIe and after it
  the GPUs idle, and over the whole run the peak would be the weight load and the mean the idle's share. A
  training run's, and a serving run's before a request completed: every sample of the run;
- a sample that could not read a value (``None``) counts for none of its figures: a GPU without NVLink, or
  none of whose samples fall in the window, has ``None`` mean and peak, never 0.
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


LINKS = {
    "pcie_tx": "pcie_tx_bytes_per_s",
    "pcie_rx": "pcie_rx_bytes_per_s",
    "nvlink_tx": "nvlink_tx_bytes_per_s",
    "nvlink_rx": "nvlink_rx_bytes_per_s",
}
"""Each link rate's name in the figures, and its sample column."""
LINK_LABELS = {"pcie_tx": "PCIe tx", "pcie_rx": "PCIe rx", "nvlink_tx": "NVLink tx", "nvlink_rx": "NVLink rx"}
"""Each link rate as a reader names it."""
LAST_READ = (
    "uuid",
    "utilization_pct",
    "memory_used_bytes",
    "power_w",
    "temperature_c",
    "sm_clock_mhz",
    *LINKS.values(),
)
"""What is kept of each GPU's last sample: what a reader shows of the GPU now (``/metrics``'s gauges)."""
_LinkSums = dict[str, tuple[float, int, float | None]]
"""Per link rate: the sum and count of the samples that read it, and their largest."""


@dataclass(frozen=True, slots=True, kw_only=True)
class GpuRow:
    node: int
    gpu: int
    name: str | None
    samples: int
    peak_used_bytes: int | None
    total_bytes: int | None
    utilization_mean_pct: float | None
    links: dict[str, dict[str, float | None]]
    """Per link rate of :data:`LINKS`: its ``mean`` and ``peak`` in bytes/s (``None``: NVML gave none)."""
    links_over: str
    """The samples the link rates are over: ``load`` (the load's window) or ``run``."""


@dataclass(slots=True)
class _Gpu:
    name: str | None = None
    samples: int = 0
    peak: int | None = None
    total: int | None = None
    busy_sum: float = 0.0
    busy_count: int = 0
    links: _LinkSums | None = None


LINK_AGGREGATES = [(column, how) for column in LINKS.values() for how in ("sum", "count", "max")]
"""What a group-by of samples takes of the link rates: per rate, the sum, count and largest of those that read it."""


def _link_sums_at(per_gpu: dict[str, list[Any]], index: int) -> _LinkSums:
    """GPU ``index``'s link sums in a group-by's columns (:data:`LINK_AGGREGATES`)."""
    return {
        name: (
            per_gpu[f"{column}_sum"][index] or 0.0,
            per_gpu[f"{column}_count"][index],
            per_gpu[f"{column}_max"][index],
        )
        for name, column in LINKS.items()
    }


def _link_sums(table: pa.Table) -> dict[tuple[int, int], _LinkSums]:
    """Each GPU's link sums in ``table``."""
    per_gpu = table.group_by(["node", "gpu"], use_threads=False).aggregate(LINK_AGGREGATES).to_pydict()
    keys = zip(per_gpu["node"], per_gpu["gpu"], strict=True)
    return {key: _link_sums_at(per_gpu, index) for index, key in enumerate(keys)}


def _with(held: _LinkSums | None, more: _LinkSums) -> _LinkSums:
    """Two spans' link sums as one."""
    if held is None:
        return more
    return {
        name: (
            held[name][0] + more[name][0],
            held[name][1] + more[name][1],
            max((v for v in (held[name][2], more[name][2]) if v is not None), default=None),
        )
        for name in LINKS
    }


def _link_figures(sums: _LinkSums | None) -> dict[str, dict[str, float | None]]:
    """Mean and peak of each link rate (``None`` where no sample read it)."""
    return {
        name: {
            "mean": sums[name][0] / sums[name][1] if sums is not None and sums[name][1] else None,
            "peak": sums[name][2] if sums is not None and sums[name][1] else None,
        }
        for name in LINKS
    }


class GpuFold:
    """The GPUs' samples, folded a table at a time as they come; ``keeps_samples`` (a serving run's): their
    link rates kept with their times too, for the load's window (the rules above). A serving run's GPUs are
    one node's, so its samples are few enough to keep (8 GPUs at 10 Hz: 40 bytes a sample, 12 MB an hour); a
    training fleet's are folded only."""

    def __init__(self, *, keeps_samples: bool = False) -> None:
        self._gpus: dict[tuple[int, int], _Gpu] = {}
        self.keeps_samples = keeps_samples
        self._kept: list[pa.Table] = []
        """A serving run's samples: node, GPU, time and link rates."""
        self.last: dict[tuple[int, int], dict[str, Any]] = {}
        """Each GPU's last sample, by (node, index): its :data:`LAST_READ` (a reading it could not take: ``None``)."""

    def add(self, table: pa.Table) -> None:
        """Fold a ``gpu`` table, its rows in the order they came: per GPU at once (a fleet's hour is tens of
        millions of samples)."""
        if not len(table):
            return
        for key, values in _sample_of_each_gpu(table, LAST_READ, "max").items():
            self.last[key] = dict(zip(LAST_READ, values, strict=True))
        if self.keeps_samples:
            self._kept.append(table.select(["node", "gpu", "wall_ns", *LINKS.values()]))
        name = table.column("name")
        per_gpu = (
            table.select(["node", "gpu", "memory_used_bytes", "memory_total_bytes", "utilization_pct", *LINKS.values()])
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
                    *LINK_AGGREGATES,
                ]
            )
            .to_pydict()
        )
        columns = [per_gpu[column] for column in list(per_gpu)[:8]]  # node, gpu, then the six above
        for index, (node, gpu, samples, name_, peak, total, busy_sum, busy_count) in enumerate(
            zip(*columns, strict=True)
        ):
            state = self._gpus.setdefault((node, gpu), _Gpu())
            state.links = _with(state.links, _link_sums_at(per_gpu, index))
            state.samples += samples
            state.name = name_ or state.name
            if peak is not None:
                state.peak = peak if state.peak is None else max(state.peak, peak)
            if total is not None:
                state.total = total
            state.busy_sum += busy_sum or 0.0
            state.busy_count += busy_count

    def rows(self, load_ns: tuple[int, int] | None = None) -> list[GpuRow]:
        """Each GPU's figures; its link rates over ``load_ns`` (the load's first arrival and last end, ns) where
        the samples are kept, else over the run."""
        windowed = None
        if load_ns is not None and self.keeps_samples:
            if len(self._kept) > 1:
                self._kept = [pa.concat_tables(self._kept).combine_chunks()]
            kept = self._kept[0] if self._kept else None
            windowed = {}
            if kept is not None:
                wall = kept.column("wall_ns")
                within = pc.and_(pc.greater_equal(wall, load_ns[0]), pc.less_equal(wall, load_ns[1]))
                windowed = _link_sums(kept.filter(within))
        return [
            GpuRow(
                node=node,
                gpu=gpu,
                name=state.name,
                samples=state.samples,
                peak_used_bytes=state.peak,
                total_bytes=state.total,
                utilization_mean_pct=state.busy_sum / state.busy_count if state.busy_count else None,
                links=_link_figures(state.links if windowed is None else windowed.get((node, gpu))),
                links_over="run" if windowed is None else "load",
            )
            for (node, gpu), state in sorted(self._gpus.items())
        ]
