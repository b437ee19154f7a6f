"""A recording's events back as event objects, in the order they happened (what a replay plays)."""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Any

import pandas as pd

from probes.events import EVENT_TYPES, Event, StepTiming, event_from_record
from recordings.reader import Recording


def event_time_ns(event: Event) -> int:
    """When an event became known: the end of a timed span, else its sample time (0 for timeless facts)."""
    if isinstance(event, StepTiming):
        return event.start_ns + int(event.duration_s * 1e9)
    for name in ("end_ns", "wall_ns", "start_ns"):
        value = getattr(event, name, None)
        if value is not None:
            return int(value)
    return 0


@dataclass(frozen=True, slots=True)
class Timeline:
    """Every event of a recording, sorted by :func:`event_time_ns`, with those times beside them."""

    events: list[Event]
    times_ns: list[int]

    @property
    def start_ns(self) -> int:
        """The first timed event (timeless facts such as GPU links sort before it at 0)."""
        return next((t for t in self.times_ns if t > 0), 0)

    @property
    def end_ns(self) -> int:
        return self.times_ns[-1] if self.times_ns else 0


def _integer_fields(cls: type[Event]) -> frozenset[str]:
    return frozenset(f.name for f in fields(cls) if "int" in str(f.type) and "float" not in str(f.type))


def _clean(record: dict[str, Any], integers: frozenset[str]) -> dict[str, Any]:
    """pandas' NaN back to ``None``, and integers stored as floats (beside a missing value) back to int."""
    for name, value in record.items():
        if isinstance(value, float):
            if math.isnan(value):
                record[name] = None
            elif name in integers:
                record[name] = int(value)
        elif value is pd.NA:
            record[name] = None
    return record


def load_timeline(recording: Recording) -> Timeline:
    """Every event of every table the recording holds, as event objects in time order."""
    events: list[Event] = []
    for kind in recording.kinds():
        if kind not in EVENT_TYPES:
            recording.problems.append(f"events/{kind}: not an event kind this meshtop knows; skipped")
            continue
        table = recording.table(kind)
        if table.empty:
            continue
        integers = _integer_fields(EVENT_TYPES[kind])
        for record in table.to_dict("records"):
            record["kind"] = kind
            try:
                events.append(event_from_record(_clean(record, integers)))
            except (TypeError, ValueError):
                recording.problems.append(f"events/{kind}: a row that is not a {kind} event; skipped")
    keyed = sorted(((event_time_ns(e), i, e) for i, e in enumerate(events)), key=lambda item: item[:2])
    return Timeline(events=[e for _, _, e in keyed], times_ns=[t for t, _, _ in keyed])
