"""Many nodes: the options of a multi-node job, and how its nodes find the head.

meshtop follows torchrun onto many machines. The user runs the same
``meshtop run|record`` on every node with torchrun's own options, given to
meshtop for the built-in runner (``--nnodes N --node-rank I --rdzv-endpoint
HOST:PORT --rdzv-id ID``) or to torchrun after ``--``, or none of them where
a scheduler (SLURM, a Kubernetes PyTorchJob) says them in the environment
(:mod:`meshtop.runner.multinode.scheduler`). Every node's launcher
joins torchrun's c10d rendezvous, and meshtop adds one key to the same
store: the head (node 0, or the node ``--head-node`` names) publishes where
its collector listens and the session's token; every other node reads them
there (:mod:`meshtop.runner.session.relay`) and streams its ranks' and samplers' events to it.
Nothing else is configured.

torchrun numbers the nodes by the order the rendezvous sorts them in, not by
``--node-rank``, so a node's global ranks are whatever its launcher was
given; meshtop's node number is its ``--node-rank``, the one the user chose.

An elastic script (``--nnodes MIN:MAX``) runs on the nodes that joined the
rendezvous, from MIN to MAX of them. A node that comes later makes torchrun
start every rank again with it, and meshtop follows each start (:mod:`meshtop.runner.job.rounds`):
the ranks say how many they are (:class:`meshtop.probes.events.RankStarted`). A node
lost stops the job, as on N nodes.
"""

from __future__ import annotations

import ipaddress
import json
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING

from meshtop.recordings.typed_json import RecordingError, dump, load
from meshtop.runner.errors import PlanError

if TYPE_CHECKING:
    from torch.distributed import TCPStore

DEFAULT_RDZV_PORT = 29400
"""torchrun's, for an endpoint given without a port."""
DEFAULT_RDZV_ID = "none"
"""torchrun's default ``--rdzv-id``."""
STORE_KEY = "meshtop/{run_id}/head"
"""The key, in the rendezvous store, that holds the head's collector address and token."""
STORE_CONNECT_S = 5.0
NO_SUCH_HOST = "192.0.2.1"
"""TEST-NET-1 (RFC 5737): a route to it is the default route; no packet is sent."""
LOOK_EVERY_S = 0.2


NODE_OPTIONS = ("nnodes", "node_rank", "rdzv_endpoint", "rdzv_id")
"""torchrun's own node options: a script's go to torchrun, after --."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Nodes:
    """A job on ``count`` nodes (from ``min_count`` to ``count`` for an elastic one), seen from node ``rank``."""

    count: int
    rank: int
    """meshtop's node number, the ``--node-rank`` given here."""
    endpoint: str
    """The c10d rendezvous endpoint, ``HOST:PORT``."""
    run_id: str
    head_rank: int = 0
    """The node that records and shows the job (``--head-node``, the same on every node)."""
    collector_bind: tuple[str, int] | None = None
    """Where the head's collector listens (``--collector-bind``); ``None``: on the address this node reaches
    the rendezvous endpoint from (loopback for a loopback endpoint), on a free port."""
    min_count: int | None = None
    """The MIN of ``--nnodes MIN:MAX`` (``count`` is MAX); ``None`` for ``--nnodes N``."""
    note: str | None = None
    """Where the values came from, where the scheduler's environment gave any
    (:mod:`meshtop.runner.multinode.scheduler`): a line of the session's output."""

    @property
    def elastic(self) -> bool:
        return self.min_count is not None and self.min_count < self.count

    @property
    def head(self) -> bool:
        return self.rank == self.head_rank

    @property
    def others(self) -> tuple[int, ...]:
        """The nodes that stream to the head."""
        return tuple(node for node in range(self.count) if node != self.head_rank)

    def launcher_args(self, nproc_per_node: int) -> tuple[str, ...]:
        """torchrun's options for this node (the built-in runner's)."""
        nnodes = f"{self.min_count}:{self.count}" if self.elastic else str(self.count)
        return (
            f"--nnodes={nnodes}",
            f"--node-rank={self.rank}",
            f"--nproc-per-node={nproc_per_node}",
            "--rdzv-backend=c10d",
            f"--rdzv-endpoint={self.endpoint}",
            f"--rdzv-id={self.run_id}",
        )

    def bind_address(self) -> tuple[str, int]:
        """Where the head's collector listens."""
        if self.collector_bind is not None:
            return self.collector_bind
        return reachable_address(split_endpoint(self.endpoint)[0]), 0

    def advertised(self, bound: tuple[str, int]) -> tuple[str, int]:
        """The address the other nodes are told, of a collector listening on ``bound`` (for a wildcard bind,
        this node's address towards the rendezvous endpoint)."""
        host, port = bound
        if host in ("0.0.0.0", "::", ""):
            host = reachable_address(split_endpoint(self.endpoint)[0])
        return host, port

    @property
    def store_key(self) -> str:
        return STORE_KEY.format(run_id=self.run_id)


def split_endpoint(endpoint: str) -> tuple[str, int]:
    """``(host, port)`` of ``HOST[:PORT]`` (``[v6]:PORT`` too), or a :class:`PlanError`."""
    host, colon, port = endpoint.rpartition(":")
    if not colon or "]" in port:
        host, port = endpoint, str(DEFAULT_RDZV_PORT)
    host = host.strip("[]")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise PlanError(f"--rdzv-endpoint {endpoint!r} is not HOST:PORT (a port from 1 to 65535)")
    return host, int(port)


def reachable_address(endpoint_host: str) -> str:
    """This node's address as the other nodes reach it: the one it reaches the endpoint from, unless that is
    loopback while the endpoint was not named as loopback (a host name that ``/etc/hosts`` maps to
    127.0.1.1 here and the other nodes resolve to this node's address): then the address of the default
    route's interface."""
    address = route_address(endpoint_host)
    if ipaddress.ip_address(address).is_loopback and not named_loopback(endpoint_host):
        address = route_address(NO_SUCH_HOST)
    return address


def named_loopback(host: str) -> bool:
    """``localhost`` or a loopback address written out: every node means itself by it."""
    try:
        return host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def route_address(host: str) -> str:
    """The local address that packets to ``host`` leave from (no packet is sent): the interface the other
    nodes reach this one on, if they reach the rendezvous endpoint the same way."""
    try:
        family, _, _, _, address = socket.getaddrinfo(host, DEFAULT_RDZV_PORT, type=socket.SOCK_DGRAM)[0]
        with socket.socket(family, socket.SOCK_DGRAM) as probe:
            probe.connect(address)
            return str(probe.getsockname()[0])
    except (OSError, ValueError) as error:  # ValueError: a name IDNA refuses ("a..b")
        raise PlanError(
            f"--rdzv-endpoint host {host!r}: {getattr(error, 'strerror', None) or error}: give a host this node "
            "reaches, or --collector-bind ADDRESS"
        ) from None


def nodes_from_options(
    *,
    nnodes: str | None,
    node_rank: int | None,
    endpoint: str | None,
    run_id: str | None,
    backend: str = "c10d",
    collector_bind: str | None = None,
    head_node: int | None = None,
    elastic: bool = False,
) -> Nodes | None:
    """The :class:`Nodes` of a job on many nodes, ``None`` on one, or a :class:`PlanError` naming the fix;
    ``elastic``: a node range (``MIN:MAX``) may be given (a script's, not the built-in runner's)."""
    if nnodes is None or nnodes in ("1", "1:1"):
        given = [
            flag
            for flag, value in (
                ("--node-rank", node_rank),
                ("--rdzv-endpoint", endpoint),
                ("--collector-bind", collector_bind),
                ("--head-node", head_node),
            )
            if value not in (None, 0)
        ]
        if given:
            raise PlanError(f"{given[0]} is for a job on many nodes: add --nnodes N (or leave it out)")
        return None
    least, count = node_range(nnodes)
    if least != count and not elastic:
        raise PlanError(
            f"--nnodes {nnodes}: the built-in runner's plan fixes its ranks (dp x tp x pp): give "
            f"--nnodes N; a script of yours takes a range (`-- torchrun --nnodes {nnodes} ...`)"
        )
    if count == 1:
        return None
    if node_rank is None:
        raise PlanError(
            f"--nnodes {nnodes} needs --node-rank I on every node (0 is the head, which records "
            "and shows the dashboard; the others stream to it)"
        )
    if not 0 <= node_rank < count:
        raise PlanError(f"--node-rank {node_rank}: give a node rank from 0 to {count - 1}")
    head = head_node if head_node is not None else 0
    if not 0 <= head < count:
        raise PlanError(f"--head-node {head}: give a node rank from 0 to {count - 1}, the same on every node")
    if backend != "c10d":
        raise PlanError(
            f"--rdzv-backend {backend}: meshtop follows a job on many nodes through torchrun's c10d "
            "rendezvous: give --rdzv-backend c10d --rdzv-endpoint HOST:PORT"
        )
    if not endpoint:
        raise PlanError(
            f"--nnodes {nnodes} needs --rdzv-endpoint HOST:PORT, the same on every node (the head's address, say)"
        )
    host, port = split_endpoint(endpoint)
    if node_rank == head and collector_bind is None:
        reachable_address(host)  # the head listens where the others reach it: that must be known now
    bind = None
    if collector_bind is not None:
        bind_host, colon, bind_port = collector_bind.rpartition(":")
        if not colon:
            bind_host, bind_port = collector_bind, "0"
        if not bind_host or not bind_port.isdigit() or int(bind_port) > 65535:
            raise PlanError(f"--collector-bind {collector_bind!r} is not ADDRESS or ADDRESS:PORT")
        bind = (bind_host.strip("[]"), int(bind_port))
    return Nodes(
        count=count,
        rank=node_rank,
        endpoint=f"{host}:{port}",
        run_id=run_id or DEFAULT_RDZV_ID,
        head_rank=head,
        collector_bind=bind,
        min_count=least if least != count else None,
    )


def node_range(nnodes: str) -> tuple[int, int]:
    """``(MIN, MAX)`` of ``--nnodes N`` (``(N, N)``) or ``MIN:MAX``."""
    low, colon, high = nnodes.partition(":")
    if not low.isdigit() or (colon and not high.isdigit()) or int(low) < 1:
        raise PlanError(f"--nnodes {nnodes!r} is not N or MIN:MAX")
    if colon and int(high) < int(low):
        raise PlanError(f"--nnodes {nnodes}: MIN is above MAX: give MIN:MAX with MIN <= MAX")
    return int(low), int(high) if colon else int(low)


@dataclass(frozen=True, slots=True, kw_only=True)
class HeadAddress:
    """What the head publishes in the rendezvous store."""

    address: tuple[str, int]
    token: str
    host: str


def _store(nodes: Nodes) -> TCPStore:
    """A client of the rendezvous store; an ``OSError`` while nothing listens there yet (asked with a plain
    connection first: torch's client logs every failed try of its own)."""
    from torch.distributed import TCPStore

    host, port = split_endpoint(nodes.endpoint)
    socket.create_connection((host, port), timeout=STORE_CONNECT_S).close()
    return TCPStore(host, port, is_master=False, timeout=timedelta(seconds=STORE_CONNECT_S), wait_for_workers=False)


def publish_head(nodes: Nodes, head: HeadAddress, *, going: Callable[[], bool]) -> bool:
    """Put ``head`` in the rendezvous store, once the store is up (torchrun's launcher starts it); whether it
    got there before ``going()`` turned false."""
    while going():
        try:
            _store(nodes).set(nodes.store_key, json.dumps(dump(head)))
            return True
        except (RuntimeError, OSError, ValueError):  # the store is not up yet (the launchers start it)
            time.sleep(LOOK_EVERY_S)
    return False


def find_head(nodes: Nodes, *, going: Callable[[], bool]) -> HeadAddress | None:
    """The head's address and token, once it published them; ``None`` if ``going()`` turned false first."""
    store = None
    while going():
        try:
            store = store or _store(nodes)
            if store.check([nodes.store_key]):
                return load(HeadAddress, json.loads(store.get(nodes.store_key)))
        except RecordingError:
            pass  # not what a head writes: keep looking for it
        except (RuntimeError, OSError, ValueError):
            store = None
        time.sleep(LOOK_EVERY_S)
    return None
