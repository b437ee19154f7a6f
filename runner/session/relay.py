"""A node other than the head: its ranks and samplers run here, their events go to the head.

The node runs its share of the job as a single machine would (its own
launcher, a collector on loopback, the NVML and psutil samplers, py-spy), and
a relay thread streams what they report to the head's collector, found in
the rendezvous store (:func:`meshtop.runner.multinode.nodes.find_head`). It
forwards the ranks' blocks of events as they came, unread, on this node's
clock, each message with the offset that a ping exchange over the same
connection measured (:class:`meshtop.probes.events.NodeClock`; at start and
every :data:`CLOCK_EVERY_S`): the head puts them on its clock where it reads
them (:mod:`meshtop.recordings.clock`). Reading each event to move it here cost
28 us an event, more than one node's meshtop can spend on a thousand ranks.

The pings (twice a second) are also how the two sides watch each other: the
head answers each with whether to stop the job (it failed elsewhere, or the
user stopped it) and whether to dump the ranks' stacks; a head that does not
answer for :data:`HEAD_SILENT_S` is lost and this node stops its ranks. At
the end the node says how its ranks ended (``bye``) and exits as the whole
job did.
"""

from __future__ import annotations

import math
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

from meshtop.probes.arrivals import Arrivals, EncodedEvents
from meshtop.probes.kinds import FORWARDED_KINDS
from meshtop.probes.sender import Link, Outbox
from meshtop.probes.wire import FrameError
from meshtop.runner.job.control import JobControl
from meshtop.runner.job.environment import Launch
from meshtop.runner.job.launch import run_job
from meshtop.runner.job.supervise import NodeProbes
from meshtop.runner.multinode.fleet import HeadAnswer, NodeEnd, Ping, message, read
from meshtop.runner.multinode.nodes import HeadAddress, Nodes, find_head
from meshtop.runner.results import JobResult

PING_S = 0.5
CLOCK_EVERY_S = 10.0
CLOCK_ROUND = 5
"""Ping exchanges per clock measurement; the one with the shortest round trip counts."""
HEAD_SILENT_S = 10.0
"""A head that has not answered for this long is lost."""
FRAME_EVENTS = 5_000
"""Events per forwarded message (well under the wire's frame limit)."""
MAX_QUEUED = 1_000_000
"""Events held for the head at most; more are counted as dropped."""
CONNECT_S = 5.0


class HeadLost(Exception):
    """The head stopped answering."""


class Relay:
    """Streams this node's events to the head and carries the head's requests back (see the module)."""

    def __init__(
        self,
        nodes: Nodes,
        control: JobControl,
        *,
        on_head: Callable[[HeadAddress], None] = lambda head: None,
        find: Callable[[Nodes, Callable[[], bool]], HeadAddress | None] = lambda nodes, going: find_head(
            nodes, going=going
        ),
    ) -> None:
        self.nodes = nodes
        self.control = control
        self.on_head = on_head
        """Called (on the relay's thread) once the head is found."""
        self.find = find
        """How the head is found: in the rendezvous store (a benchmark's simulated fleet knows it already)."""
        self.host = socket.gethostname()
        self.head: HeadAddress | None = None
        self.offset_ns: int | None = None
        self.rtt_ns: int | None = None
        self.head_status: str | None = None
        """How the head said the job ended, when it asked this node to stop."""
        self.head_lost: str | None = None
        self._outbox = Outbox(MAX_QUEUED)
        self._link: Link | None = None
        self._result: JobResult | None = None
        self._closing = threading.Event()
        self._last_answer = 0.0
        self._thread = threading.Thread(target=self._run, name="meshtop-relay", daemon=True)

    def start(self) -> Relay:
        self._thread.start()
        return self

    @property
    def dropped(self) -> int:
        """Events the queue refused, not yet reported to the head."""
        return self._outbox.dropped

    def forward(self, arrivals: Arrivals) -> None:
        """Queue what this node's ranks and samplers reported (``run_job``'s ``on_events``); how its ranks
        ended goes in the last word instead (the head decides how the job ended)."""
        for item in arrivals.items:
            if isinstance(item, EncodedEvents):
                self._outbox.emit_block(item)
            elif item.kind in FORWARDED_KINDS:
                self._outbox.emit(item)

    def finish(self, result: JobResult | None) -> None:
        """Send what is left and how this node's ranks ended (``None``: meshtop itself broke), then stop.

        Waits while the head takes the events still queued (each message refreshes the head's view of this
        node) and at most :data:`HEAD_SILENT_S` once the head stops answering."""
        self._result = result
        self._closing.set()
        self._thread.join()

    # -- the relay's thread

    def _run(self) -> None:
        head = self.find(self.nodes, lambda: not self._closing.is_set())
        if head is None:
            return
        self.head = head
        self._last_answer = time.monotonic()  # from here the head has HEAD_SILENT_S to answer
        self.on_head(head)
        self._link = link = Link(
            head.address, {"token": head.token, "rank": 0, "node": self.nodes.rank}, timeout_s=CONNECT_S
        )
        try:
            self._measure_clock()
            next_ping = next_clock = time.monotonic()
            while not self._closing.is_set():
                now = time.monotonic()
                if now >= next_clock:
                    self._measure_clock()
                    next_clock = now + CLOCK_EVERY_S
                elif now >= next_ping:
                    self._ping()
                    next_ping = now + PING_S
                if not self._send_frame():  # one message a pass, so the pings keep their pace
                    self._closing.wait(0.05)
            while self._send_frame():
                pass
            if self._result is not None:  # the last word
                self._exchange(message("bye", NodeEnd.of(self._result, self.offset_ns or 0)), answer=True)
        except HeadLost as error:
            self.head_lost = str(error)
            self.control.stop.set()
        finally:
            link.close()

    def _exchange(self, fields: dict[str, Any], body: bytes = b"", *, answer: bool) -> dict[str, Any] | None:
        """Send one message (and read the head's answer), reconnecting for as long as the head may still come
        back."""
        assert self._link is not None
        while True:
            try:
                reply = self._link.send(fields, body, answer=answer)
                if answer:
                    self._last_answer = time.monotonic()
                return reply
            except (OSError, FrameError) as error:
                if time.monotonic() - self._last_answer > HEAD_SILENT_S:
                    where = f"{self._link.address[0]}:{self._link.address[1]}"
                    raise HeadLost(f"the head at {where} stopped answering ({error})") from None
                time.sleep(0.5)

    def _ping(self) -> tuple[int, int, int]:
        """One exchange: (t0, the head's t1, t2); acts on what the head asks."""
        t0 = time.time_ns()
        ping = Ping(t0=t0, host=self.host, offset_ns=self.offset_ns, rtt_ns=self.rtt_ns)
        answer = read(HeadAnswer, self._exchange(message("ping", ping), answer=True)) or HeadAnswer(t1=t0)
        if answer.stop is not None and self.head_status is None:
            self.head_status = answer.stop
            self.control.stop.set()
        if answer.stacks:
            self.control.ask_stacks()
        return t0, answer.t1, time.time_ns()

    def _measure_clock(self) -> None:
        """A round of pings; the shortest round trip gives the offset (:class:`meshtop.probes.events.NodeClock`)."""
        t0, t1, t2 = min((self._ping() for _ in range(CLOCK_ROUND)), key=lambda t: t[2] - t[0])
        self.offset_ns, self.rtt_ns = t1 - (t0 + t2) // 2, t2 - t0

    def _send_frame(self) -> bool:
        """Forward about :data:`FRAME_EVENTS` queued events (whole blocks, one at least), with this node's
        clock offset; whether there were any."""
        assert self.offset_ns is not None, "the clock is measured before anything is forwarded"
        taken = self._outbox.take(FRAME_EVENTS)
        if taken is None:
            return False
        fields, body, _events = taken
        self._exchange({**fields, "offset_ns": self.offset_ns}, body, answer=False)
        return True


def serve_as_node(
    launch: Launch, nodes: Nodes, *, session_dir: Path, out: TextIO, node_probes: NodeProbes = NodeProbes()
) -> str:
    """Run this node's ranks, stream them to the head, and say in a line or two how it went; the whole job's
    status as the head gave it (this node's own where the head could not say)."""
    control = JobControl()
    control.stop_on_hang = False  # the head watches for hangs, over every node's ranks
    where = f"meshtop: node {nodes.rank} of {nodes.count}"

    def found(head: HeadAddress) -> None:
        print(
            f"{where}: {launch.local_world_size} ranks here, streaming to the head at "
            f"{head.address[0]}:{head.address[1]} (host {head.host})",
            file=out,
            flush=True,
        )

    print(
        f"{where}: waiting for the head (node {nodes.head_rank}) through the rendezvous at {nodes.endpoint}",
        file=out,
        flush=True,
    )
    relay = Relay(nodes, control, on_head=found).start()
    result = None
    try:
        result = run_job(
            launch,
            session_dir=session_dir,
            on_events=relay.forward,
            node_probes=node_probes,
            control=control,
            hang_timeout_s=math.inf,
        )
    finally:
        relay.finish(result)
    status = relay.head_status or ("failed" if relay.head_lost else result.status)
    if relay.head_lost:
        print(f"{where}: lost the head: {relay.head_lost}; this node's ranks were stopped", file=out, flush=True)
    elif relay.head is None:
        print(f"{where}: the head never published its address; this node's job {result.status}", file=out, flush=True)
    else:
        print(f"{where}: the job {status} (the head holds the recording)", file=out, flush=True)
    for rank in result.failed:
        how = f"signal {rank.signal}" if rank.signal else f"exit code {rank.exit_code}"
        print(f"  rank {rank.rank}: {how}: {rank.error or 'no error message'}", file=out, flush=True)
    return status
