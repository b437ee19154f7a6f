"""The loss of a user's script, each step, read without synchronising the device.

Rules, in order:

- **A loss** is a one-element tensor that autograd is asked to differentiate with no gradient of its own
  (``loss.backward()``, ``torch.autograd.backward(loss)``): autograd seeds it with 1, which is what makes it
  the objective. A tensor handed an explicit gradient (a pipeline stage's outputs, whose gradient came from
  the next stage) is not one. ``Tensor.backward`` calls ``torch.autograd.backward``, the one place hooked.
- **A pipeline's loss** is what its schedule's loss function returned (``_PipelineSchedule._compute_loss``,
  on the last stage only: the other stages have none). A rank that ran a schedule's loss in a step counts no
  other loss in that step, so the zero-bubble schedules (which differentiate the loss through
  ``torch.autograd.grad``) and the others read alike.
- **A step's loss** is the sum of the losses differentiated in it, with their count: the loss whose
  gradient the optimizer applies. Under gradient accumulation a loop that scales each micro-batch's loss by
  1 / accumulation before ``backward()`` (the Hugging Face Trainer, accelerate, Lightning, most hand-written
  loops) differentiates losses that sum to the mean of its micro-batches': what those frameworks log. A loop
  that does not scale reads the sum of its micro-batches' losses, which is what its optimizer follows (its
  gradients are summed). A pipeline schedule's losses are its microbatches' and the schedule itself scales the
  gradients by 1 / microbatches (its ``scale_grads``, on by default): each counts as loss / microbatches
  then, so a schedule's step reads the mean of its microbatches' losses, as the schedule's gradients are.
- **Not a number**: a loss that is NaN or infinite is read as it is (a diverged step keeps its loss).
- **Mixed precision's loss scaling**: ``GradScaler.scale(loss)`` multiplies the loss by the scaler's factor
  before ``backward()`` and divides the gradients by it before the optimizer steps, so the loss read is the
  one handed to ``scale``. An iteration whose ``GradScaler.step`` did not step the optimizer (an inf or NaN in
  the gradients: the gradients are thrown away) has its losses thrown away too, not added to the next step's.
- **Never a synchronisation**: on the CPU each value is read as it comes. On a GPU the step's losses are
  summed on the device; at the step's end the sum is copied to pinned host memory on the current stream with
  an event recorded after it, and read once the event has completed (:meth:`PendingLoss.ready`), so a GPU
  step's loss can be known a step or two after the step. A DTensor loss is read from its local part where it
  is replicated (reading a sharded or partial one would take a collective: it is not read).
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch.amp.grad_scaler import GradScaler
from torch.optim.optimizer import register_optimizer_step_post_hook

from meshtop.probes.patching import Patches, require


@dataclass(slots=True)
class PendingLoss:
    """One step's loss on its way to the host."""

    count: int
    """Losses differentiated in the step."""
    _total: float | None = None
    """Their (weighted) sum, read already (CPU)."""
    _host: torch.Tensor | None = None
    """The sum's pinned copy, valid once ``_copied`` has completed (GPU)."""
    _copied: Any = None

    def ready(self) -> bool:
        return self._copied is None or bool(self._copied.query())

    def value(self) -> float | None:
        """The step's loss (call once :meth:`ready`); ``None`` for a step with none."""
        if self.count == 0:
            return None
        return self._total if self._host is None else float(self._host)


def _local_scalar(tensor: Any) -> torch.Tensor | None:
    """The tensor whose value is the loss's, or ``None`` where reading it would need a collective."""
    to_local = getattr(tensor, "to_local", None)
    if to_local is not None:  # a DTensor
        if not all(placement.is_replicate() for placement in tensor.placements):
            return None
        tensor = to_local()
    return tensor if isinstance(tensor, torch.Tensor) else None


def _microbatch_weight(schedule: Any) -> float:
    """What one microbatch's loss counts for in its schedule's step: 1 / microbatches where the schedule scales
    its gradients so (``scale_grads``, torch's default), else 1 (a loss function that sums)."""
    microbatches = getattr(schedule, "_n_microbatches", None)
    if not getattr(schedule, "scale_grads", True) or not isinstance(microbatches, int) or microbatches < 1:
        return 1.0
    return 1.0 / microbatches


MAX_SCALED = 64
"""Scaled losses kept waiting for their ``backward()`` (a step scales one a micro-batch)."""


class LossProbe:
    """Sees each loss a rank differentiates and hands out each step's (:meth:`take`)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._patches = Patches()
        self._count = 0
        self._total = 0.0
        self._device_total: torch.Tensor | None = None
        self._from_schedule = False
        self._schedule = False
        """Pipeline schedules' losses are read too (:meth:`want_schedule`): each :meth:`install` wraps them."""
        self._installed = False
        self._scaled: dict[int, tuple[weakref.ref[torch.Tensor], torch.Tensor]] = {}
        """A ``GradScaler``'s scaled losses since the last step, by id: (the scaled tensor, the loss it scaled)."""
        self._optimizer_steps = 0
        """Optimizer steps seen (any optimizer's): a ``GradScaler.step`` that adds none skipped its step."""
        self._counting: Any = None

    # -- hooks -------------------------------------------------------------------------

    def install(self) -> None:
        """Wrap ``torch.autograd.backward`` as it is now (another probe's wrapper, where one is in), and the
        schedules' loss function where :meth:`want_schedule` asked for it.

        An :class:`~meshtop.probes.instrument.Instrumentation` installs it after the phases probe and takes it
        out before, so each restores exactly what it replaced however often the hooks are switched.
        """
        original = torch.autograd.backward
        probe = self

        def backward(tensors: Any, grad_tensors: Any = None, *args: Any, **kwargs: Any) -> Any:
            # A one-pass iterable (a generator) is read once here and handed on as a tuple: both see it whole.
            if not isinstance(tensors, (torch.Tensor, tuple, list)):
                tensors = tuple(tensors)
            if grad_tensors is not None and not isinstance(grad_tensors, (torch.Tensor, tuple, list)):
                grad_tensors = tuple(grad_tensors)
            if not probe._from_schedule:
                with contextlib.suppress(Exception):  # a probe never breaks the backward it watches
                    probe._seen_backward(tensors, grad_tensors)
            return original(tensors, grad_tensors, *args, **kwargs)

        backward.__wrapped__ = original  # type: ignore[attr-defined]
        self._patches.replace(torch.autograd, "backward", backward)
        self._wrap_grad_scaler()
        self._installed = True
        if self._schedule:
            self._wrap_schedule()

    def _wrap_grad_scaler(self) -> None:
        """``GradScaler.scale`` remembers each scaled loss's own; ``GradScaler.step`` that steps no optimizer
        drops the iteration's losses."""
        scale, step = GradScaler.scale, GradScaler.step
        probe = self

        def scaled(self: GradScaler, outputs: Any) -> Any:
            result = scale(self, outputs)
            if isinstance(outputs, torch.Tensor) and isinstance(result, torch.Tensor) and result is not outputs:
                with contextlib.suppress(Exception):  # a probe never breaks the loss it reads
                    if len(probe._scaled) >= MAX_SCALED:  # scaled and never differentiated: the oldest go
                        probe._scaled.pop(next(iter(probe._scaled)))
                    probe._scaled[id(result)] = (weakref.ref(result), outputs)
            return result

        def stepped(self: GradScaler, optimizer: Any, *args: Any, **kwargs: Any) -> Any:
            before = probe._optimizer_steps
            result = step(self, optimizer, *args, **kwargs)
            if probe._optimizer_steps == before:  # inf or NaN found: no step, its gradients and losses dropped
                probe._drop()
            return result

        self._patches.replace(GradScaler, "scale", scaled)
        self._patches.replace(GradScaler, "step", stepped)
        self._counting = register_optimizer_step_post_hook(self._optimizer_stepped)

    def _optimizer_stepped(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        self._optimizer_steps += 1

    def want_schedule(self) -> None:
        """Read pipeline schedules' losses where they compute them, from now on and at each :meth:`install`
        (call once pipelining is imported); :class:`~meshtop.probes.patching.MissingInternal` where torch
        lacks the internal, the probe left as it was."""
        self._schedule_loss()  # checked before it is wanted: a later install must not fail on it
        if self._schedule:
            return
        self._schedule = True
        if self._installed:
            self._wrap_schedule()

    def uninstall(self) -> None:
        """Every patch out (:meth:`install` again puts them back, the schedules' with them)."""
        self._patches.restore()
        if self._counting is not None:
            self._counting.remove()
            self._counting = None
        self._installed = False

    @staticmethod
    def _schedule_loss() -> tuple[Any, Any]:
        """The schedules' base class and its loss function, or :class:`~meshtop.probes.patching.MissingInternal`."""
        from torch.distributed.pipelining import schedules

        schedule = require(schedules, "_PipelineSchedule")
        return schedule, require(schedule, "_compute_loss")

    def _wrap_schedule(self) -> None:
        schedule, original = self._schedule_loss()
        probe = self

        def compute_loss(self: Any, *args: Any, **kwargs: Any) -> Any:
            loss = original(self, *args, **kwargs)
            probe._from_schedule = True
            with contextlib.suppress(Exception):  # a probe never breaks the schedule it watches
                probe._add(loss, weight=_microbatch_weight(self))
            return loss

        self._patches.replace(schedule, "_compute_loss", compute_loss)

    def _seen_backward(self, tensors: Any, grad_tensors: Any) -> None:
        outputs: Sequence[Any] = (tensors,) if isinstance(tensors, torch.Tensor) else tuple(tensors)
        if grad_tensors is None:
            grads: Sequence[Any] = (None,) * len(outputs)
        elif isinstance(grad_tensors, torch.Tensor):
            grads = (grad_tensors,)
        else:
            grads = tuple(grad_tensors)
        for output, grad in zip(outputs, grads, strict=False):
            if grad is None and isinstance(output, torch.Tensor) and output.numel() == 1:
                self._add(self._unscaled(output))

    def _unscaled(self, output: torch.Tensor) -> torch.Tensor:
        """The loss a ``GradScaler`` scaled into ``output``, else ``output``."""
        found = self._scaled.pop(id(output), None)
        return found[1] if found is not None and found[0]() is output else output

    def _add(self, loss: Any, *, weight: float = 1.0) -> None:
        local = _local_scalar(loss)
        if local is None or local.numel() != 1:
            return
        value = local.detach()
        if value.device.type == "cpu":
            self._total += float(value) * weight
        else:  # summed on the device, read at the step's end
            value = value.reshape(()).to(torch.float64) * weight
            self._device_total = value if self._device_total is None else self._device_total + value
        self._count += 1

    # -- steps -------------------------------------------------------------------------

    def take(self) -> PendingLoss:
        """The losses since the last call, as one step's (its copy to the host started, never waited for)."""
        pending = PendingLoss(count=self._count, _total=self._total)
        if self._device_total is not None:
            host = torch.empty((), dtype=torch.float64, pin_memory=True)
            host.copy_(self._device_total, non_blocking=True)
            copied = torch.cuda.Event()
            copied.record()
            pending = PendingLoss(count=self._count, _host=host, _copied=copied)
        self._drop()
        return pending

    def _drop(self) -> None:
        """Forget the losses since the last step."""
        self._count, self._total, self._device_total, self._from_schedule = 0, 0.0, None, False
        self._scaled.clear()
