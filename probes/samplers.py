"""Node samplers in the meshtop process: NVML per GPU (10 Hz) and psutil per rank (2 Hz).

Each sampler is a thread that reads at its rate and hands events to a
callback; a failed reading becomes a :class:`SamplerError` event and the
sampler goes on. A late sample is not made up for: the next one is taken
at the next tick.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import psutil

from meshtop.probes.events import Event, ProcessSample, SamplerError
from meshtop.probes.nvml import Nvml

DEFAULT_GPU_HZ = 10.0
DEFAULT_PROCESS_HZ = 2.0


class Sampler:
    """Calls :meth:`sample` ``rate_hz`` times a second on its own thread."""

    name = "sampler"

    def __init__(self, *, rate_hz: float, emit: Callable[[list[Event]], None]) -> None:
        if rate_hz <= 0:
            raise ValueError("a sampler's rate must be positive")
        self.period_s = 1.0 / rate_hz
        self.emit = emit
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"meshtop-{self.name}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=2.0)

    def sample(self) -> list[Event]:
        raise NotImplementedError

    def _run(self) -> None:
        deadline = time.monotonic()
        while not self._stop.is_set():
            try:
                self.emit(self.sample())
            except Exception as error:  # a sampler reports and carries on
                self.emit([SamplerError(wall_ns=time.time_ns(), sampler=self.name, message=repr(error))])
            deadline += self.period_s
            delay = deadline - time.monotonic()
            if delay < 0:  # late: skip the missed ticks
                deadline = time.monotonic()
                delay = 0
            self._stop.wait(delay)


class GpuSampler(Sampler):
    """One :class:`GpuSample` per visible GPU per tick; the NVML state and topology once."""

    name = "gpu"

    def __init__(
        self, *, rate_hz: float = DEFAULT_GPU_HZ, emit: Callable[[list[Event]], None], nvml: Nvml | None = None
    ) -> None:
        super().__init__(rate_hz=rate_hz, emit=emit)
        self.nvml = nvml if nvml is not None else Nvml()
        self._announced = False

    def sample(self) -> list[Event]:
        events: list[Event] = []
        if not self._announced:
            self._announced = True
            events.append(self.nvml.state_event())
            events.extend(self.nvml.topology())
        if self.nvml.state == "ok":
            events.extend(self.nvml.samples())
        return events

    def stop(self) -> None:
        super().stop()
        self.nvml.close()


class ProcessSampler(Sampler):
    """CPU %, RSS and threads of every rank's process, once the rank has said its pid."""

    name = "process"

    def __init__(self, *, rate_hz: float = DEFAULT_PROCESS_HZ, emit: Callable[[list[Event]], None]) -> None:
        super().__init__(rate_hz=rate_hz, emit=emit)
        self._processes: dict[int, psutil.Process] = {}
        self._lock = threading.Lock()

    def watch(self, rank: int, pid: int) -> None:
        try:
            process = psutil.Process(pid)
            process.cpu_percent()  # the first reading only primes the counter
        except psutil.Error:
            return
        with self._lock:
            self._processes[rank] = process

    def sample(self) -> list[Event]:
        with self._lock:
            processes = list(self._processes.items())
        events: list[Event] = []
        for rank, process in processes:
            try:
                with process.oneshot():
                    events.append(
                        ProcessSample(
                            rank=rank,
                            pid=process.pid,
                            wall_ns=time.time_ns(),
                            cpu_pct=process.cpu_percent(),
                            rss_bytes=process.memory_info().rss,
                            threads=process.num_threads(),
                        )
                    )
            except psutil.NoSuchProcess:
                with self._lock:
                    self._processes.pop(rank, None)
            except psutil.Error as error:
                events.append(
                    SamplerError(wall_ns=time.time_ns(), sampler=self.name, message=f"rank {rank}: {error!r}")
                )
        return events
