"""The collector: where every worker's events arrive, in the meshtop process.

It listens on 127.0.0.1 by default. Every message must carry the session's
token; a message without it, a malformed or oversized frame, or a connection
that sends faster than the consumer drains (the queue is bounded) is
rejected and counted, never fatal: the collector keeps serving the others.
A non-loopback bind is allowed only with a token (there always is one).

On the head of a multi-node job it also takes the other nodes' streams
(:mod:`meshtop.runner.multinode.relay`): their messages name their ``node``, which must be one
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
import socket
import socketserver
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from meshtop.probes.arrivals import Arrival, EncodedEvents, event_count
from meshtop.probes.errors import ProbeError
from meshtop.probes.events import EventsDropped
from meshtop.probes.wire import FrameError, is_count, pack, read_frame, sections

DEFAULT_QUEUE_EVENTS = 1_000_000
DEFAULT_QUEUE_BYTES = 512 * 1024 * 1024
READ_TIMEOUT_S = 30.0


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
        collector = self

        class Handler(socketserver.BaseRequestHandler):
            def handle(self) -> None:
                collector._serve(self.request)

        class Server(socketserver.ThreadingTCPServer):
            daemon_threads = True
            allow_reuse_address = True

        try:
            self._server = Server((host, port), Handler)
        except OSError as error:
            raise ProbeError(f"cannot listen on {host}:{port}: {error.strerror}") from None
        # serve_forever checks for shutdown() once per poll interval: 0.5 s by default, which every job's end waited.
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, name="meshtop-collector", daemon=True
        )

    @property
    def address(self) -> tuple[str, int]:
        host, port = self._server.server_address[:2]
        return str(host), int(port)

    def start(self) -> Collector:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

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

    def _serve(self, sock: socket.socket) -> None:
        sock.settimeout(READ_TIMEOUT_S)
        node: list[int] = []  # the node this connection speaks for, once it said so
        connection = next(self._connections)
        try:
            while self._serve_one(sock, node, connection):
                pass
        except OSError:
            pass
        except Exception:  # whatever a peer sends, the collector goes on serving the others
            self.counts.add(malformed=1)
        if node and self.on_control is not None:
            self.on_control({"control": "closed", "node": node[0]}, connection)

    def _serve_one(self, sock: socket.socket, node: list[int], connection: int) -> bool:
        """Take one message; whether to read another from this connection."""
        try:
            message = read_frame(sock)
        except FrameError as error:
            self.counts.add(**({"oversized": 1} if "limit" in str(error) else {"malformed": 1}))
            return False
        if message is None:
            return False
        header, body = message
        token = header.get("token")
        if not isinstance(token, str) or not hmac.compare_digest(
            token.encode("utf-8", "surrogatepass"), self.token.encode()
        ):
            self.counts.add(bad_token=1)
            return False
        if "node" in header:
            sender = header["node"]
            if not is_count(sender) or sender not in self.nodes or (node and node[0] != sender):
                self.counts.add(unknown_node=1)
                return False
            node[:] = [sender]
        if "control" in header:
            if self.on_control is None or not node or header["control"] in ("data", "closed"):
                self.counts.add(malformed=1)
                return False
            sock.sendall(pack(self.on_control(header, connection)))
            return True
        self._accept(header, body)
        if node and self.on_control is not None:
            self.on_control({"control": "data", "node": node[0]}, connection)
        return True

    def _accept(self, header: dict[str, Any], body: bytes) -> None:
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
