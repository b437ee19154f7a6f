"""Events made by hand, as the probes send them: a rank's start, a step, a collective, a pipeline stage's action,
a heartbeat, a GPU sample, a memory snapshot.

Each factory fills the fields a test does not care about with fixed values and takes the ones it does as
arguments; a module whose tests share a convention (steps 10 ms apart, four ranks a group) binds it once
with :func:`functools.partial`.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from meshtop.probes.events import (
    CollectiveTiming,
    Event,
    GpuSample,
    MemorySnapshot,
    RankProgress,
    RankStarted,
    StageAction,
    StepTiming,
)
from meshtop.recordings.metrics.gpus import LINKS
from meshtop.recordings.metrics.run import RunFold
from meshtop.recordings.metrics.steps import JobStep, StepFolder, StepRows
from meshtop.recordings.schema import table_of, tables_of

SECOND_NS = 1_000_000_000


def rank_started(
    rank: int,
    *,
    world_size: int = 0,
    restart: int = 0,
    pp_rank: int = 0,
    dp_rank: int = 0,
    **fields: Any,
) -> RankStarted:
    """Rank ``rank`` started (pid ``100 * (restart + 1) + rank``, on CPU, host ``h``); ``world_size`` 0: not said."""
    values: dict[str, Any] = {
        "pid": 100 * (restart + 1) + rank,
        "host": "h",
        "device": "cpu",
        "tp_rank": 0,
        "stages": (),
        "local_parameters": 10,
        "wall_ns": 0,
    }
    values.update(fields)
    return RankStarted(rank=rank, world_size=world_size, restart=restart, pp_rank=pp_rank, dp_rank=dp_rank, **values)


def step(
    rank: int,
    number: int = 0,
    duration_s: float = 0.1,
    *,
    start_ns: int | None = None,
    every_ns: int = SECOND_NS,
    tokens: int = 8,
    loss: float | None = 1.0,
    **fields: Any,
) -> StepTiming:
    """Rank ``rank``'s step ``number`` of ``duration_s``: it starts at ``number * every_ns`` unless ``start_ns``."""
    start = number * every_ns if start_ns is None else start_ns
    return StepTiming(rank=rank, step=number, start_ns=start, duration_s=duration_s, tokens=tokens, loss=loss, **fields)


def collective(
    rank: int,
    number: int | None = 0,
    seconds: float = 0.001,
    op: str = "all_reduce",
    *,
    every_ns: int = SECOND_NS,
    offset_ns: int = 0,
    waited: bool = False,
    group: str = "dp",
    group_size: int = 2,
    bytes: int = 1 << 20,
    **fields: Any,
) -> CollectiveTiming:
    """A collective of ``seconds`` in rank ``rank``'s step ``number`` (``None``: outside any step), starting
    ``offset_ns`` after the step's start (``number * every_ns``); ``waited``: a wait covered all of it."""
    start = (number or 0) * every_ns + offset_ns
    end = start + round(seconds * 1e9)
    values: dict[str, Any] = {"peer": None, "dtype": "float32", "clock": "completion"}
    values.update(fields)
    return CollectiveTiming(
        rank=rank,
        step=number,
        op=op,
        group=group,
        group_size=group_size,
        bytes=bytes,
        start_ns=start,
        end_ns=end,
        waited_ns=end - start if waited else None,
        **values,
    )


def stage_action(
    rank: int,
    number: int | None = 0,
    action: str = "forward",
    *,
    stage: int = 0,
    microbatch: int = 0,
    every_ns: int = SECOND_NS,
) -> StageAction:
    """Stage ``stage``'s ``action`` on ``microbatch`` in rank ``rank``'s step ``number`` (``None``: outside any
    step), for 1 ms from the step's start (``number * every_ns``)."""
    start = (number or 0) * every_ns
    return StageAction(
        rank=rank, step=number, stage=stage, microbatch=microbatch, action=action, start_ns=start, end_ns=start + 10**6
    )


def rank_progress(rank: int, number: int | None = 0, *, wall_ns: int = 0) -> RankProgress:
    """Rank ``rank``'s heartbeat in its step ``number`` (``None``: between steps), no collective in flight."""
    return RankProgress(
        rank=rank,
        wall_ns=wall_ns,
        step=number,
        in_flight=0,
        oldest_op=None,
        oldest_group=None,
        oldest_peer=None,
        oldest_start_ns=None,
    )


GPU_READINGS = (
    "name",
    "memory_used_bytes",
    "memory_total_bytes",
    "utilization_pct",
    "memory_utilization_pct",
    "power_w",
    "sm_clock_mhz",
    "temperature_c",
    "pcie_tx_bytes_per_s",
    "pcie_rx_bytes_per_s",
    "nvlink_tx_bytes_per_s",
    "nvlink_rx_bytes_per_s",
)
"""The readings a :class:`GpuSample` must be given; :func:`gpu_sample` leaves those not named unread."""


NO_LINKS = {name: {"mean": None, "peak": None} for name in LINKS}
"""A GPU's link figures where NVML gave no link rate (no NVLink, PCIe throughput not supported): unknown, not 0."""


def gpu_sample(*, gpu: int = 0, wall_ns: int = 0, **fields: Any) -> GpuSample:
    """GPU ``gpu``'s sample at ``wall_ns``: the readings in ``fields``, every other one ``None`` (not read)."""
    return GpuSample(gpu=gpu, wall_ns=wall_ns, **{**dict.fromkeys(GPU_READINGS, None), **fields})


def memory_snapshot(rank: int, peak_bytes: int, *, step: int = 0, wall_ns: int = 1, **fields: Any) -> MemorySnapshot:
    """Rank ``rank``'s memory at ``step``: everything it holds at its ``peak_bytes`` in weights, unless
    ``fields`` say otherwise; the device's readings not measured (CPU)."""
    measured: dict[str, Any] = {
        "weights_bytes": peak_bytes,
        "grads_bytes": 0,
        "optimizer_bytes": 0,
        "activations_bytes": None,
        "kv_cache_bytes": None,
        "allocated_bytes": peak_bytes,
        "reserved_bytes": peak_bytes,
        "peak_allocated_bytes": peak_bytes,
        "device_used_bytes": None,
        "device_total_bytes": None,
        "rss_bytes": None,
    }
    return MemorySnapshot(rank=rank, step=step, wall_ns=wall_ns, **{**measured, **fields})


def fold_events(fold: RunFold, events: Iterable[Event]) -> None:
    """Fold events made by hand through the door events come in by: a table a kind, in the fold's order."""
    for kind, table in tables_of(events):
        fold.apply(kind, table)


def reported(folder: StepFolder, *timings: StepTiming) -> list[JobStep]:
    """The job steps ``timings`` complete, taken as one table."""
    return folder.add(StepRows.of(table_of(timings))) if timings else []
