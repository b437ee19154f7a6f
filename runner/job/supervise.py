"""What meshtop runs beside a child process it supervises (a job's launcher, a load generator): the collector
its processes send to, this node's samplers, and the batches they make together, until the child ends or is
stopped.

:func:`meshtop.runner.job.launch.run_job` and :func:`meshtop.runner.serving.run.run_endpoint` each start their
child and say how it ended; the batches, the counts of what the collector dropped or refused, the polling
loop and the closing lifecycle events are this module's, so a job and a load are watched alike.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from meshtop.probes.arrivals import Arrivals
from meshtop.probes.collector import Collector
from meshtop.probes.events import Event, EventsDropped, FramesRefused, on_node
from meshtop.probes.samplers import DEFAULT_GPU_HZ, DEFAULT_PROCESS_HZ, GpuSampler, ProcessSampler
from meshtop.runner.results import JobResult, lifecycle_events

POLL_S = 0.2
"""How often a batch is gathered while the child runs."""


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeProbes:
    """The samplers meshtop runs beside the job, and their rates."""

    gpu_hz: float = DEFAULT_GPU_HZ
    process_hz: float = DEFAULT_PROCESS_HZ


class Supervisor:
    """A child's collector and this node's samplers, gathered into one batch at a time for ``on_events``.

    ``examine`` sees each batch first and may add to it (the job's hang watch, its stack dumps). The node's
    samples name ``node`` (on a node other than the head, the head tells them from its own). A batch also
    counts what the collector dropped (its queue full) or refused (:class:`FramesRefused`) since the last one,
    so a loss is said where it happened.
    """

    def __init__(
        self,
        collector: Collector,
        probes: NodeProbes,
        *,
        on_events: Callable[[Arrivals], None],
        examine: Callable[[Arrivals], None] = lambda arrivals: None,
        node: int = 0,
    ) -> None:
        self.collector = collector
        self._on_events = on_events
        self._examine = examine
        self._node = node
        self._node_events: queue.SimpleQueue[list[Event]] = queue.SimpleQueue()
        self.processes = ProcessSampler(rate_hz=probes.process_hz, emit=self.emit)
        """Samples the processes it is told to watch (:meth:`ProcessSampler.watch`)."""
        self._samplers = (GpuSampler(rate_hz=probes.gpu_hz, emit=self.emit), self.processes)
        self._dropped = 0
        self._refused: dict[str, int] = {}

    def emit(self, events: list[Event]) -> None:
        """Events of this node's own (a sampler's, a scraper's), into the next batch."""
        self._node_events.put(events)

    def start_sampling(self) -> None:
        for sampler in self._samplers:
            sampler.start()

    def stop_sampling(self) -> None:
        for sampler in self._samplers:
            sampler.stop()

    def send_batch(self) -> None:
        """What came in since the last batch, through ``examine`` to ``on_events``."""
        arrivals = Arrivals(self.collector.drain())
        while not self._node_events.empty():
            events = self._node_events.get()
            arrivals.add([on_node(e, offset_ns=0, node=self._node) for e in events] if self._node else events)
        now = time.time_ns()
        counts = self.collector.counts
        if counts.queue_full != self._dropped:
            arrivals.add(
                [EventsDropped(wall_ns=now, rank=None, where="collector", count=counts.queue_full - self._dropped)]
            )
            self._dropped = counts.queue_full
        for reason, count in (
            ("bad token", counts.bad_token),
            ("malformed", counts.malformed),
            ("oversized", counts.oversized),
            ("unknown node", counts.unknown_node),
        ):
            if count != self._refused.get(reason, 0):
                arrivals.add([FramesRefused(wall_ns=now, reason=reason, count=count - self._refused.get(reason, 0))])
                self._refused[reason] = count
        self._examine(arrivals)
        self._on_events(arrivals)

    def follow(
        self, running: Callable[[], bool], stop: threading.Event, go_on: Callable[[], bool] = lambda: True
    ) -> None:
        """Send a batch every :data:`POLL_S` while the child is ``running`` and ``stop`` is not set; ``go_on``,
        asked after each batch, ends the watch early where it says ``False``."""
        while running() and not stop.is_set():
            self.send_batch()
            if not go_on():
                return
            stop.wait(POLL_S)

    def last_batch(self) -> None:
        """Once the child ended: what it sent last, and the collector stopped."""
        self.send_batch()
        self.collector.stop()

    def say_ended(self, result: JobResult) -> None:
        """How the child ended, as lifecycle events (its ranks' exits and the job's end)."""
        self._on_events(Arrivals(lifecycle_events(result)))
