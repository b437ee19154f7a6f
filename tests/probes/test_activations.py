"""The activations probe in this process: what a forward pass saves for backward, counted once per storage
while autograd holds it, the model's weights left out."""

from __future__ import annotations

import gc

import torch
from torch import nn

from meshtop.probes.activations import SavedActivations


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
    # Backward released every saved slot: nothing is saved any more, although the caller still holds x
    # (a pipeline's receive buffer is held the same way) and out.
    assert probe.live_bytes == 0
    assert probe.take_peak() == 0  # the period since saved nothing
    assert x.shape == (8, 16) and out.shape == (8, 16)


def test_a_graph_dropped_without_backward_releases_its_saved_bytes() -> None:
    model = nn.Linear(16, 16)
    probe = SavedActivations()
    probe.leave_out(model.parameters())
    probe.install()
    try:
        x = torch.randn(4, 16)
        loss = model(x).pow(2).sum()
    finally:
        probe.uninstall()
    assert probe.live_bytes == 4 * 4 * (16 + 16)  # x for the linear, its output for the square
    del loss
    gc.collect()
    assert probe.live_bytes == 0


def test_outside_the_hooks_nothing_is_counted() -> None:
    probe = SavedActivations()
    probe.install()
    probe.uninstall()
    model = nn.Linear(4, 4)
    model(torch.randn(2, 4)).sum().backward()
    assert probe.live_bytes == 0 and probe.take_peak() == 0


def test_what_an_earlier_step_left_saved_is_not_the_next_steps() -> None:
    model = nn.Linear(16, 16)
    probe = SavedActivations()
    probe.leave_out(model.parameters())
    probe.install()
    try:
        kept = model(torch.randn(4, 16)).pow(2).sum()  # a graph no backward will run on
        assert probe.take_peak() == 4 * 4 * 32
        loss = model(torch.randn(2, 16)).pow(2).sum()
    finally:
        probe.uninstall()
    assert probe.live_bytes == 4 * (4 + 2) * 32  # both graphs are held...
    assert probe.take_peak() == 4 * 2 * 32  # ...but this period saved only the second
    loss.backward()
    del kept
    gc.collect()
    assert probe.live_bytes == 0


def test_a_storage_an_earlier_step_left_saved_counts_again_once_this_step_saves_it() -> None:
    """The same input saved by a graph kept from an earlier period (torch pipelining's shape-inference forward)
    and by this period's forward: this period holds it too, so its peak counts it (once)."""
    model = nn.Linear(16, 16)
    probe = SavedActivations()
    probe.leave_out(model.parameters())
    x = torch.randn(4, 16)
    probe.install()
    try:
        kept = model(x).pow(2).sum()  # saves x and the linear's output; no backward will run on it
        assert probe.take_peak() == 4 * 4 * 32
        loss = model(x).pow(2).sum()  # saves x again, and a new output
    finally:
        probe.uninstall()
    assert probe.live_bytes == 4 * 4 * (16 + 16 + 16)  # x once, both outputs
    assert probe.take_peak() == 4 * 4 * 32  # x and the new output: this period's, although saved before
    loss.backward()
    del kept
    gc.collect()
    assert probe.live_bytes == 0
    assert probe.take_peak() == 0
