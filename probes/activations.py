"""Activations saved for backward, measured on CPU as on CUDA: the bytes the autograd graph holds.

Opt-in (``--activations``): a default saved-tensors hook pair on the training
thread sees every tensor an op saves for backward. Each saved storage is
counted once, while autograd holds any saved slot on it (a weak reference's
finalizer on the packed slot says when autograd lets it go: after its
backward, or when its graph is dropped); the model's own parameters are not
activations and are left out. The figure is the peak over a step of the
bytes that step saved and autograd still holds: at the end of the forward
pass, or with a pipeline schedule's microbatches in flight.

Why it is not on by default: the hooks are Python objects in every op's
thread-local state (so every collective's work holds one, and whichever
thread frees it last needs the GIL), each saved tensor costs a Python call,
``torch.compile`` does not trace through default saved-tensor hooks, and
``torch.func`` transforms (``grad``, ``vjp``, ``jacrev``) refuse to run under them.
Weights are recognised by storage (the parameters given) and by being a
parameter or a view of one, which also leaves out FSDP's unsharded
parameters: they are gathered for the step, not activations.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Iterable
from typing import Any

import torch
from torch.autograd.graph import saved_tensors_hooks

from meshtop.probes.memory import local_shard


def holder(tensor: torch.Tensor) -> torch.Tensor:
    """The plain tensor whose storage ``tensor`` uses: a DTensor's local shard; the buffer inside a functional
    collective's ``AsyncCollectiveTensor`` (tensor parallelism's all-reduced outputs), which has no storage of
    its own (skipping it counts tp's activations short: docs/benchmarks.md)."""
    local = local_shard(tensor)
    inner = getattr(local, "elem", None)
    return inner if isinstance(inner, torch.Tensor) else local


def storage_key(tensor: torch.Tensor) -> int:
    """The address of the storage ``tensor`` (see :func:`holder`) views."""
    return holder(tensor).untyped_storage().data_ptr()


class _Saved:
    """What autograd keeps for a saved tensor: released when autograd lets the saved slot go (its backward ran,
    or its graph was dropped), whoever else still holds the tensor. Finalizing the tensor itself would count
    it as long as anything refers to it: a pipeline's receive buffer, or a reference cycle the garbage
    collector has not reached yet (seen: 18 % too much on a GPipe stage)."""

    __slots__ = ("__weakref__", "tensor")

    def __init__(self, tensor: torch.Tensor) -> None:
        self.tensor = tensor


class SavedActivations:
    """The live bytes of tensors saved for backward, and their peak since :meth:`take_peak`."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        """Finalizers run on whichever thread drops a saved tensor last (an autograd device thread, say), or
        inside :meth:`_pack` itself when a collection there frees one: re-entrant."""
        self._live: dict[int, list[int]] = {}
        """Storage address -> [bytes, saved slots alive on it, the period it was (last) saved in]."""
        self._parameters: set[int] = set()
        self.live_bytes = 0
        """Every saved storage autograd holds now."""
        self._carried = 0
        """Of those, the bytes saved in earlier periods (a graph nobody ran backward on is not this step's)."""
        self._period = 0
        self._peak = 0
        self._hooks: saved_tensors_hooks | None = None

    def leave_out(self, parameters: Iterable[torch.Tensor]) -> None:
        """Do not count the storages of ``parameters`` (the model's weights; uninitialised lazy ones have none)."""
        for parameter in parameters:
            try:
                self._parameters.add(storage_key(parameter))
            except (RuntimeError, ValueError):
                continue

    def install(self) -> None:
        """Hook the calling thread's saves (the training thread)."""
        self._hooks = saved_tensors_hooks(self._pack, self._unpack)
        self._hooks.__enter__()

    def uninstall(self) -> None:
        if self._hooks is not None:
            self._hooks.__exit__(None, None, None)
            self._hooks = None

    def take_peak(self) -> int:
        """The peak since the last call of the bytes saved since the last call and still held.

        What earlier periods saved and autograd still holds is left out of the new period: torch's
        pipelining keeps its first stage's shape-inference forward alive for good (0.87 MB for the tiny model,
        pp2), a graph no step runs backward on.
        """
        with self._lock:
            peak, self._peak = self._peak, 0
            self._period += 1
            self._carried = self.live_bytes
        return peak

    def _pack(self, tensor: torch.Tensor) -> Any:
        base = tensor._base if tensor._base is not None else tensor
        if isinstance(base, torch.nn.Parameter):  # a weight, or a view of one (FSDP's unsharded parameters)
            return tensor
        try:
            key = storage_key(tensor)
        except (RuntimeError, ValueError):  # a tensor without storage (a subclass of another kind): nothing to count
            return tensor
        if key == 0 or key in self._parameters:
            return tensor
        with self._lock:
            entry = self._live.get(key)
            if entry is None:
                entry = self._live[key] = [holder(tensor).untyped_storage().nbytes(), 0, self._period]
                self.live_bytes += entry[0]
            elif entry[2] != self._period:  # saved again now: this period's from here on
                entry[2] = self._period
                self._carried -= entry[0]
            self._peak = max(self._peak, self.live_bytes - self._carried)
            entry[1] += 1
        saved = _Saved(tensor)
        weakref.finalize(saved, self._released, key)
        return saved

    @staticmethod
    def _unpack(saved: Any) -> torch.Tensor:
        return saved.tensor if isinstance(saved, _Saved) else saved

    def _released(self, key: int) -> None:
        with self._lock:
            entry = self._live.get(key)
            if entry is None:
                return
            entry[1] -= 1
            if entry[1] == 0:
                del self._live[key]
                self.live_bytes -= entry[0]
                if entry[2] != self._period:
                    self._carried -= entry[0]
