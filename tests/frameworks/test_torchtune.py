"""torchtune's ``full_finetune_distributed`` recipe (``ranks/torchtune_recipe.py``): FSDP2 over 2 CPU ranks, 2
micro-batches a step, recorded by ``meshtop record OUT -- torchrun ...``. It runs where torchtune is installed
(0.6.1, with torchao 0.11: later torchao releases lack the ``torchao.dtypes.nf4tensor`` its import needs); it is
not among the ``frameworks`` extra's packages.

How torchtune counts: a step is an optimizer step (its log's ``Step N`` lines). Each micro-batch differentiates
its mean token loss times its labelled tokens, the sum of its token losses; before the step the recipe
all-reduces the tokens and the summed loss and multiplies the gradients by ``ranks / tokens``
(``training.scale_grads``); it logs the summed loss over the tokens: the mean token loss of the step's whole
batch. meshtop's rank loss is what the rank differentiated, the sum of its token losses: as many times the logged
loss as the rank has labelled tokens a step (4 sequences of 15 labelled tokens, 2 micro-batches: 120).

torchtitan (0.3.0) is not in the corpus: it does not start on a CPU-only torch. Its model code imports
``triton`` unconditionally (``models/common/moe.py`` -> ``distributed/minimal_async_ep/kernels.py``: "No module
named 'triton'"), and its device is ``cuda`` wherever no accelerator is found (``tools/utils.py``:
``_get_available_device_type() or "cuda"``), with nccl as the backend.
"""

from __future__ import annotations

import pytest

from tests.frameworks.corpus import (
    FrameworkRun,
    assert_breakdown_adds_up,
    assert_collectives_are_torchs,
    assert_gradients_reduced,
    assert_memory_is_the_optimizers,
    assert_steps_are_the_frameworks,
    assert_the_jobs_loss_is_the_logged_loss,
    record,
    require,
    torchrun,
)

pytestmark = [pytest.mark.slow, pytest.mark.frameworks]
INSTALL = "pip install torchtune==0.6.1 torchao==0.11.0 (over the installed torch)"
require("torchtune", "torchtune's recipe", install=INSTALL)
require("torchao", "torchtune imports it", install=INSTALL)


@pytest.fixture(scope="module")
def recipe(tmp_path_factory: pytest.TempPathFactory) -> FrameworkRun:
    return record(tmp_path_factory.mktemp("torchtune"), torchrun("torchtune_recipe.py"), accum=2)


def test_steps_are_the_steps_torchtune_logged(recipe: FrameworkRun) -> None:
    assert_steps_are_the_frameworks(recipe, backpropagated=False)


@pytest.mark.xfail(
    strict=True,
    raises=AssertionError,
    reason="meshtop's loss is the sum of the scalars given to backward; torchtune differentiates summed token "
    "losses and divides the gradients afterwards (scale_grads), so meshtop reads each rank's summed token loss: "
    "120 times the logged loss here",
)
def test_the_jobs_loss_is_the_loss_torchtune_logged(recipe: FrameworkRun) -> None:
    assert_the_jobs_loss_is_the_logged_loss(recipe)


def test_collectives_are_torchs_flight_records(recipe: FrameworkRun) -> None:
    assert_collectives_are_torchs(recipe)


def test_fsdp_reduce_scatters_the_gradients_on_every_micro_batch(recipe: FrameworkRun) -> None:
    """torchtune 0.6's recipe does not hold FSDP2's gradient sync back while it accumulates
    (``set_requires_gradient_sync``): each micro-batch's backward reduce-scatters the whole gradient."""
    assert_gradients_reduced(recipe, "reduce_scatter", times=recipe.accum)


def test_the_step_breakdown_adds_up(recipe: FrameworkRun) -> None:
    assert_breakdown_adds_up(recipe)


def test_memory_is_each_ranks_shard(recipe: FrameworkRun) -> None:
    assert_memory_is_the_optimizers(recipe, sharded=True)
