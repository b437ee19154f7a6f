"""Lightning's Trainer (``ranks/lightning_trainer.py``), DDP strategy over 2 CPU ranks, recorded by
``meshtop record OUT -- torchrun ...``, plain and with 2 micro-batches a step.

How Lightning counts: a step is an optimizer step (``trainer.global_step``). In float32 it runs a step's last
micro-batch, forward and backward, inside ``optimizer.step(closure)`` (the earlier ones outside), so torch's
optimizer pre-step hook fires before that micro-batch's forward. It differentiates ``training_step``'s loss
divided by K (the accumulation); ``self.log(..., sync_dist=True)`` logs each micro-batch's loss, undivided,
averaged over the ranks, and keeps no accumulated loss of its own: a step's logged loss is the mean of its
micro-batches' logged values, which is the ranks' mean of the sum of what each differentiated.
"""

from __future__ import annotations

import pytest

from tests.frameworks.corpus import (
    RANKS,
    FrameworkRun,
    assert_breakdown_adds_up,
    assert_collectives_are_torchs,
    assert_each_ranks_loss_is_what_it_backpropagated,
    assert_gradients_reduced,
    assert_memory_is_the_optimizers,
    assert_steps_are_the_frameworks,
    assert_the_jobs_loss_is_the_logged_loss,
    record,
    require,
    torchrun,
)

pytestmark = [pytest.mark.slow, pytest.mark.frameworks]
require("lightning", "Lightning's Trainer")
require("transformers", "the tiny Llama is transformers'")
RUNS = ["plain", "accumulated"]


@pytest.fixture(scope="module")
def plain(tmp_path_factory: pytest.TempPathFactory) -> FrameworkRun:
    """One micro-batch a step: all of it, forward and backward, inside ``optimizer.step``."""
    return record(tmp_path_factory.mktemp("lightning"), torchrun("lightning_trainer.py"), accum=1)


@pytest.fixture(scope="module")
def accumulated(tmp_path_factory: pytest.TempPathFactory) -> FrameworkRun:
    """Two micro-batches a step: the first outside ``optimizer.step``, the second inside."""
    return record(tmp_path_factory.mktemp("lightning-accum2"), torchrun("lightning_trainer.py"), accum=2)


@pytest.fixture(params=RUNS)
def trainer(request: pytest.FixtureRequest) -> FrameworkRun:
    return request.getfixturevalue(request.param)


def test_steps_are_lightnings_global_steps(trainer: FrameworkRun) -> None:
    assert_steps_are_the_frameworks(trainer)


def test_each_ranks_loss_is_the_sum_lightning_backpropagated(trainer: FrameworkRun) -> None:
    assert_each_ranks_loss_is_what_it_backpropagated(trainer)


def test_the_jobs_loss_is_the_loss_lightning_logged(trainer: FrameworkRun) -> None:
    assert_the_jobs_loss_is_the_logged_loss(trainer)


def test_collectives_are_torchs_flight_records(trainer: FrameworkRun) -> None:
    assert_collectives_are_torchs(trainer)


def test_ddp_reduces_the_gradients_once_a_step(trainer: FrameworkRun) -> None:
    assert_gradients_reduced(trainer, "all_reduce")


def test_memory_is_what_lightnings_optimizer_holds(trainer: FrameworkRun) -> None:
    assert_memory_is_the_optimizers(trainer, sharded=False)


def test_the_step_breakdown_adds_up_with_accumulation(accumulated: FrameworkRun) -> None:
    assert_breakdown_adds_up(accumulated)


def test_the_forward_and_backward_inside_the_optimizer_step_are_not_the_optimizers(plain: FrameworkRun) -> None:
    """Every forward and backward of the plain run happens inside ``optimizer.step``: they are still forward and
    backward in the step breakdown, and the optimizer part is only the rest of the step call."""
    assert_breakdown_adds_up(plain)
    for rank, parts in plain.summary["breakdown"]["per_rank"].items():
        compute = parts["forward"]["s_per_step"] + parts["backward"]["s_per_step"]
        assert parts["optimizer"]["s_per_step"] < compute, (rank, parts)
    assert len(plain.summary["breakdown"]["per_rank"]) == RANKS
