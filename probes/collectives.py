"""See every collective a worker issues, whoever issues it, and time it.

Every c10d collective, from a direct ``torch.distributed`` call, DDP's C++
reducer, FSDP2 or DTensor's functional collectives, ends in a dispatcher op
of the ``c10d`` namespace (``c10d::allreduce_``, ...). The probe registers a
kernel for those ops alone at the ``BackendSelect`` key: it is in every call's
key set (it is in the thread's default included set, which
``torch.inference_mode`` leaves alone, where it excludes ``ADInplaceOrView``
and autograd: a kernel there missed every collective under inference mode),
and it comes right before the backend's kernel, after autograd,
functionalization and fake tensors (a traced call is not a collective run).
The kernel comes in two builds:

- **C++** (``c10d_kernel.cpp``, built by :mod:`meshtop.probes.native`), used on gloo
  whenever it could be built: it covers the point-to-point ops too
  (``c10d::send``, ``c10d::recv_``), stamps the end in a C++ callback on the
  work's future, and keeps finished operations until :meth:`CollectiveProbe.flush`
  takes them, off the training thread, already written as the wire's JSON
  lines (Python names each process group for it once, from its first
  operation). About 1-2 us per operation on the calling thread, and as much
  per event on the shipper's.
- **Python**, for nccl (whose futures complete when the work is queued, so
  CUDA events time it) and where no C++ build is possible. Point-to-point
  operations are issued from Python in every PyTorch caller
  (``torch.distributed`` and pipelining both call ``ProcessGroup.send`` /
  ``recv``), so those two methods are wrapped instead of hooked: a Python
  wrapper costs a few microseconds where a dispatcher kernel written in
  Python costs tens. Either way the probe notes the start, lets the operation
  go, and arranges to learn the end:

- gloo collectives: a callback on the work's future, run when it completes
  (on gloo's thread; handing completions to a watcher thread through a
  C-level queue instead was tried and measured slower in real jobs: the
  watcher's wake-ups contend for the GIL with the training thread);
- gloo works that have no future (send, recv, reduce-scatter): the return of
  the caller's ``wait()``, which ``Work.wait`` is wrapped to see; functional
  collectives (DTensor, sequence parallelism) wait in C++ through
  ``_c10d_functional::wait_tensor``, which is hooked at the same key and ends
  the work whose output tensor it waits on (found by the tensor's storage);
- nccl: the work's own CUDA-event timing (``TORCH_NCCL_ENABLE_TIMING=1``),
  read by a watcher thread once the work is done, so the host never blocks.

In C++, works without a future end at Python's ``Work.wait`` or at
``wait_tensor`` too. gloo completes such a work only inside a wait on it (its
``is_completed`` stays false until then, and a reduce-scatter's output is
written there), so one that nobody waits on is never complete: it stays in
flight and is not recorded. gloo's monitored barrier issues no c10d op (gloo
carries it out with its own sends and receives): both kernels time it around
``ProcessGroup.monitored_barrier``, which returns once every rank arrived.
Nothing is computed per call beyond what is needed to find the end; the event
is built when the operation completes (Python) or is drained (C++).

Both kernels also say how each operation was waited for, the same way:

- ``waited_ns``: the wrapped ``Work.wait`` notes when a wait on a work still
  in flight began (the first, where several do); at completion the event
  carries end minus that start, or ``None`` where no Python wait began first
  (it completed before anyone waited, or it is waited inside C++: DDP's
  reducer, functional collectives' ``wait_tensor``). nccl's CUDA-event timing
  leaves it ``None``: a host-side wait there only orders streams.
- ``overlapped``: when an operation is issued, every operation in flight on
  the same c10d process group on this rank is marked, and so is the new one;
  the mark is read at completion. It is the host's view (issue to seen
  complete) on every backend.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from types import ModuleType
from typing import Any

import torch
from torch._C._distributed_c10d import ProcessGroup, Work

from meshtop.probes.arrivals import decode_lines
from meshtop.probes.c10d_ops import (
    C10D_OPS,
    MONITORED_BARRIER,
    P2P_METHODS,
    OpShape,
    dtype_names,
    first_tensor,
    native_table,
    nbytes_of,
    storages_of,
)
from meshtop.probes.device_clock import StreamSpan, cuda_mark
from meshtop.probes.events import CollectiveTiming, Event
from meshtop.probes.groups import GroupDirectory, GroupInfo
from meshtop.probes.patching import Patches, require

DEVICE_POLL_S = 0.002
NATIVE_BLOCK = 10_000
"""Finished operations the C++ kernel writes into one block of JSON lines (about 2 MB: well inside a frame)."""
MAX_WAITABLE = 10_000
"""In-flight works the ``Work.wait`` wrapper can find (the C++ kernel's kMaxWaitable): beyond it an operation
with a future is still timed, without ``waited_ns``, and one without a future is not tracked at all."""


@dataclass(slots=True)
class _Issued:
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
    """``id`` of its work in :attr:`CollectiveProbe._waitable`, where the wait wrapper finds it."""
    ends_at_wait: bool = False
    """Its work has no future: it completes when a wait on it returns (gloo's send, recv, reduce-scatter)."""
    storages: tuple[int, ...] = ()
    """Where it ends at a wait: its output tensors' storages, by which ``wait_tensor`` finds its work."""


class CollectiveProbe:
    """Times every c10d operation of this process and emits :class:`CollectiveTiming`.

    With ``native`` (the module :mod:`meshtop.probes.native` built), the C++ kernel
    does the timing on gloo; its operations reach ``emit`` at :meth:`flush`.
    """

    def __init__(
        self,
        *,
        rank: int,
        groups: GroupDirectory,
        emit: Callable[[Event], None],
        step: Callable[[], int | None],
        device_timing: bool,
        on_error: Callable[[str], None] = lambda message: None,
        native: ModuleType | None = None,
        emit_lines: Callable[[str, bytes, int], None] | None = None,
        device_mark: Callable[[], Any] = cuda_mark,
    ) -> None:
        self.rank = rank
        self.device_mark = device_mark
        """Records a timing event on the device's current stream (:func:`cuda_mark`; a scripted one in tests)."""
        self.groups = groups
        self.emit = emit
        self.emit_lines = emit_lines
        """Takes the C++ kernel's events as the JSON lines it wrote (kind, lines, count); without it they are
        decoded here and go to ``emit``."""
        self.step = step
        self.device_timing = device_timing
        self.on_error = on_error
        self.native = native if not device_timing else None
        self._native_ops, self._native_rows = native_table() if self.native is not None else ([], [])
        """The C++ kernel's ops (its records name them by index) and what it is told of each, fixed for the
        probe's life: the shipper thread reads the ops while the training thread reinstalls."""
        self._dtype_names: dict[int, str] = dtype_names(self.native) if self.native is not None else {}
        self._named: set[str] = set()
        """c10d groups the C++ kernel can name itself, as of the directory's ``generation`` below."""
        self._named_generation = -1
        self._naming = threading.Lock()
        """The shipper thread and the training thread (at uninstall) both flush."""
        self._library: torch.library.Library | None = None
        self._functional_library: torch.library.Library | None = None
        self._lock = threading.Lock()
        """Guards the two maps below and the in-flight records' wait and overlap marks: completions arrive
        on the backend's thread, waits on any thread."""
        self._waitable: dict[int, tuple[Work, _Issued]] = {}
        """In-flight works by ``id`` (each kept alive here, so the ``id`` is not reused while it is a key),
        for the ``Work.wait`` wrapper: it stamps a wait's start, and ends works without a future. A work with
        a future leaves in its completion callback, on gloo's thread, which holds the work until the callback
        has run: this reference is never the last one there."""
        self._in_flight: dict[int, _Issued] = {}
        """Issued and not yet complete, by ``id``: where a hung rank is stuck, and what a new one overlaps."""
        self._by_storage: dict[int, Work] = {}
        """Futureless works in flight by their outputs' storage addresses, for the ``wait_tensor`` hook
        (a functional collective's wait, in C++, never calls Python's ``Work.wait``)."""
        self._without_future: set[str] = set()
        """c10d ops whose works have no future on this backend."""
        self._device_pending: list[tuple[Work | StreamSpan, _Issued]] = []
        self._device_lock = threading.Lock()
        self._patches = Patches()
        self._watcher: threading.Thread | None = None
        self._stopping = threading.Event()

    # -- installing -------------------------------------------------------------------------
    def install(self) -> None:
        """Hook every c10d op and ``Work.wait``. Raises :class:`~meshtop.probes.patching.MissingInternal` before any
        patch where this torch lacks an internal the kernel needs; where anything else fails half-way,
        :meth:`uninstall` takes out what was put in (the instrumentation calls it)."""
        self._require_internals()
        self._stopping.clear()
        if self.native is not None:
            self._install_native()
        else:
            self._install_python()
        self._patch_wait()
        if hasattr(ProcessGroup, "monitored_barrier"):
            self._patches.replace(
                ProcessGroup, "monitored_barrier", self._monitored_barrier(ProcessGroup.monitored_barrier)
            )
        if self.device_timing and (self._watcher is None or not self._watcher.is_alive()):
            self._watcher = threading.Thread(target=self._watch_device, name="meshtop-nccl-timing", daemon=True)
            self._watcher.start()

    def _require_internals(self) -> None:
        """Every private torch attribute this kernel uses, looked up before anything is patched."""
        require(Work, "wait")
        if self.device_timing:
            require(Work, "_get_duration")
        if self.native is None:
            require(torch._C, "_dispatch_keyset_full_after")
            require(Work, "unbox")
            require(ProcessGroup, "unbox")
            for method in P2P_METHODS:
                require(ProcessGroup, method)

    def _install_native(self) -> None:
        assert self.native is not None
        self.native.set_names(self.rank, [shape.op for shape in self._native_ops], self._dtype_names)
        self.native.install(self._native_rows)

    def _install_python(self) -> None:
        below = torch._C._dispatch_keyset_full_after(torch._C.DispatchKey.BackendSelect)
        library = torch.library.Library("c10d", "IMPL")
        for name, shape in C10D_OPS.items():
            packet = getattr(torch.ops.c10d, name, None)
            if packet is None:  # an op this torch release does not have
                continue
            library.impl(
                name, self._kernel(packet.default._handle, name, shape, below), "BackendSelect", with_keyset=True
            )
        self._library = library
        wait_tensor = getattr(getattr(torch.ops, "_c10d_functional", None), "wait_tensor", None)
        if wait_tensor is not None:  # functional collectives' wait (every supported torch has it)
            functional = torch.library.Library("_c10d_functional", "IMPL")
            functional.impl(
                "wait_tensor", self._wait_tensor(wait_tensor.default._handle, below), "BackendSelect", with_keyset=True
            )
            self._functional_library = functional
        for method, shape in P2P_METHODS.items():
            self._patches.replace(ProcessGroup, method, self._p2p_wrapper(getattr(ProcessGroup, method), shape))

    def uninstall(self) -> None:
        self._stopping.set()
        if self.native is not None:
            self.native.uninstall()
        for library in (self._library, self._functional_library):
            if library is not None:
                library._destroy()
        self._library = self._functional_library = None
        self._patches.restore()

    def step_changed(self, step: int | None) -> None:
        """The C++ kernel tags operations with the step it was last told (the Python one asks ``step``)."""
        if self.native is not None:
            self.native.set_step(step)

    def flush(self) -> int:
        """Emit the operations the C++ kernel finished since the last call; how many it had to drop."""
        if self.native is None:
            return 0
        dropped = 0
        with self._naming:
            self._forget_stale_names()
            for group in self.groups.known():
                self._teach(group)
            while True:
                lines, count, unnamed, dropped_now, errors = self.native.drain_lines(NATIVE_BLOCK)
                dropped += dropped_now
                for message in errors:
                    self.on_error(f"collective probe: {message}")
                if count:
                    self._emit_lines(lines, count)
                for record in unnamed:
                    issued = self._native_issued(record)
                    self._teach(issued.group)
                    waited_ns, end_ns = record[-3], record[-1]
                    self.emit(self._event(issued, end_ns=end_ns, waited_ns=waited_ns))
                if count + len(unnamed) < NATIVE_BLOCK:
                    return dropped

    def _emit_lines(self, lines: bytes, count: int) -> None:
        if self.emit_lines is not None:
            self.emit_lines(CollectiveTiming.kind, lines, count)
            return
        events, _bad = decode_lines(lines, CollectiveTiming.kind)
        for event in events:
            self.emit(event)

    def _forget_stale_names(self) -> None:
        """Under ``_naming``: the directory renamed or forgot groups since the C++ kernel learnt its names."""
        if self._named_generation != self.groups.generation:
            assert self.native is not None
            self.native.forget_groups()
            self._named.clear()
            self._named_generation = self.groups.generation

    def _teach(self, group: GroupInfo) -> None:
        """Under ``_naming``: let the C++ kernel name ``group``'s operations itself from now on (not ``other``:
        c10d may still come to know it). The directory's groups are taught before each drain; one it names
        from c10d's registry, after the drain that brought its first operations."""
        if group.name == "other" or group.c10d_name in self._named:
            return
        assert self.native is not None
        try:
            self.native.name_group(group.c10d_name, group.name, list(group.ranks))
        except (TypeError, UnicodeError, RuntimeError):  # a name C++ cannot take: Python keeps naming it
            return
        self._named.add(group.c10d_name)

    def _kernel(self, handle: Any, name: str, shape: OpShape, below: Any) -> Callable[..., Any]:
        def kernel(keyset: Any, *args: Any) -> Any:
            start_ns = time.time_ns()
            opened = self._mark_now()
            out = handle.redispatch_boxed(keyset & below, *args)
            try:
                self._issued(name, shape, args, out, start_ns, opened)
            except Exception as error:  # a probe must never break the job it measures
                self.on_error(f"collective probe ({shape.op}): {error!r}")
            return out

        return kernel

    def _wait_tensor(self, handle: Any, below: Any) -> Callable[..., Any]:
        """``_c10d_functional::wait_tensor``'s kernel: a wait on a futureless work's output waits through
        ``Work.wait`` (wrapped: it stamps the wait and ends the work) before the functional wait, which then
        finds the work complete."""
        by_storage = self._by_storage

        def wait_tensor(keyset: Any, tensor: torch.Tensor) -> Any:
            if by_storage:  # nothing futureless in flight (nccl, gloo's all-reduce): no lookup at all
                work = by_storage.get(tensor.untyped_storage().data_ptr())
                if work is not None:
                    try:
                        Work.wait(work)  # looked up now: the wrapper, installed after this kernel
                    except Exception as error:  # the functional wait below raises it for the job, as torch does
                        self.on_error(f"collective probe (wait_tensor): {error!r}")
            return handle.redispatch_boxed(keyset & below, tensor)

        return wait_tensor

    def _p2p_wrapper(self, original: Callable[..., Any], shape: OpShape) -> Callable[..., Any]:
        def p2p(group: ProcessGroup, *args: Any, **kwargs: Any) -> Any:
            start_ns = time.time_ns()
            work = original(group, *args, **kwargs)
            try:
                self._track(shape.op, shape, work, self.groups.of_group(group), args, start_ns)
            except Exception as error:
                self.on_error(f"collective probe ({shape.op}): {error!r}")
            return work

        return p2p

    def _monitored_barrier(self, original: Callable[..., Any]) -> Callable[..., Any]:
        """gloo's monitored barrier: gloo carries it out with its own sends and receives, never through a c10d
        op, so neither kernel sees it; it is timed around the call (it returns once every rank arrived)."""

        def monitored_barrier(group: ProcessGroup, *args: Any, **kwargs: Any) -> Any:
            issued = None
            try:
                group_info = self.groups.of_group(group)
                issued = _Issued(MONITORED_BARRIER, group_info, None, 0, None, self.step(), time.time_ns())
                with self._lock:
                    self._in_flight[id(issued)] = issued
            except Exception as error:
                self.on_error(f"collective probe (monitored_barrier): {error!r}")
            try:
                result = original(group, *args, **kwargs)
            except BaseException:
                if issued is not None:
                    with self._lock:
                        self._in_flight.pop(id(issued), None)
                raise
            if issued is not None:
                self._completed(issued)
            return result

        return monitored_barrier

    def _mark_now(self) -> Any:
        """With device timing, a mark on the current stream before an op, in case torch gives it no work."""
        if not self.device_timing:
            return None
        try:
            return self.device_mark()
        except Exception as error:  # a probe must never break the job it measures
            self.on_error(f"collective probe (device mark): {error!r}")
            return None

    def _issued(
        self, name: str, shape: OpShape, args: tuple[Any, ...], out: Any, start_ns: int, opened: Any = None
    ) -> None:
        work = Work.unbox(out[-1] if isinstance(out, tuple) else out)
        self._track(name, shape, work, self.groups.lookup(args[shape.group_arg]), args, start_ns, opened)

    def _track(
        self,
        name: str,
        shape: OpShape,
        work: Work | StreamSpan | None,
        group: GroupInfo,
        args: tuple[Any, ...],
        start_ns: int,
        opened: Any = None,
    ) -> None:
        """Note an issued operation and arrange to learn when it completes (and when it is waited for);
        ``opened``: a device mark recorded before the call (device timing), for an op torch gives no work."""
        buffer = args[shape.buffer_arg] if shape.buffer_arg >= 0 else None
        nbytes = nbytes_of(buffer) * (group.size if shape.times_group else 1)
        tensor = first_tensor(buffer)
        peer = group.global_rank(args[shape.peer_arg]) if shape.peer_arg is not None else None
        dtype = str(tensor.dtype).removeprefix("torch.") if tensor is not None else None
        issued = _Issued(shape, group, peer, nbytes, dtype, self.step(), start_ns)
        if work is None:  # a blocking op torch gives no work for (StreamSpan says when)
            closed = self._mark_now() if opened is not None else None
            if closed is None:  # no device marks: it ended as the call returned, on the host's clock
                self._completed(issued)
                return
            work = StreamSpan(opened, closed)
        future = None
        if not self.device_timing and name not in self._without_future:
            try:
                future = work.get_future()  # type: ignore[union-attr]  # not device-timed: no StreamSpan
            except RuntimeError:  # "Work::getFuture not implemented" (gloo send / recv / reduce-scatter)
                self._without_future.add(name)
        issued.ends_at_wait = future is None and not self.device_timing
        with self._lock:
            waitable = not self.device_timing and len(self._waitable) < MAX_WAITABLE
            if issued.ends_at_wait and not waitable:
                return  # would never be seen to end: it could not be told apart from a hang
            self._mark_overlaps(issued)
            self._in_flight[id(issued)] = issued
            if waitable:  # (so not device-timed: no StreamSpan)
                issued.work_key = id(work)
                self._waitable[id(work)] = (work, issued)  # type: ignore[assignment]
                if issued.ends_at_wait and shape.group_arg >= 0:  # a c10d op: its outputs are its first argument
                    issued.storages = storages_of(args[0])
                    for storage in issued.storages:
                        self._by_storage[storage] = work  # type: ignore[assignment]
        if self.device_timing:
            with self._device_lock:
                self._device_pending.append((work, issued))
        elif future is not None:
            # After the maps are filled: a work already complete runs the callback here and now.
            future.add_done_callback(partial(self._completed, issued))

    def _mark_overlaps(self, issued: _Issued) -> None:
        """Under the lock: mark ``issued`` and every in-flight operation on its c10d group as overlapped."""
        group_name = issued.group.c10d_name
        for other in self._in_flight.values():
            if other.group.c10d_name == group_name:
                other.overlapped = issued.overlapped = True

    # -- completing -------------------------------------------------------------------------
    def _completed(
        self, issued: _Issued, _future: Any = None, *, end_ns: int | None = None, clock: str = "completion"
    ) -> None:
        if end_ns is None:
            end_ns = time.time_ns()
        with self._lock:
            self._in_flight.pop(id(issued), None)
            self._take_waitable(issued)
            wait_start_ns = issued.wait_start_ns
        # A wait stamped just before the end but recorded just after it did not block on this operation.
        waited_ns = end_ns - wait_start_ns if wait_start_ns is not None and wait_start_ns <= end_ns else None
        self.emit(self._event(issued, end_ns=end_ns, waited_ns=waited_ns, clock=clock))

    def _take_waitable(self, issued: _Issued) -> bool:
        """Under the lock: take ``issued``'s work out of the maps a wait finds it by; whether it was there
        (so of two threads ending one work, only the one that took it ends it)."""
        entry = self._waitable.get(issued.work_key) if issued.work_key is not None else None
        if entry is None or entry[1] is not issued:
            return False
        del self._waitable[issued.work_key]  # type: ignore[arg-type]
        for storage in issued.storages:
            if self._by_storage.get(storage) is entry[0]:
                del self._by_storage[storage]
        return True

    def _event(
        self, issued: _Issued, *, end_ns: int, waited_ns: int | None, clock: str = "completion"
    ) -> CollectiveTiming:
        return CollectiveTiming(
            rank=self.rank,
            step=issued.step,
            op=issued.shape.op,
            group=issued.group.name,
            group_size=issued.group.size,
            peer=issued.peer,
            bytes=issued.nbytes,
            dtype=issued.dtype,
            start_ns=issued.start_ns,
            end_ns=end_ns,
            clock=clock,
            waited_ns=None if clock == "cuda_events" else waited_ns,
            overlapped=issued.overlapped,
        )

    def oldest_in_flight(self) -> tuple[int, _Issued | None]:
        """How many operations are in flight, and the one issued first (from any thread)."""
        pending = list(self._in_flight.values())  # one C-level copy: safe against the callbacks' updates
        count = len(pending)
        if self.native is not None:
            native_count, oldest = self.native.in_flight()
            count += native_count
            if oldest is not None:
                pending.append(self._native_issued(oldest))
        return count, min(pending, key=lambda issued: issued.start_ns, default=None)

    def _native_issued(self, record: tuple[Any, ...]) -> _Issued:
        """A C++ kernel's record (see ``c10d_kernel.cpp``'s ``as_tuple``) as the Python kernel notes it."""
        op, group_name, group_size, peer, nbytes, dtype, step, start_ns, _waited_ns, overlapped, _end_ns = record
        group = self.groups.named(group_name, group_size)
        return _Issued(
            self._native_ops[op],
            group,
            None if peer is None else group.global_rank(peer),
            nbytes,
            None if dtype is None else self._dtype_names.get(dtype),
            step,
            start_ns,
            overlapped=overlapped,
        )

    def _patch_wait(self) -> None:
        """Wrap ``Work.wait``: its start is a wait on an in-flight operation, its return the end of a work
        without a future."""
        original = Work.wait
        if self.native is not None:
            self._patches.replace(Work, "wait", self.native.make_wait(original))
            return

        waitable, lock, completed, take = self._waitable, self._lock, self._completed, self._take_waitable

        def wait(work: Work, *args: Any, **kwargs: Any) -> Any:
            if waitable:  # nothing in flight (the common case between steps): no clock, no lock
                started_ns = time.time_ns()
                with lock:
                    pending = waitable.get(id(work))
                    if pending is not None and pending[0] is work and pending[1].wait_start_ns is None:
                        pending[1].wait_start_ns = started_ns
            result = original(work, *args, **kwargs)
            if waitable:
                ended: _Issued | None = None
                with lock:  # taken out under the lock, so two waits on one work do not both end it
                    pending = waitable.get(id(work))
                    if pending is not None and pending[0] is work and pending[1].ends_at_wait and take(pending[1]):
                        ended = pending[1]
                if ended is not None:
                    completed(ended)
            return result

        self._patches.replace(Work, "wait", wait)

    def _watch_device(self) -> None:
        """Emit each nccl operation once its CUDA events say it finished (no host sync)."""
        while not self._stopping.is_set():
            with self._device_lock:
                pending, self._device_pending = self._device_pending, []
            still = []
            for work, issued in pending:
                try:
                    if not work.is_completed():
                        still.append((work, issued))
                        continue
                    duration_ms = work._get_duration()  # type: ignore[union-attr]  # Work's is not in its stubs
                    end_ns = issued.start_ns + int(duration_ms * 1e6)
                    self._completed(issued, end_ns=end_ns, clock="cuda_events")
                except Exception as error:
                    self.on_error(f"nccl timing ({issued.shape.op}): {error!r}")
                    self._completed(issued)
            if still:
                with self._device_lock:
                    self._device_pending[:0] = still
            time.sleep(DEVICE_POLL_S)
