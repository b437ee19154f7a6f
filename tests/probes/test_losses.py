"""The loss probe in one process (the scripts' losses under meshtop: tests/runner/test_script_loss.py)."""

from __future__ import annotations

import math

import pytest
import torch
from torch.distributed.pipelining import schedules
from torch.utils.data import dataloader

from meshtop.probes.groups import GroupDirectory
from meshtop.probes.instrument import OVERHEAD_BLOCK_ENV, Instrumentation
from meshtop.probes.losses import LossProbe
from tests.witness_worker import ListSink

CPU = torch.device("cpu")


def patched() -> tuple[object, ...]:
    """What the phases and loss probes patch, as it stands now."""
    return (
        torch.autograd.backward,
        torch.autograd.grad,
        vars(dataloader._BaseDataLoaderIter)["__next__"],
        vars(schedules._PipelineSchedule)["_compute_loss"],
    )


def a_backward(value: float) -> None:
    weight = torch.ones(1, requires_grad=True)
    (weight * value).sum().backward()


def test_the_loss_probe_reads_a_generator_of_outputs_and_still_hands_it_on_whole() -> None:
    """``torch.autograd.backward`` takes any iterable of tensors: the probe reads it once and passes on a
    tuple, so the backward still runs (both outputs' gradients arrive) and the scalar is read as the loss."""
    probe = LossProbe(torch.device("cpu"))
    probe.install()
    try:
        weight = torch.ones(2, requires_grad=True)
        loss = (weight * 3).sum()
        torch.autograd.backward(iter([loss]))
        assert weight.grad is not None and weight.grad.tolist() == [3.0, 3.0]
        pending = probe.take()
        assert pending.ready() and (pending.count, pending.value()) == (1, 6.0)
    finally:
        probe.uninstall()


def test_switching_the_hooks_off_and_on_keeps_the_loss_probe_over_the_phases_probe_and_restores_both(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The overhead benchmark switches the hooks every block of steps: the loss probe wraps the phases probe's
    ``torch.autograd.backward``, so it comes out first and goes back in after it, each time (the schedules'
    loss function with it, though it was asked for while the hooks were out); at the end every function is
    torch's own again."""
    monkeypatch.setenv(OVERHEAD_BLOCK_ENV, "1")  # on in even steps, off in odd ones
    before = patched()
    probes = Instrumentation(rank=0, sink=ListSink(), device=CPU, enabled=True)
    probes.install(groups=GroupDirectory(), pipeline=False, phases=True, loss=True)
    taken = []
    for step in range(5):
        probes.step_started(step)
        if step == 1:  # pipelining imported while the hooks are out
            probes.read_schedule_losses()
        a_backward(float(step + 1))
        probes.step_ended(step)
        phases, pending = probes.take_phases(), probes.take_loss()
        taken.append((probes.enabled, phases is not None and "b" in phases.kinds, pending and pending.value()))
    on, off = (True, True), (False, False)  # (hooks in, a backward window)
    assert taken == [(*on, 1.0), (*off, None), (*on, 3.0), (*off, None), (*on, 5.0)]  # each step's loss, hooks in
    assert torch.autograd.backward.__wrapped__.__wrapped__ is before[0]  # the loss probe's over the phases probe's
    assert patched()[3] is not before[3]  # the schedules' loss function wrapped too
    probes.uninstall()
    assert patched() == before


def test_the_built_in_runners_instrumentation_reads_no_loss() -> None:
    """The worker reports its own loss: an instrumentation installed without ``loss`` has no loss probe."""
    before = patched()
    probes = Instrumentation(rank=0, sink=ListSink(), device=CPU, enabled=True)
    probes.install(groups=GroupDirectory(), pipeline=False, phases=True)
    probes.step_started(0)
    a_backward(2.0)
    probes.step_ended(0)
    assert probes.take_loss() is None
    probes.read_schedule_losses()  # nothing to read them with
    probes.uninstall()
    assert patched() == before


def test_a_steps_loss_is_the_sum_of_the_losses_differentiated_in_it() -> None:
    """Gradient accumulation as the frameworks write it: micro-batch losses 3.0 and 5.0, each scaled by 1/2 before
    its backward (1.5 and 2.5): the step's loss is 1.5 + 2.5 = 4.0, the mean of 3 and 5 that the frameworks log
    and the loss whose gradient the optimizer applies; of 2 losses. A loop that does not scale: 3 + 5 = 8.0."""
    probe = LossProbe(CPU)
    probe.install()
    try:
        for value in (3.0, 5.0):
            a_backward(value / 2)
        scaled = probe.take()
        for value in (3.0, 5.0):
            a_backward(value)
        unscaled = probe.take()
    finally:
        probe.uninstall()
    assert (scaled.count, scaled.value()) == (2, 4.0)
    assert (unscaled.count, unscaled.value()) == (2, 8.0)


def test_a_scalar_given_its_own_gradient_is_no_loss() -> None:
    """``backward(torch.tensor(0.5))`` on a one-element tensor: autograd is not seeding it with 1, so it is not
    the objective (a pipeline stage's output, whose gradient came from the next stage): no loss is read, though
    its backward runs."""
    probe = LossProbe(CPU)
    probe.install()
    try:
        weight = torch.ones(1, requires_grad=True)
        (weight * 3.0).sum().backward(torch.tensor(0.5))
        assert weight.grad is not None and weight.grad.tolist() == [1.5]
        pending = probe.take()
    finally:
        probe.uninstall()
    assert (pending.count, pending.value()) == (0, None)


def test_a_loss_that_is_not_a_number_is_read_as_it_is() -> None:
    """A diverged step: one loss NaN, or one infinite, makes the step's NaN or infinite (never left out)."""
    probe = LossProbe(CPU)
    probe.install()
    try:
        a_backward(1.0)
        a_backward(float("nan"))
        diverged = probe.take()
        a_backward(float("inf"))
        infinite = probe.take()
    finally:
        probe.uninstall()
    assert diverged.count == 2 and math.isnan(diverged.value())
    assert (infinite.count, infinite.value()) == (1, math.inf)


def test_a_grad_scalers_loss_is_read_unscaled_and_a_skipped_steps_losses_are_dropped() -> None:
    """Mixed precision's loss scaling, on the CPU's ``GradScaler`` (scale 1024). Step 1: loss 3w = 3.0 at
    w = 1, handed to backward as 3072: read 3.0; SGD at lr 0.1 moves w to 1 - 0.1 x 3 = 0.7. Iteration 2: an
    infinite loss, whose gradient the scaler finds infinite: no optimizer step, and its loss is dropped with its
    gradients. Step 2 (iteration 3): 2w = 1.4, read alone (not inf + 1.4 of 2 losses)."""
    probe = LossProbe(CPU)
    probe.install()
    try:
        weight = torch.nn.Parameter(torch.ones(1))
        optimizer = torch.optim.SGD([weight], lr=0.1)
        scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
        taken = []
        for factor in (3.0, math.inf, 2.0):
            scaler.scale((weight * factor).sum()).backward()
            scaler.step(optimizer)
            scaler.update()
            optimizer.zero_grad()
            if factor != math.inf:  # a step closed (meshtop's step hook takes the loss at each optimizer step)
                taken.append(probe.take())
    finally:
        probe.uninstall()
    assert weight.item() == pytest.approx(0.7 - 0.1 * 2)  # stepped twice: the infinite iteration was skipped
    assert [(pending.count, pending.value()) for pending in taken] == [(1, 3.0), (1, pytest.approx(1.4))]
