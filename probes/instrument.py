"""All of a worker's probes, installed and driven together.

The worker creates one :class:`Instrumentation`, calls :meth:`step_started`
and :meth:`step_ended` around each step, and every probe tags its events with
the current step. With ``enabled=False`` (``--no-instrument``) no hook is
installed; the worker still reports its step timings, so overhead can be
measured against an identical run.

The collective hooks use the C++ kernel the launcher built
(:mod:`probes.native`) where there is one; where there is none, rank 0 says
why in a :class:`SamplerError`, and the Python kernel does the same work.
"""

from __future__ import annotations

import os
import time
from typing import Any

import torch
from torch import nn

from probes.collectives import CollectiveProbe, GroupDirectory
from probes.events import Event, RankProgress, SamplerError
from probes.memory import MemoryProbe
from probes.native import from_environment
from probes.pipeline import StageProbe
from probes.sink import EventSink
from probes.wire import NCCL_TIMING_ENV


class Instrumentation:
    def __init__(self, *, rank: int, sink: EventSink, device: torch.device, enabled: bool) -> None:
        self.rank = rank
        self.sink = sink
        self.device = device
        self.enabled = enabled
        self._step: int | None = None
        self._collectives: CollectiveProbe | None = None
        self._stages: StageProbe | None = None
        self._memory: MemoryProbe | None = None
        self._installed = False

    def emit(self, event: Event) -> None:
        self.sink.emit(event)

    def report_error(self, message: str) -> None:
        self.sink.emit(SamplerError(wall_ns=time.time_ns(), sampler=f"rank {self.rank}", message=message))

    @property
    def step(self) -> int | None:
        """The step (or inference op) the worker is in, which the probes tag their events with."""
        return self._step

    @step.setter
    def step(self, step: int | None) -> None:
        self._step = step
        if self._collectives is not None:
            self._collectives.step_changed(step)

    @property
    def collective_kernel(self) -> str | None:
        """Which kernel times collectives: ``cpp``, ``python``, or ``None`` before :meth:`install`."""
        if self._collectives is None:
            return None
        return "cpp" if self._collectives.native is not None else "python"

    def current_step(self) -> int | None:
        return self._step

    def shipment(self) -> list[Event]:
        """What the shipper sends besides the emitted events: finished collectives, then the heartbeat.

        Called on the shipper thread before each shipment.
        """
        self._flush_collectives()
        return [self.progress()]

    def _flush_collectives(self) -> None:
        """Emit what the C++ kernel finished, and count what it had to drop as the sink's drops."""
        if self._collectives is not None and (dropped := self._collectives.flush()):
            self.sink.drop(dropped)

    def progress(self) -> RankProgress:
        """This rank's heartbeat: its step and the oldest collective it waits on (called off the training thread)."""
        count, oldest = self._collectives.oldest_in_flight() if self._installed and self._collectives else (0, None)
        return RankProgress(
            rank=self.rank, wall_ns=time.time_ns(), step=self.step, in_flight=count,
            oldest_op=oldest.shape.op if oldest else None, oldest_group=oldest.group.name if oldest else None,
            oldest_peer=oldest.peer if oldest else None, oldest_start_ns=oldest.start_ns if oldest else None,
        )

    def install(self, *, mesh: Any, pipeline: bool) -> None:
        """Hook collectives (and pipeline stages) before the job is built, so set-up traffic is seen too."""
        device_timing = self.device.type == "cuda" and os.environ.get(NCCL_TIMING_ENV) == "1"
        native, why_not = from_environment() if self.device.type == "cpu" else (None, None)
        if why_not is not None and self.rank == 0:
            self.report_error(f"{why_not}; the Python kernel times collectives instead (about 100 us more each)")
        self._collectives = CollectiveProbe(rank=self.rank, groups=GroupDirectory.from_mesh(mesh), emit=self.emit,
                                            step=self.current_step, device_timing=device_timing,
                                            on_error=self.report_error, native=native)
        if pipeline:
            self._stages = StageProbe(rank=self.rank, emit=self.emit, step=self.current_step)
        if self.enabled:
            self._hook()

    def watch_memory(self, *, modules: list[nn.Module], optimizer: torch.optim.Optimizer | None) -> None:
        self._memory = MemoryProbe(rank=self.rank, modules=modules, optimizer=optimizer, device=self.device)

    def set_enabled(self, enabled: bool) -> None:
        """Turn the hooks on or off between steps (the overhead benchmark alternates them)."""
        if enabled and not self._installed:
            self._hook()
        elif not enabled and self._installed:
            self.uninstall()
        self.enabled = enabled

    def _hook(self) -> None:
        for probe in (self._collectives, self._stages):
            if probe is not None:
                probe.install()
        self._installed = True

    def step_started(self, step: int) -> None:
        self.step = step
        if self.enabled and self._memory is not None:
            self._memory.step_started()

    def set_step(self, step: int | None) -> None:
        """Tag what follows with ``step`` (an inference op; ``None``: between ops), without a step's memory
        bookkeeping."""
        self.step = step

    def memory_snapshot(self, step: int, *, kv_cache_bytes: int | None) -> None:
        """Report memory now (inference: a few times a second rather than after every op)."""
        if self.enabled and self._memory is not None:
            self.emit(self._memory.snapshot(step, kv_cache_bytes=kv_cache_bytes))

    def step_ended(self, step: int) -> float | None:
        """Close the step; the seconds it spent blocked on pipeline P2P, where that was measured."""
        if self.enabled and self._memory is not None:
            self.emit(self._memory.snapshot(step))
        self.step = None
        return self._stages.take_wait_s() if self.enabled and self._stages is not None else None

    def uninstall(self) -> None:
        """Take the hooks out, and emit what the C++ kernel finished (so a sink that is closed next has it)."""
        if not self._installed:
            return
        for probe in (self._stages, self._collectives):
            if probe is not None:
                probe.uninstall()
        self._flush_collectives()
        self._installed = False
