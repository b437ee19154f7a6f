"""A job's nodes as the scheduler that started this node says, where the command line does not.

A job on many nodes needs three values on each node: the node count, this node's rank, and the head's address
(the c10d rendezvous endpoint, whose store the head's launcher hosts). ``srun meshtop record ...`` under SLURM
and a Kubernetes PyTorchJob pod running ``meshtop record ...`` give none of them on the command line: the
scheduler puts them in the environment. Each value is taken, on its own, from the first of these that gives it:

1. **the command line**: meshtop's node options (the built-in runner) or torchrun's after ``--``
   (``--nnodes``, ``--node-rank``, ``--rdzv-endpoint``);
2. **torchrun's environment**: ``PET_NNODES``, ``PET_NODE_RANK``, ``PET_RDZV_ENDPOINT``, then
   ``PET_MASTER_ADDR`` / ``PET_MASTER_PORT`` (torchrun reads each of its options from its ``PET_*``
   variable), then the unprefixed ``MASTER_ADDR`` / ``MASTER_PORT`` that a PyTorchJob sets in each pod (and an
   sbatch script often exports);
3. **SLURM's**, which torchrun does not read: ``SLURM_NNODES``, ``SLURM_NODEID``, and the first host of
   the step's host list as the head (the node that ``srun`` numbers 0): ``SLURM_STEP_NODELIST``, set by
   ``srun`` (a step on fewer nodes than the job's starts on its own first node), else ``SLURM_JOB_NODELIST``.

The command line wins so that one option can correct a scheduler (``--nnodes 1`` runs on this node alone);
torchrun's variables win over SLURM's because they are torchrun's own, set for this launch. A head found
without a port listens on :data:`DEFAULT_RDZV_PORT`, torchrun's c10d default. A job on one node (no count, or
a count of 1) reads nothing else: a ``MASTER_ADDR`` exported for another purpose changes nothing there.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, replace

from meshtop.runner.errors import PlanError
from meshtop.runner.multinode.nodes import DEFAULT_RDZV_PORT, Nodes, node_range, nodes_from_options

COUNT_VARIABLES = ("PET_NNODES", "SLURM_NNODES")
"""Where the node count is read, first to last."""
RANK_VARIABLES = ("PET_NODE_RANK", "SLURM_NODEID")
ENDPOINT_VARIABLES = ("PET_RDZV_ENDPOINT",)
HEAD_VARIABLES = ("PET_MASTER_ADDR", "MASTER_ADDR")
"""The head's host, after an endpoint, first to last (SLURM's comes from its node list)."""
PORT_VARIABLES = ("PET_MASTER_PORT", "MASTER_PORT")
NODELIST_VARIABLES = ("SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST")

_RANGE = r"\d+(?:-\d+)?"
_ENTRY = rf"(?:[A-Za-z0-9._-]+|\[{_RANGE}(?:,{_RANGE})*\])+"
_HOSTLIST = re.compile(rf"{_ENTRY}(?:,{_ENTRY})*")
_BRACKETS = re.compile(r"\[([^\]]*)\]")


def first_host(nodelist: str, variable: str = "SLURM_JOB_NODELIST") -> str:
    """The first host of a SLURM host list (``gpu[01-04,07],login2`` gives ``gpu01``; ``node-[1-3]``,
    ``node-1``; ``rack[1-2]-gpu[08-09]``, ``rack1-gpu08``), or a :class:`PlanError` naming ``variable`` for a
    list it cannot read.

    A bracket holds numbers and ranges ``LO-HI``, each number written with its zeros (``[01-04]``); the first
    host takes the first number of each bracket of the list's first entry, as written. The whole list is
    checked, so a list cut short or mistyped is refused rather than read in part."""
    text = nodelist.strip()
    if not _HOSTLIST.fullmatch(text) or not all(_ranges_ascend(inside) for inside in _BRACKETS.findall(text)):
        raise PlanError(
            f"{variable} {nodelist!r} is not a host list meshtop reads (like gpu[01-04,07],login2): "
            "give the head's address yourself (--rdzv-endpoint HOST:PORT)"
        )
    entry = re.split(r",(?![^\[]*\])", text, maxsplit=1)[0]
    return _BRACKETS.sub(lambda bracket: re.split(r"[,-]", bracket.group(1))[0], entry)


def _ranges_ascend(inside: str) -> bool:
    return all(int(low) <= int(high) for low, _, high in (part.partition("-") for part in inside.split(",")) if high)


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeValues:
    """The node count, this node's rank and the head's endpoint, as the command line and the environment give
    them (:func:`node_values`); ``None`` where neither does."""

    nnodes: str | None = None
    """``N`` or ``MIN:MAX``."""
    node_rank: int | None = None
    endpoint: str | None = None
    """``HOST:PORT``."""
    found_in: tuple[str, ...] = ()
    """The environment variables that gave a value the command line did not, in the values' order."""

    @property
    def count(self) -> int:
        """The most nodes the job runs on (1 where no count is given)."""
        return node_range(self.nnodes)[1] if self.nnodes is not None else 1

    @property
    def note(self) -> str | None:
        """Where the values came from, as a line for the session's output (``nodes from SLURM (SLURM_NNODES,
        SLURM_NODEID, SLURM_JOB_NODELIST): 2 nodes, this is node 1, head gpu01:29400``); ``None`` where the
        environment gave none."""
        if not self.found_in or self.count == 1:
            return None
        slurm = all(name.startswith("SLURM_") for name in self.found_in)
        where = "SLURM" if slurm else "the environment"
        return (
            f"nodes from {where} ({', '.join(self.found_in)}): {self.nnodes} nodes, this is node {self.node_rank}, "
            f"head {self.endpoint}"
        )


def node_values(
    *,
    nnodes: str | None,
    node_rank: int | None,
    endpoint: str | None,
    env: Mapping[str, str],
) -> NodeValues:
    """The job's node values: those the command line gives (``None``: not given), the rest from ``env`` by the
    module's order, or a :class:`PlanError` naming a variable that does not hold what it should. On one node
    nothing more is read."""
    nnodes, name = _nnodes(nnodes, env)
    found = [name] if name is not None else []
    count = node_range(nnodes)[1] if nnodes is not None else 1
    if count == 1:
        return NodeValues(nnodes=nnodes, node_rank=node_rank, endpoint=endpoint, found_in=tuple(found))
    if node_rank is None:
        given = _first(env, RANK_VARIABLES)
        if given is None and found:
            raise PlanError(
                f"{found[0]}={nnodes} says {count} nodes, but nothing says which one this is: give --node-rank I "
                f"(or set {' or '.join(RANK_VARIABLES)})"
            )
        if given is None:  # a count given on the command line, and no rank: nodes_from_options names the fix
            return NodeValues(nnodes=nnodes, endpoint=endpoint)
        name, rank = given
        _check(name, rank, rank.isdigit() and int(rank) < count, f"a node rank from 0 to {count - 1}")
        node_rank = int(rank)
        found.append(name)
    if endpoint is None:
        endpoint = _head(env, found)
    return NodeValues(nnodes=nnodes, node_rank=node_rank, endpoint=endpoint, found_in=tuple(found))


def node_count(nnodes: str | None, env: Mapping[str, str]) -> int:
    """The most nodes the job runs on: ``nnodes`` (the command line's), else the environment's count, else 1."""
    nnodes, _ = _nnodes(nnodes, env)
    return node_range(nnodes)[1] if nnodes is not None else 1


def _nnodes(nnodes: str | None, env: Mapping[str, str]) -> tuple[str | None, str | None]:
    """The node count the command line gives, else the environment, checked; and the variable it came from."""
    if nnodes is not None or (given := _first(env, COUNT_VARIABLES)) is None:
        return nnodes, None
    name, nnodes = given
    counts = re.fullmatch(r"0*([1-9]\d*)(?::(\d+))?", nnodes)
    good = counts is not None and int(counts.group(2) or counts.group(1)) >= int(counts.group(1))
    _check(name, nnodes, good, "a node count N (or MIN:MAX)")
    return nnodes, name


def _first(env: Mapping[str, str], names: tuple[str, ...]) -> tuple[str, str] | None:
    """The first of ``names`` set (not empty) in ``env``, and its value."""
    for name in names:
        if value := env.get(name, "").strip():
            return name, value
    return None


def _head(env: Mapping[str, str], found: list[str]) -> str | None:
    """The head's endpoint where the command line gives none (``found`` gets the variables read)."""
    if (given := _first(env, ENDPOINT_VARIABLES)) is not None:
        name, endpoint = given
        found.append(name)
        return endpoint
    host: str | None = None
    if (given := _first(env, HEAD_VARIABLES)) is not None:
        name, host = given
        found.append(name)
    if host is None and (given := _first(env, NODELIST_VARIABLES)) is not None:
        name, nodelist = given
        host = first_host(nodelist, name)
        found.append(name)
    if host is None:
        return None
    port = DEFAULT_RDZV_PORT
    if (given := _first(env, PORT_VARIABLES)) is not None:
        name, text = given
        _check(name, text, text.isdigit() and 0 < int(text) < 65536, "a port from 1 to 65535")
        port = int(text)
        found.append(name)
    endpoint_host = f"[{host}]" if ":" in host else host
    return f"{endpoint_host}:{port}"


def _check(name: str, value: str, good: bool, what: str) -> None:
    if not good:
        raise PlanError(f"{name}={value!r} is not {what}: fix it, or give the value on the command line")


def scheduled_nodes(
    values: NodeValues,
    *,
    run_id: str | None,
    backend: str = "c10d",
    collector_bind: str | None = None,
    head_node: int | None = None,
    elastic: bool = False,
) -> Nodes | None:
    """The :class:`Nodes` of ``values`` (``None`` on one node), with the note of where they came from."""
    nodes = nodes_from_options(
        nnodes=values.nnodes,
        node_rank=values.node_rank,
        endpoint=values.endpoint,
        run_id=run_id,
        backend=backend,
        collector_bind=collector_bind,
        head_node=head_node,
        elastic=elastic,
    )
    return nodes if nodes is None or values.note is None else replace(nodes, note=values.note)
