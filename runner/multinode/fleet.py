"""The head's view of the other nodes of a multi-node job: who is there, their clocks, how they ended.

Each node's relay (:mod:`meshtop.runner.session.relay`) speaks to the head's collector in
control messages, answered on the same connection:

- ``ping`` (twice a second): the node's time ``t0``, its host, and its last clock measurement; the answer holds
  the head's time ``t1`` and what the head asks of the node: stop the job (and how it ended), dump stacks.
- ``bye``: how the node's part of the job ended, its ranks' exit codes and errors (times on the head's clock).

and the collector says when a node's events came (``data``) and when its
connection closed (``closed``), each with the connection's number.

A node whose connection closed and did not come back on a new one within
:data:`RECONNECT_S`, without its ``bye``, or that says nothing for
:data:`NODE_SILENT_S`, is lost: the head stops the job and names the node and
its ranks. A node whose ranks failed stops the job too.

:class:`SingleNode` has the same interface and does nothing: the fleet of a job on one node, and of a node
other than the head (whose relay, not a fleet, speaks to the head), so
:func:`meshtop.runner.job.launch.run_job` follows every job the same way.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from meshtop.probes.collector import Collector
from meshtop.probes.events import Event, NodeClock
from meshtop.probes.wire import is_count
from meshtop.runner.multinode.nodes import HeadAddress, Nodes, publish_head
from meshtop.runner.results import PEER_GONE, JobResult, RankExit, root_cause

NODE_SILENT_S = 10.0
"""A node that said nothing (its pings come twice a second) for this long is lost."""
RECONNECT_S = 2.0
"""A node whose connection closed has this long to come back on another (a relay reconnects at once)."""
SETTLE_S = 20.0
"""After the head's own ranks ended, how long it waits for every other node's last word."""


STATUSES = ("completed", "interrupted", "failed")


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeEnd:
    """A node's last word (``bye``): how its part of the job ended, and its ranks' exits."""

    status: str
    """One of :data:`STATUSES`."""
    ranks: tuple[RankExit, ...]
    failure_times: dict[int, float]
    """When each rank that said so failed, on the head's clock (seconds)."""

    @classmethod
    def read(cls, header: dict[str, Any]) -> NodeEnd:
        """What the ``bye`` in ``header`` says, checked as the wire checks a header: a field of the wrong type is
        left out, and a status other than :data:`STATUSES` is ``failed`` (a node that cannot say how it ended
        did not complete)."""
        said = header.get("ranks")
        ranks: list[RankExit] = []
        times: dict[int, float] = {}
        for rank, end in said.items() if isinstance(said, dict) else ():
            if not (str(rank).isdigit() and isinstance(end, dict)):
                continue
            code, signal, error = end.get("exit_code"), end.get("signal"), end.get("error")
            ranks.append(
                RankExit(
                    rank=int(rank),
                    exit_code=code if isinstance(code, int) and not isinstance(code, bool) else None,
                    signal=signal if isinstance(signal, str) else None,
                    error=error if isinstance(error, str) else None,
                )
            )
            if isinstance(when := end.get("timestamp"), (int, float)) and not isinstance(when, bool):
                times[int(rank)] = float(when)
        status = header.get("status")
        return cls(status=status if status in STATUSES else "failed", ranks=tuple(ranks), failure_times=times)


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
    threads call :meth:`on_control`, the session's loop the rest)."""

    def __init__(
        self,
        nodes: Nodes,
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
        self._nodes = {node: NodeState(node) for node in nodes.others}
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
            if what == "bye":
                state.bye = NodeEnd.read(header)
                return {"t1": time.time_ns()}
            host, offset, rtt = header.get("host"), header.get("offset_ns"), header.get("rtt_ns")
            if isinstance(host, str):
                state.host = host[:255]
            if isinstance(offset, int) and is_count(rtt) and (offset, rtt) != (state.offset_ns, state.rtt_ns):
                state.offset_ns, state.rtt_ns = offset, rtt
                self._events.append(
                    NodeClock(
                        node=state.node, host=state.host or "?", wall_ns=time.time_ns(), offset_ns=offset, rtt_ns=rtt
                    )
                )
            stacks, state.stacks = state.stacks, False
            return {"t1": time.time_ns(), "stop": self._stop, "stacks": stacks}

    # -- the session's side

    def collector(self) -> Collector:
        """The head's collector: it listens where the other nodes reach it and hands their control messages
        to :meth:`on_control`."""
        host, port = self._head.bind_address()
        return Collector(host=host, port=port, nodes=self._head.others, on_control=self.on_control)

    def publish(self, collector: Collector, *, going: Callable[[], bool]) -> None:
        """Put the collector's address and token into the rendezvous store, from a thread (the store is up
        once a launcher joined the rendezvous; ``going``: whether the launcher still runs)."""
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
            return next(
                (
                    replace(state)
                    for state in self._nodes.values()
                    if state.bye is not None and state.bye.status == "failed"
                ),
                None,
            )

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
        ranks: dict[int, RankExit] = {r.rank: r for r in local.ranks if r.rank in local_ranks}
        failures: dict[str, dict[str, object]] = {}
        statuses = {local.status}
        lost, node_failed = None, None
        for state in self.nodes():
            if not state.last_seen:  # never came: an elastic job ran without it
                continue
            if state.lost is not None and lost is None:
                lost = state
            end = state.bye
            if end is None:
                statuses.add("failed")
                continue
            statuses.add(end.status)
            if end.status == "failed" and node_failed is None:  # why, if no rank of it is to blame
                said = next((ended.error for ended in end.ranks if ended.error), None)
                node_failed = f"node {state.node} (host {state.host or '?'}) failed" + (f": {said}" if said else "")
            for ended in end.ranks:
                ranks[ended.rank] = ended
                if ended.exit_code not in (0, None):
                    when = end.failure_times.get(ended.rank)
                    failures[str(ended.rank)] = {"signal": ended.signal, "error": ended.error, "timestamp": when}
        for ended in local.failed:
            failures.setdefault(
                str(ended.rank), {"signal": ended.signal, "timestamp": local.failure_times.get(ended.rank)}
            )
        with self._lock:
            asked = self._stop
        if lost is not None and asked != "interrupted":
            what = node_line(lost)
            for rank in range(world_size):
                ranks.setdefault(
                    rank,
                    RankExit(
                        rank=rank,
                        exit_code=None,
                        signal=None,
                        error=f"on the lost node {lost.node}" if rank in lost.ranks else f"stopped: {what}",
                    ),
                )
            return JobResult(
                status="failed",
                ranks=tuple(ranks[r] for r in sorted(ranks)),
                duration_s=local.duration_s,
                log_path=local.log_path,
                root_cause=min(lost.ranks) if lost.ranks else None,
                node_lost=what,
            )
        if local.hang is not None or asked == "interrupted":
            status, first = local.status, local.root_cause
        else:
            status = "failed" if "failed" in statuses else "interrupted" if "interrupted" in statuses else "completed"
            first = root_cause(failures) if status == "failed" else None
        if node_failed is not None and first is not None and PEER_GONE.search(str(ranks[first].error or "")):
            first = None  # it lost its peers with the node that failed: the node is the cause
        if status != "failed" or first is not None or local.hang is not None:
            node_failed = None
        why = (
            "stopped on request"
            if status == "interrupted"
            else (
                f"stopped after rank {first} failed"
                if first is not None
                else (local.hang and "stopped: hang") or (node_failed and f"stopped: {node_failed}")
            )
        )
        for rank in range(world_size):
            ranks.setdefault(
                rank,
                RankExit(rank=rank, exit_code=0 if status == "completed" else None, signal=None, error=why or None),
            )
        return JobResult(
            status=status,
            ranks=tuple(ranks[r] for r in sorted(ranks)),
            duration_s=local.duration_s,
            log_path=local.log_path,
            root_cause=first,
            hang=local.hang,
            node_failed=node_failed,
        )


def node_line(state: NodeState) -> str:
    """``node 1 (host b, ranks 2, 3) lost: ...``."""
    ranks = ", ".join(map(str, sorted(state.ranks))) or "none started"
    return f"node {state.node} (host {state.host or '?'}, ranks {ranks}) lost: {state.lost}"


class SingleNode:
    """The fleet of a job that no other node reports to here: one node, or a node other than the head. It has
    :class:`Fleet`'s interface and does nothing: no other node to hear from, stop, wait for or merge."""

    def collector(self) -> Collector:
        """A collector on loopback, for this node's ranks alone."""
        return Collector()

    def publish(self, collector: Collector, *, going: Callable[[], bool]) -> None:
        """Nothing to publish: no other node looks for this one."""

    def is_other(self, node: int) -> bool:
        return False

    def take_events(self) -> list[Event]:
        return []

    def note_ranks(self, node: int, rank: int) -> None:
        """No other node's ranks to note."""

    def restarted(self) -> None:
        """No other node's ranks to forget."""

    def lost(self) -> NodeState | None:
        return None

    def failed(self) -> NodeState | None:
        return None

    def stop(self, status: str) -> None:
        """No other node to stop."""

    def ask_stacks(self) -> None:
        """No other node to dump its ranks."""

    def note_stack(self, rank: int) -> None:
        """No other node's dumps to count."""

    def stacks_in(self) -> bool:
        return True

    def settle(self, timeout_s: float = SETTLE_S) -> None:
        """No other node to wait for."""

    def merge(self, local: JobResult, local_ranks: set[int], world_size: int) -> JobResult:
        """This node's result is the job's."""
        return local
