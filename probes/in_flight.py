"""The collectives a rank has issued and not yet seen complete, and how each is waited for.

Completions arrive on the backend's thread and waits on any thread, so one lock guards every map here and
every record's wait and overlap marks. A work is found three ways: by its record's ``id`` (what is in flight:
where a hung rank is stuck, what a new operation overlaps), by the work's ``id`` (the ``Work.wait``
wrapper), and by its outputs' storages (``_c10d_functional::wait_tensor``, which waits in C++ and never
calls Python's ``Work.wait``).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from torch._C._distributed_c10d import Work

from meshtop.probes.c10d_ops import OpShape, storages_of
from meshtop.probes.events import CollectiveTiming
from meshtop.probes.groups import GroupInfo

MAX_WAITABLE = 10_000
"""In-flight works the ``Work.wait`` wrapper can find (the C++ kernel's kMaxWaitable): beyond it an operation
with a future is still timed, without ``waited_ns``, and one without a future is not tracked at all."""


@dataclass(slots=True)
class Issued:
    """What is known of an operation when it is issued, and what is learnt while it is in flight."""

    shape: OpShape
    group: GroupInfo
    peer: int | None
    nbytes: int
    dtype: str | None
    step: int | None
    start_ns: int
    wait_start_ns: int | None = None
    """When the first ``Work.wait`` on it began while it was in flight."""
    overlapped: bool = False
    """Another operation on its c10d group was in flight with it (final once it completes)."""
    work_key: int | None = None
    """``id`` of its work in :attr:`InFlight.waitable`, where the wait wrapper finds it."""
    ends_at_wait: bool = False
    """Its work has no future: it completes when a wait on it returns (gloo's send, recv, reduce-scatter)."""
    storages: tuple[int, ...] = ()
    """Where it ends at a wait: its output tensors' storages, by which ``wait_tensor`` finds its work."""

    def timing(self, *, rank: int, end_ns: int, waited_ns: int | None, clock: str = "completion") -> CollectiveTiming:
        """The operation as an event, ended at ``end_ns``; nccl's CUDA-event timing carries no ``waited_ns``
        (a host-side wait there only orders streams)."""
        return CollectiveTiming(
            rank=rank,
            step=self.step,
            op=self.shape.op,
            group=self.group.name,
            group_size=self.group.size,
            peer=self.peer,
            bytes=self.nbytes,
            dtype=self.dtype,
            start_ns=self.start_ns,
            end_ns=end_ns,
            clock=clock,
            waited_ns=None if clock == "cuda_events" else waited_ns,
            overlapped=self.overlapped,
        )


class InFlight:
    """The issued and not yet complete operations of one process, with the works a wait can end."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.by_id: dict[int, Issued] = {}
        """Issued and not yet complete, by the record's ``id``."""
        self.waitable: dict[int, tuple[Work, Issued]] = {}
        """In-flight works by ``id`` (each kept alive here, so the ``id`` is not reused while it is a key). A
        work with a future leaves in its completion callback, on gloo's thread, which holds the work until the
        callback has run: this reference is never the last one there."""
        self.by_storage: dict[int, Work] = {}
        """Futureless works in flight by their outputs' storage addresses, for the ``wait_tensor`` hook."""

    def add(self, issued: Issued, work: Work | None = None, outputs: Any = None) -> bool:
        """Note ``issued`` in flight, marking it and every operation in flight on its c10d group as overlapped;
        with ``work``, where a wait finds it (while fewer than :data:`MAX_WAITABLE` are), and with ``outputs``
        (futureless: it ends at a wait), where ``wait_tensor`` finds it. False, and nothing noted, where it
        ends at a wait that could not find it: it would never be seen to end, and could not be told apart
        from a hang."""
        with self.lock:
            waitable = work is not None and len(self.waitable) < MAX_WAITABLE
            if issued.ends_at_wait and not waitable:
                return False
            group_name = issued.group.c10d_name
            for other in self.by_id.values():
                if other.group.c10d_name == group_name:
                    other.overlapped = issued.overlapped = True
            self.by_id[id(issued)] = issued
            if waitable:
                issued.work_key = id(work)
                self.waitable[id(work)] = (work, issued)  # type: ignore[assignment]  # not None: waitable
                if outputs is not None:
                    issued.storages = storages_of(outputs)
                    for storage in issued.storages:
                        self.by_storage[storage] = work  # type: ignore[assignment]
        return True

    def add_blocking(self, issued: Issued) -> None:
        """Note a call timed around itself (gloo's monitored barrier) in flight, for :meth:`oldest`: it holds
        its thread, and c10d never sees it, so nothing is marked as overlapping it."""
        with self.lock:
            self.by_id[id(issued)] = issued

    def drop(self, issued: Issued) -> None:
        """``issued`` raised: it never completes."""
        with self.lock:
            self.by_id.pop(id(issued), None)

    def finish(self, issued: Issued) -> int | None:
        """``issued`` completed: out of every map; when the first wait on it began (``None``: none did)."""
        with self.lock:
            self.by_id.pop(id(issued), None)
            self._take_waitable(issued)
            return issued.wait_start_ns

    def _take_waitable(self, issued: Issued) -> bool:
        """Under the lock: take ``issued``'s work out of the maps a wait finds it by; whether it was there
        (so of two threads ending one work, only the one that took it ends it)."""
        entry = self.waitable.get(issued.work_key) if issued.work_key is not None else None
        if entry is None or entry[1] is not issued:
            return False
        del self.waitable[issued.work_key]  # type: ignore[arg-type]
        for storage in issued.storages:
            if self.by_storage.get(storage) is entry[0]:
                del self.by_storage[storage]
        return True

    def snapshot(self) -> list[Issued]:
        """What is in flight now (from any thread)."""
        return list(self.by_id.values())  # one C-level copy: safe against the callbacks' updates

    def wrap_wait(self, original: Callable[..., Any], completed: Callable[[Issued], None]) -> Callable[..., Any]:
        """``Work.wait`` wrapped: its start is a wait on an in-flight operation, its return the end of a work
        without a future (handed to ``completed``)."""
        waitable, lock, take = self.waitable, self.lock, self._take_waitable

        def wait(work: Work, *args: Any, **kwargs: Any) -> Any:
            if waitable:  # nothing in flight (the common case between steps): no clock, no lock
                started_ns = time.time_ns()
                with lock:
                    pending = waitable.get(id(work))
                    if pending is not None and pending[0] is work and pending[1].wait_start_ns is None:
                        pending[1].wait_start_ns = started_ns
            result = original(work, *args, **kwargs)
            if waitable:
                ended: Issued | None = None
                with lock:  # taken out under the lock, so two waits on one work do not both end it
                    pending = waitable.get(id(work))
                    if pending is not None and pending[0] is work and pending[1].ends_at_wait and take(pending[1]):
                        ended = pending[1]
                if ended is not None:
                    completed(ended)
            return result

        return wait
