"""The collector: where every worker's events arrive, in the meshtop process.

It listens on 127.0.0.1 by default. Every message must carry the session's
token; a message without it, a malformed or oversized frame, or a connection
that sends too much is rejected and counted, never fatal: the collector
keeps serving the others. The queue is bounded (events and bytes): past
three quarters of a bound the collector stops reading until the consumer
drains it (for 2 s at most: a node's pings wait no longer), so the senders
wait (TCP's own flow control) and what they cannot keep meanwhile is counted
in their own bounded buffers (a worker's ``dropped``, a node's relay); a
message that still does not fit is refused whole and counted.
A non-loopback bind is allowed only with a token (there always is one).

On the head of a multi-node job it also takes the other nodes' streams
(:mod:`meshtop.runner.session.relay`): their messages name their ``node``, which must be one
of the job's (else refused and counted), and a message with a ``control``
field is handed to the ``on_control`` callback, whose answer goes back on
the same connection (the ping exchange that measures a node's clock, a
node's last word). The callback also hears of a node's event messages
(``{"control": "data", "node": N}``: it is alive; no answer is sent) and of
its connection closing (``{"control": "closed", "node": N}``); with each, the
connection's number, so a node that reconnects is told from one that is gone.
"""

from __future__ import annotations

import hmac
import itertools
import secrets
import selectors
import socket
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from meshtop.probes.arrivals import Arrival, EncodedEvents, event_count
from meshtop.probes.errors import ProbeError
from meshtop.probes.events import EventsDropped
from meshtop.probes.wire import HEADER, FrameError, frame_length, is_count, pack, sections, split_payload

DEFAULT_QUEUE_EVENTS = 1_000_000
DEFAULT_QUEUE_BYTES = 512 * 1024 * 1024
READ_TIMEOUT_S = 30.0
"""A connection that sends nothing for this long is closed (a worker's shipper sends at least twice a second)."""
READ_BYTES = 1 << 20
"""The most one connection's turn reads, so that one busy peer cannot keep the others waiting."""
POLL_S = 0.05
PAUSE_AT = 0.75
"""The share of the queue's bounds past which the collector reads nothing until the queue is drained."""
PAUSE_MAX_S = 2.0
"""The longest it reads nothing: then it serves on (the nodes' pings wait no longer), refusing what does not fit."""


@dataclass
class CollectorCounts:
    """What the collector refused, by reason."""

    messages: int = 0
    events: int = 0
    bad_token: int = 0
    malformed: int = 0
    oversized: int = 0
    queue_full: int = 0
    unknown_node: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add(self, **counts: int) -> None:
        with self.lock:
            for name, value in counts.items():
                setattr(self, name, getattr(self, name) + value)


class Collector:
    """A TCP server that puts the workers' messages on a bounded queue, as blocks of encoded events.

    It checks each frame (token, header, that every section holds its lines) and reads no event:
    decoding is left to whoever needs an event (:mod:`meshtop.probes.arrivals`). The queue holds each
    message's blocks as one batch (one lock per message); its bound counts events.

    One thread reads every connection (a selector over non-blocking sockets), not a thread a connection:
    with sixteen nodes' relays on two cores, sixteen reader threads woke for their sockets and took the
    interpreter's lock in turn, and the session thread, which gives that lock up at each file it writes,
    took 6.6 s to write one take (0.4 s of its own CPU) while the queue filled and refused half of what
    came; with one reader, nothing refused (docs/multinode.md, "Scale").
    """

    def __init__(
        self,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        token: str | None = None,
        max_queue_events: int = DEFAULT_QUEUE_EVENTS,
        max_queue_bytes: int = DEFAULT_QUEUE_BYTES,
        nodes: tuple[int, ...] = (),
        on_control: Callable[[dict[str, Any], int], dict[str, Any]] | None = None,
    ) -> None:
        self.token = token or secrets.token_hex(16)
        self.nodes = frozenset(nodes)
        """The other nodes of a multi-node job: a message may name one of them (the head's own name none)."""
        self.on_control = on_control
        self._connections = itertools.count(1)
        self.counts = CollectorCounts()
        self.max_queue_events = max_queue_events
        self.max_queue_bytes = max_queue_bytes
        self._batches: deque[list[Arrival]] = deque()
        self._queued = 0
        self._queued_bytes = 0
        self._queue_lock = threading.Lock()
        self._stopping = threading.Event()
        self._selector = selectors.DefaultSelector()
        try:
            self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            self._listener.bind((host, port))
            self._listener.listen(socket.SOMAXCONN)
        except OSError as error:
            self._listener.close()
            raise ProbeError(f"cannot listen on {host}:{port}: {error.strerror or error}") from None
        self._listener.setblocking(False)
        self._selector.register(self._listener, selectors.EVENT_READ, None)
        self._thread = threading.Thread(target=self._run, name="meshtop-collector", daemon=True)

    @property
    def address(self) -> tuple[str, int]:
        host, port = self._listener.getsockname()[:2]
        return str(host), int(port)

    def start(self) -> Collector:
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop reading and close every connection (what was queued stays to be drained)."""
        self._stopping.set()
        if self._thread.is_alive():
            self._thread.join()
        else:
            self._close_all()

    @property
    def queued(self) -> int:
        """Events received and not yet drained."""
        return self._queued

    def drain(self) -> list[Arrival]:
        """Every block (and drop report) received so far (non-blocking), in the order the messages came."""
        with self._queue_lock:
            batches = list(self._batches)
            self._batches.clear()
            self._queued = self._queued_bytes = 0
        return [item for batch in batches for item in batch]

    def _enqueue(self, items: list[Arrival]) -> int:
        """Queue the blocks that fit under the bounds (events and bytes), whole; how many events did not fit."""
        refused = 0
        with self._queue_lock:
            taken = []
            for item in items:
                size, nbytes = event_count(item), len(item.lines) if isinstance(item, EncodedEvents) else 0
                if self._queued + size <= self.max_queue_events and self._queued_bytes + nbytes <= self.max_queue_bytes:
                    taken.append(item)
                    self._queued += size
                    self._queued_bytes += nbytes
                else:
                    refused += size
            if taken:
                self._batches.append(taken)
        return refused

    # -- the reading thread

    def _run(self) -> None:
        try:
            paused_since: float | None = None
            waited = False
            silence_checked = time.monotonic()
            while not self._stopping.is_set():
                now = time.monotonic()
                if not self._nearly_full():
                    paused_since = None
                elif now - (paused_since := paused_since or now) < PAUSE_MAX_S:
                    waited = True  # the peers' sends wait in their sockets meanwhile
                    self._stopping.wait(POLL_S / 5)
                    continue
                if waited:  # the connections were not silent: unread
                    waited = False
                    self._heard_all(now)
                for key, _ in self._selector.select(timeout=POLL_S):
                    if key.data is None:
                        self._accept_connections()
                    else:
                        self._read(key.data)
                if (now := time.monotonic()) - silence_checked >= 1.0:  # not at every turn: a thousand ranks
                    self._close_silent(now)
                    silence_checked = now
        finally:
            self._close_all()

    def _nearly_full(self) -> bool:
        return self._queued >= self.max_queue_events * PAUSE_AT or self._queued_bytes >= self.max_queue_bytes * PAUSE_AT

    def _heard_all(self, now: float) -> None:
        for key in self._selector.get_map().values():
            if key.data is not None:
                key.data.last = now

    def _accept_connections(self) -> None:
        while True:
            try:
                sock, _ = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError:  # out of descriptors, a connection reset before it was taken: serve the others
                return
            sock.setblocking(False)  # an answer that finds no room in its socket closes the connection
            self._selector.register(sock, selectors.EVENT_READ, _Connection(sock, next(self._connections)))

    def _read(self, connection: _Connection) -> None:
        """Read what ``connection`` has (:data:`READ_BYTES` at most) and serve its whole messages."""
        closed, read = False, 0
        while read < READ_BYTES:
            try:
                chunk = connection.sock.recv(READ_BYTES)
            except (BlockingIOError, InterruptedError):
                break
            except OSError:
                chunk = b""
            if not chunk:
                closed = True
                break
            connection.chunks.append(chunk)
            connection.buffered += len(chunk)
            read += len(chunk)
        connection.last = time.monotonic()
        try:
            keep = self._take_frames(connection)
        except OSError:
            keep = False
        except Exception:  # whatever a peer sends, the collector goes on serving the others
            self.counts.add(malformed=1)
            keep = False
        if closed and keep and connection.buffered >= HEADER.size:
            self.counts.add(malformed=1)  # closed inside a frame
        if closed or not keep:
            self._close(connection)

    def _take_frames(self, connection: _Connection) -> bool:
        """Serve every whole message in the connection's buffer; whether to keep reading it."""
        while connection.buffered >= max(HEADER.size, connection.needed):
            data = connection.joined()  # once a frame is whole (and once for its length): not at every read
            if not connection.needed:
                try:
                    connection.needed = HEADER.size + frame_length(data)
                except FrameError:
                    self.counts.add(oversized=1)
                    return False
                if len(data) < connection.needed:
                    return True
            end, connection.needed = connection.needed, 0
            connection.chunks = [memoryview(data)[end:]] if len(data) > end else []  # no copy until joined
            connection.buffered = len(data) - end
            try:
                header, body = split_payload(data, HEADER.size, end)
            except FrameError:
                self.counts.add(malformed=1)
                return False
            if not self._serve_one(connection, header, body):
                return False
        return True

    def _serve_one(self, connection: _Connection, header: dict[str, Any], body: memoryview) -> bool:
        """Take one message; whether to read another from this connection."""
        token = header.get("token")
        if not isinstance(token, str) or not hmac.compare_digest(
            token.encode("utf-8", "surrogatepass"), self.token.encode()
        ):
            self.counts.add(bad_token=1)
            return False
        if "node" in header:
            sender = header["node"]
            if not is_count(sender) or sender not in self.nodes or connection.node not in (None, sender):
                self.counts.add(unknown_node=1)
                return False
            connection.node = sender
        if "control" in header:
            if self.on_control is None or connection.node is None or header["control"] in ("data", "closed"):
                self.counts.add(malformed=1)
                return False
            connection.sock.sendall(pack(self.on_control(header, connection.number)))
            return True
        self._accept(header, body)
        if connection.node is not None and self.on_control is not None:
            self.on_control({"control": "data", "node": connection.node}, connection.number)
        return True

    def _close(self, connection: _Connection) -> None:
        try:
            self._selector.unregister(connection.sock)
        except (KeyError, ValueError):
            pass
        connection.sock.close()
        if connection.node is not None and self.on_control is not None:
            self.on_control({"control": "closed", "node": connection.node}, connection.number)

    def _close_silent(self, now: float) -> None:
        """Close the connections that sent nothing for :data:`READ_TIMEOUT_S`."""
        silent = [
            key.data
            for key in self._selector.get_map().values()
            if key.data is not None and now - key.data.last > READ_TIMEOUT_S
        ]
        for connection in silent:
            self._close(connection)

    def _close_all(self) -> None:
        for key in list(self._selector.get_map().values()):
            if key.data is not None:
                self._close(key.data)
        self._selector.close()
        self._listener.close()

    def _accept(self, header: dict[str, Any], body: memoryview) -> None:
        dropped = header.get("dropped", 0)
        try:
            if not is_count(dropped):
                raise FrameError("dropped must be a count")
            items: list[Arrival] = list(sections(header, body))
        except FrameError:
            self.counts.add(malformed=1)
            return
        if dropped and "node" in header:  # lost on another node, on its way here
            items.append(
                EventsDropped(wall_ns=time.time_ns(), rank=None, where=f"node {header['node']}", count=dropped)
            )
        elif dropped:
            items.append(EventsDropped(wall_ns=time.time_ns(), rank=header["rank"], where="worker", count=dropped))
        events = sum(map(event_count, items))
        full = self._enqueue(items)
        self.counts.add(messages=1, events=events - full, queue_full=full)


@dataclass(eq=False)
class _Connection:
    """One peer's connection as the reading thread keeps it."""

    sock: socket.socket
    number: int
    node: int | None = None
    """The node this connection speaks for, once it said so."""
    chunks: list[bytes | memoryview] = field(default_factory=list)
    """What was read and is not yet a whole message (a view: what followed the last message served)."""
    buffered: int = 0
    """Their bytes."""
    needed: int = 0
    """The bytes of the frame begun (its prefix and payload), once its prefix came."""
    last: float = field(default_factory=time.monotonic)
    """``time.monotonic()`` when it last sent something."""

    def joined(self) -> bytes:
        """The bytes read and not yet served, as one (kept so)."""
        first = self.chunks[0] if len(self.chunks) == 1 else None
        if not isinstance(first, bytes):
            first = b"".join(self.chunks)
            self.chunks = [first]
        return first
