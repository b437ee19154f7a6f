"""A hand-built inference recording, written the way meshtop writes them (an EventWriter, a manifest, optionally
compacted to Parquet), dp2 x pp2, with known request times, so that every figure is worked out by hand:

request  replica  arrival  tokens at (ms)     TTFT  TPOT  gaps      e2e  tokens
0        0        0        20 30 40 50        20    10    10 10 10  50   4
1        1        0        40 55 70           40    15    15 15     70   3
2        0        50       110 130            60    20    20        80   2
3        1        50       80                 30    -     -         30   1
4        0        100      failed at 120 (out of memory)
5        -        -        never served (the job failed first)
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from meshtop.probes.events import Event, JobEnded, MemorySnapshot, RankStarted, RequestDone, StepTiming
from meshtop.recordings.manifest import RunDescription
from tests.kit.recordings import description
from tests.kit.recordings import write_recording as write_events

BASE_NS = 1_764_000_000_000_000_000
"""A wall clock of 2025: large enough that float64 would round it (the analysis must not)."""
MS = 1_000_000
KV_BYTES = 64 << 20
OOM = "out of memory: KV cache full"
WINDOW_S = 0.130
"""First arrival (0 ms) to last end (130 ms) of the completed requests."""


def run_description(
    *, concurrency: int = 2, slo_ttft_ms: float | None = 50, slo_tpot_ms: float | None = 12, requests: int | None = 6
) -> RunDescription:
    """An infer-mode run, dp2 x pp2; ``requests=None`` leaves the load section out (and so the SLOs)."""
    run = description(
        mode="infer",
        dp=2,
        pp=2,
        requests=requests or 6,
        concurrency=concurrency,
        prompt_len="8",
        output_len="1-4",
        max_batch=4,
        slo_ttft_ms=slo_ttft_ms,
        slo_tpot_ms=slo_tpot_ms,
    )
    return dataclasses.replace(run, load=None) if requests is None else run


def served(request: int, replica: int, arrival_ms: float, tokens_ms: list[float]) -> RequestDone:
    times = tuple(BASE_NS + int(t * MS) for t in tokens_ms)
    return RequestDone(
        rank=replica,
        replica=replica,
        request=request,
        arrival_ns=BASE_NS + int(arrival_ms * MS),
        first_token_ns=times[0],
        end_ns=times[-1],
        prompt_tokens=8,
        output_tokens=len(times),
        token_ns=times,
        output_ids=tuple(range(len(times))),
        status="completed",
        error=None,
    )


def failed(request: int, replica: int, arrival_ms: float, end_ms: float, error: str) -> RequestDone:
    return RequestDone(
        rank=replica,
        replica=replica,
        request=request,
        arrival_ns=BASE_NS + int(arrival_ms * MS),
        first_token_ns=None,
        end_ns=BASE_NS + int(end_ms * MS),
        prompt_tokens=8,
        output_tokens=0,
        token_ns=(),
        output_ids=(),
        status="failed",
        error=error,
    )


def the_requests() -> list[RequestDone]:
    return [
        served(0, 0, 0, [20, 30, 40, 50]),
        served(1, 1, 0, [40, 55, 70]),
        served(2, 0, 50, [110, 130]),
        served(3, 1, 50, [80]),
        failed(4, 0, 100, 120, OOM),
    ]


def iteration(rank: int, step: int, duration_ms: float, wait_ms: float | None) -> StepTiming:
    return StepTiming(
        rank=rank,
        step=step,
        start_ns=BASE_NS + step * 10 * MS,
        duration_s=duration_ms / 1e3,
        tokens=2,
        loss=None,
        pipeline_wait_s=None if wait_ms is None else wait_ms / 1e3,
    )


def engine_events() -> list[Event]:
    """Ranks (pp, dp): 0 (0, 0), 1 (0, 1), 2 (1, 0), 3 (1, 1); iterations with their pipeline waits; memory."""
    events: list[Event] = [
        RankStarted(
            rank=rank,
            pid=100 + rank,
            host="h",
            device="cpu",
            pp_rank=rank // 2,
            dp_rank=rank % 2,
            tp_rank=0,
            stages=(rank // 2,),
            local_parameters=500,
            wall_ns=BASE_NS - 10 * MS,
        )
        for rank in range(4)
    ]
    events += [iteration(0, step, d, w) for step, (d, w) in enumerate([(10, 2), (10, 2), (20, 4), (10, 2), (30, 6)])]
    events += [iteration(1, step, 10, 5) for step in range(3)]
    events += [iteration(2, step, 10, 1) for step in range(5)]
    events += [iteration(3, step, 10, None) for step in range(3)]
    events += [
        MemorySnapshot(
            rank=rank,
            step=4,
            wall_ns=BASE_NS + 60 * MS,
            weights_bytes=4 << 20,
            grads_bytes=0,
            optimizer_bytes=0,
            activations_bytes=None,
            kv_cache_bytes=KV_BYTES,
            allocated_bytes=None,
            reserved_bytes=None,
            peak_allocated_bytes=None,
            device_used_bytes=None,
            device_total_bytes=None,
            rss_bytes=300 << 20,
        )
        for rank in range(4)
    ]
    return events


def write_inference_recording(
    directory: Path, rows: list[RequestDone], *, parquet: bool = False, status: str = "failed", **load: Any
) -> Path:
    """The engine's events, ``rows`` and the job's end (``status``) as a recording of
    :func:`run_description` (``load``: its options) in ``directory``."""
    events = [
        *engine_events(),
        *rows,
        JobEnded(wall_ns=BASE_NS + 200 * MS, status=status, duration_s=0.2, root_cause_rank=None),
    ]
    return write_events(directory, events, run=run_description(**load), status=status, parquet=parquet)
