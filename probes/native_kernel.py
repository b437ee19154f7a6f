"""The C++ collective kernel (``c10d_kernel.cpp``) as :mod:`meshtop.probes.collectives` drives it: installed,
taught the groups' names, and drained of the operations it finished (an operation of a group it cannot name
yet comes back as a record, named here)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from types import ModuleType
from typing import Any

from meshtop.probes.arrivals import decode_lines
from meshtop.probes.c10d_ops import dtype_names, native_table
from meshtop.probes.events import CollectiveTiming, Event
from meshtop.probes.groups import GroupDirectory, GroupInfo
from meshtop.probes.in_flight import Issued

NATIVE_BLOCK = 10_000
"""Finished operations the C++ kernel writes into one block of JSON lines (about 2 MB: well inside a frame)."""


class NativeKernel:
    """One process's C++ kernel (``native``: the module :mod:`meshtop.probes.native` built)."""

    def __init__(self, native: ModuleType, *, rank: int, groups: GroupDirectory) -> None:
        self.module = native
        self.rank = rank
        self.groups = groups
        self._ops, self._rows = native_table()
        """The kernel's ops (its records name them by index) and what it is told of each, fixed for the
        probe's life: the shipper thread reads the ops while the training thread reinstalls."""
        self._dtype_names: dict[int, str] = dtype_names(native)
        self._named: set[str] = set()
        """c10d groups the kernel can name itself, as of the directory's ``generation`` below."""
        self._named_generation = -1
        self._naming = threading.Lock()
        """The shipper thread and the training thread (at uninstall) both drain."""

    def install(self) -> None:
        self.module.set_names(self.rank, [shape.op for shape in self._ops], self._dtype_names)
        self.module.install(self._rows)

    def drain(
        self,
        *,
        emit: Callable[[Event], None],
        emit_lines: Callable[[str, bytes, int], None] | None,
        on_error: Callable[[str], None],
    ) -> int:
        """Hand on the operations the kernel finished since the last call: as JSON lines to ``emit_lines``
        (without it, decoded, to ``emit``), and those of groups it could not name as events to ``emit``; how
        many it had to drop."""
        dropped = 0
        with self._naming:
            self._forget_stale_names()
            for group in self.groups.known():
                self._teach(group)
            while True:
                lines, count, unnamed, dropped_now, errors = self.module.drain_lines(NATIVE_BLOCK)
                dropped += dropped_now
                for message in errors:
                    on_error(f"collective probe: {message}")
                if count and emit_lines is not None:
                    emit_lines(CollectiveTiming.kind, lines, count)
                elif count:
                    for event in decode_lines(lines, CollectiveTiming.kind)[0]:
                        emit(event)
                for record in unnamed:
                    issued = self.issued(record)
                    self._teach(issued.group)
                    waited_ns, end_ns = record[-3], record[-1]
                    emit(issued.timing(rank=self.rank, end_ns=end_ns, waited_ns=waited_ns))
                if count + len(unnamed) < NATIVE_BLOCK:
                    return dropped

    def in_flight(self) -> tuple[int, Issued | None]:
        """How many operations the kernel has in flight, and the one issued first."""
        count, oldest = self.module.in_flight()
        return count, None if oldest is None else self.issued(oldest)

    def issued(self, record: tuple[Any, ...]) -> Issued:
        """A kernel's record (see ``c10d_kernel.cpp``'s ``as_tuple``) as the Python kernel notes it."""
        op, group_name, group_size, peer, nbytes, dtype, step, start_ns, _waited_ns, overlapped, _end_ns = record
        group = self.groups.named(group_name, group_size)
        return Issued(
            self._ops[op],
            group,
            None if peer is None else group.global_rank(peer),
            nbytes,
            None if dtype is None else self._dtype_names.get(dtype),
            step,
            start_ns,
            overlapped=overlapped,
        )

    def _forget_stale_names(self) -> None:
        """Under ``_naming``: the directory renamed or forgot groups since the kernel learnt its names."""
        if self._named_generation != self.groups.generation:
            self.module.forget_groups()
            self._named.clear()
            self._named_generation = self.groups.generation

    def _teach(self, group: GroupInfo) -> None:
        """Under ``_naming``: let the kernel name ``group``'s operations itself from now on (not ``other``:
        c10d may still come to know it). The directory's groups are taught before each drain; one it names
        from c10d's registry, after the drain that brought its first operations."""
        if group.name == "other" or group.c10d_name in self._named:
            return
        try:
            self.module.name_group(group.c10d_name, group.name, list(group.ranks))
        except (TypeError, UnicodeError, RuntimeError):  # a name C++ cannot take: Python keeps naming it
            return
        self._named.add(group.c10d_name)
