"""A run until stopped: every rank ends after the same step, whether q asked for it or the time limit did."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch.distributed as dist

from meshtop.probes.events import Event, StepTiming
from meshtop.runner.errors import PlanError
from meshtop.runner.job.control import JobControl
from meshtop.runner.plan import RunSpec, resolve
from meshtop.runner.rank.until import MARGIN_STEPS, RunUntilStopped
from tests.kit.jobs import launch


def ranks(store: dist.Store, stop_file: Path, *, world: int = 2, time_limit_s: float = 3600.0) -> list[RunUntilStopped]:
    return [
        RunUntilStopped(rank=rank, time_limit_s=time_limit_s, store=store, stop_file=stop_file) for rank in range(world)
    ]


def test_every_rank_ends_after_the_step_rank_0_names_once_asked(tmp_path: Path) -> None:
    stop_file = tmp_path / "stop"
    rank0, rank1 = ranks(dist.HashStore(), stop_file)
    for step in range(3):  # nothing asked: the run goes on
        assert not rank0.ends_after(step) and not rank1.ends_after(step)
    stop_file.touch()
    assert not rank1.ends_after(3)  # rank 1 is not the one that looks at the request
    assert not rank0.ends_after(3)  # rank 0 sees it at the end of step 3: the last step is 3 + margin
    last = 3 + MARGIN_STEPS
    assert rank0.last_step == last
    for step in range(4, last):
        assert not rank0.ends_after(step) and not rank1.ends_after(step)
    assert rank0.ends_after(last) and rank1.ends_after(last)


def test_the_time_limit_ends_the_run_without_a_request(tmp_path: Path) -> None:
    rank0, rank1 = ranks(dist.HashStore(), tmp_path / "never-written", time_limit_s=0.2)
    assert not rank0.ends_after(0) and rank0.last_step is None  # within the limit
    time.sleep(0.3)
    assert not rank1.ends_after(1) and rank1.last_step is None  # rank 1 does not read the clock
    assert not rank0.ends_after(1) and rank0.last_step == 1 + MARGIN_STEPS
    assert rank1.ends_after(1 + MARGIN_STEPS)


def test_a_run_until_stopped_takes_no_step_count() -> None:
    with pytest.raises(PlanError, match="no --steps"):
        resolve(RunSpec(device="cpu", steps=5, time_limit_s=60), gpus_visible=0)
    run = resolve(RunSpec(device="cpu", time_limit_s=60), gpus_visible=0)
    assert run.steps is None and run.describe().steps is None


def steps_of_each_rank(events: list[object]) -> dict[int, list[int]]:
    steps: dict[int, list[int]] = {}
    for event in events:
        if isinstance(event, StepTiming):
            steps.setdefault(event.rank, []).append(event.step)
    return steps


@pytest.mark.slow
def test_asked_to_finish_a_pipeline_job_ends_after_the_same_step_on_every_rank_and_completes(tmp_path: Path) -> None:
    control = JobControl()

    def ask_after_step_2(events: list[Event]) -> None:
        if any(isinstance(event, StepTiming) and event.step >= 2 for event in events):
            control.finish.set()

    launched = launch(tmp_path, control=control, on_events=ask_after_step_2, dp=2, pp=2, time_limit_s=600)
    assert launched.result.status == "completed", launched.result
    steps = steps_of_each_rank(launched.events)
    assert len(steps) == 4 and len({tuple(done) for done in steps.values()}) == 1, steps
    assert 2 + MARGIN_STEPS <= len(steps[0]) <= 40, steps[0]  # a few steps after it was asked, not 600 s
    assert steps[0] == list(range(len(steps[0])))
    assert all(rank.exit_code == 0 for rank in launched.result.ranks)


@pytest.mark.slow
def test_asked_to_finish_before_the_first_step_the_job_is_stopped(tmp_path: Path) -> None:
    control = JobControl()
    control.finish.set()
    launched = launch(tmp_path, control=control, dp=2, time_limit_s=600)
    assert launched.result.status == "interrupted"


@pytest.mark.slow
def test_the_time_limit_ends_a_job_on_every_rank_at_once(tmp_path: Path) -> None:
    launched_ns = time.time_ns()
    launched = launch(tmp_path, dp=2, tp=2, time_limit_s=3)
    assert launched.result.status == "completed", launched.result
    steps = steps_of_each_rank(launched.events)
    assert len(steps) == 4 and len({tuple(done) for done in steps.values()}) == 1, steps
    assert steps[0] == list(range(len(steps[0])))
    # Rank 0 named the last step at the end of the first step past the limit, which counts from the rank's
    # start (setup included: on a loaded 2-core machine the first step alone can take the 3 s). So the step
    # MARGIN_STEPS before the last ended at least 3 s after the launch: the clock ended the run, not a count.
    timings = {event.step: event for event in launched.events if isinstance(event, StepTiming) and event.rank == 0}
    named_at = timings[len(steps[0]) - 1 - MARGIN_STEPS]
    assert named_at.start_ns + named_at.duration_s * 1e9 >= launched_ns + 3e9
