"""Parallel plans compute what one process computes: same per-step losses on the same data."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from tests.kit.jobs import RTOL, LaunchedRun, assert_parts_add_up, launch

pytestmark = pytest.mark.slow

STEPS = 4
BATCH = 8

PLANS = {
    "dp2": dict(dp=2),
    "fsdp2": dict(dp=2, fsdp=True),
    "tp2": dict(tp=2),
    "pp2-gpipe": dict(pp=2, schedule="gpipe", microbatches=4),
    "pp2-1f1b": dict(pp=2, schedule="1f1b", microbatches=4),
    "pp2-interleaved-1f1b": dict(pp=2, schedule="interleaved-1f1b", microbatches=2),
    "dp2-pp2": dict(dp=2, pp=2, microbatches=2),
    "fsdp2-tp2": dict(dp=2, fsdp=True, tp=2),
    "dp2-tp2-pp2": dict(dp=2, tp=2, pp=2, microbatches=2),
}


@pytest.fixture(scope="module")
def single_process(tmp_path_factory: pytest.TempPathFactory) -> LaunchedRun:
    return launch(tmp_path_factory.mktemp("single"), dp=1, steps=STEPS, batch_size=BATCH)


@pytest.fixture(scope="module")
def parallel(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], LaunchedRun]:
    """Each plan's run, launched once for this module's tests (how a plan splits the model and what it
    computes are asked of the same run: each job costs the 2-core CI machine 20-40 s)."""
    runs: dict[str, LaunchedRun] = {}

    def run_of(key: str) -> LaunchedRun:
        if key not in runs:
            runs[key] = launch(tmp_path_factory.mktemp(key), steps=STEPS, batch_size=BATCH, **PLANS[key])
        return runs[key]

    return run_of


def test_single_process_run_learns(single_process: LaunchedRun) -> None:
    assert single_process.result.status == "completed"
    losses = single_process.losses
    assert len(losses) == STEPS
    assert losses[-1] < losses[0]


@pytest.mark.parametrize("plan", PLANS)
def test_parallel_losses_match_one_process(
    plan: str, single_process: LaunchedRun, parallel: Callable[[str], LaunchedRun]
) -> None:
    run = parallel(plan)
    assert run.result.status == "completed", run.result
    assert len(run.losses) == STEPS
    assert run.losses == pytest.approx(single_process.losses, rel=RTOL)
    # where each rank's steps went: every part measured, adding up to its step
    assert_parts_add_up(run.breakdown(), run.run.plan.world_size, pipelined=run.run.plan.pp > 1)


@pytest.mark.parametrize(("plan", "shards"), [("fsdp2", "dp"), ("tp2", "tp"), ("pp2-1f1b", "pp")])
def test_each_rank_stores_only_its_share(plan: str, shards: str, parallel: Callable[[str], LaunchedRun]) -> None:
    """The split is real: a rank holds part of the model, and the parts add up to the whole."""
    run = parallel(plan)
    total = run.run.shape.parameter_count()
    local = [started.local_parameters for started in run.started]
    assert len(local) == 2
    assert all(count < total for count in local)
    if shards == "tp":
        # RMSNorm weights stay whole on every tensor-parallel rank.
        norms = (2 * run.run.shape.n_layers + 1) * run.run.shape.dim
        assert sum(local) == total + norms
    else:
        assert sum(local) == total


@pytest.mark.parametrize("key", ["fsdp2-tp2", "dp2-tp2-pp2"])
def test_a_composed_plan_splits_the_model_over_each_of_its_dimensions(
    key: str, parallel: Callable[[str], LaunchedRun]
) -> None:
    """fsdp2 x tp2: the four ranks' parts add up to the model once (RMSNorm weights once per tensor-parallel
    rank), a quarter each; dp2 x tp2 x pp2: each data-parallel replica's four parts add up so, and the two
    replicas hold the same."""
    plan, run = PLANS[key], parallel(key)
    assert run.result.status == "completed", run.result
    shape = run.run.shape
    total, norms = shape.parameter_count(), (2 * shape.n_layers + 1) * shape.dim
    held = {(s.dp_rank, s.pp_rank, s.tp_rank): s.local_parameters for s in run.started}
    assert len(held) == len(run.started) == 2 * 2 * (2 if plan.get("pp") else 1)
    if plan.get("fsdp"):
        assert sum(held.values()) == total + norms
        assert all(abs(count - (total + norms) / 4) <= 0.02 * total for count in held.values()), held
    else:
        replicas = [{place[1:]: count for place, count in held.items() if place[0] == dp} for dp in (0, 1)]
        assert replicas[0] == replicas[1]
        assert sum(replicas[0].values()) == total + norms
        assert all(count < total / 2 for count in replicas[0].values()), replicas[0]
