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
  lines (:mod:`meshtop.probes.native_kernel`; Python names each process group
  for it once, from its first operation). It costs the calling thread about a
  microsecond per operation, and the shipper's about as much per event
  (docs/benchmarks.md, "Per-op cost of the collective hooks").
- **Python**, for nccl (whose futures complete when the work is queued, so
  CUDA events time it) and where no C++ build is possible. Point-to-point
  operations are issued from Python in every PyTorch caller
  (``torch.distributed`` and pipelining both call ``ProcessGroup.send`` /
  ``recv``), so those two methods are wrapped instead of hooked: a Python
  wrapper costs a few microseconds where a dispatcher kernel written in
  Python costs tens. Either way the probe notes the start, lets the operation
  go, and arranges to learn the end:

- gloo collectives: a callback on the work's future, run when it completes
  (on gloo's thread, not handed to a watcher thread: a watcher's wake-ups
  contend for the GIL with the training thread);
- gloo works that have no future (send, recv, reduce-scatter): the return of
  the caller's ``wait()``, which ``Work.wait`` is wrapped to see; functional
  collectives (DTensor, sequence parallelism) wait in C++ through
  ``_c10d_functional::wait_tensor``, which is hooked at the same key and ends
  the work whose output tensor it waits on (found by the tensor's storage);
- nccl: the work's own CUDA-event timing (``TORCH_NCCL_ENABLE_TIMING=1``),
  read by a watcher thread once the work is done, so the host never blocks
  (:mod:`meshtop.probes.nccl_timing`).

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

The Python kernel's operations in flight, and the maps a wait finds them by,
are :mod:`meshtop.probes.in_flight`'s.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from functools import partial
from types import ModuleType
from typing import Any

import torch
from torch._C._distributed_c10d import ProcessGroup, Work

from meshtop.probes.c10d_ops import C10D_OPS, MONITORED_BARRIER, P2P_METHODS, OpShape, first_tensor, nbytes_of
from meshtop.probes.device_clock import StreamSpan, cuda_mark
from meshtop.probes.events import Event
from meshtop.probes.groups import GroupDirectory, GroupInfo
from meshtop.probes.in_flight import InFlight, Issued
from meshtop.probes.native_kernel import NativeKernel
from meshtop.probes.nccl_timing import NcclTimings
from meshtop.probes.patching import Patches, require


class CollectiveProbe:
    """Times every c10d operation of this process and emits :class:`~meshtop.probes.events.CollectiveTiming`.

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
        self.native = (
            NativeKernel(native, rank=rank, groups=groups) if native is not None and not device_timing else None
        )
        self._library: torch.library.Library | None = None
        self._functional_library: torch.library.Library | None = None
        self._in_flight = InFlight()
        self._without_future: set[str] = set()
        """c10d ops whose works have no future on this backend."""
        self._nccl = NcclTimings(completed=self._completed, on_error=on_error) if device_timing else None
        self._patches = Patches()

    # -- installing -------------------------------------------------------------------------
    def install(self) -> None:
        """Hook every c10d op and ``Work.wait``. Raises :class:`~meshtop.probes.patching.MissingInternal` before any
        patch where this torch lacks an internal the kernel needs; where anything else fails half-way,
        :meth:`uninstall` takes out what was put in (the instrumentation calls it)."""
        self._require_internals()
        if self.native is not None:
            self.native.install()
            self._patches.replace(Work, "wait", self.native.module.make_wait(Work.wait))
        else:
            self._install_python()
            self._patches.replace(Work, "wait", self._in_flight.wrap_wait(Work.wait, self._completed))
        if hasattr(ProcessGroup, "monitored_barrier"):
            self._patches.replace(
                ProcessGroup, "monitored_barrier", self._monitored_barrier(ProcessGroup.monitored_barrier)
            )
        if self._nccl is not None:
            self._nccl.start()

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
        if self._nccl is not None:
            self._nccl.stop()
        if self.native is not None:
            self.native.module.uninstall()
        for library in (self._library, self._functional_library):
            if library is not None:
                library._destroy()
        self._library = self._functional_library = None
        self._patches.restore()

    def step_changed(self, step: int | None) -> None:
        """The C++ kernel tags operations with the step it was last told (the Python one asks ``step``)."""
        if self.native is not None:
            self.native.module.set_step(step)

    def flush(self) -> int:
        """Emit the operations the C++ kernel finished since the last call; how many it had to drop."""
        if self.native is None:
            return 0
        return self.native.drain(emit=self.emit, emit_lines=self.emit_lines, on_error=self.on_error)

    def _failed(self, where: str, error: BaseException) -> None:
        """A probe must never break the job it measures: an error of its own is said, and the job goes on."""
        self.on_error(f"collective probe ({where}): {error!r}")

    # -- issuing ----------------------------------------------------------------------------
    def _kernel(self, handle: Any, name: str, shape: OpShape, below: Any) -> Callable[..., Any]:
        def kernel(keyset: Any, *args: Any) -> Any:
            start_ns = time.time_ns()
            opened = self._mark_now()
            out = handle.redispatch_boxed(keyset & below, *args)
            try:
                work = Work.unbox(out[-1] if isinstance(out, tuple) else out)
                self._track(name, shape, work, self.groups.lookup(args[shape.group_arg]), args, start_ns, opened)
            except Exception as error:
                self._failed(shape.op, error)
            return out

        return kernel

    def _wait_tensor(self, handle: Any, below: Any) -> Callable[..., Any]:
        """``_c10d_functional::wait_tensor``'s kernel: a wait on a futureless work's output waits through
        ``Work.wait`` (wrapped: it stamps the wait and ends the work) before the functional wait, which then
        finds the work complete."""
        by_storage = self._in_flight.by_storage

        def wait_tensor(keyset: Any, tensor: torch.Tensor) -> Any:
            if by_storage:  # nothing futureless in flight (nccl, gloo's all-reduce): no lookup at all
                work = by_storage.get(tensor.untyped_storage().data_ptr())
                if work is not None:
                    try:
                        Work.wait(work)  # looked up now: the wrapper, installed after this kernel
                    except Exception as error:  # the functional wait below raises it for the job, as torch does
                        self._failed("wait_tensor", error)
            return handle.redispatch_boxed(keyset & below, tensor)

        return wait_tensor

    def _p2p_wrapper(self, original: Callable[..., Any], shape: OpShape) -> Callable[..., Any]:
        def p2p(group: ProcessGroup, *args: Any, **kwargs: Any) -> Any:
            start_ns = time.time_ns()
            work = original(group, *args, **kwargs)
            try:
                self._track(shape.op, shape, work, self.groups.of_group(group), args, start_ns)
            except Exception as error:
                self._failed(shape.op, error)
            return work

        return p2p

    def _monitored_barrier(self, original: Callable[..., Any]) -> Callable[..., Any]:
        """gloo's monitored barrier: gloo carries it out with its own sends and receives, never through a c10d
        op, so neither kernel sees it; it is timed around the call (it returns once every rank arrived)."""

        def monitored_barrier(group: ProcessGroup, *args: Any, **kwargs: Any) -> Any:
            issued = None
            try:
                group_info = self.groups.of_group(group)
                issued = Issued(MONITORED_BARRIER, group_info, None, 0, None, self.step(), time.time_ns())
                self._in_flight.add_blocking(issued)
            except Exception as error:
                self._failed("monitored_barrier", error)
            try:
                result = original(group, *args, **kwargs)
            except BaseException:
                if issued is not None:
                    self._in_flight.drop(issued)
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
        except Exception as error:
            self._failed("device mark", error)
            return None

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
        issued = Issued(shape, group, peer, nbytes, dtype, self.step(), start_ns)
        if work is None:  # a blocking op torch gives no work for (StreamSpan says when)
            closed = self._mark_now() if opened is not None else None
            if closed is None:  # no device marks: it ended as the call returned, on the host's clock
                self._completed(issued)
                return
            work = StreamSpan(opened, closed)
        if self._nccl is not None:
            self._in_flight.add(issued)
            self._nccl.add(work, issued)
            return
        future = None
        if name not in self._without_future:
            try:
                future = work.get_future()  # type: ignore[union-attr]  # not device-timed: no StreamSpan
            except RuntimeError:  # "Work::getFuture not implemented" (gloo send / recv / reduce-scatter)
                self._without_future.add(name)
        issued.ends_at_wait = future is None
        # A c10d op's outputs are its first argument; wait_tensor finds a futureless one by them.
        outputs = args[0] if issued.ends_at_wait and shape.group_arg >= 0 else None
        if self._in_flight.add(issued, work, outputs) and future is not None:  # type: ignore[arg-type]
            # After the maps are filled: a work already complete runs the callback here and now.
            future.add_done_callback(partial(self._completed, issued))

    # -- completing -------------------------------------------------------------------------
    def _completed(
        self, issued: Issued, _future: Any = None, *, end_ns: int | None = None, clock: str = "completion"
    ) -> None:
        if end_ns is None:
            end_ns = time.time_ns()
        wait_start_ns = self._in_flight.finish(issued)
        # A wait stamped just before the end but recorded just after it did not block on this operation.
        waited_ns = end_ns - wait_start_ns if wait_start_ns is not None and wait_start_ns <= end_ns else None
        self.emit(issued.timing(rank=self.rank, end_ns=end_ns, waited_ns=waited_ns, clock=clock))

    def oldest_in_flight(self) -> tuple[int, Issued | None]:
        """How many operations are in flight, and the one issued first (from any thread)."""
        pending = self._in_flight.snapshot()
        count = len(pending)
        if self.native is not None:
            native_count, oldest = self.native.in_flight()
            count += native_count
            if oldest is not None:
                pending.append(oldest)
        return count, min(pending, key=lambda issued: issued.start_ns, default=None)
