"""Worker side of the stream: a bounded buffer and a background thread that ships it.

The training thread only appends to a deque (or counts a drop when it is
full); serialising and sending happen on the shipper thread, so a slow or
absent collector never stalls training. Events that come already written as
JSON lines (the C++ collective probe's, :meth:`EventShipper.emit_lines`) go
into the frame as they are.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from collections import deque
from collections.abc import Callable

from meshtop.probes.arrivals import EncodedEvents
from meshtop.probes.events import Event
from meshtop.probes.sink import EventSink
from meshtop.probes.wire import ADDRESS_ENV, TOKEN_ENV, encode_events, parse_address

DEFAULT_CAPACITY = 200_000
SHIP_INTERVAL_S = 0.25
BATCH_MAX = 20_000
CONNECT_TIMEOUT_S = 5.0
CLOSE_TIMEOUT_S = 5.0


class EventShipper(EventSink):
    """Buffers events and ships them to the collector at ``address`` every :data:`SHIP_INTERVAL_S`."""

    def __init__(self, *, address: tuple[str, int], token: str, rank: int, capacity: int = DEFAULT_CAPACITY) -> None:
        self.before_shipment: Callable[[], list[Event]] | None = None
        """Called on the shipper thread before each shipment; its events go out with it (the heartbeat of
        the hang reports, the C++ probe's collectives)."""
        self.address = address
        self.token = token
        self.rank = rank
        self.capacity = capacity
        self._buffer: deque[Event] = deque()
        self._blocks: deque[EncodedEvents] = deque()
        """Events already encoded, a block per :meth:`emit_lines` (bounded by ``capacity`` events too)."""
        self._dropped = 0
        self._drop_lock = threading.Lock()
        self._socket: socket.socket | None = None
        self._closing = threading.Event()
        self._thread = threading.Thread(target=self._run, name="meshtop-shipper", daemon=True)
        self._thread.start()

    @property
    def dropped(self) -> int:
        """Events refused so far because the buffer was full (or lost in a failed send)."""
        return self._dropped

    def emit(self, event: Event) -> None:
        if len(self._buffer) >= self.capacity:
            with self._drop_lock:
                self._dropped += 1
            return
        self._buffer.append(event)

    def emit_lines(self, kind: str, lines: bytes, count: int) -> None:
        if sum(block.count for block in self._blocks) + count > self.capacity:
            self.drop(count)
            return
        self._blocks.append(EncodedEvents(kind, self.rank, lines, count))

    def drop(self, count: int) -> None:
        with self._drop_lock:
            self._dropped += count

    def close(self) -> None:
        self._closing.set()
        self._thread.join(CLOSE_TIMEOUT_S)
        if self._socket is not None:
            self._socket.close()

    def _run(self) -> None:
        reported = 0
        while True:
            closing = self._closing.wait(SHIP_INTERVAL_S)
            if self.before_shipment is not None and not closing:
                try:
                    for event in self.before_shipment():
                        self.emit(event)
                except Exception:  # a probe must never stop the shipping
                    pass
            while self._buffer or self._blocks or self._dropped != reported:
                batch, blocks = self._next_batch()
                dropped_now = self._dropped
                if self._send(batch, blocks, dropped_now - reported):
                    reported = dropped_now
                else:
                    self.drop(len(batch) + sum(block.count for block in blocks))
                    break
            if closing:
                return

    def _next_batch(self) -> tuple[list[Event], list[EncodedEvents]]:
        """At most BATCH_MAX events (or one larger block), the buffer's first, then whole encoded blocks."""
        batch = [self._buffer.popleft() for _ in range(min(len(self._buffer), BATCH_MAX))]
        blocks: list[EncodedEvents] = []
        room = BATCH_MAX - len(batch)
        while self._blocks and (self._blocks[0].count <= room or not (batch or blocks)):
            blocks.append(self._blocks.popleft())
            room -= blocks[-1].count
        return batch, blocks

    def _send(self, batch: list[Event], blocks: list[EncodedEvents], dropped: int) -> bool:
        frame = encode_events(token=self.token, rank=self.rank, dropped=dropped, events=batch, blocks=blocks)
        for _attempt in range(2):
            try:
                if self._socket is None:
                    self._socket = socket.create_connection(self.address, timeout=CONNECT_TIMEOUT_S)
                self._socket.sendall(frame)
                return True
            except OSError:
                if self._socket is not None:
                    self._socket.close()
                self._socket = None
                time.sleep(0.1)
        return False


def open_sink(rank: int) -> EventSink:
    """The collector named by the launcher's environment; a do-nothing sink without one."""
    address, token = os.environ.get(ADDRESS_ENV), os.environ.get(TOKEN_ENV)
    if not address or not token:
        return EventSink()
    return EventShipper(address=parse_address(address), token=token, rank=rank)
