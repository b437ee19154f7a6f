"""The device's time of a window of host calls, on the host's wall clock, without a synchronisation.

A GPU runs what the host queued later than the host queued it, so a host clock around ``forward()`` measures
the queueing, not the work. Rules:

- **A device mark** is a timing event recorded on the current stream where a window opens or closes
  (``torch.cuda.Event(enable_timing=True).record()``): it completes when the device reaches that point of
  the stream, after the work queued before it.
- **The anchor** places device time on the host clock: an event recorded while the current stream has
  nothing queued (``Stream.query()``), so the device reaches it at once, paired with the host's
  ``time.time_ns()`` then. A mark's host time is the anchor's plus ``anchor.elapsed_time(mark)``. The anchor
  is renewed at each step's end where the stream is idle then (the built-in runner synchronises each step;
  a script's stream drains at least where it reads a value); the two clocks drift apart by parts per
  million, microseconds over a minute.
- **Read when complete, never waited on**: a step's marks are read once every one has completed
  (``Event.query()``); before the first anchor (a stream never seen idle), device windows cannot be placed
  and the host's are kept.

Events are made through ``event_factory`` and the stream asked through ``stream_idle``, so the rules are
tested on a machine without a GPU with a scripted device (tests/probes/test_device_clock.py); the real ones
are checked on a GPU (tests/probes/test_gpu.py).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol


class Mark(Protocol):
    """What the clock needs of an event: torch.cuda.Event's own methods."""

    def record(self) -> None: ...

    def query(self) -> bool: ...

    def elapsed_time(self, end_event: Any) -> float: ...


def cuda_event() -> Mark:
    import torch

    return torch.cuda.Event(enable_timing=True)


def cuda_stream_idle() -> bool:
    import torch

    return bool(torch.cuda.current_stream().query())


def cuda_capturing() -> bool:
    """Whether the current stream is capturing a CUDA graph (``torch.compile``'s reduce-overhead mode): an event
    recorded then would be part of the graph, or refused."""
    import torch

    return bool(torch.cuda.is_current_stream_capturing())


@dataclass(frozen=True, slots=True)
class StreamSpan:
    """A blocking nccl operation's time on the device where torch returns no work to follow: python collectives
    without ``async_op`` (``dist.all_reduce(t)``, ``dist.barrier()``) may reach the kernel with none, where DDP's
    and the functional collectives' ops have one. Two CUDA events on the current stream, recorded before the
    call and after it, bracket the operation: nccl's stream waits for the current one before it starts, and a
    blocking call leaves the current stream waiting for its end. It reads as a work does
    (:class:`meshtop.probes.nccl_timing.NcclTimings`)."""

    opened: Mark
    closed: Mark

    def is_completed(self) -> bool:
        return bool(self.closed.query())

    def _get_duration(self) -> float:
        """Milliseconds, as ``Work._get_duration``."""
        return float(self.opened.elapsed_time(self.closed))


def cuda_mark() -> Any:
    """A timing event recorded on the current CUDA stream now; ``None`` while a CUDA graph is captured."""
    if cuda_capturing():
        return None
    event = cuda_event()
    event.record()
    return event


def poll(ready: Callable[[], bool], timeout_s: float, interval_s: float = 0.001) -> bool:
    """Ask ``ready`` until it says yes, for at most ``timeout_s``: where the device was synchronised already, or
    at exit (a device that hung is not waited on longer)."""
    deadline = time.monotonic() + timeout_s
    while not ready():
        if time.monotonic() > deadline:
            return False
        time.sleep(interval_s)
    return True


class DeviceClock:
    """Device marks, and their host-clock times once they have completed."""

    def __init__(
        self,
        *,
        event_factory: Callable[[], Mark] = cuda_event,
        stream_idle: Callable[[], bool] = cuda_stream_idle,
        host_ns: Callable[[], int] = time.time_ns,
        capturing: Callable[[], bool] = cuda_capturing,
    ) -> None:
        self._event = event_factory
        self._idle = stream_idle
        self._capturing = capturing
        self._broken = False
        """An event could not be recorded (a driver's error): no more marks, every window the host's."""
        self._host_ns = host_ns
        self._anchor: tuple[Mark, int] | None = None
        """The anchor read from (completed)."""
        self._next_anchor: tuple[Mark, int] | None = None
        """The newest anchor, until its event has completed."""

    def mark(self) -> Mark | None:
        """A mark here in the current stream; ``None`` while a CUDA graph is being captured, or once recording
        one failed (those windows keep the host's times)."""
        if self._broken:
            return None
        try:
            if self._capturing():
                return None
            event = self._event()
            event.record()
        except Exception:  # a probe never breaks the job it measures: the host's windows from here on
            self._broken = True
            return None
        return event

    def anchor_if_idle(self) -> None:
        """Renew the anchor where the current stream has nothing queued (called at a step's end)."""
        if self._idle() and (mark := self.mark()) is not None:
            self._next_anchor = (mark, self._host_ns())

    def complete(self, marks: list[Mark]) -> bool:
        """Whether every one of ``marks`` has completed, and the newest anchor with them (it was recorded on an
        idle stream: it completes at once)."""
        if self._next_anchor is not None:
            if not self._next_anchor[0].query():
                return False
            self._anchor, self._next_anchor = self._next_anchor, None
        return all(mark.query() for mark in marks)

    def host_ns(self, marks: list[Mark]) -> list[int] | None:
        """The host-clock time of each of ``marks`` (once :meth:`complete`), or ``None`` before any anchor."""
        if self._anchor is None:
            return None
        event, anchor_ns = self._anchor
        return [anchor_ns + round(event.elapsed_time(mark) * 1e6) for mark in marks]
