"""The step breakdown's, collectives', MFU's, memory's and pipeline's folds on small inputs worked out by hand:
the survivors of the mutation run of 2026-12-05 17:00 (tests/recordings only) that the tests beside this one
let through."""

from __future__ import annotations

import dataclasses
import tracemalloc

import numpy as np
import pytest

from meshtop.probes.events import CollectiveTiming, ProcessSample
from meshtop.recordings.metrics import collectives
from meshtop.recordings.metrics.breakdown import HISTORY, PARTS, BreakdownFold, RankStep
from meshtop.recordings.metrics.collectives import CollectiveFold
from meshtop.recordings.metrics.memory import MemoryFold, MemoryRow
from meshtop.recordings.metrics.mfu import GpuModel, mfu
from meshtop.recordings.metrics.pipeline import StageFold
from meshtop.recordings.metrics.steps import StepSpans
from meshtop.recordings.schema import table_of
from tests.kit.events import collective, stage_action
from tests.kit.recordings import description, with_model

T = 1_700_000_000_000_000_000
MS = 1_000_000


def op(
    rank: int, start_ns: int, end_ns: int, name: str = "all_reduce", *, step: int = 0, group: str = "dp"
) -> CollectiveTiming:
    return dataclasses.replace(
        collective(rank, step, op=name, group=group, bytes=1 << 20), start_ns=start_ns, end_ns=end_ns, waited_ns=None
    )


# -- the step breakdown ------------------------------------------------------------------------------------


def test_a_rank_whose_steps_took_no_time_has_no_share_of_anything() -> None:
    """One step of rank 0 that starts and ends at T: every part 0 s a step, and its share 0, not 0 / 0 (nor 1),
    for the rank and for the job."""
    fold = BreakdownFold()
    empty = RankStep(
        start_ns=T, end_ns=T, schedule_end_ns=None, phases="", phase_start_ns=[], phase_end_ns=[],
        communication=[], pipeline_waits=[],
    )  # fmt: skip
    assert fold.add(0, empty) == dict.fromkeys(PARTS, 0.0)
    found = fold.figures()
    nothing = {part: {"s_per_step": 0.0, "share": 0.0} for part in PARTS}
    assert (found.steps, found.parts, found.per_rank) == (1, nothing, {0: nothing})


def test_the_dashboards_chart_keeps_each_parts_last_240_closed_steps() -> None:
    """241 closed steps of one rank, step i all data (i seconds): the chart keeps steps 1 to 240."""
    assert HISTORY == 240
    fold = BreakdownFold()
    for i in range(241):
        fold.add_step([0], np.array([[float(i), 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]]), [0])
    history = fold.figures().history
    assert history["data"] == tuple(float(i) for i in range(1, 241))
    assert history["other"] == (0.0,) * 240


# -- collectives -------------------------------------------------------------------------------------------


def test_collective_rows_go_by_in_flight_time_most_first_to_the_nanosecond() -> None:
    """dp all_reduce: one operation of 1 s = 1e9 ns: 1.0 s exactly; tp all_gather: 2 of 1 s: 2.0 s, listed
    first."""
    fold = CollectiveFold(per_step=False)
    fold.add(
        table_of(
            [
                op(0, T, T + 1_000_000_000),
                op(0, T, T + 1_000_000_000, "all_gather", group="tp"),
                op(1, T, T + 1_000_000_000, "all_gather", group="tp"),
            ]
        )
    )
    assert [(row.group, row.op, row.in_flight_total_s) for row in fold.rows()] == [
        ("tp", "all_gather", 2.0),
        ("dp", "all_reduce", 1.0),
    ]


def test_an_operation_of_an_open_step_has_no_exposed_share_and_a_step_of_no_time_none_either() -> None:
    """Step 0 closes (1 s) with no operation; step 1's all_reduce is still open: the job's steps total 1 s
    but the operation has no closed step, so no exposed time and no share (not 0 / 1 = 0). Another fold: step
    0's operation closes in a step of 0 s: exposed 0.01 s a step, but no share (nothing to divide by)."""
    fold = CollectiveFold(per_step=True)
    fold.add(table_of([op(0, T + 1000 * MS, T + 1010 * MS, step=1)]))
    [(by_op, by_rank, _)] = fold.close_steps([(0, 1.0, StepSpans())])
    assert (by_op, by_rank, fold.open_steps()) == ({}, {}, [1])
    [row] = fold.rows()
    assert (row.exposed_per_step_s, row.exposed_share, row.exposed_measured) == (None, None, None)

    instant = CollectiveFold(per_step=True)
    instant.add(table_of([op(0, T, T + 10 * MS)]))
    instant.close(0, 0.0, StepSpans())
    [row] = instant.rows()
    assert (row.exposed_per_step_s, row.exposed_share) == (pytest.approx(0.01), None)


def test_a_closed_step_is_not_opened_again_by_a_late_operation() -> None:
    """Step 0 closes; a late operation of step 0 counts (2 operations) but opens nothing."""
    fold = CollectiveFold(per_step=True)
    fold.add(table_of([op(0, T, T + 10 * MS)]))
    fold.close_steps([(0, 1.0, StepSpans())])
    fold.add(table_of([op(0, T + 20 * MS, T + 30 * MS)]))
    assert fold.open_steps() == []
    assert fold.rows()[0].count == 2


def test_closing_steps_at_once_decides_no_more_cells_a_pass_than_the_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    """The bound made 2**14 cells (step, op, rank) a pass. One all_reduce at rank 8192 a step: 8,193 ranks, so
    one step's cells (8,193) fit a pass and two (16,386) do not: closing two steps at once decides them one by
    one and holds no more memory at its peak than closing one (a pass's arrays of 8,193 entries, about 0.7 MiB
    here; both steps in one pass would hold twice that)."""
    monkeypatch.setattr(collectives, "CELLS_AT_ONCE", 1 << 14)

    def peak_bytes(steps: int) -> int:
        fold = CollectiveFold(per_step=True)
        fold.add(table_of([op(8192, T + k * 1000 * MS, T + k * 1000 * MS + MS, step=k) for k in range(steps)]))
        tracemalloc.start()
        try:
            exposures = fold.close_steps([(k, 1.0, StepSpans()) for k in range(steps)])
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert [by_op for by_op, _, _ in exposures] == [{("dp", "all_reduce"): 0.001}] * steps
        return peak

    one = peak_bytes(1)
    assert peak_bytes(2) < 1.25 * one


# -- MFU ---------------------------------------------------------------------------------------------------


def test_an_mfu_without_a_value_still_names_its_flops_a_token() -> None:
    """A 1e9-parameter model (6,000,098,304 FLOPs a token, as in test_folds_by_hand.py): a GPU whose bf16 peak
    is not known says so; an H100 with no complete step yet has its peak, 989e12, and no value."""
    run = with_model(description(dp=4, device="cuda", dtype="bf16"), parameters=1_000_000_000)
    unknown = mfu(run, gpus=[GpuModel("Acme Abacus 9", None)], tokens_per_s=20_480.0)
    assert (unknown.value, unknown.why_not, unknown.flops_per_token) == (
        None,
        "no bf16 peak known for Acme Abacus 9",
        6_000_098_304.0,
    )
    waiting = mfu(run, gpus=[GpuModel("NVIDIA H100", 700.0)], tokens_per_s=None)
    assert (waiting.value, waiting.why_not, waiting.flops_per_token, waiting.peak_flops_per_s) == (
        None,
        "no complete step yet",
        6_000_098_304.0,
        989e12,
    )


# -- memory ------------------------------------------------------------------------------------------------


def test_a_rank_seen_only_by_its_resident_set_has_a_row_with_its_peak_and_nothing_else() -> None:
    """Rank 2: a process sample of 300 bytes, no memory snapshot: a row of its peak, every category unknown."""
    fold = MemoryFold()
    fold.add_process(table_of([ProcessSample(rank=2, pid=7, wall_ns=1, cpu_pct=None, rss_bytes=300, threads=None)]))
    unknown = dict.fromkeys(
        ("weights_bytes", "grads_bytes", "optimizer_bytes", "activations_bytes", "kv_cache_bytes"), None
    )
    assert fold.rows() == [MemoryRow(rank=2, peak_bytes=300, **unknown, device_total_bytes=None, headroom_bytes=None)]
    assert fold.headroom_bytes() is None


# -- pipeline ----------------------------------------------------------------------------------------------


def test_with_one_pipeline_rank_every_stage_is_pipeline_rank_0() -> None:
    """pp 1: stages 0 and 1 (1 ms each, ranks 0 and 1) are both pipeline rank 0: 1 ms each, mean 1 ms. pp 0 is
    taken as 1."""
    for pp in (1, 0):
        fold = StageFold(pp=pp)
        fold.add_actions(table_of([stage_action(0, 0, stage=0), stage_action(1, 0, stage=1)]))
        assert fold.busy_by_stage(0) == {0: 0.001}
