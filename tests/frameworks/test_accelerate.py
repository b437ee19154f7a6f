"""A plain accelerate loop (``ranks/accelerate_loop.py``), DDP over 2 CPU ranks with 2 micro-batches a step,
recorded by ``meshtop record OUT -- torchrun ...`` and by ``meshtop record OUT -- accelerate launch ...``.

How accelerate counts: ``accelerator.backward`` differentiates ``loss / K`` (K the accumulation);
``optimizer.step()`` is called on every micro-batch, and accelerate's optimizer wrapper steps the inner
optimizer only where ``sync_gradients`` holds (the wrapper never runs ``Optimizer.__init__``, so only the inner
optimizer's step hooks fire). accelerate logs nothing itself; the loop logs ``accelerator.reduce(sum of loss /
K, "mean")``, the ranks' mean of each rank's mean micro-batch loss. meshtop's rank loss is the sum of the
``loss / K`` it differentiated: the same mean.
"""

from __future__ import annotations

import pytest

from tests.frameworks.corpus import (
    RANKS,
    RANKS_DIR,
    STEPS,
    FrameworkRun,
    assert_breakdown_adds_up,
    assert_collectives_are_torchs,
    assert_each_ranks_loss_is_what_it_backpropagated,
    assert_gradients_reduced,
    assert_memory_is_the_optimizers,
    assert_steps_are_the_frameworks,
    assert_the_jobs_loss_is_the_logged_loss,
    on_path,
    record,
    require,
    torchrun,
)

pytestmark = [pytest.mark.slow, pytest.mark.frameworks]
require("accelerate", "the loop is accelerate's")
require("transformers", "the tiny Llama is transformers'")
ACCUM = 2


@pytest.fixture(scope="module")
def loop(tmp_path_factory: pytest.TempPathFactory) -> FrameworkRun:
    return record(tmp_path_factory.mktemp("accelerate"), torchrun("accelerate_loop.py"), accum=ACCUM)


def test_steps_are_the_optimizer_steps_accelerate_took(loop: FrameworkRun) -> None:
    """12 micro-batches each call ``optimizer.step()``; 6 of them step the optimizer (``sync_gradients``)."""
    assert_steps_are_the_frameworks(loop)


def test_each_ranks_loss_is_the_sum_accelerate_backpropagated(loop: FrameworkRun) -> None:
    assert_each_ranks_loss_is_what_it_backpropagated(loop)


def test_the_jobs_loss_is_the_loss_the_loop_logged(loop: FrameworkRun) -> None:
    assert_the_jobs_loss_is_the_logged_loss(loop)


def test_collectives_are_torchs_flight_records(loop: FrameworkRun) -> None:
    assert_collectives_are_torchs(loop)


def test_ddp_reduces_the_gradients_once_a_step(loop: FrameworkRun) -> None:
    """``accelerator.accumulate`` holds DDP's all-reduce back (``no_sync``) on the first micro-batch."""
    assert_gradients_reduced(loop, "all_reduce")


def test_the_step_breakdown_adds_up(loop: FrameworkRun) -> None:
    assert_breakdown_adds_up(loop)


def test_memory_is_what_the_inner_optimizer_holds(loop: FrameworkRun) -> None:
    assert_memory_is_the_optimizers(loop, sharded=False)


def test_accelerate_launch_is_recorded_as_torchrun_is(tmp_path_factory: pytest.TempPathFactory) -> None:
    """``accelerate launch --multi_gpu`` starts the ranks through torchrun's own code (on a machine without GPUs
    they run on the CPU with gloo); under meshtop it records what the torchrun launch records."""
    launcher = ["accelerate", "launch", "--multi_gpu", f"--num_processes={RANKS}", "--num_machines=1"]
    launcher += ["--mixed_precision=no", "--dynamo_backend=no", str(RANKS_DIR / "accelerate_loop.py")]
    run = record(tmp_path_factory.mktemp("accelerate-launch"), launcher, accum=ACCUM, env=on_path())
    assert_steps_are_the_frameworks(run)
    assert_each_ranks_loss_is_what_it_backpropagated(run)
    assert_the_jobs_loss_is_the_logged_loss(run)
    assert run.summary["run"]["world_size"] == RANKS and run.summary["steps"]["count"] == STEPS
