"""The training recipes of the built-in runner: activation checkpointing changes memory and time, never the
math; mixed precision trains in bf16 over fp32 master weights, on one process and in parallel alike.

The planner's side (each recipe's bytes and traffic predicted exactly, for every plan of 4 ranks) is
tests/runner/test_sweep.py's.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.kit.jobs import RTOL, LaunchedRun, launch

pytestmark = pytest.mark.slow

STEPS = 4
BATCH = 8
MIXED_RTOL = 2e-2
"""bf16 compute against fp32: the first losses of tiny agree to about 0.3 %; bf16 rounding of gradients
reduced by different ranks in different orders moves later ones by less than 1 %."""


@pytest.fixture(scope="module")
def plain(tmp_path_factory: pytest.TempPathFactory) -> LaunchedRun:
    return launch(tmp_path_factory.mktemp("plain"), dp=1, steps=STEPS, batch_size=BATCH)


@pytest.mark.parametrize(
    "plan",
    [dict(dp=1, checkpoint="full"), dict(dp=1, checkpoint="selective"), dict(dp=2, fsdp=True, tp=2, checkpoint="full")],
    ids=["full", "selective", "fsdp2-tp2-full"],
)
def test_checkpointing_recomputes_the_same_losses(plan: dict[str, object], plain: LaunchedRun, tmp_path: Path) -> None:
    checkpointed = launch(tmp_path, steps=STEPS, batch_size=BATCH, **plan)
    assert checkpointed.result.status == "completed", checkpointed.result
    assert checkpointed.run.checkpoint == plan["checkpoint"]
    assert checkpointed.losses == pytest.approx(plain.losses, rel=RTOL)


@pytest.mark.parametrize("plan", [dict(dp=1), dict(dp=2), dict(dp=2, fsdp=True), dict(tp=2)], ids=str)
def test_mixed_precision_trains_like_fp32_to_bf16_rounding(
    plan: dict[str, object], plain: LaunchedRun, tmp_path: Path
) -> None:
    """One process and DDP keep an fp32 copy in the optimizer; FSDP2 keeps fp32 shards and gathers bf16."""
    mixed = launch(tmp_path, steps=STEPS, batch_size=BATCH, precision="mixed", **plan)
    assert mixed.result.status == "completed", mixed.result
    assert (mixed.run.precision, mixed.run.dtype) == ("mixed", "bf16")
    assert mixed.losses == pytest.approx(plain.losses, rel=MIXED_RTOL)
    assert mixed.losses != pytest.approx(plain.losses, rel=1e-6)  # bf16 did compute
    assert mixed.losses[-1] < mixed.losses[0]


def test_recomputation_shows_in_the_backward_part(tmp_path: Path) -> None:
    """Full checkpointing runs each block's forward again inside backward: the backward part grows against
    the forward part, which stays (one rank of the small model, where compute outweighs Python)."""
    ratios = {}
    for checkpoint in ("none", "full"):
        run = launch(tmp_path / checkpoint, dp=1, model="small", steps=6, batch_size=8, checkpoint=checkpoint)
        assert run.result.status == "completed", run.result
        breakdown = run.breakdown()
        assert breakdown is not None
        parts = breakdown["parts"]
        ratios[checkpoint] = parts["backward"]["s_per_step"] / parts["forward"]["s_per_step"]
    # a block's backward costs about two of its forwards: recomputing one adds about half again
    assert ratios["full"] > 1.2 * ratios["none"], ratios
