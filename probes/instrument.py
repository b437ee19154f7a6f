"""All of a worker's probes, installed and driven together.

The worker creates one :class:`Instrumentation`, calls :meth:`step_started`
and :meth:`step_ended` around each step, and every probe tags its events with
the current step. With ``enabled=False`` (``--no-instrument``) no hook is
installed; the worker still reports its step timings, so overhead can be
measured against an identical run.

The collective hooks use the C++ kernel the launcher built
(:mod:`meshtop.probes.native`) where there is one; where there is none, rank 0 says
why in a :class:`SamplerError`, and the Python kernel does the same work.

The probes hook private torch internals, which a torch release may rename.
A probe that cannot be installed (a missing internal, or any error while
installing) is left off, fully restored, and reported once per rank as a
:class:`ProbeOff`; the job runs on without it.

Benchmarks only: with :data:`OVERHEAD_BLOCK_ENV` set to N, the hooks switch
on and off every N steps (training) or inference ops, so one job times both
halves; the worker's loops know nothing of it.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Protocol

import torch

from meshtop.probes.activations import SavedActivations
from meshtop.probes.collectives import CollectiveProbe, GroupDirectory
from meshtop.probes.device_clock import DeviceClock
from meshtop.probes.events import Event, ProbeOff, RankProgress, SamplerError
from meshtop.probes.flight import FlightDumps
from meshtop.probes.losses import LossProbe, PendingLoss
from meshtop.probes.memory import MemoryProbe
from meshtop.probes.native import first_line, from_environment
from meshtop.probes.patching import MissingInternal
from meshtop.probes.phases import Phases, StepWindows
from meshtop.probes.pipeline import StageProbe
from meshtop.probes.sink import EventSink
from meshtop.probes.wire import NCCL_TIMING_ENV

OVERHEAD_BLOCK_ENV = "MESHTOP_OVERHEAD_BLOCK"
"""Benchmarks only (``tests/bench/overhead.py``): switch the hooks on and off every N steps, to time both in one
job. Read once, when the worker's :class:`Instrumentation` is made."""
COLLECTIVES, PIPELINE_STAGES, MEMORY, PHASES, LOSS = "collectives", "pipeline stages", "memory", "step phases", "loss"
"""The probes' names in :class:`ProbeOff`."""


class HookProbe(Protocol):
    """A probe that patches torch while the hooks are on."""

    def install(self) -> None: ...

    def uninstall(self) -> None: ...


def why_off(error: BaseException) -> str:
    """A probe's failure in one line: a missing internal says itself, anything else its type and message."""
    if isinstance(error, MissingInternal):
        return str(error)
    return f"{type(error).__name__}: {first_line(error)}"


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
        self._activations: SavedActivations | None = None
        self._phases: Phases | None = None
        self._losses: LossProbe | None = None
        self._installed = False
        self._off: set[str] = set()
        """Probes that could not be installed: reported once, never tried again in this process."""
        self._overhead_block = int(os.environ.get(OVERHEAD_BLOCK_ENV, "0")) if enabled else 0
        """N of :data:`OVERHEAD_BLOCK_ENV` (0: off); a run without hooks has nothing to switch."""
        self._flight = FlightDumps.from_environment(rank, on_error=self.report_error)
        """Answers the launcher's requests for torch's flight-recorder dump (hooks or not)."""

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
        """What the shipper sends besides the emitted events: finished collectives, then the heartbeat; and a
        flight-recorder dump where the launcher asked for one.

        Called on the shipper thread before each shipment.
        """
        self._flight.poll()
        self.flush()
        return [self.progress()]

    def flush(self) -> None:
        """Emit what the C++ kernel finished, and count what it had to drop as the sink's drops."""
        if self._collectives is not None and (dropped := self._collectives.flush()):
            self.sink.drop(dropped)

    def progress(self) -> RankProgress:
        """This rank's heartbeat: its step and the oldest collective it waits on (called off the training thread)."""
        collectives = self._collectives if self._installed and COLLECTIVES not in self._off else None
        count, oldest = collectives.oldest_in_flight() if collectives is not None else (0, None)
        return RankProgress(
            rank=self.rank,
            wall_ns=time.time_ns(),
            step=self.step,
            in_flight=count,
            oldest_op=oldest.shape.op if oldest else None,
            oldest_group=oldest.group.name if oldest else None,
            oldest_peer=oldest.peer if oldest else None,
            oldest_start_ns=oldest.start_ns if oldest else None,
        )

    def install(self, *, groups: GroupDirectory, pipeline: bool, phases: bool = False, loss: bool = False) -> None:
        """Hook collectives (and pipeline stages, and with ``phases`` the step's phases: training) before the
        job is built, so set-up traffic is seen too.

        ``groups`` names the process groups (it may learn more of them later: a user's DeviceMesh). ``loss``
        reads the losses the rank differentiates (a user's script: the built-in runner reports its own)."""
        device_timing = self.device.type == "cuda" and os.environ.get(NCCL_TIMING_ENV) == "1"
        native, why_not = from_environment() if self.device.type == "cpu" else (None, None)
        if why_not is not None and self.rank == 0:
            self.report_error(f"{why_not}; the Python kernel times collectives instead (about 100 us more each)")
        self._collectives = CollectiveProbe(
            rank=self.rank,
            groups=groups,
            emit=self.emit,
            step=self.current_step,
            device_timing=device_timing,
            on_error=self.report_error,
            native=native,
            emit_lines=self.sink.emit_lines,
        )
        if pipeline:
            self._stages = StageProbe(rank=self.rank, emit=self.emit, step=self.current_step)
        if phases:
            self._phases = Phases(DeviceClock() if self.device.type == "cuda" else None)
        if loss:
            self._losses = LossProbe(self.device)
        if self.enabled:
            self._hook()

    def add_stage_probe(self, on_stage: Callable[[tuple[int, ...]], None]) -> None:
        """Time pipeline stages from now on (a user's script imports ``torch.distributed.pipelining`` after
        :meth:`install`); ``on_stage`` learns this rank's stages as it first runs each."""
        if self._stages is not None:
            return
        self._stages = StageProbe(rank=self.rank, emit=self.emit, step=self.current_step, on_stage=on_stage)
        if self._installed:
            self._install_or_report(PIPELINE_STAGES, self._stages)

    def pipeline_wait_s(self) -> float | None:
        """Seconds blocked on pipeline P2P since the last call, where that is measured."""
        stages = self._stages if self.enabled and PIPELINE_STAGES not in self._off else None
        return stages.take_wait_s() if stages is not None else None

    @property
    def phases(self) -> Phases | None:
        """The step-phases probe while its hooks are in (a worker marks its own data loading on it)."""
        return self._phases if self._installed and PHASES not in self._off else None

    def take_phases(self) -> StepWindows | None:
        """The step's phase windows (:meth:`Phases.take`), where they are measured."""
        phases = self.phases
        return phases.take() if phases is not None else None

    def take_loss(self) -> PendingLoss | None:
        """The step's losses (:meth:`LossProbe.take`), where they are read: ``None`` without the loss probe, or
        while the hooks are out."""
        losses = self._losses if self._installed and LOSS not in self._off else None
        return losses.take() if losses is not None else None

    def read_schedule_losses(self) -> None:
        """Read pipeline schedules' losses too, from now on (a user's script imported pipelining); where torch
        lacks the internal, said as the loss probe's, whose other losses are still read."""
        if self._losses is None or LOSS in self._off:
            return
        try:
            self._losses.want_schedule()
        except Exception as error:  # a probe must never break the job it measures: reported, the rest kept
            self.emit(ProbeOff(rank=self.rank, wall_ns=time.time_ns(), probe=LOSS, reason=why_off(error)))

    def watch_memory(self, *, parameters: list[torch.Tensor], optimizer: torch.optim.Optimizer | None) -> None:
        """Account the memory of ``parameters`` and ``optimizer`` from now on (off, and said so, where that
        fails)."""
        try:
            self._memory = MemoryProbe(rank=self.rank, parameters=parameters, optimizer=optimizer, device=self.device)
        except Exception as error:  # a probe must never break the job it measures: reported, left off
            self._probe_off(MEMORY, error)

    def watch_activations(self, activations: SavedActivations) -> None:
        """Report ``activations``' peak per step as the step's activations (measured, CPU and CUDA)."""
        self._activations = activations

    def set_enabled(self, enabled: bool) -> None:
        """Turn the hooks on or off between steps."""
        if enabled and not self._installed:
            self._hook()
        elif not enabled and self._installed:
            self._unhook()
        self.enabled = enabled

    def _hook_probes(self) -> list[tuple[str, HookProbe]]:
        """The probes that patch torch, by name, in install order, less those left off.

        They are taken out in reverse order: a probe that wraps what an earlier one patched (the loss probe's
        ``torch.autograd.backward`` over the phases probe's) comes after it, so switching the hooks off puts
        back each function as it was."""
        probes: list[tuple[str, HookProbe | None]] = [
            (COLLECTIVES, self._collectives),
            (PIPELINE_STAGES, self._stages),
            (PHASES, self._phases),
            (LOSS, self._losses),  # after the phases probe: it wraps the torch.autograd.backward that one put in
        ]
        return [(name, probe) for name, probe in probes if probe is not None and name not in self._off]

    def _hook(self) -> None:
        for name, probe in self._hook_probes():
            self._install_or_report(name, probe)
        self._installed = True

    def _install_or_report(self, name: str, probe: HookProbe) -> None:
        """Install ``probe``; where that fails, take out whatever it had put in and report it off."""
        try:
            probe.install()
        except Exception as error:  # a probe must never break the job it measures: reported, left off
            self._probe_off(name, error, undo=probe.uninstall)

    def _probe_off(self, name: str, error: BaseException, undo: Callable[[], None] | None = None) -> None:
        """Leave probe ``name`` off for the rest of the run (after ``undo``) and say why, once."""
        reason = why_off(error)
        if undo is not None:
            try:
                undo()
            except Exception as undo_error:  # said in the same event: the probe may be left half-installed
                reason += f"; and undoing it failed: {why_off(undo_error)}"
        self._off.add(name)
        self.emit(ProbeOff(rank=self.rank, wall_ns=time.time_ns(), probe=name, reason=reason))

    def _switch_for_benchmark(self, step: int) -> None:
        """:data:`OVERHEAD_BLOCK_ENV`: hooks on in even blocks of steps, off in odd ones, switched between steps;
        it lives here, not in tests/bench/, because only the instrumentation sees every rank's steps and inference
        ops in every kind of job, and a rank's process has no other door a benchmark could use (the script
        runner's bootstrap takes its ``sitecustomize``)."""
        if self._overhead_block and step % self._overhead_block == 0:
            self.set_enabled((step // self._overhead_block) % 2 == 0)

    def step_started(self, step: int) -> None:
        self._switch_for_benchmark(step)
        self.step = step
        if self.enabled and self._memory is not None:
            self._memory.step_started()

    def set_step(self, step: int | None) -> None:
        """Tag what follows with ``step`` (an inference op; ``None``: between ops), without a step's memory
        bookkeeping."""
        if step is not None:
            self._switch_for_benchmark(step)
        self.step = step

    def memory_snapshot(self, step: int, *, kv_cache_bytes: int | None) -> None:
        """Report memory now (inference: a few times a second rather than after every op)."""
        if self.enabled and self._memory is not None:
            self.emit(self._memory.snapshot(step, kv_cache_bytes=kv_cache_bytes))

    def step_ended(self, step: int) -> float | None:
        """Close the step; the seconds it spent blocked on pipeline P2P, where that was measured."""
        if self.enabled and self._memory is not None:
            saved = self._activations.take_peak() if self._activations is not None else None
            self.emit(self._memory.snapshot(step, saved_activations_bytes=saved))
        self.step = None
        return self.pipeline_wait_s()

    def uninstall(self) -> None:
        """Take the hooks out for good, and emit what the C++ kernel finished (so a sink that is closed next has
        it)."""
        if self._installed:
            self._unhook()
        if self._phases is not None:
            self._phases.close()

    def _unhook(self) -> None:
        """Take the hooks out until :meth:`_hook` (the overhead benchmark's switching, inside a step's hooks)."""
        for _name, probe in reversed(self._hook_probes()):
            probe.uninstall()
        self.flush()
        self._installed = False
