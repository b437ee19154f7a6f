"""The head's view of the other nodes of a multi-node job: who is there, their clocks, how they ended.

Each node's relay (:mod:`meshtop.runner.session.relay`) speaks to the head's collector in
control messages, a ``control`` field naming it and a ``says`` field holding it (:func:`message`), each answered
on the same connection by a :class:`HeadAnswer`:

- ``ping`` (twice a second, a :class:`Ping`): the node's time ``t0``, its host, and its last clock measurement;
  the answer holds the head's time ``t1`` and what the head asks of the node: stop the job (and how it ended),
  dump stacks.
- ``bye`` (a :class:`NodeEnd`): how the node's part of the job ended, its ranks' exit codes and errors (times on
  the head's clock).

and the collector says when a node's events came (``data``) and when its
connection closed (``closed``), each with the connection's number.

A node whose connection closed and did not come back on a new one within
:data:`RECONNECT_S`, without its ``bye``, or that says nothing for
:data:`NODE_SILENT_S`, is lost: the head stops the job and names the node and
its ranks. A node whose ranks failed stops the job too.

A fleet of no other nodes (a job on one node, a node other than the head) does nothing, so
:func:`meshtop.runner.job.launch.run_job` follows every job the same way.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

from meshtop.probes.collector import Collector
from meshtop.probes.events import Event, NodeClock
from meshtop.probes.wire import is_count
from meshtop.recordings.typed_json import RecordingError, dump, load
from meshtop.runner.multinode.nodes import HeadAddress, Nodes, publish_head
from meshtop.runner.results import PEER_GONE, JobResult, RankExit, RankFailure, root_cause

NODE_SILENT_S = 10.0
"""A node that said nothing (its pings come twice a second) for this long is lost."""
RECONNECT_S = 2.0
"""A node whose connection closed has this long to come back on another (a relay reconnects at once)."""
SETTLE_S = 20.0
"""After the head's own ranks ended, how long it waits for every other node's last word."""


STATUSES = ("completed", "interrupted", "failed")
Said = TypeVar("Said")


@dataclass(frozen=True, slots=True, kw_only=True)
class Ping:
    """A node's ``ping``: its time, its host, and its last clock measurement."""

    t0: int
    host: str
    offset_ns: int | None = None
    rtt_ns: int | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class HeadAnswer:
    """The head's answer to a ``ping`` or a ``bye``: its time, and what it asks of the node."""

    t1: int
    stop: str | None = None
    """Stop the node's ranks: the job ended so."""
    stacks: bool = False
    """Dump the node's ranks' stacks."""


@dataclass(frozen=True, slots=True, kw_only=True)
class RankEnded:
    """A rank of another node, as its node says it ended."""

    exit: RankExit
    failed_at: float | None = None
    """When it failed, on the head's clock (torchrun's timestamp, seconds)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeEnd:
    """A node's last word (``bye``): how its part of the job ended, and its ranks' exits."""

    status: str
    """One of :data:`STATUSES`."""
    ranks: tuple[RankEnded, ...]

    @classmethod
    def of(cls, result: JobResult, offset_ns: int) -> NodeEnd:
        """How ``result`` ended, its times moved onto the head's clock (this node's is ``offset_ns`` behind)."""
        times = {rank: when + offset_ns / 1e9 for rank, when in result.failure_times.items()}
        return cls(
            status=result.status, ranks=tuple(RankEnded(exit=r, failed_at=times.get(r.rank)) for r in result.ranks)
        )


def message(control: str, says: object) -> dict[str, Any]:
    """A control message's fields: what it is, and what it says (a dataclass, as JSON)."""
    return {"control": control, "says": dump(says)}


def read(hint: type[Said], said: object) -> Said | None:
    """What a node or the head said, as ``hint``; ``None`` where it is not one (checked as the manifest is)."""
    try:
        return load(hint, said, whole=hint.__name__)
    except RecordingError:
        return None


@dataclass
class NodeState:
    """One node as the head knows it."""

    node: int
    host: str | None = None
    last_seen: float = 0.0
    """``time.monotonic()`` of its last message (0: none yet)."""
    connection: int = 0
    """The number of the connection it last spoke on."""
    closed_at: float | None = None
    """When that connection closed, if it did."""
    offset_ns: int | None = None
    rtt_ns: int | None = None
    bye: NodeEnd | None = None
    lost: str | None = None
    """Why the node is lost, once it is."""
    ranks: set[int] = field(default_factory=set)
    stacks: bool = False
    """A stack dump of its ranks is asked for and not yet passed on."""


class Fleet:
    """The other nodes of ``nodes``, as their control messages tell the head; thread-safe (the collector's
    threads call :meth:`on_control`, the session's loop the rest). Without ``nodes`` (a job on one node, or a
    node other than the head, whose relay speaks to the head) it has no other node to hear from, stop, wait
    for or merge."""

    def __init__(
        self,
        nodes: Nodes | None = None,
        *,
        silent_s: float = NODE_SILENT_S,
        reconnect_s: float = RECONNECT_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._head = nodes
        """The job's nodes, seen from the head (this node)."""
        self.silent_s = silent_s
        self.reconnect_s = reconnect_s
        self._clock = clock
        """Seconds, for silences and reconnects (a test's own clock: a busy machine stretches real ones)."""
        self._lock = threading.Lock()
        self._nodes = {node: NodeState(node) for node in (nodes.others if nodes is not None else ())}
        self._events: list[Event] = []
        self._stop: str | None = None
        self._stacks_from: set[int] = set()

    # -- the collector's side

    def on_control(self, header: dict[str, Any], connection: int) -> dict[str, Any]:
        now = self._clock()
        with self._lock:
            state = self._nodes[header["node"]]  # the collector checked it is one of the job's
            what = header.get("control")
            if what == "closed":
                if connection == state.connection:
                    state.closed_at = now
                return {}
            if connection > state.connection:  # a new connection: a reconnect, not a loss
                state.connection, state.closed_at = connection, None
            state.last_seen = now
            if what == "data":
                return {}
            if what == "bye":  # a node that cannot say how it ended did not complete
                end = read(NodeEnd, header.get("says")) or NodeEnd(status="failed", ranks=())
                state.bye = end if end.status in STATUSES else replace(end, status="failed")
                return dump(HeadAnswer(t1=time.time_ns()))
            if (ping := read(Ping, header.get("says"))) is not None:
                state.host = ping.host[:255]
                offset, rtt = ping.offset_ns, ping.rtt_ns
                if offset is not None and is_count(rtt) and (offset, rtt) != (state.offset_ns, state.rtt_ns):
                    state.offset_ns, state.rtt_ns = offset, rtt
                    clock = NodeClock(
                        node=state.node, host=state.host, wall_ns=time.time_ns(), offset_ns=offset, rtt_ns=rtt
                    )
                    self._events.append(clock)
            stacks, state.stacks = state.stacks, False
            return dump(HeadAnswer(t1=time.time_ns(), stop=self._stop, stacks=stacks))

    # -- the session's side

    def collector(self) -> Collector:
        """The head's collector: it listens where the other nodes reach it and hands their control messages
        to :meth:`on_control` (on loopback, for this node's ranks alone, without other nodes)."""
        host, port = self._head.bind_address() if self._head is not None else ("127.0.0.1", 0)
        return Collector(host=host, port=port, nodes=tuple(self._nodes), on_control=self.on_control)

    def publish(self, collector: Collector, *, going: Callable[[], bool]) -> None:
        """Put the collector's address and token into the rendezvous store, from a thread (the store is up
        once a launcher joined the rendezvous; ``going``: whether the launcher still runs)."""
        if self._head is None:
            return
        head = HeadAddress(
            address=self._head.advertised(collector.address), token=collector.token, host=socket.gethostname()
        )
        threading.Thread(
            target=publish_head,
            args=(self._head, head),
            kwargs={"going": going},
            name="meshtop-publish-head",
            daemon=True,
        ).start()

    def is_other(self, node: int) -> bool:
        """Whether ``node`` is one of the other nodes (its own meshtop samples its ranks and dumps their stacks)."""
        return node in self._nodes

    def take_events(self) -> list[Event]:
        """The clock measurements that came since the last call."""
        with self._lock:
            events, self._events = self._events, []
        return events

    def note_ranks(self, node: int, rank: int) -> None:
        """Rank ``rank`` runs on ``node`` (from its :class:`RankStarted`)."""
        with self._lock:
            if node in self._nodes:
                self._nodes[node].ranks.add(rank)

    def restarted(self) -> None:
        """torchrun started every rank again: each node's ranks are told anew by their starts."""
        with self._lock:
            for state in self._nodes.values():
                state.ranks.clear()

    def lost(self) -> NodeState | None:
        """The first node lost (its stream closed without a last word, or silent too long), if any."""
        now = self._clock()
        with self._lock:
            for state in self._nodes.values():
                if state.lost is not None or state.bye is not None or not state.last_seen:
                    continue
                if state.closed_at is not None and now - state.closed_at > self.reconnect_s:
                    state.lost = "its stream to the head closed before it said how its ranks ended"
                elif now - state.last_seen > self.silent_s:
                    state.lost = f"nothing from it for {now - state.last_seen:.0f} s (network, or the node is down)"
            return next((replace(state) for state in self._nodes.values() if state.lost is not None), None)

    def failed(self) -> NodeState | None:
        """The first node that said its ranks failed, if any."""
        with self._lock:
            failed = [state for state in self._nodes.values() if state.bye is not None and state.bye.status == "failed"]
            return replace(failed[0]) if failed else None

    def stop(self, status: str) -> None:
        """Ask every node to stop its ranks; the job ends ``status`` (what they exit with)."""
        with self._lock:
            self._stop = self._stop or status

    def ask_stacks(self) -> None:
        """A py-spy dump of every rank of every node (each node dumps its own)."""
        with self._lock:
            self._stacks_from.clear()
            for state in self._nodes.values():
                state.stacks = True

    def note_stack(self, rank: int) -> None:
        with self._lock:
            self._stacks_from.add(rank)

    def stacks_in(self) -> bool:
        """Whether every rank of the other nodes sent the stack dump last asked for (or its node is gone)."""
        with self._lock:
            return all(
                state.ranks <= self._stacks_from
                for state in self._nodes.values()
                if state.lost is None and state.bye is None
            )

    def settle(self, timeout_s: float = SETTLE_S) -> None:
        """Wait until every node said how it ended or is lost; one still silent then is lost, and told to stop
        (a node that never came is not waited for)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            self.lost()
            with self._lock:
                if all(s.bye is not None or s.lost is not None or not s.last_seen for s in self._nodes.values()):
                    return
            time.sleep(0.1)
        with self._lock:
            self._stop = self._stop or "failed"
            for state in self._nodes.values():
                if state.bye is None and state.lost is None and state.last_seen:
                    state.lost = f"it did not say how its ranks ended within {timeout_s:.0f} s of the head's end"

    def nodes(self) -> list[NodeState]:
        with self._lock:
            return [replace(state, ranks=set(state.ranks)) for state in self._nodes.values()]

    def merge(self, local: JobResult, local_ranks: set[int], world_size: int) -> JobResult:
        """The whole job's result: the head's own ranks' from ``local``, the others' from their nodes.

        A node lost ends the job ``failed``, naming it; a stop the head asked for (the user's, or a hang)
        keeps the head's status, whatever the other nodes' ranks did once their peers were gone; else the
        first failure over every node is the root cause."""
        if not self._nodes:
            return local
        ranks: dict[int, RankExit] = {r.rank: r for r in local.ranks if r.rank in local_ranks}
        failures = {
            r.rank: RankFailure(
                exit_code=r.exit_code, signal=r.signal, error=r.error, timestamp=local.failure_times.get(r.rank)
            )
            for r in local.failed
        }
        statuses = {local.status}
        seen = [state for state in self.nodes() if state.last_seen]  # one never seen: an elastic job ran without it
        for state in seen:
            end = state.bye or NodeEnd(status="failed", ranks=())
            statuses.add(end.status)
            for ended in end.ranks:
                ranks[ended.exit.rank] = ended.exit
                if ended.exit.exit_code not in (0, None):
                    failures[ended.exit.rank] = RankFailure(
                        exit_code=ended.exit.exit_code,
                        signal=ended.exit.signal,
                        error=ended.exit.error,
                        timestamp=ended.failed_at,
                    )
        with self._lock:
            asked = self._stop
        lost = next((state for state in seen if state.lost is not None), None) if asked != "interrupted" else None
        node_failed = next((failure_line(s) for s in seen if lost is None and s.bye and s.bye.status == "failed"), None)
        if lost is not None:
            status, first = "failed", min(lost.ranks, default=None)
        elif local.hang is not None or asked == "interrupted":
            status, first = local.status, local.root_cause
        else:
            status = "failed" if "failed" in statuses else "interrupted" if "interrupted" in statuses else "completed"
            first = root_cause(failures) if status == "failed" else None
        if node_failed is not None and first is not None and PEER_GONE.search(str(ranks[first].error or "")):
            first = None  # it lost its peers with the node that failed: the node is the cause
        if status != "failed" or first is not None or local.hang is not None:
            node_failed = None
        node_lost = node_line(lost) if lost is not None else None
        why = (
            f"stopped: {node_lost}"
            if node_lost is not None
            else "stopped on request"
            if status == "interrupted"
            else f"stopped after rank {first} failed"
            if first is not None
            else (local.hang and "stopped: hang") or (node_failed and f"stopped: {node_failed}")
        )
        for rank in range(world_size):
            error = f"on the lost node {lost.node}" if lost is not None and rank in lost.ranks else why or None
            ranks.setdefault(
                rank, RankExit(rank=rank, exit_code=0 if status == "completed" else None, signal=None, error=error)
            )
        return JobResult(
            status=status,
            ranks=tuple(ranks[r] for r in sorted(ranks)),
            duration_s=local.duration_s,
            log_path=local.log_path,
            root_cause=first,
            hang=local.hang if lost is None else None,
            node_lost=node_lost,
            node_failed=node_failed,
        )


def failure_line(state: NodeState) -> str:
    """``node 1 (host b) failed: ...``, with the first error its ranks said."""
    said = next((ended.exit.error for ended in state.bye.ranks if ended.exit.error), None) if state.bye else None
    return f"node {state.node} (host {state.host or '?'}) failed" + (f": {said}" if said else "")


def node_line(state: NodeState) -> str:
    """``node 1 (host b, ranks 2, 3) lost: ...``."""
    ranks = ", ".join(map(str, sorted(state.ranks))) or "none started"
    return f"node {state.node} (host {state.host or '?'}, ranks {ranks}) lost: {state.lost}"
