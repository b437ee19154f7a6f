"""The phases probe in one process: each step's data, forward, backward and optimizer windows, in order, on a
real DataLoader, model and optimizer; a sleeping dataset's wait is the data window's length."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint
from torch.utils.data import DataLoader, Dataset

from meshtop.probes.phases import MAX_WINDOWS, Phases

SLEEP_S = 0.02


class Sleepy(Dataset[torch.Tensor]):
    """Each sample takes ``SLEEP_S`` to load."""

    def __len__(self) -> int:
        return 64

    def __getitem__(self, index: int) -> torch.Tensor:
        time.sleep(SLEEP_S)
        return torch.full((8,), float(index))


@pytest.fixture
def phases() -> Iterator[Phases]:
    probe = Phases()
    probe.install()
    try:
        yield probe
    finally:
        probe.uninstall()


def windows(taken: tuple[str, tuple[int, ...], tuple[int, ...]]) -> list[tuple[str, float]]:
    kinds, starts, ends = taken
    assert list(starts) == sorted(starts) or len(kinds) > 1  # in the order they closed
    return [(kind, (end - start) / 1e9) for kind, start, end in zip(kinds, starts, ends, strict=True)]


def test_each_step_has_its_data_forward_backward_and_optimizer_windows(phases: Phases) -> None:
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 8))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = iter(DataLoader(Sleepy(), batch_size=2))  # 2 samples a batch: 2 x SLEEP_S of waiting
    for step in range(3):
        began = time.perf_counter()
        batch = next(loader)
        fetched_s = time.perf_counter() - began
        loss = model(batch).pow(2).mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        taken = windows(phases.take().final())
        assert [kind for kind, _ in taken] == ["d", "f", "b", "o"], (step, taken)  # submodules nest in the root
        # the data window is the wait for the batch: its two sleeps at least, and no longer than the call that
        # fetched it (a bound the machine's load cannot move, where a fixed margin past the sleeps was)
        assert 2 * SLEEP_S <= taken[0][1] <= fetched_s + 1e-3, (taken[0][1], fetched_s)
    assert phases._roots and set(phases._roots) == {model}  # learned at the first take: the root alone


def test_recomputation_runs_inside_backward_and_nested_windows_count_once(phases: Phases) -> None:
    inner = nn.Sequential(nn.Linear(8, 8), nn.ReLU())
    model = nn.Linear(8, 8)
    x = torch.randn(4, 8, requires_grad=True)
    out = checkpoint(inner, model(x), use_reentrant=False)
    out.sum().backward()
    kinds, starts, ends = phases.take().final()
    assert kinds.count("b") == 1
    backward = kinds.index("b")
    recomputed = [i for i, kind in enumerate(kinds) if kind == "f" and starts[i] >= starts[backward]]
    assert recomputed and all(ends[i] <= ends[backward] for i in recomputed)  # the recompute lies in backward


def test_a_step_keeps_at_most_max_windows_and_merges_the_rest_into_the_last(phases: Phases) -> None:
    model = nn.Linear(4, 4)
    for _ in range(MAX_WINDOWS + 10):
        model(torch.zeros(1, 4))
    kinds, starts, ends = phases.take().final()
    assert len(kinds) == MAX_WINDOWS and set(kinds) == {"f"}
    assert ends[-1] > starts[-1] and ends[-1] >= max(ends[:-1])
    assert phases.take().final() == ("", (), ())  # handed out once


def test_uninstall_takes_every_hook_out() -> None:
    before = (torch.autograd.backward, torch.autograd.grad)
    probe = Phases()
    probe.install()
    probe.uninstall()
    assert (torch.autograd.backward, torch.autograd.grad) == before
    nn.Linear(2, 2)(torch.zeros(1, 2)).sum().backward()
    assert probe.take().final() == ("", (), ())


def test_switching_the_probe_inside_an_optimizer_step_hook_is_safe_and_close_takes_its_hooks_out() -> None:
    """A script's step ends in an optimizer step hook, where the overhead benchmark switches the hooks: taking
    the probe's own step hooks out of the dict torch iterates raised "OrderedDict mutated during iteration"."""
    from torch.optim import optimizer as optim_module  # torch.optim's module (the package's name is a class)

    hooks = (optim_module._global_optimizer_pre_hooks, optim_module._global_optimizer_post_hooks)
    before = [len(h) for h in hooks]
    probe = Phases()
    probe.install()
    model = nn.Linear(2, 2)
    sgd = torch.optim.SGD(model.parameters(), lr=0.1)
    switched = []

    def switch(*_: object) -> None:
        probe.uninstall() if probe._on else probe.install()
        switched.append(probe._on)

    handle = optim_module.register_optimizer_step_post_hook(switch)
    try:
        for _ in range(4):
            model(torch.ones(1, 2)).sum().backward()
            sgd.step()
    finally:
        handle.remove()
    assert switched == [False, True, False, True]
    assert "o" in probe.take().final()[0]  # the steps with the probe in kept their optimizer windows
    assert [len(h) for h in hooks] == [count + 1 for count in before]
    probe.close()
    assert [len(h) for h in hooks] == before
