"""The Hugging Face Trainer (``transformers``, through ``accelerate``), DDP over 2 CPU ranks, recorded by
``meshtop record OUT -- torchrun ... ranks/hf_trainer.py``, plain and with 2 micro-batches a step.

How the Trainer counts (``ranks/hf_trainer.py``): a step is an optimizer step (``state.global_step``); each
micro-batch differentiates its summed token losses over the tokens of the step's whole batch on every rank,
times the ranks, and the logged loss is the unweighted mean over the ranks of each rank's sum of those: the
mean token loss of the step's batch. So meshtop's rank loss (the sum of what the rank differentiated) averaged
over the ranks is the logged loss, with or without accumulation.

FSDP is not here: accelerate 1.16 applies its FSDP plugin only to GPU-like devices (``AcceleratorState`` makes
the run ``DistributedType.FSDP`` only from ``MULTI_GPU`` and its kin); on the CPU it drops the plugin without a
word and the Trainer runs DDP (the same collectives as without it).
"""

from __future__ import annotations

import pytest

from tests.frameworks.corpus import (
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
require("transformers", "the Trainer")
require("accelerate", "the Trainer runs on it")


@pytest.fixture(scope="module", params=[1, 2], ids=["ddp", "ddp-accum2"])
def trainer(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> FrameworkRun:
    out = tmp_path_factory.mktemp(f"hf-accum{request.param}")
    return record(out, torchrun("hf_trainer.py"), accum=request.param)


def test_steps_are_the_trainers_global_steps(trainer: FrameworkRun) -> None:
    assert_steps_are_the_frameworks(trainer)


def test_each_ranks_loss_is_the_sum_the_trainer_backpropagated(trainer: FrameworkRun) -> None:
    assert_each_ranks_loss_is_what_it_backpropagated(trainer)


def test_the_jobs_loss_is_the_trainers_logged_loss(trainer: FrameworkRun) -> None:
    assert_the_jobs_loss_is_the_logged_loss(trainer)


def test_collectives_are_torchs_flight_records(trainer: FrameworkRun) -> None:
    assert_collectives_are_torchs(trainer)


def test_ddp_reduces_the_gradients_once_a_step(trainer: FrameworkRun) -> None:
    assert_gradients_reduced(trainer, "all_reduce")


def test_the_step_breakdown_adds_up(trainer: FrameworkRun) -> None:
    assert_breakdown_adds_up(trainer)


def test_memory_is_what_the_trainers_optimizer_holds(trainer: FrameworkRun) -> None:
    assert_memory_is_the_optimizers(trainer, sharded=False)
