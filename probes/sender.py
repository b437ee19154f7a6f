"""The sending end of the telemetry wire, for a rank's shipper and a node's relay alike.

An :class:`Outbox` holds what waits to be sent: events and blocks of events already written as JSON lines,
in the order they came. Whoever fills it never waits: past ``capacity`` held events (a block counts its
events) what comes is counted as dropped, and the count goes out with the next message. A message holds at
most ``most`` events, whole blocks, one item at least: a block's lines are sent as they came, never split.

A :class:`Link` is the connection the messages leave on, opened when a message is sent and dropped when a
send fails; each sender decides how long to try again (a rank's shipper gives up on a batch, a node's relay
tries until the head is lost).
"""

from __future__ import annotations

import socket
import threading
from collections import deque
from typing import Any

from meshtop.probes.arrivals import Arrival, EncodedEvents, event_count
from meshtop.probes.events import Event
from meshtop.probes.sink import EventSink
from meshtop.probes.wire import event_sections, pack, read_frame


class Outbox(EventSink):
    """Events and encoded blocks waiting to be sent, at most ``capacity`` events; thread-safe, and adding an
    event takes no lock (the training thread adds them)."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._items: deque[Arrival] = deque()
        self._in_blocks = 0
        """Events held in blocks beyond one an item: ``len(_items) + _in_blocks`` are held."""
        self._dropped = 0
        """Events refused (or lost in a failed send) since the last message."""
        self._lock = threading.Lock()

    @property
    def dropped(self) -> int:
        """Events dropped and not yet reported in a message."""
        return self._dropped

    def emit(self, event: Event) -> None:
        if len(self._items) + self._in_blocks >= self.capacity:
            self.drop(1)
            return
        self._items.append(event)

    def emit_block(self, block: EncodedEvents) -> None:
        with self._lock:
            if len(self._items) + self._in_blocks + block.count > self.capacity:
                self._dropped += block.count
                return
            self._items.append(block)
            self._in_blocks += block.count - 1

    def drop(self, count: int) -> None:
        with self._lock:
            self._dropped += count

    def take(self, most: int) -> tuple[dict[str, Any], bytes, int] | None:
        """The next message's ``dropped`` and ``sections`` fields and its body, and the events it stands for
        (to :meth:`drop` if it cannot be sent); ``None`` when there is nothing to send."""
        events: list[Event] = []
        blocks: list[EncodedEvents] = []
        with self._lock:
            dropped, self._dropped = self._dropped, 0
            taken = 0
            while self._items and (taken == 0 or taken + event_count(self._items[0]) <= most):
                item = self._items.popleft()
                taken += event_count(item)
                if isinstance(item, EncodedEvents):
                    blocks.append(item)
                    self._in_blocks -= item.count - 1
                else:
                    events.append(item)
        if not taken and not dropped:
            return None
        listed, body = event_sections(events, blocks)
        return {"dropped": dropped, "sections": listed}, body, taken + dropped


class Link:
    """The connection to a collector at ``address``; each message starts with ``header`` (the token, the
    sender's rank, a node's number)."""

    def __init__(self, address: tuple[str, int], header: dict[str, Any], *, timeout_s: float) -> None:
        self.address = address
        self.header = header
        self.timeout_s = timeout_s
        """For connecting, and for each send and answer."""
        self._socket: socket.socket | None = None

    def send(self, fields: dict[str, Any], body: bytes = b"", *, answer: bool = False) -> dict[str, Any] | None:
        """Send one message (connecting first if need be) and, if ``answer``, read the answer's header; an
        ``OSError`` or a :class:`meshtop.probes.wire.FrameError` when that fails (the connection is then closed,
        and the next send opens another)."""
        try:
            if self._socket is None:
                self._socket = socket.create_connection(self.address, timeout=self.timeout_s)
            self._socket.sendall(pack({**self.header, **fields}, body))
            if not answer:
                return None
            reply = read_frame(self._socket)
            if reply is None:
                raise OSError("the collector closed the connection")
            return reply[0]
        except Exception:
            self.close()
            raise

    def close(self) -> None:
        if self._socket is not None:
            self._socket.close()
        self._socket = None
