"""Activations saved for backward, measured on CPU as on CUDA: the bytes the autograd graph holds.

Opt-in (``--activations``, a user's script): a default saved-tensors hook pair
on the training thread sees every tensor an op saves for backward. Each saved
storage is counted once, while any saved tensor on it is alive (a weak
reference's finalizer says when the graph and the script let it go); the
model's own parameters are not activations and are left out. The figure is
the peak of those live bytes over a step: at the end of the forward pass, or
with a pipeline schedule's microbatches in flight.

Why it is not on by default: the hooks are Python objects in every op's
thread-local state (so every collective's work holds one, and whichever
thread frees it last needs the GIL), each saved tensor costs a Python call,
``torch.compile`` does not trace through default saved-tensor hooks, and
``torch.func`` transforms (``grad``, ``vjp``, ``jacrev``) refuse to run under them.
FSDP's unsharded parameters that ops save are counted as activations.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Iterable
from typing import Any

import torch
from torch.autograd.graph import saved_tensors_hooks

from probes.memory import local_shard


def storage_key(tensor: torch.Tensor) -> int:
    """The address of the storage ``tensor`` (a DTensor's local shard) views."""
    return local_shard(tensor).untyped_storage().data_ptr()


class SavedActivations:
    """The live bytes of tensors saved for backward, and their peak since :meth:`take_peak`."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        """Finalizers run on whichever thread drops a saved tensor last (an autograd device thread, say), or
        inside :meth:`_pack` itself when a collection there frees one: re-entrant."""
        self._live: dict[int, list[int]] = {}
        """Storage address -> [bytes, saved tensors alive on it]."""
        self._parameters: set[int] = set()
        self.live_bytes = 0
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
        """The peak live bytes since the last call (the next period starts from what is live now)."""
        with self._lock:
            peak, self._peak = self._peak, self.live_bytes
        return peak

    def _pack(self, tensor: torch.Tensor) -> Any:
        if isinstance(tensor, torch.nn.Parameter):
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
                entry = self._live[key] = [local_shard(tensor).untyped_storage().nbytes(), 0]
                self.live_bytes += entry[0]
                self._peak = max(self._peak, self.live_bytes)
            entry[1] += 1
        weakref.finalize(tensor, self._released, key)
        return tensor

    @staticmethod
    def _unpack(tensor: torch.Tensor) -> torch.Tensor:
        return tensor

    def _released(self, key: int) -> None:
        with self._lock:
            entry = self._live.get(key)
            if entry is None:
                return
            entry[1] -= 1
            if entry[1] == 0:
                del self._live[key]
                self.live_bytes -= entry[0]
