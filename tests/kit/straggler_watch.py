"""Watch a job's straggler alert as the dashboard would: its events folded as they come, a table a kind per
delivery, and after each delivery the stragglers named and the suspects (shared by tests and a benchmark)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc

from meshtop.probes.events import Event
from meshtop.recordings.manifest import RunDescription
from meshtop.recordings.metrics.run import RunFold
from meshtop.recordings.reader import open_recording
from meshtop.recordings.replay import event_times_ns, in_kind_order, load_timeline
from meshtop.recordings.schema import tables_of


@dataclass
class StragglerWatch:
    """One job's stragglers over its run; times are job seconds: from its first step's start to the latest
    step end folded."""

    fold: RunFold
    first_start_ns: int | None = None
    last_end_ns: int | None = None
    named: dict[int, float] = field(default_factory=dict)
    """Each rank ever named a straggler: the job second it was first named at."""
    verdicts: set[str] = field(default_factory=set)
    """Every verdict the alert showed."""
    longest_suspect_s: dict[int, float] = field(default_factory=dict)
    """Each rank ever a suspect: the longest it was one (seconds of steps)."""
    deliveries_with_alert: int = 0
    deliveries: int = 0

    @classmethod
    def of(cls, run: RunDescription) -> StragglerWatch:
        return cls(RunFold(run))

    @property
    def seconds(self) -> float:
        """Job seconds watched."""
        if self.first_start_ns is None or self.last_end_ns is None:
            return 0.0
        return (self.last_end_ns - self.first_start_ns) / 1e9

    @property
    def closed_steps(self) -> int:
        return self.fold.closed_count

    def take_events(self, events: list[Event]) -> None:
        """One delivery of events, as the runner hands them over."""
        self.take(tables_of(events))

    def take(self, tables: Iterable[tuple[str, pa.Table]]) -> None:
        """One delivery, as (kind, table) pairs."""
        for kind, table in in_kind_order(tables):
            if kind == "step" and len(table):
                low, high = pc.min(table.column("start_ns")).as_py(), int(event_times_ns(kind, table).max())
                self.first_start_ns = low if self.first_start_ns is None else min(self.first_start_ns, low)
                self.last_end_ns = high if self.last_end_ns is None else max(self.last_end_ns, high)
            self.fold.apply(kind, table)
        self.deliveries += 1
        for rank, held_s in self.fold.compute.suspects().items():
            self.longest_suspect_s[rank] = max(self.longest_suspect_s.get(rank, 0.0), held_s)
        stragglers = self.fold.figures().stragglers
        self.deliveries_with_alert += bool(stragglers)
        for straggler in stragglers:
            self.named.setdefault(straggler.rank, self.seconds)
            self.verdicts.add(straggler.verdict)

    def report(self) -> str:
        longest = max(self.longest_suspect_s.values(), default=0.0)
        named = ", ".join(f"rank {rank} at {at:.1f} s" for rank, at in sorted(self.named.items())) or "none"
        return (
            f"{self.closed_steps} closed steps over {self.seconds:.1f} s of the job, {self.deliveries} deliveries; "
            f"named: {named} (an alert in {self.deliveries_with_alert} deliveries); longest a suspect: "
            f"{longest:.1f} s"
        )


def watch_recording(recording: Path, run: RunDescription | None = None) -> StragglerWatch:
    """A recording played back a step at a time (each slice up to the end of its next step), as a replay
    delivers it."""
    opened = open_recording(recording)
    watch = StragglerWatch.of(run if run is not None else opened.manifest.run)
    timeline = load_timeline(opened)
    after: int | None = None
    for end_ns, _ in timeline.step_ends():
        watch.take(timeline.between(after, end_ns))
        after = end_ns
    watch.take(timeline.between(after, timeline.end_ns))
    return watch
