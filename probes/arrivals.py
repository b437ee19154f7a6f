"""Events as they reach meshtop: the workers' still encoded, one JSON-lines block per kind, decoded only where needed.

A worker ships each kind's events as the lines the recording keeps
(``json`` of :meth:`Event.to_record`, one per line). The collector checks the
frame and queues the blocks as they came; the session appends them to the
recording unchanged and decodes only the kinds a consumer asks for (a
headless ``record`` never builds the collectives, the bulk of a job's events;
the dashboard decodes everything, at its own pace). A block decodes once,
whoever asks first.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Iterable
from dataclasses import dataclass, field

from meshtop.probes.events import Event, event_from_record, on_node

_ENCODER = json.JSONEncoder(separators=(",", ":"), check_circular=False)


def encode_lines(events: Iterable[Event]) -> bytes:
    """``events`` as JSON lines, each ending in a newline."""
    return "".join([_ENCODER.encode(event.to_record()) + "\n" for event in events]).encode()


def decode_lines(lines: bytes, kind: str) -> tuple[list[Event], int]:
    """The events of a block of ``kind`` and how many of its lines were not one (bad JSON, wrong fields or kind).

    The block is parsed in one go, as a JSON array of its lines (JSON strings hold no raw newline), at
    half the cost of a parse per line; a block that does not parse so, or not into one value per line,
    is parsed line by line, so a line counts as one event or none, as the recording's reader sees it.
    """
    body = lines.rstrip(b"\n")
    if not body:
        return [], 0
    bad = 0
    try:
        records = json.loads(b"[" + body.replace(b"\n", b",") + b"]")
    except (ValueError, RecursionError):  # not JSON, not UTF-8, too deep, a huge integer
        records = None
    if records is None or len(records) != body.count(b"\n") + 1:
        records = []
        for line in body.split(b"\n"):
            try:
                records.append(json.loads(line))
            except (ValueError, RecursionError):
                bad += 1
    events = []
    for record in records:
        try:
            event = event_from_record(record)
        except (KeyError, TypeError, ValueError, AttributeError):
            bad += 1
            continue
        if event.kind == kind:
            events.append(event)
        else:
            bad += 1
    return events, bad


@dataclass(slots=True)
class EncodedEvents:
    """``count`` events of one ``kind`` from one rank, as the JSON lines it sent."""

    kind: str
    rank: int
    lines: bytes
    count: int
    bad: int = 0
    """Lines that did not decode to an event of ``kind`` (known once decoded)."""
    node: int | None = None
    """The node that streamed the block to the head, its times on that node's clock; ``None``: on this
    machine's clock (this machine's ranks, or times already moved)."""
    offset_ns: int = 0
    """What that node's clock is behind the head's (:class:`meshtop.probes.events.NodeClock`)."""
    _events: list[Event] | None = field(default=None, repr=False)

    def events(self) -> list[Event]:
        """The decoded events, on this machine's clock (decoded on the first call)."""
        if self._events is None:
            self._events, self.bad = decode_lines(self.lines, self.kind)
            if self.node is not None:
                node, offset = self.node, self.offset_ns
                self._events = [on_node(event, offset_ns=offset, node=node) for event in self._events]
        return self._events


Arrival = EncodedEvents | Event


def event_count(item: Arrival) -> int:
    """Events that ``item`` stands for: a block's count, or 1."""
    return item.count if isinstance(item, EncodedEvents) else 1


class Arrivals:
    """What reached meshtop since the last look, in the order it came: encoded blocks and events made here."""

    def __init__(self, items: Iterable[Arrival] = ()) -> None:
        self.items: list[Arrival] = list(items)

    def add(self, events: Iterable[Event]) -> None:
        self.items.extend(events)

    @property
    def count(self) -> int:
        """Events, encoded or not."""
        return sum(map(event_count, self.items))

    def has(self, kind: str) -> bool:
        """Whether any event of ``kind`` came (without decoding anything)."""
        return any(event_count(item) > 0 for item in self.items if item.kind == kind)

    def events(self, kinds: Collection[str] | None = None) -> list[Event]:
        """The events of ``kinds`` (every kind when ``None``), decoded, in arrival order."""
        events: list[Event] = []
        for item in self.items:
            if kinds is not None and item.kind not in kinds:
                continue
            if isinstance(item, EncodedEvents):
                events.extend(item.events())
            else:
                events.append(item)
        return events
