"""Where a worker's events go: a do-nothing base and an append-only JSON-lines file."""

from __future__ import annotations

import json
from pathlib import Path

from probes.events import Event, event_from_record


class EventSink:
    """Receives events from a worker; the base class drops them."""

    def emit(self, event: Event) -> None:
        """Take one event; must not block the training thread for long."""

    def close(self) -> None:
        """Flush and release whatever the sink holds."""


class JsonLinesSink(EventSink):
    """Appends one JSON object a line to ``path``, flushed after each event."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self._file = path.open("a", encoding="utf-8")

    def emit(self, event: Event) -> None:
        self._file.write(json.dumps(event.to_record()) + "\n")
        self._file.flush()

    def close(self) -> None:
        self._file.close()


class JsonLinesTail:
    """Reads the events appended to a JSON-lines file since the last call."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._offset = 0

    def read_new(self) -> list[Event]:
        """Complete lines written since the previous call; a half-written last line waits."""
        try:
            with self.path.open("rb") as file:
                file.seek(self._offset)
                chunk = file.read()
        except FileNotFoundError:
            return []
        end = chunk.rfind(b"\n") + 1
        self._offset += end
        return [event_from_record(json.loads(line)) for line in chunk[:end].splitlines() if line.strip()]
