"""Worker side of the stream: a bounded buffer and a background thread that ships it.

The training thread only appends to an outbox (:mod:`meshtop.probes.sender`; or
counts a drop when it is full); serialising and sending happen on the shipper thread, so a slow or
absent collector never stalls training. Events that come already written as
JSON lines (the C++ collective probe's, :meth:`EventShipper.emit_lines`) go
into the frame as they are.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from typing import Any

from meshtop.probes.arrivals import EncodedEvents
from meshtop.probes.events import Event
from meshtop.probes.sender import Link, Outbox
from meshtop.probes.sink import EventSink
from meshtop.probes.wire import ADDRESS_ENV, TOKEN_ENV, parse_address

DEFAULT_CAPACITY = 200_000
"""Events a rank holds for the collector at most (a block of lines counts its events)."""
SHIP_INTERVAL_S = 0.25
BATCH_MAX = 20_000
CONNECT_TIMEOUT_S = 5.0
CLOSE_TIMEOUT_S = 5.0


class EventShipper(Outbox):
    """Buffers events and ships them to the collector at ``address`` every :data:`SHIP_INTERVAL_S`."""

    def __init__(self, *, address: tuple[str, int], token: str, rank: int, capacity: int = DEFAULT_CAPACITY) -> None:
        self.before_shipment: Callable[[], list[Event]] | None = None
        """Called on the shipper thread before each shipment; its events go out with it (the heartbeat of
        the hang reports, the C++ probe's collectives)."""
        super().__init__(capacity)
        self.rank = rank
        self._link = Link(address, {"token": token, "rank": rank}, timeout_s=CONNECT_TIMEOUT_S)
        self._closing = threading.Event()
        self._thread = threading.Thread(target=self._run, name="meshtop-shipper", daemon=True)
        self._thread.start()

    def emit_lines(self, kind: str, lines: bytes, count: int) -> None:
        self.emit_block(EncodedEvents(kind, self.rank, lines, count))

    def close(self) -> None:
        self._closing.set()
        self._thread.join(CLOSE_TIMEOUT_S)
        self._link.close()

    def _run(self) -> None:
        while True:
            closing = self._closing.wait(SHIP_INTERVAL_S)
            if self.before_shipment is not None and not closing:
                try:
                    for event in self.before_shipment():
                        self.emit(event)
                except Exception:  # a probe must never stop the shipping
                    pass
            while (message := self.take(BATCH_MAX)) is not None:
                fields, body, events = message
                if not self._send(fields, body):
                    self.drop(events)
                    break
            if closing:
                return

    def _send(self, fields: dict[str, Any], body: bytes) -> bool:
        """Two tries: a collector that is gone loses the batch, not the training's time."""
        for _attempt in range(2):
            try:
                self._link.send(fields, body)
                return True
            except OSError:
                time.sleep(0.1)
        return False


def open_sink(rank: int) -> EventSink:
    """The collector named by the launcher's environment; a do-nothing sink without one."""
    address, token = os.environ.get(ADDRESS_ENV), os.environ.get(TOKEN_ENV)
    if not address or not token:
        return EventSink()
    return EventShipper(address=parse_address(address), token=token, rank=rank)
