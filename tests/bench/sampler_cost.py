"""Sampler cost: CPU time of the NVML and psutil samplers at their default rates, as a share of one core.

The samplers run in this process as they run in meshtop's, the psutil one
watching 8 processes (one per GPU of an 8-GPU node; here idle ``sleep``
processes: what a reading costs does not depend on what the process does).
Windows with the samplers running alternate with baseline windows without
them; each pair gives (process CPU time with - without) / wall time. The
sampler threads' own CPU time (the kernel's per-thread clock) is reported
too, as a check that the difference is theirs.
"""

from __future__ import annotations

import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

from meshtop.probes.nvml import Nvml
from meshtop.probes.samplers import (
    DEFAULT_GPU_HZ,
    DEFAULT_PROCESS_HZ,
    GpuSampler,
    ProcessSampler,
)
from tests.bench.figures import Row, Spread, Target, median

WATCHED = 8
WINDOW_S = 2.0
TARGET = Target(high=1.0)
"""Per cent of one core."""


@contextmanager
def idle_processes(count: int) -> Iterator[list[int]]:
    """``count`` idle processes to watch; stopped on exit."""
    children = [subprocess.Popen(["sleep", "600"]) for _ in range(count)]
    try:
        yield [child.pid for child in children]
    finally:
        for child in children:
            child.kill()
            child.wait()


def thread_cpu_s(threads: list[threading.Thread]) -> float:
    """CPU seconds the live ``threads`` have used since they started (the kernel's per-thread clock)."""
    return sum(time.clock_gettime(time.pthread_getcpuclockid(t.ident)) for t in threads if t.ident is not None)


def window(pids: list[int] | None) -> tuple[float, float, int]:
    """One window: process CPU seconds, the sampler threads' CPU seconds, events; samplers only with ``pids``."""
    samplers, events = [], []
    if pids is not None:
        samplers = [GpuSampler(emit=events.extend), ProcessSampler(emit=events.extend)]
        for rank, pid in enumerate(pids):
            samplers[1].watch(rank, pid)
    before = set(threading.enumerate())
    cpu0 = time.process_time()
    for sampler in samplers:
        sampler.start()
    time.sleep(WINDOW_S)
    threads_s = thread_cpu_s([t for t in threading.enumerate() if t not in before])
    for sampler in samplers:
        sampler.stop()
    return time.process_time() - cpu0, threads_s, len(events)


def rows(reps: int = 5) -> list[Row]:
    nvml = Nvml()
    shares, thread_shares, events = [], [], 0
    with idle_processes(WATCHED) as pids:
        for _ in range(reps):
            base_s, _, _ = window(None)
            used_s, thread_s, count = window(pids)
            shares.append((used_s - base_s) / WINDOW_S * 100)
            thread_shares.append(thread_s / WINDOW_S * 100)
            events += count
    gpu_note = (
        f"NVML {nvml.state}" + (f" ({nvml.detail})" if nvml.detail else "") + ": the GPU sampler only ticks"
        if nvml.state != "ok"
        else f"NVML ok, {len(nvml.handles)} GPU(s)"
    )
    nvml.close()
    return [
        Row(
            "samplers",
            f"NVML {DEFAULT_GPU_HZ:g} Hz + psutil {DEFAULT_PROCESS_HZ:g} Hz x {WATCHED} procs",
            median(shares),
            "% of a core",
            Spread.of(shares),
            TARGET,
            note=f"{gpu_note}; sampler threads {median(thread_shares):.3f} %",
            details={
                "window_s": WINDOW_S,
                "process_share_pct": shares,
                "thread_share_pct": thread_shares,
                "events": events,
                "nvml_state": nvml.state,
            },
        )
    ]
