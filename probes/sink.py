"""Where a worker's events go: the do-nothing base of every sink."""

from __future__ import annotations

from meshtop.probes.arrivals import decode_lines
from meshtop.probes.events import Event


class EventSink:
    """Receives events from a worker; the base class drops them."""

    def emit(self, event: Event) -> None:
        """Take one event; must not block the training thread."""

    def emit_lines(self, kind: str, lines: bytes, count: int) -> None:
        """Take ``count`` events of ``kind`` already written as the wire's JSON lines (the C++ collective
        probe's); the base class decodes them for :meth:`emit`, a shipper sends them as they are."""
        if type(self).emit is EventSink.emit:  # dropped anyway: no need to decode
            return
        events, _bad = decode_lines(lines, kind)
        for event in events:
            self.emit(event)

    def drop(self, count: int) -> None:
        """Count events lost before they reached the sink (reported with the sink's own drops)."""

    def close(self) -> None:
        """Flush and release whatever the sink holds."""
