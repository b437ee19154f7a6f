"""Process groups by the names events carry: the DeviceMesh dim they span, ``world``, or their ranks.

The collective probe names each operation's group through a :class:`GroupDirectory` (the C++ kernel through
the names the directory taught it, :meth:`meshtop.probes.collectives.CollectiveProbe.flush`).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d
from torch._C._distributed_c10d import ProcessGroup


@dataclass(frozen=True, slots=True)
class GroupInfo:
    name: str
    size: int
    ranks: tuple[int, ...]
    """Global rank of each group rank (empty for a group not named: then ranks are given as they are)."""
    c10d_name: str
    """c10d's name of the process group: two groups of one mesh dim label are told apart by it."""

    def global_rank(self, group_rank: int) -> int:
        return self.ranks[group_rank] if self.ranks else group_rank


class GroupDirectory:
    """Names process groups: by the DeviceMesh dim they span (dp, tp, pp, or the user's own dim names),
    else ``world``, else by their ranks (``ranks 0,2``).

    Groups are named when first seen, from any thread: a group nobody added is
    looked up in c10d's registry by its name, and ``other`` only where c10d no
    longer knows it (destroyed before its operations were read).
    """

    def __init__(self) -> None:
        self._by_name: dict[str, GroupInfo] = {}
        self._lock = threading.Lock()
        """The training thread adds meshes while the shipper thread names what the C++ kernel finished."""
        self.generation = 0
        """Counts the times a name was replaced or forgotten (the C++ kernel's copy of the names is then stale)."""

    def add(self, name: str, group: dist.ProcessGroup, *, replace: bool = False) -> None:
        """Name ``group``; the first name given to a group wins (mesh dims before world), unless ``replace``."""
        key = group.group_name
        info = GroupInfo(name, group.size(), tuple(dist.get_process_group_ranks(group)), key)
        with self._lock:
            if key not in self._by_name:
                self._by_name[key] = info
            elif replace and self._by_name[key] != info:
                self._by_name[key] = info
                self.generation += 1

    def known(self) -> list[GroupInfo]:
        """Every group named so far."""
        with self._lock:
            return list(self._by_name.values())

    def forget(self) -> None:
        """Forget every name: c10d reuses group names once its groups are destroyed."""
        with self._lock:
            self._by_name.clear()
            self.generation += 1

    def add_mesh(self, mesh: Any, *, replace: bool = False) -> None:
        """Name each group of ``mesh`` by its dim (a mesh without dim names adds nothing)."""
        for dim in mesh.mesh_dim_names or ():
            self.add(dim, mesh.get_group(dim), replace=replace)

    @classmethod
    def from_mesh(cls, mesh: Any) -> GroupDirectory:
        directory = cls()
        directory.add_mesh(mesh)
        world = dist.group.WORLD
        assert world is not None, "a mesh is built in an initialised process group"
        directory.add("world", world)
        return directory

    def lookup(self, group_object: Any) -> GroupInfo:
        """The group of a c10d op's process-group argument (a new wrapper object on every call)."""
        return self.of_group(ProcessGroup.unbox(group_object))

    def of_group(self, group: ProcessGroup) -> GroupInfo:
        known = self._by_name.get(group.group_name)
        return known if known is not None else self.named(group.group_name, group.size())

    def named(self, group_name: str, size: int) -> GroupInfo:
        """The group of this c10d name, named on first sight where nobody added it (``other`` is not kept:
        c10d may know the group later)."""
        known = self._by_name.get(group_name)
        if known is not None:
            return known
        found = _unnamed_group(group_name, size)
        if found.name == "other":
            return found
        with self._lock:
            return self._by_name.setdefault(group_name, found)


def _unnamed_group(group_name: str, size: int) -> GroupInfo:
    """A group nobody named: ``world``, or its global ranks, as c10d's registry has them (``other`` where it
    no longer does)."""
    try:
        group = c10d._resolve_process_group(group_name)  # type: ignore[arg-type]  # a GroupName is a str
        ranks = tuple(dist.get_process_group_ranks(group))
    except Exception:  # a private registry, or a group already destroyed: the figures still have its size
        return GroupInfo("other", size, (), group_name)
    world = dist.group.WORLD
    name = "world" if world is not None and world.group_name == group_name else "ranks " + ",".join(map(str, ranks))
    return GroupInfo(name, size, ranks, group_name)
