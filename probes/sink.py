"""Where a worker's events go: the do-nothing base of every sink."""

from __future__ import annotations

from probes.events import Event


class EventSink:
    """Receives events from a worker; the base class drops them."""

    def emit(self, event: Event) -> None:
        """Take one event; must not block the training thread."""

    def drop(self, count: int) -> None:
        """Count events lost before they reached the sink (reported with the sink's own drops)."""

    def close(self) -> None:
        """Flush and release whatever the sink holds."""
