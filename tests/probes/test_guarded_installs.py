"""A torch internal a probe or a plan needs may be missing from a torch release: the probe is left off, put
back as it was and said to be off in one line, and the job runs on; a plan that needs it fails in one line.

Also the benchmark switch of the hooks (``MESHTOP_OVERHEAD_BLOCK``), which lives in the instrumentation
rather than in the worker's loops.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch._C._distributed_c10d import Work
from torch.distributed.pipelining import schedules, stage

from meshtop.probes.events import CollectiveTiming, ProbeOff, StageAction, StepTiming
from meshtop.probes.groups import GroupDirectory
from meshtop.probes.instrument import OVERHEAD_BLOCK_ENV, Instrumentation
from meshtop.probes.patching import MissingInternal, require
from meshtop.probes.pipeline import STAGE_METHODS, StageProbe
from meshtop.runner.errors import PlanError
from meshtop.runner.rank.data_parallel import apply_replicate
from meshtop.runner.rank.mesh import build_mesh
from meshtop.tui.alerts import alerts_of
from meshtop.tui.state import DashboardState
from tests.kit.jobs import launch
from tests.witness_worker import ListSink

SITE_HOOKS = Path(__file__).resolve().parents[1] / "site_hooks"
CPU = torch.device("cpu")


@pytest.fixture
def world_of_one() -> Iterator[None]:
    """A one-rank gloo process group in this process, so the instrumentation can name its groups."""
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def stage_hooks() -> tuple[object, ...]:
    """What the stage probe patches, as it stands now."""
    return (*(vars(stage._PipelineStageBase).get(m) for m in STAGE_METHODS), schedules._wait_batch_p2p)


def probes_offs(sink: ListSink) -> list[tuple[int, str, str]]:
    return [(e.rank, e.probe, e.reason) for e in sink.events if isinstance(e, ProbeOff)]


def test_a_missing_internal_is_named_with_its_module_class_and_the_torch_release() -> None:
    assert require(stage._PipelineStageBase, "forward_one_chunk") is stage._PipelineStageBase.forward_one_chunk
    with pytest.raises(MissingInternal) as raised:
        require(stage._PipelineStageBase, "forward_one_microbatch")
    assert str(raised.value) == (
        f"torch {torch.__version__} has no torch.distributed.pipelining.stage._PipelineStageBase.forward_one_microbatch"
    )
    with pytest.raises(MissingInternal, match=r" has no torch\._C\._no_such_thing$"):
        require(torch._C, "_no_such_thing")


def test_the_stage_probe_patches_nothing_when_one_of_its_internals_is_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delattr(stage._PipelineStageBase, "backward_weight_one_chunk")
    before = stage_hooks()
    with pytest.raises(MissingInternal, match=r"_PipelineStageBase\.backward_weight_one_chunk"):
        StageProbe(rank=0, emit=lambda event: None, step=lambda: None).install()
    assert stage_hooks() == before


def test_a_probe_that_fails_half_way_is_put_back_reported_once_and_the_others_stay_on(
    world_of_one: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken_wait_timer(probe: StageProbe, original: object) -> object:
        raise RuntimeError("cannot time the wait\nsecond line of the error")

    # The three stage methods are patched by then: the failure comes half-way through install().
    monkeypatch.setattr(StageProbe, "_timed_wait", broken_wait_timer)
    before = stage_hooks()
    sink = ListSink()
    probes = Instrumentation(rank=0, sink=sink, device=CPU, enabled=True)
    probes.install(groups=GroupDirectory.from_mesh(build_mesh(device_type="cpu", pp=1, dp=1, tp=1)), pipeline=True)
    assert probes_offs(sink) == [(0, "pipeline stages", "RuntimeError: cannot time the wait")]
    assert stage_hooks() == before
    probes.step_started(0)
    dist.all_reduce(torch.ones(4))
    assert probes.step_ended(0) is None  # no pipeline wait figure without the stage probe
    probes.set_enabled(False)
    probes.set_enabled(True)  # a probe left off is not tried, nor reported, again
    probes.uninstall()
    assert len(probes_offs(sink)) == 1
    assert [(e.op, e.step) for e in sink.events if isinstance(e, CollectiveTiming)] == [("all_reduce", 0)]


def test_the_python_collective_kernel_is_left_off_where_torch_lacks_its_dispatcher_internal(
    world_of_one: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("MESHTOP_NATIVE_PROBE", raising=False)  # no C++ kernel: the Python one
    monkeypatch.delattr(torch._C, "_dispatch_keyset_full_after")
    wait = vars(Work)["wait"]
    sink = ListSink()
    probes = Instrumentation(rank=0, sink=sink, device=CPU, enabled=True)
    probes.install(groups=GroupDirectory.from_mesh(build_mesh(device_type="cpu", pp=1, dp=1, tp=1)), pipeline=False)
    assert probes_offs(sink) == [
        (0, "collectives", f"torch {torch.__version__} has no torch._C._dispatch_keyset_full_after")
    ]
    assert vars(Work)["wait"] is wait
    dist.all_reduce(torch.ones(4))  # the job goes on, untimed
    assert probes.progress().in_flight == 0
    probes.uninstall()
    assert not [e for e in sink.events if isinstance(e, CollectiveTiming)]


def test_the_benchmark_switch_turns_the_hooks_on_and_off_every_block_of_steps_and_inference_ops(
    world_of_one: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(OVERHEAD_BLOCK_ENV, "2")
    wait = vars(Work)["wait"]
    probes = Instrumentation(rank=0, sink=ListSink(), device=CPU, enabled=True)
    probes.install(groups=GroupDirectory.from_mesh(build_mesh(device_type="cpu", pp=1, dp=1, tp=1)), pipeline=False)
    on_in_step = []
    for step in range(6):
        probes.step_started(step)
        on_in_step.append((probes.enabled, vars(Work)["wait"] is not wait))
        probes.step_ended(step)
    assert on_in_step == [(True, True)] * 2 + [(False, False)] * 2 + [(True, True)] * 2
    on_in_op = []
    for op in (0, 2, 3, 4):
        probes.set_step(op)
        on_in_op.append(probes.enabled)
    probes.set_step(None)  # between ops: no switch
    assert on_in_op == [True, False, False, True] and probes.enabled
    probes.uninstall()

    off = Instrumentation(rank=0, sink=ListSink(), device=CPU, enabled=False)  # --no-instrument: nothing to switch
    off.install(groups=GroupDirectory.from_mesh(build_mesh(device_type="cpu", pp=1, dp=1, tp=1)), pipeline=False)
    off.step_started(0)
    assert not off.enabled and vars(Work)["wait"] is wait


def test_replication_with_tp_or_pp_on_a_torch_without_replicate_with_fsdp_is_a_one_line_plan_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "torch.distributed._composable.replicate_with_fsdp", None)  # import fails
    with pytest.raises(PlanError) as raised:
        apply_replicate(torch.nn.Module(), dp_mesh=None)  # type: ignore[arg-type]
    message = str(raised.value)
    assert "\n" not in message
    assert message.startswith(f"torch {torch.__version__} has no torch.distributed._composable.replicate_with_fsdp")
    assert "tp or pp" in message and "--fsdp" in message


@pytest.mark.slow
def test_a_pipeline_job_runs_on_without_stage_hooks_where_torch_lacks_one_and_every_rank_says_why(
    tmp_path: Path,
) -> None:
    path = os.pathsep.join(filter(None, (str(SITE_HOOKS), os.environ.get("PYTHONPATH"))))
    launched = launch(
        tmp_path,
        env={"PYTHONPATH": path, "MESHTOP_TEST_MOVE_STAGE_METHOD": "forward_one_chunk"},
        pp=2,
        microbatches=4,
        steps=3,
    )
    assert launched.result.status == "completed", launched.result
    assert [r.exit_code for r in launched.result.ranks] == [0, 0]
    assert [s.step for s in launched.steps] == [0, 1, 2]
    offs = sorted((e.rank, e.probe, e.reason) for e in launched.events if isinstance(e, ProbeOff))
    reason = f"torch {torch.__version__} has no torch.distributed.pipelining.stage._PipelineStageBase.forward_one_chunk"
    assert offs == [(0, "pipeline stages", reason), (1, "pipeline stages", reason)]
    assert not [e for e in launched.events if isinstance(e, StageAction)]
    assert all(e.pipeline_wait_s is None for e in launched.events if isinstance(e, StepTiming))
    p2p = {(e.rank, e.op) for e in launched.events if isinstance(e, CollectiveTiming) and e.step is not None}
    assert {(0, "send"), (1, "recv")} <= p2p
    state = DashboardState(launched.run.describe())  # what the dashboard says
    state.apply_events(launched.events)
    assert f"probe off: pipeline stages on every rank: {reason}" in [alert.text for alert in alerts_of(state)]
