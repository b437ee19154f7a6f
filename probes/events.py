"""Event types: what the probes measure, one frozen dataclass per kind.

Units are in the field names (``_ns``, ``_s``, ``bytes``); a value that is
not known is ``None``, never a sentinel.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any, ClassVar


@dataclass(frozen=True, slots=True, kw_only=True)
class Event:
    """Base of every event; ``kind`` names the type on the wire and on disk."""

    kind: ClassVar[str] = "event"

    def to_record(self) -> dict[str, Any]:
        record = asdict(self)
        record["kind"] = self.kind
        return record


@dataclass(frozen=True, slots=True, kw_only=True)
class RankStarted(Event):
    """A worker joined the job: where it sits in the mesh and what it runs on."""

    kind: ClassVar[str] = "rank_started"
    rank: int
    pid: int
    host: str
    device: str
    pp_rank: int
    dp_rank: int
    tp_rank: int
    stages: tuple[int, ...]
    """Pipeline stages this rank holds (empty without a pipeline)."""
    local_parameters: int
    """Parameter elements this rank stores (its shards only)."""
    wall_ns: int


@dataclass(frozen=True, slots=True, kw_only=True)
class StepTiming(Event):
    """One optimizer step as one rank saw it."""

    kind: ClassVar[str] = "step"
    rank: int
    step: int
    start_ns: int
    """Wall-clock time (``time.time_ns``) at the start of the step."""
    duration_s: float
    tokens: int
    """Tokens of the global batch consumed by this step."""
    loss: float | None
    """This rank's mean loss over its data; ``None`` where the rank computes no loss."""


EVENT_TYPES: dict[str, type[Event]] = {cls.kind: cls for cls in (RankStarted, StepTiming)}


def event_from_record(record: dict[str, Any]) -> Event:
    """Rebuild an event from :meth:`Event.to_record`'s output."""
    cls = EVENT_TYPES[record["kind"]]
    values = {f.name: record[f.name] for f in fields(cls)}
    if cls is RankStarted:
        values["stages"] = tuple(values["stages"])
    return cls(**values)
