"""Memory accounting of one rank: what its weights, gradients and optimizer state take.

The weights are a list of parameters: the built-in runner's modules', or the
parameters a user's optimizer holds (:mod:`meshtop.runner.script.attach`).

Counted from the tensors themselves (the local shard of a DTensor), so the
figures are the same on CPU and CUDA. Weights are counted once; gradients
and optimizer state on the first steps and then every ``RECOUNT_EVERY``
steps, since their sizes do not change between steps of a fixed model and
counting them walks every tensor (docs/history.md, "Probes"). On CUDA the
allocator's allocated / reserved / peak and the device's used / total
complete them, and activations are the step's peak minus the static part; on
CPU the process RSS.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterable

import psutil
import torch
from torch import nn

from meshtop.probes.events import MemorySnapshot

RECOUNT_EVERY = 50


def loaded_dtensor() -> type[torch.Tensor] | None:
    """torch's DTensor class, or ``None`` while ``torch.distributed.tensor`` is not imported: no tensor can be a
    DTensor before it is, and importing it would cost every rank some 1.4 s of start-up that a plan without
    DTensors (DDP, a user's plain script) has no reason to pay."""
    module = sys.modules.get("torch.distributed.tensor")
    return getattr(module, "DTensor", None) if module is not None else None


def local_shard(tensor: torch.Tensor) -> torch.Tensor:
    """What this rank holds of ``tensor``: a DTensor's local shard, any other tensor itself."""
    dtensor = loaded_dtensor()
    if dtensor is not None and isinstance(tensor, dtensor):
        return tensor.to_local()  # type: ignore[attr-defined]
    return tensor


def tensor_bytes(tensor: torch.Tensor) -> int:
    local = local_shard(tensor)
    return local.numel() * local.element_size()


def local_numel(tensor: torch.Tensor) -> int:
    """Elements this rank holds of ``tensor``."""
    return local_shard(tensor).numel()


def parameters_of(modules: Iterable[nn.Module]) -> list[torch.Tensor]:
    return [p for module in modules for p in module.parameters()]


def optimizer_bytes(optimizer: torch.optim.Optimizer, *, model: Iterable[torch.Tensor] = ()) -> int:
    """The optimizer's state (AdamW's moments and step counters), and the parameters it updates that are not
    the ``model``'s: an fp32 master copy of each weight under mixed precision
    (:func:`meshtop.runner.rank.precision.master_weights_adamw`)."""
    state = sum(
        tensor_bytes(value)
        for state in optimizer.state.values()
        for value in state.values()
        if isinstance(value, torch.Tensor)
    )
    models = {id(parameter) for parameter in model}
    copies = sum(
        tensor_bytes(parameter)
        for group in optimizer.param_groups
        for parameter in group["params"]
        if id(parameter) not in models
    )
    return state + (copies if models else 0)


class ResidentSize:
    """This process's resident set size, as psutil reads it on Linux (``/proc/<pid>/statm``'s second field
    times the page size), but from a file kept open: psutil opens the file on every call, which after a
    training step (cold caches) costs several times one ``pread`` of an open file (docs/history.md, "Probes").
    Elsewhere, or if the file cannot be read, psutil."""

    def __init__(self) -> None:
        self._page_bytes = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
        self._pid = -1
        self._fd: int | None = None

    def read(self) -> int:
        if self._pid != os.getpid():  # first call, or a forked child: /proc/self was the parent's at open
            self._reopen()
        if self._fd is not None:
            try:
                return int(os.pread(self._fd, 128, 0).split()[1]) * self._page_bytes
            except (OSError, ValueError, IndexError):
                pass
        return psutil.Process().memory_info().rss

    def _reopen(self) -> None:
        self.close()
        self._pid = os.getpid()
        try:
            self._fd = os.open(f"/proc/{self._pid}/statm", os.O_RDONLY)
        except OSError:
            self._fd = None

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __del__(self) -> None:
        self.close()


class MemoryProbe:
    """Takes a :class:`MemorySnapshot` at the end of each step."""

    def __init__(
        self,
        *,
        rank: int,
        parameters: list[torch.Tensor],
        optimizer: torch.optim.Optimizer | None,
        device: torch.device,
    ) -> None:
        self.rank = rank
        self.parameters = parameters
        self.optimizer = optimizer
        self.device = device
        self.weights_bytes = sum(tensor_bytes(p) for p in parameters)  # parameters do not change size
        self._resident = ResidentSize()
        self._static: tuple[int, int] | None = None
        self._snapshots = 0

    def step_started(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)

    def snapshot(
        self, step: int, *, kv_cache_bytes: int | None = None, saved_activations_bytes: int | None = None
    ) -> MemorySnapshot:
        """Memory now; ``saved_activations_bytes`` (measured, :mod:`meshtop.probes.activations`) stands in for the
        allocator's estimate of activations where given."""
        if self._static is None or self._snapshots < 2 or self._snapshots % RECOUNT_EVERY == 0:
            optimizer_state = (
                optimizer_bytes(self.optimizer, model=self.parameters) if self.optimizer is not None else 0
            )
            gradients = sum(tensor_bytes(p.grad) for p in self.parameters if p.grad is not None)
            self._static = (gradients, optimizer_state)
        self._snapshots += 1
        grads, optimizer = self._static
        allocated = reserved = peak = used = total = activations = rss = None
        if self.device.type == "cuda":
            allocated = torch.cuda.memory_allocated(self.device)
            reserved = torch.cuda.memory_reserved(self.device)
            peak = torch.cuda.max_memory_allocated(self.device)
            free, total = torch.cuda.mem_get_info(self.device)
            used = total - free
            static = self.weights_bytes + grads + optimizer + (kv_cache_bytes or 0)
            activations = max(0, peak - static)
        else:
            rss = self._resident.read()
        if saved_activations_bytes is not None:
            activations = saved_activations_bytes
        return MemorySnapshot(
            rank=self.rank,
            step=step,
            wall_ns=time.time_ns(),
            weights_bytes=self.weights_bytes,
            grads_bytes=grads,
            optimizer_bytes=optimizer,
            activations_bytes=activations,
            kv_cache_bytes=kv_cache_bytes,
            allocated_bytes=allocated,
            reserved_bytes=reserved,
            peak_allocated_bytes=peak,
            device_used_bytes=used,
            device_total_bytes=total,
            rss_bytes=rss,
        )
