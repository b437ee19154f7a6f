"""The loss probe in one process (the scripts' losses under meshtop: tests/runner/test_script_loss.py)."""

from __future__ import annotations

import torch

from meshtop.probes.losses import LossProbe


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
