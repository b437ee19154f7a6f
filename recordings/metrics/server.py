"""The serving engine's own view, from its scraped ``/metrics`` (an endpoint's load): each figure once.

Rules:

- a scrape is the series of one ``wall_ns``; a series left out of a scrape (unchanged) keeps its last value;
  replicas (``--endpoint URL1,URL2``) are scraped in one round, at one ``wall_ns``, each series with its
  replica's index;
- a common series (``server_metric.common``, named by the scraper for the engines it knows) is, at each
  scrape, the sum of its label sets' values over every replica (several engines, ranks or replicas each
  publish their own queue: the requests waiting and running add up, as do the counters), except
  ``kv_cache_usage``, a share: its largest (the fullest cache is the one that preempts);
- gauges (``requests_running``, ``requests_waiting``, ``kv_cache_usage``): mean and max over the scrapes
  during the load, and the recent values for the dashboard;
- counters (``preemptions``, ``prompt_tokens``, ``generation_tokens``): their increase from the first
  scrape to the last (what the load added; a counter that went down, a server restart, counts from there);
- a gauge's thirds: its mean over the first third of the scrapes and over the last third (``n // 3`` scrapes
  each, from 3 scrapes on), of the scrapes while the load was sent where that is known (from its first send
  to its last: after it a backlog drains, and a queue that grew falls), how it went through the load (a queue
  that grows: what blocks the run, :mod:`~meshtop.recordings.metrics.blocker`).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from meshtop.probes.events import ServerMetric

GAUGES = ("requests_running", "requests_waiting", "kv_cache_usage")
COUNTERS = ("preemptions", "prompt_tokens", "generation_tokens")
LARGEST = frozenset({"kv_cache_usage"})
"""Common series combined by their largest label set, not their sum."""
RECENT = 240
"""Recent values of each gauge kept for the dashboard (two minutes at two scrapes a second)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ServerFigures:
    scrapes: int
    series: int
    """Distinct series the server published (replicas: each replica's counted)."""
    gauges: dict[str, dict[str, float | None]]
    """For each of :data:`GAUGES` the engine published: last, mean, max."""
    counters: dict[str, float]
    """For each of :data:`COUNTERS` it published: the increase over the run."""
    thirds: dict[str, tuple[float, float]] = field(default_factory=dict)
    """For each of :data:`GAUGES` of at least 3 scrapes: its mean over the first third of them, and over the
    last third."""

    def to_json(self) -> dict[str, object]:
        return {"scrapes": self.scrapes, "series": self.series, **self.gauges, **self.counters}


class ServerFold:
    """A serving engine's scraped series, folded a scrape at a time."""

    def __init__(self) -> None:
        self._values: dict[str, dict[tuple[int, str, str], float]] = {}
        """Each common series' label sets, by replica: their last values."""
        self._series: set[tuple[int, str, str]] = set()
        self._scrape_ns: int | None = None
        self.scrapes = 0
        self._sum: dict[str, float] = {}
        self._max: dict[str, float] = {}
        self._count: dict[str, int] = {}
        self._increase: dict[str, float] = {}
        self._last: dict[str, float] = {}
        self.recent: dict[str, deque[float]] = {name: deque(maxlen=RECENT) for name in GAUGES}
        self._timeline: list[tuple[int, str, float]] = []
        """(scrape's wall_ns, common name, its value at the scrape) of every scrape closed."""

    def add(self, event: ServerMetric) -> None:
        if self._scrape_ns is not None and event.wall_ns != self._scrape_ns:
            self._close_scrape()
        self._scrape_ns = event.wall_ns
        key = (event.replica, event.name, event.labels)
        self._series.add(key)
        if event.common is not None:
            self._values.setdefault(event.common, {})[key] = event.value

    def _close_scrape(self) -> None:
        """The scrape that just ended: each common series' value at it."""
        self.scrapes += 1
        for common, values in self._values.items():
            value = max(values.values()) if common in LARGEST else sum(values.values())
            if common in COUNTERS:
                previous = self._last.get(common)
                if previous is not None:
                    self._increase[common] = self._increase.get(common, 0.0) + max(0.0, value - previous)
                    if value < previous:  # a restart: the counter counts again from 0
                        self._increase[common] += value
            else:
                self._sum[common] = self._sum.get(common, 0.0) + value
                self._count[common] = self._count.get(common, 0) + 1
                self._max[common] = max(self._max.get(common, value), value)
                if common in self.recent:
                    self.recent[common].append(value)
            self._last[common] = value
            if self._scrape_ns is not None:
                self._timeline.append((self._scrape_ns, common, value))

    def timeline(self) -> list[tuple[int, str, float]]:
        """Each common series' value at each scrape, by the rules above: (wall_ns, name, value), in order."""
        return self._snapshot()._timeline if self._scrape_ns is not None else []

    def figures(self, sending_ns: tuple[int, int] | None = None) -> ServerFigures | None:
        """``None`` until a scrape came (``sending_ns``: the load's first and last send, for the thirds)."""
        if self._scrape_ns is None:
            return None
        closed = self._snapshot()
        return ServerFigures(
            scrapes=closed.scrapes,
            series=len(self._series),
            gauges={
                name: {
                    "last": closed._last[name],
                    "mean": closed._sum[name] / closed._count[name],
                    "max": closed._max[name],
                }
                for name in GAUGES
                if closed._count.get(name)
            },
            counters={name: closed._increase.get(name, 0.0) for name in COUNTERS if name in closed._last},
            thirds=closed._thirds(sending_ns),
        )

    def _thirds(self, sending_ns: tuple[int, int] | None) -> dict[str, tuple[float, float]]:
        """Each gauge's mean over its first third of scrapes and its last third (by the rules above)."""
        start, end = sending_ns if sending_ns is not None else (None, None)
        thirds = {}
        for name in GAUGES:
            values = [
                value
                for wall_ns, common, value in self._timeline
                if common == name and (start is None or start <= wall_ns) and (end is None or wall_ns <= end)
            ]
            if (third := len(values) // 3) > 0:
                thirds[name] = (sum(values[:third]) / third, sum(values[-third:]) / third)
        return thirds

    def _snapshot(self) -> ServerFold:
        """This fold with its scrape in progress closed (a copy: the next events may belong to it)."""
        copy = ServerFold.__new__(ServerFold)
        copy._values = {common: dict(values) for common, values in self._values.items()}
        copy._series, copy._scrape_ns, copy.scrapes = self._series, self._scrape_ns, self.scrapes
        copy._timeline = list(self._timeline)
        copy._sum, copy._max, copy._count = dict(self._sum), dict(self._max), dict(self._count)
        copy._increase, copy._last = dict(self._increase), dict(self._last)
        copy.recent = {name: deque(values, maxlen=RECENT) for name, values in self.recent.items()}
        copy._close_scrape()
        return copy
