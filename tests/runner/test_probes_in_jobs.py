"""What the worker probes report from real jobs: memory by category, stage actions, step tags."""

from __future__ import annotations

import itertools
from collections import Counter

import pytest

from meshtop.probes.events import CollectiveTiming, MemorySnapshot, StageAction, StepTiming
from meshtop.recordings.metrics.bandwidth import bus_factor, busbw_gbps

pytestmark = pytest.mark.slow


def test_memory_is_accounted_by_category_from_the_local_shards(launch_cpu) -> None:
    launched = launch_cpu(dp=2, fsdp=True, steps=3)
    assert launched.result.status == "completed"
    local = {s.rank: s.local_parameters for s in launched.started}
    params_per_rank = {s.rank: s for s in launched.started}
    snapshots = [e for e in launched.events if isinstance(e, MemorySnapshot)]
    assert sorted((s.rank, s.step) for s in snapshots) == [(r, n) for r in range(2) for n in range(3)]
    for snapshot in snapshots:
        weights = local[snapshot.rank] * 4  # fp32
        assert snapshot.weights_bytes == weights
        assert snapshot.grads_bytes == weights  # every parameter has a gradient after backward
        # AdamW keeps exp_avg and exp_avg_sq (each the size of the weights) and a scalar step per tensor.
        assert 2 * weights <= snapshot.optimizer_bytes <= 2 * weights + 4 * 64
        assert snapshot.rss_bytes > 100 * 2**20
        assert snapshot.allocated_bytes is None and snapshot.activations_bytes is None  # CUDA-only figures
    assert (
        params_per_rank[0].local_parameters + params_per_rank[1].local_parameters
        == launched.run.shape.parameter_count()
    )


def test_each_stage_reports_forward_and_backward_of_every_microbatch(launch_cpu) -> None:
    launched = launch_cpu(pp=2, schedule="1f1b", microbatches=4, steps=2)
    actions = [e for e in launched.events if isinstance(e, StageAction)]
    counts = Counter((a.rank, a.stage, a.step, a.action) for a in actions)
    assert counts == Counter(
        {(r, r, s, action): 4 for r in range(2) for s in range(2) for action in ("forward", "backward")}
    )
    for rank in range(2):
        mine = sorted((a for a in actions if a.rank == rank), key=lambda a: a.start_ns)
        assert sorted(a.microbatch for a in mine if a.step == 0 and a.action == "forward") == [0, 1, 2, 3]
        for earlier, later in itertools.pairwise(mine):
            assert earlier.end_ns <= later.start_ns  # one rank runs one action at a time
    waits = [e.pipeline_wait_s for e in launched.events if isinstance(e, StepTiming)]
    assert all(w is not None and w >= 0 for w in waits)
    steps = {e.rank: e for e in launched.events if isinstance(e, StepTiming) and e.step == 1}
    busy = sum((a.end_ns - a.start_ns) / 1e9 for a in actions if a.rank == 0 and a.step == 1)
    assert busy < steps[0].forward_backward_s


def test_collectives_carry_group_bytes_and_the_step(launch_cpu) -> None:
    launched = launch_cpu(dp=2, tp=2, steps=2, batch_size=8)
    collectives = [e for e in launched.events if isinstance(e, CollectiveTiming)]
    in_steps = [c for c in collectives if c.step is not None]
    assert {c.step for c in in_steps} == {0, 1}
    assert {c.group for c in in_steps} == {"dp", "tp"}
    assert all(c.group_size == 2 and c.end_ns >= c.start_ns and c.clock == "completion" for c in in_steps)
    tp_reduce = [c for c in in_steps if c.group == "tp" and c.op == "all_reduce" and c.rank == 0]
    # A tensor-parallel all-reduce carries activations: microbatch x seq x dim floats.
    run = launched.run
    activation = (run.batch_size // run.plan.dp) * run.seq_len * run.shape.dim * 4
    assert Counter(c.bytes for c in tp_reduce).most_common(1)[0][0] == activation


def test_bus_bandwidth_follows_nccl_tests() -> None:
    assert bus_factor("all_reduce", 4) == pytest.approx(1.5)
    assert bus_factor("all_gather", 4) == bus_factor("reduce_scatter", 4) == pytest.approx(0.75)
    assert bus_factor("broadcast", 8) == bus_factor("send", 2) == 1.0
    assert bus_factor("barrier", 8) is None
    assert busbw_gbps("all_reduce", 2, 10**9, 1.0) == pytest.approx(1.0)
