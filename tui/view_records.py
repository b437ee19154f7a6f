"""What the dashboard's state hands its screen: a rank's and a GPU's views, a collectives row with its
history, a pipeline step's timeline, an inference run's requests (:class:`meshtop.tui.state.DashboardState`
keeps and fills them; the panels draw them)."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from meshtop.probes.events import GpuSample, RankExited
from meshtop.recordings.metrics.collectives import CollectiveRow
from meshtop.recordings.metrics.requests import RequestFigures
from meshtop.recordings.metrics.server import ServerFigures

HISTORY = 240
"""Points kept for each chart (steps, utilisation, power, CPU)."""


@dataclass(slots=True)
class RankView:
    """One rank as the dashboard knows it."""

    rank: int
    pid: int | None = None
    device: str | None = None
    host: str | None = None
    node: int = 0
    """The node of a multi-node job it runs on (0, the head, on one machine)."""
    pp_rank: int = 0
    dp_rank: int = 0
    tp_rank: int = 0
    cpu_pct: float | None = None
    rss_bytes: int | None = None
    threads: int | None = None
    cpu_history: deque[float] = field(default_factory=lambda: deque(maxlen=HISTORY))
    exited: RankExited | None = None

    @property
    def status(self) -> str:
        if self.exited is None:
            return "running" if self.pid is not None else "starting"
        if self.exited.exit_code == 0:
            return "exited 0"
        if self.exited.signal:
            return f"killed by {self.exited.signal}"
        if self.exited.exit_code is None:
            return "stopped"
        return f"exit {self.exited.exit_code}"


@dataclass(slots=True)
class GpuView:
    """One GPU's latest NVML reading and its recent history."""

    gpu: int
    sample: GpuSample
    node: int = 0
    utilization: deque[float] = field(default_factory=lambda: deque(maxlen=HISTORY))
    power_w: deque[float] = field(default_factory=lambda: deque(maxlen=HISTORY))


@dataclass(frozen=True, slots=True)
class CollectiveLine:
    """A (group, op) row of the collectives table: the core's figures and the recent exposed times."""

    figures: CollectiveRow
    history: tuple[float, ...]
    """The job's exposed seconds in this op, per recent closed step."""


@dataclass(frozen=True, slots=True)
class Segment:
    """One stage action on the timeline, in seconds from the start of its step."""

    start_s: float
    end_s: float
    action: str
    microbatch: int


@dataclass(frozen=True, slots=True)
class PipelineStep:
    step: int
    span_s: float
    lanes: dict[int, tuple[Segment, ...]]
    """Segments per pipeline rank (its first dp / tp copy)."""
    bubble: dict[int, float]
    """Idle share of the step per pipeline stage (its copies' mean busy time)."""


@dataclass(frozen=True, slots=True)
class RequestsView:
    """What the requests panel and the header show of an inference run."""

    figures: RequestFigures
    total: int | None
    history: dict[str, tuple[float, ...]]
    """Recent values of each latency, oldest first."""
    server: ServerFigures | None = None
    """An endpoint's engine, from its ``/metrics``."""
    server_history: dict[str, tuple[float, ...]] = field(default_factory=dict)
    """Recent values of each of the engine's gauges, a scrape each, oldest first."""

    def p50_p99(self, name: str) -> tuple[float | None, float | None]:
        latency = self.figures.latencies[name]
        return latency["p50"], latency["p99"]
