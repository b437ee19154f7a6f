"""The activations probe in this process: what a forward pass saves for backward, counted once per storage
while it is alive, the model's weights left out."""

from __future__ import annotations

import gc

import torch
from torch import nn

from probes.activations import SavedActivations


def test_saved_tensors_are_counted_once_while_alive_and_weights_are_not() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 16))
    probe = SavedActivations()
    probe.leave_out(model.parameters())
    probe.install()
    try:
        x = torch.randn(8, 16)
        out = model(x)
        loss = out.pow(2).mean()
    finally:
        probe.uninstall()
    # x (8 x 16) for the first linear, its output (8 x 64) for ReLU (which saves its own output, the same
    # storage the second linear saves as its input: once), out (8 x 16) for the square; 4 bytes each.
    saved = 4 * 8 * (16 + 64 + 16)
    assert probe.live_bytes == saved
    assert probe.take_peak() == saved
    loss.backward()
    del out, loss
    gc.collect()
    assert probe.live_bytes == 4 * 8 * 16  # only x: the caller still holds it
    del x
    gc.collect()
    assert probe.live_bytes == 0
    assert probe.take_peak() == saved  # this period began with all of it live
    assert probe.take_peak() == 0  # ...and the next with none


def test_outside_the_hooks_nothing_is_counted() -> None:
    probe = SavedActivations()
    probe.install()
    probe.uninstall()
    model = nn.Linear(4, 4)
    model(torch.randn(2, 4)).sum().backward()
    assert probe.live_bytes == 0 and probe.take_peak() == 0
