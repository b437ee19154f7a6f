"""The core's figures against numbers worked out by hand from known events, not against meshtop itself: the
quantile rule (exact and bucketed), bus bandwidth per op, the pipeline bubble (training and inference),
exposed communication, MFU, how per-rank step reports fold into the job's steps, and the run's JSON.

The dashboard, ``summary`` and ``/metrics`` read one fold, so a test that compares them passes whatever the fold
computes; each figure here is written down as a literal, with the arithmetic beside it."""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Iterable

import numpy as np
import pytest

from meshtop.probes.events import Event, StageAction
from meshtop.recordings.manifest import RunDescription
from meshtop.recordings.metrics.bandwidth import algbw_gbps, bus_factor, busbw_column, busbw_gbps
from meshtop.recordings.metrics.breakdown import Breakdown
from meshtop.recordings.metrics.collectives import communication_share
from meshtop.recordings.metrics.gpus import GpuRow
from meshtop.recordings.metrics.mfu import GpuModel, flops_per_token, mfu, script_parameters
from meshtop.recordings.metrics.pipeline import mean_bubble, theoretical_bubble
from meshtop.recordings.metrics.run import RunFold
from meshtop.recordings.metrics.server import ServerFigures
from meshtop.recordings.metrics.stats import EXACT_LIMIT, Distribution, quantile
from meshtop.recordings.metrics.steps import JobStep, StepStats, job_step
from meshtop.recordings.metrics.stragglers import Straggler
from meshtop.recordings.schema import tables_of
from tests.kit.events import NO_LINKS, collective, fold_events, gpu_sample, step
from tests.kit.recordings import description, elastic_script, with_model

MS = 1_000_000
EVERY_NS = 100 * MS
"""Steps start 100 ms apart: step ``n`` at ``n * 100`` ms."""


def folded(run: RunDescription, run_events: list[Event], *, as_tables: bool = True) -> RunFold:
    """A finished run of ``run_events``: folded a table a kind as ``summary`` does, or (``as_tables`` false,
    for the kinds folded as events: steps) an event at a time as the dashboard does."""
    fold = RunFold(run)
    if as_tables:
        for kind, table in tables_of(run_events):
            fold.apply(kind, table)
    else:
        fold_events(fold, run_events)
    fold.finish("completed")
    return fold


# -- the quantile rule -------------------------------------------------------------------------------------
#
# stats.py documents numpy's default (linear) method: of n sorted values x[0] <= ... <= x[n - 1], the q quantile
# is at position p = q (n - 1), between x[floor p] and x[ceil p]: x[floor p] + (p - floor p)(x[ceil p] - x[floor p]).


QUANTILE_CASES = [
    # [1, 2, 3, 4] (the docstring's): p50 at 1.5 -> 2.5; p90 at 2.7 -> 3.7; p99 at 2.97 -> 3.97
    # (at q n, one past: p50 3, p90 4)
    ([4.0, 1.0, 3.0, 2.0], (2.5, 3.7, 3.97)),
    # odd length, [10 .. 50]: p50 at 2 -> 30 (a value itself); p90 at 3.6 -> 40 + 0.6 x 10 = 46; p99 at 3.96 -> 49.6
    ([50.0, 10.0, 40.0, 20.0, 30.0], (30.0, 46.0, 49.6)),
    # nine 0s and a 100: p50 at 4.5 -> 0; p90 at 8.1 -> 0.1 x 100 = 10; p99 at 8.91 -> 91 (at q n: 0, 100, 100)
    ([100.0] + [0.0] * 9, (0.0, 10.0, 91.0)),
    # two values: p50 at 0.5 -> 2; p90 at 0.9 -> 1 + 0.9 x 2 = 2.8; p99 -> 1 + 0.99 x 2 = 2.98
    ([3.0, 1.0], (2.0, 2.8, 2.98)),
    ([7.0], (7.0, 7.0, 7.0)),  # one value is every quantile
]


@pytest.mark.parametrize(("values", "expected"), QUANTILE_CASES)
def test_the_quantiles_interpolate_between_the_ranks_either_side_of_q_times_n_less_one(
    values: list[float], expected: tuple[float, float, float]
) -> None:
    p50, p90, p99 = (pytest.approx(value, abs=1e-12) for value in expected)
    assert [quantile(np.array(values), q) for q in (0.5, 0.9, 0.99)] == [p50, p90, p99]
    assert Distribution(values).quantiles("p50", "p90", "p99") == {"p50": p50, "p90": p90, "p99": p99}
    one_by_one = Distribution()  # as the dashboard fills it: a value at a time, in another order
    for value in reversed(values):
        one_by_one.add(value)
    assert one_by_one.quantiles("p50", "p90", "p99") == {"p50": p50, "p90": p90, "p99": p99}
    assert one_by_one.quantile(0.25) == quantile(np.array(values), 0.25)


def test_no_values_have_no_quantile() -> None:
    assert quantile(np.array([]), 0.5) is None
    assert Distribution().quantile(0.5) is None and Distribution().quantiles("p50", "p99") == {"p50": None, "p99": None}


def test_the_bucketed_quantiles_are_the_middles_of_the_buckets_of_the_ranks_either_side() -> None:
    """105,000 values of 1.0 and 105,000 of 3.0: past the exact limit, kept in buckets. frexp(1.0) = 0.5 x 2^1:
    sub-bucket 0, middle 2 (0.5 + 0.5 / 256) = 1.00390625; frexp(3.0) = 0.75 x 2^2: sub-bucket (0.75 - 0.5) x 256
    = 64, middle 4 (0.5 + 64.5 / 256) = 3.0078125. p50 at 0.5 x 209,999 = 104,999.5: halfway between the last
    1.0 (rank 104,999) and the first 3.0 (rank 105,000): 2.005859375 (exactly 2.0: 0.29 % off); p90 at 188,999.1
    and p99: both 3.0s."""
    values = np.repeat([1.0, 3.0], 105_000)
    assert len(values) > EXACT_LIMIT
    expected = {"p50": 2.005859375, "p90": 3.0078125, "p99": 3.0078125}
    whole = Distribution()
    whole.extend(values)  # as summary fills it: a column at once
    one_by_one = Distribution()  # as the dashboard does, the 3.0s first: past the limit on the way
    for value in values[::-1].tolist():
        one_by_one.add(value)
    assert whole.quantiles("p50", "p90", "p99") == expected
    assert one_by_one.quantiles("p50", "p90", "p99") == expected
    assert whole.quantile(0.25) == 1.00390625  # 52,499.75: both ranks 1.0s


def test_the_bucketed_quantiles_are_within_one_part_in_256_of_the_exact_ones() -> None:
    """A bucket spans 2^e / 256 of values at least 2^e / 2, and its middle is within half of that of any of
    them: within 1 / 256 (0.4 %, the documented bound) of the value, and so of a quantile between two."""
    values = np.geomspace(1e-3, 1e3, EXACT_LIMIT + 50_001)
    bucketed = Distribution(values)
    qs = (0.01, 0.25, 0.5, 0.9, 0.99, 0.999)
    exact = np.quantile(values, qs)
    found = np.array(bucketed.quantiles_at(*qs))
    assert np.all(np.abs(found - exact) <= exact / 256 * (1 + 1e-9))
    assert np.any(found != exact)  # bucketed indeed


# -- bus bandwidth -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("op", "n", "expected_gbps"),
    [
        # 1 GB in 0.5 s: algbw 2 GB/s, then x the op's factor over n ranks
        ("all_reduce", 8, 3.5),  # 2 (8 - 1) / 8 = 1.75
        ("all_reduce", 2, 2.0),  # 2 (2 - 1) / 2 = 1
        ("all_gather", 4, 1.5),  # (4 - 1) / 4 = 0.75
        ("reduce_scatter", 4, 1.5),
        ("all_to_all", 8, 1.75),  # 7 / 8
        ("broadcast", 8, 2.0),  # 1
        ("reduce", 4, 2.0),
        ("send", 2, 2.0),
        ("recv", 2, 2.0),
        ("barrier", 8, None),  # moves no buffer: no bandwidth
    ],
)
def test_the_bus_bandwidth_is_the_algorithm_bandwidth_times_the_nccl_tests_factor(
    op: str, n: int, expected_gbps: float | None
) -> None:
    assert algbw_gbps(1_000_000_000, 0.5) == 2.0
    assert busbw_gbps(op, n, 1_000_000_000, 0.5) == (pytest.approx(expected_gbps) if expected_gbps else None)
    factor = bus_factor(op, n)
    column = busbw_column(np.array([1_000_000_000]), np.array([0.5]), np.array([np.nan if factor is None else factor]))
    assert column[0] == pytest.approx(expected_gbps) if expected_gbps else np.isnan(column[0])


def test_an_operation_of_no_time_has_no_bandwidth() -> None:
    assert algbw_gbps(1 << 20, 0.0) is None and busbw_gbps("all_reduce", 4, 1 << 20, 0.0) is None
    assert np.isnan(busbw_column(np.array([1 << 20]), np.array([0.0]), np.array([1.5]))[0])


def test_a_groups_busbw_is_the_median_over_the_operations_that_ran_alone() -> None:
    """Four all-gathers of 8 MB over 4 ranks, (4 - 1) / 4 = 0.75: in 2 ms 4 GB/s -> 3.0; in 4 ms -> 1.5; in 8 ms
    -> 0.75; one of 1 ms queued behind another (8 GB/s -> 6.0) is left out: p50 of 0.75, 1.5, 3.0 = 1.5 (with it,
    2.25). In flight 1, 2, 4, 8 ms: total 15 ms, p50 at 1.5 -> 3 ms, p99 at 2.97 -> 4 + 0.97 x 4 = 7.88 ms."""
    gather = {"op": "all_gather", "group": "tp", "group_size": 4, "bytes": 8_000_000}
    events: list[Event] = [
        collective(0, 0, 0.002, **gather),
        collective(0, 1, 0.004, **gather),
        collective(0, 2, 0.008, **gather),
        collective(0, 3, 0.001, overlapped=True, **gather),
    ]
    [row] = folded(description(dp=4), events).figures().collectives
    assert (row.group, row.op, row.count, row.bytes) == ("tp", "all_gather", 4, 32_000_000)
    assert row.busbw_p50_gbps == pytest.approx(1.5) and row.busbw_ops == 3
    assert row.in_flight_total_s == pytest.approx(0.015)
    assert (row.in_flight_p50_s, row.in_flight_p99_s) == (pytest.approx(0.003), pytest.approx(0.00788))


# -- the pipeline bubble -----------------------------------------------------------------------------------


def actions(rank: int, number: int, stage: int, busy_ms: float) -> list[StageAction]:
    """Rank ``rank``'s work in step ``number`` on ``stage``: a 2 ms forward, then a backward for the rest of
    ``busy_ms``."""
    start = number * EVERY_NS
    forward_end = start + 2 * MS
    return [
        StageAction(
            rank=rank, step=number, stage=stage, microbatch=0, action="forward", start_ns=start, end_ns=forward_end
        ),
        StageAction(
            rank=rank,
            step=number,
            stage=stage,
            microbatch=0,
            action="backward",
            start_ns=forward_end,
            end_ns=start + round(busy_ms * MS),
        ),
    ]


def pipeline_job() -> list[Event]:
    """dp 2 x pp 2: ranks 0, 1 run stage 0 and ranks 2, 3 stage 1. Per step, each rank's busy ms and its
    forward + backward ms (``None``: not measured)."""
    busy = {0: (6, 8, 8, 8), 1: (5, 7, 18, 16), 2: (4, 4, 12, 10)}
    forward_backward = {0: (10, 10, 10, 10), 1: (18, 20, 19, 17), 2: (None,) * 4}
    events: list[Event] = []
    for number, per_rank in busy.items():
        for rank, busy_ms in enumerate(per_rank):
            events += actions(rank, number, rank // 2, busy_ms)
            fb_ms = forward_backward[number][rank]
            seconds = None if fb_ms is None else fb_ms / 1e3
            events.append(step(rank, number, 0.025, every_ns=EVERY_NS, forward_backward_s=seconds))
    return events


def test_the_bubble_is_idle_over_span_summed_over_steps_with_a_stage_busy_for_the_mean_of_its_copies() -> None:
    """Stage busy = mean of its ranks; span = max(slowest forward + backward, busiest stage); idle = span - busy.
    step 0: stage 0 (6 + 8) / 2 = 7, stage 1 8; span max(10, 8) = 10; idle 3 and 2 (bubbles 0.3, 0.2)
    step 1: stage 0 (5 + 7) / 2 = 6, stage 1 (18 + 16) / 2 = 17; span max(20, 17) = 20; idle 14 and 3
    step 2: stage 0 4, stage 1 (12 + 10) / 2 = 11; no forward + backward: span the busiest, 11; idle 7 and 0
    Over the run, sum(idle) / sum(span): stage 0 (3 + 14 + 7) / 41 = 24 / 41, stage 1 (2 + 3 + 0) / 41 = 5 / 41
    (the mean of the steps' bubbles would give (0.3 + 0.7 + 7 / 11) / 3 = 0.545 for stage 0); the mean bubble
    (24 + 5) / 41 / 2 = 29 / 82. Busy per step: stage 0 (7 + 6 + 4) / 3, stage 1 (8 + 17 + 11) / 3 = 12 ms;
    idle: stage 0 (3 + 14 + 7) / 3 = 8 ms, stage 1 5 / 3 ms."""
    fold = folded(description(dp=2, pp=2), pipeline_job())
    stages = fold.figures().stages
    assert [row.stage for row in stages] == [0, 1]
    assert [row.bubble_fraction for row in stages] == [pytest.approx(24 / 41), pytest.approx(5 / 41)]
    assert [row.busy_s for row in stages] == [pytest.approx(17 / 3 / 1e3), pytest.approx(0.012)]
    assert [row.idle_s for row in stages] == [pytest.approx(0.008), pytest.approx(5 / 3 / 1e3)]
    assert mean_bubble(stages) == pytest.approx(29 / 82)
    spans = {closed.step: (closed.span_s, closed.bubbles) for closed in fold.closed}
    assert spans[0] == (pytest.approx(0.010), {0: pytest.approx(0.3), 1: pytest.approx(0.2)})
    assert spans[1] == (pytest.approx(0.020), {0: pytest.approx(0.7), 1: pytest.approx(0.15)})
    assert spans[2] == (pytest.approx(0.011), {0: pytest.approx(7 / 11), 1: pytest.approx(0.0)})


def test_an_inference_stages_bubble_is_its_waits_over_its_iteration_time() -> None:
    """pp 2 serving: rank 0 (stage 0) iterates 10 ms waiting 2, then 20 ms waiting 8: (2 + 8) / 30 = 1 / 3 (the
    mean of 0.2 and 0.4 would be 0.3); rank 1 (stage 1) 10 ms waiting 5, 30 ms waiting 3: 8 / 40 = 0.2.
    Busy per iteration: stage 0 (8 + 12) / 2 = 10 ms, stage 1 (5 + 27) / 2 = 16 ms; idle 5 and 4 ms."""
    iterations = {0: [(0.010, 0.002), (0.020, 0.008)], 1: [(0.010, 0.005), (0.030, 0.003)]}
    events: list[Event] = [
        step(rank, number, seconds, pipeline_wait_s=wait)
        for rank, pairs in iterations.items()
        for number, (seconds, wait) in enumerate(pairs)
    ]
    fold = folded(description(pp=2, mode="infer"), events)
    stages = fold.figures().stages
    assert [row.bubble_fraction for row in stages] == [pytest.approx(1 / 3), pytest.approx(0.2)]
    # each iteration's own bubble (what compare tests a change of the stage's bubble on, and the sparkline):
    # stage 0: 2 / 10 and 8 / 20; stage 1: 5 / 10 and 3 / 30
    per_iteration = {stage: sorted(fold.stages.stages[stage].bubble.values().tolist()) for stage in (0, 1)}
    assert per_iteration == {0: [pytest.approx(0.2), pytest.approx(0.4)], 1: [pytest.approx(0.1), pytest.approx(0.5)]}
    assert list(fold.stages.stages[0].recent) == [pytest.approx(0.2), pytest.approx(0.4)]
    assert [row.busy_s for row in stages] == [pytest.approx(0.010), pytest.approx(0.016)]
    assert [row.idle_s for row in stages] == [pytest.approx(0.005), pytest.approx(0.004)]
    assert mean_bubble(stages) == pytest.approx(4 / 15)  # (1 / 3 + 1 / 5) / 2


def test_the_theoretical_bubble_of_a_balanced_schedule() -> None:
    assert theoretical_bubble(4, 8) == pytest.approx(3 / 11)  # (4 - 1) / (8 + 4 - 1)
    assert theoretical_bubble(4, 8, virtual_stages=2) == pytest.approx(3 / 19)  # (4 - 1) / (2 x 8 + 4 - 1)
    assert theoretical_bubble(1, 8) == 0.0  # one stage never waits


# -- exposed communication ---------------------------------------------------------------------------------


def exposed_job() -> list[Event]:
    """dp 2, steps 100 ms apart; rank 0's step 0 takes 20 ms, every other of steps 0 and 1 25 ms (job steps: 25 ms
    each); step 2 takes 50 ms and has no collective.
    all-reduces, waited on: rank 0 waits 3 and 2 ms in step 0 (a third, 4 ms, completes before anyone waits),
    rank 1 7 ms; in step 1 rank 0 4 ms, rank 1 1 ms. all-gathers, no wait seen (as DDP's reducer): rank 0 in
    flight over [2, 6) and [4, 9) ms of step 0; rank 1 over [22, 32) ms of step 1, past its 25 ms step."""
    at = {"every_ns": EVERY_NS}
    gather = {"op": "all_gather", "every_ns": EVERY_NS}
    return [
        collective(0, 0, 0.003, offset_ns=1 * MS, waited=True, **at),
        collective(0, 0, 0.002, offset_ns=5 * MS, waited=True, **at),
        collective(0, 0, 0.004, offset_ns=8 * MS, **at),
        collective(1, 0, 0.007, offset_ns=1 * MS, waited=True, **at),
        collective(0, 1, 0.004, offset_ns=1 * MS, waited=True, **at),
        collective(1, 1, 0.001, offset_ns=1 * MS, waited=True, **at),
        collective(0, 0, 0.004, offset_ns=2 * MS, **gather),
        collective(0, 0, 0.005, offset_ns=4 * MS, **gather),
        collective(1, 1, 0.010, offset_ns=22 * MS, **gather),
        step(0, 0, 0.020, **at),
        step(1, 0, 0.025, **at),
        step(0, 1, 0.025, **at),
        step(1, 1, 0.025, **at),
        step(0, 2, 0.050, **at),
        step(1, 2, 0.050, **at),
    ]


def test_exposed_time_is_the_waits_or_else_the_time_in_flight_of_the_rank_that_had_most() -> None:
    """Per step, the mean over the closed steps an op appears in; the share, over every closed step's time
    (25 + 25 + 50 = 100 ms).
    all-reduce: step 0, rank 0 3 + 2 = 5 ms (the one not waited on: 0), rank 1 7: the job's 7 (the most);
    step 1 max(4, 1) = 4: (7 + 4) / 2 = 5.5 ms a step, (7 + 4) / 100 = 0.11 of the step time, measured.
    all-gather: step 0 the union of [2, 6) and [4, 9): 7 ms (not 4 + 5); step 1 [22, 25), clipped to rank 1's
    step: 3 ms: (7 + 3) / 2 = 5 ms a step, 10 / 100 = 0.1, an upper bound (not measured).
    Communication share 0.11 + 0.1 = 0.21. Per rank, step 0: rank 0 5 + 7 = 12 ms, rank 1 7; step 1: rank 0 4,
    rank 1 1 + 3 = 4."""
    fold = folded(description(dp=2), exposed_job())
    rows = {(row.group, row.op): row for row in fold.figures().collectives}
    reduce, gather = rows[("dp", "all_reduce")], rows[("dp", "all_gather")]
    assert (reduce.exposed_per_step_s, reduce.exposed_share) == (pytest.approx(0.0055), pytest.approx(0.11))
    assert reduce.exposed_measured is True
    assert (gather.exposed_per_step_s, gather.exposed_share) == (pytest.approx(0.005), pytest.approx(0.1))
    assert gather.exposed_measured is False
    assert communication_share(rows.values()) == pytest.approx(0.21)
    closed = {step.step: step for step in fold.closed}
    assert closed[0].exposed_by_op == {
        ("dp", "all_reduce"): pytest.approx(0.007),
        ("dp", "all_gather"): pytest.approx(0.007),
    }
    assert closed[1].exposed_by_op == {
        ("dp", "all_reduce"): pytest.approx(0.004),
        ("dp", "all_gather"): pytest.approx(0.003),
    }
    assert closed[0].exposed_by_rank == {0: pytest.approx(0.012), 1: pytest.approx(0.007)}
    assert closed[1].exposed_by_rank == {0: pytest.approx(0.004), 1: pytest.approx(0.004)}
    assert (closed[2].exposed_by_op, closed[2].exposed_by_rank) == ({}, {})


# -- MFU ---------------------------------------------------------------------------------------------------


def test_mfu_is_the_median_tokens_per_second_times_the_flops_per_token_over_the_gpus_peak() -> None:
    """4 ranks of the tiny shape counted at 1B parameters, seq_len 64, its token embedding (256 x 64 = 16,384,
    untied) only looked up: 6 x (1e9 - 16,384) + 12 x 4 x 64 x 64 = 6,000,098,304 FLOPs a token. Steps of 4096
    tokens whose slowest rank takes 0.1, 0.2, 0.4 s: 40,960, 20,480, 10,240 tokens/s, p50 20,480. Three H100
    SXM (989 TFLOP/s) and one PCIe card (756): the slowest peak, 756e12 a GPU. MFU = 20,480 x 6,000,098,304 /
    (756e12 x 4) = 122,882,013,265,920 / 3.024e15. Tied, the one matrix is the output projection's matmul and
    counts: 6,000,196,608."""
    run = with_model(description(dp=4, device="cuda", dtype="bf16"), parameters=1_000_000_000)
    assert run.seq_len == 64 and run.model is not None and (run.model.n_layers, run.model.dim) == (4, 64)
    events: list[Event] = [
        gpu_sample(gpu=gpu, name="NVIDIA H100 80GB HBM3", power_limit_w=700.0) for gpu in range(3)
    ] + [gpu_sample(gpu=3, name="NVIDIA H100 PCIe", power_limit_w=350.0)]
    for number, slowest in enumerate((0.1, 0.2, 0.4)):
        events += [step(rank, number, slowest if rank == 2 else 0.05, tokens=4096) for rank in range(4)]
    figures = folded(run, events).figures()
    assert figures.steps.tokens_per_s == pytest.approx(20_480)
    found = figures.mfu
    assert (found.flops_per_token, found.peak_flops_per_s, found.gpus) == (6_000_098_304, 756e12, 4)
    assert found.value == pytest.approx(0.0406355864) and found.why_not is None
    tied = folded(with_model(run, tie_embeddings=True), events).figures().mfu
    assert tied.flops_per_token == 6_000_196_608


def test_a_scripts_mfu_counts_6n_flops_a_token_of_the_parameters_its_optimizers_train() -> None:
    """Pipeline rank 0's two replicas train 300M each (the same ones), rank 1 200M: N = 500M, 6 N = 3e9 FLOPs a
    token (no attention term: the script's layers are not known). 10,000 tokens/s on 2 A100s (312 TFLOP/s):
    10,000 x 3e9 / (312e12 x 2) = 3e13 / 6.24e14 = 0.048077."""
    assert flops_per_token(parameters=1000, n_layers=2, dim=8, seq_len=16) == 6 * 1000 + 12 * 2 * 8 * 16
    parameters = script_parameters([(0, 300_000_000), (0, 300_000_000), (1, 200_000_000)])
    assert parameters == 500_000_000
    script = elastic_script(2)
    assert script.script is not None
    run = dataclasses.replace(
        script, device="cuda", dtype="bf16", script=dataclasses.replace(script.script, tokens_per_step=4096)
    )
    gpus: Iterable[GpuModel] = [GpuModel("NVIDIA A100-SXM4-80GB", 400.0)] * 2
    found = mfu(run, gpus=gpus, tokens_per_s=10_000.0, script_parameters=parameters)
    assert (found.flops_per_token, found.peak_flops_per_s, found.gpus) == (3e9, 312e12, 2)
    assert found.value == pytest.approx(3e13 / 6.24e14) and found.value == pytest.approx(0.0480769, rel=1e-6)


# -- steps -------------------------------------------------------------------------------------------------


def steps_job() -> list[Event]:
    """dp 2 x pp 2: ranks 2 and 3 (the last stage) compute the loss. Each step's four ranks' times and the last
    stage's two losses, 3000 tokens a step; step 3 is reported before step 2, and rank 3 never reports step 4."""
    reports = {
        0: ((0.10, 0.12, 0.11, 0.15), (2.0, 3.0)),
        1: ((0.20, 0.18, 0.19, 0.17), (1.5, 2.5)),
        3: ((0.30, 0.25, 0.29, 0.28), (1.0, 1.5)),
        2: ((0.10, 0.09, 0.08, 0.07), (1.0, 2.0)),
        4: ((5.0, 5.0, 5.0, 5.0), (0.5, 0.5)),
    }
    events: list[Event] = []
    for number, (durations, (loss_2, loss_3)) in reports.items():
        losses = (None, None, loss_2, loss_3)
        ranks = range(3) if number == 4 else range(4)
        events += [step(rank, number, durations[rank], tokens=3000, loss=losses[rank]) for rank in ranks]
    return events


@pytest.mark.parametrize("as_tables", [True, False], ids=["tables", "events"])
def test_a_job_step_is_its_slowest_rank_with_the_mean_loss_of_the_ranks_that_have_one(as_tables: bool) -> None:
    """step 0: max(0.10, 0.12, 0.11, 0.15) = 0.15 s, loss (2 + 3) / 2 = 2.5, 3000 / 0.15 = 20,000 tokens/s
    step 1: 0.20 s, loss 2.0, 15,000; step 2: 0.10 s, loss 1.5, 30,000; step 3: 0.30 s, loss 1.25, 10,000;
    step 4 never completes. Over [0.10, 0.15, 0.20, 0.30]: p50 at 1.5 -> 0.175, p90 at 2.7 -> 0.20 + 0.7 x 0.10
    = 0.27, mean 0.75 / 4 = 0.1875; tokens/s p50 (15,000 + 20,000) / 2 = 17,500. Loss first: step 0's 2.5;
    last: step 3's 1.25 (the latest by number, though step 2 came after it)."""
    fold = folded(description(dp=2, pp=2), steps_job(), as_tables=as_tables)
    done = sorted(fold.recent_steps, key=lambda job: job.step)
    assert [(job.step, job.tokens) for job in done] == [(0, 3000), (1, 3000), (2, 3000), (3, 3000)]
    assert [job.duration_s for job in done] == [0.15, 0.20, 0.10, 0.30]
    assert [job.loss for job in done] == [2.5, 2.0, 1.5, 1.25]
    assert [job.tokens_per_s for job in done] == [pytest.approx(v) for v in (20_000, 15_000, 30_000, 10_000)]
    figures = fold.figures().steps
    assert figures.count == 4
    assert figures.time_s == {"p50": pytest.approx(0.175), "p90": pytest.approx(0.27), "mean": pytest.approx(0.1875)}
    assert figures.tokens_per_s == pytest.approx(17_500)
    assert (figures.first_loss, figures.last_loss) == (2.5, 1.25)


def test_a_scripts_loss_says_how_many_losses_and_ranks_it_is_made_of() -> None:
    """A 2-stage pipeline of 4 microbatches: only the last stage (rank 1) has a loss, made of its 4; in
    step 1 it had 3 (an uneven last accumulation): the run says the most, 4, and 1 rank of 2."""
    first = job_step(0, durations_s=[0.2, 0.25], losses=[None, 2.0], tokens=0, loss_counts=[None, 4])
    assert (first.loss, first.loss_ranks, first.ranks, first.losses_per_step) == (2.0, 1, 2, 4)
    stats = StepStats()
    stats.add(first)
    stats.add(job_step(1, durations_s=[0.2, 0.2], losses=[None, 1.0], tokens=0, loss_counts=[None, 3]))
    loss = stats.figures().to_json()["loss"]
    assert loss == {"first": 2.0, "last": 1.0, "not_finite_from": None, "per_step": 4, "ranks": 1, "of_ranks": 2}
    built_in = job_step(0, durations_s=[0.1, 0.1], losses=[3.0, 5.0], tokens=0)  # no counts: the built-in runner's
    assert (built_in.loss, built_in.losses_per_step, built_in.loss_ranks) == (4.0, None, 2)


def test_a_diverged_loss_makes_its_job_steps_loss_not_a_number_and_the_run_says_from_which_step() -> None:
    """Step 0: (2 + 4) / 2 = 3.0. Step 1: rank 1's loss is NaN, so the ranks' mean is NaN (not rank 0's 1.5 alone:
    a replica that diverged is not left out). Step 2: one rank +inf, the other 1.0: +inf. Step 3 came before
    step 2 and was NaN too: the run says NaN from step 1, the first by number. JSON has no NaN: first is 3.0,
    last null (step 3's NaN), not_finite_from 1."""
    nan, inf = float("nan"), float("inf")
    steps = [
        job_step(0, durations_s=[0.1, 0.1], losses=[2.0, 4.0], tokens=0),
        job_step(3, durations_s=[0.1, 0.1], losses=[nan, 1.0], tokens=0),
        job_step(1, durations_s=[0.1, 0.1], losses=[1.5, nan], tokens=0),
        job_step(2, durations_s=[0.1, 0.1], losses=[inf, 1.0], tokens=0),
    ]
    assert steps[0].loss == 3.0 and np.isnan(steps[2].loss) and steps[3].loss == inf and steps[2].loss_ranks == 2
    stats = StepStats()
    for job in steps:
        stats.add(job)
    figures = stats.figures()
    assert figures.first_loss == 3.0 and np.isnan(figures.last_loss) and figures.not_finite_from == 1
    loss = figures.to_json()["loss"]
    assert (loss["first"], loss["last"], loss["not_finite_from"]) == (3.0, None, 1)


def test_a_step_of_no_time_or_no_tokens_has_no_rate_in_the_median() -> None:
    assert job_step(0, durations_s=[0.0, 0.0], losses=[None, None], tokens=100) == JobStep(
        step=0, loss=None, duration_s=0.0, tokens=100, tokens_per_s=0.0, loss_ranks=0, ranks=2
    )
    stats = StepStats()
    stats.add(job_step(0, durations_s=[0.5, 0.25], losses=[None, 4.0], tokens=1000))  # 1000 / 0.5 = 2000
    stats.add(job_step(1, durations_s=[0.1], losses=[3.0], tokens=0))  # 0 tokens: not known, no rate
    stats.add(job_step(2, durations_s=[0.0], losses=[None], tokens=1000))  # no time: no rate
    figures = stats.figures()
    assert figures.count == 3 and figures.tokens_per_s == 2000.0 and (figures.first_loss, figures.last_loss) == (4, 3)
    assert figures.time_s == {"p50": 0.1, "p90": pytest.approx(0.42), "mean": pytest.approx(0.2)}  # 0.1 + 0.8 x 0.4


def test_past_the_exact_limit_the_values_are_their_buckets_middles_and_zeros(monkeypatch: pytest.MonkeyPatch) -> None:
    """With room for 4 values exactly, 5 go to buckets. 1.0 = 0.5 x 2^1: bucket 1 x 128 + 0, whose middle is
    (0.5 + 0.5 / 256) x 2 = 1.00390625; 3.0 = 0.75 x 2^2: bucket 2 x 128 + 64, middle (0.5 + 64.5 / 256) x 4 =
    3.0078125; the two zeros stay zeros. Values at most 0.5, 1.00390625, 2 and 10: 2, 4, 4 and 5 (a middle
    counts itself)."""
    from meshtop.recordings.metrics import stats

    monkeypatch.setattr(stats, "EXACT_LIMIT", 4)
    distribution = Distribution([1.0, 0.0, 3.0, 1.0, 0.0])
    assert sorted(distribution.values().tolist()) == [0.0, 0.0, 1.00390625, 1.00390625, 3.0078125]
    assert distribution.counts_at_most([0.5, 1.00390625, 2.0, 10.0]) == [2, 4, 4, 5]
    assert distribution.total() == 1.00390625 * 2 + 3.0078125 and distribution.count == 5
    distribution.add(0.0)
    distribution.add(3.0)  # one at a time, bucketed too
    assert sorted(distribution.values().tolist()) == [0.0, 0.0, 0.0, 1.00390625, 1.00390625, 3.0078125, 3.0078125]


# -- the run's JSON and the bandwidth column's edges ---------------------------------------------------------


def test_a_runs_json_names_each_figure_and_its_breakdown_explains_the_furthest_straggler_with_a_cause() -> None:
    """Three stragglers: rank 1 is 3x its peers but of no known cause, rank 2 1.5x (its data loading), rank 3 2x
    (its compute): the breakdown explains rank 3's, the furthest of those with a cause. Rank 3's verdict: the
    slowest in 80 % of steps, compute 40 % of its step vs 10 % on the others."""

    def straggler(rank: int, ratio: float, cause: str | None) -> Straggler:
        known = cause is not None
        return Straggler(
            rank=rank,
            stage=0,
            compute_s=0.1 * ratio,
            peers_compute_s=0.1,
            ratio=ratio,
            slowest_in=0.8,
            cause=cause,
            cause_share=0.4 if known else None,
            peers_cause_share=0.1 if known else None,
        )

    gpu = GpuRow(
        node=0,
        gpu=0,
        name="NVIDIA H100 80GB HBM3",
        samples=3,
        peak_used_bytes=1 << 30,
        total_bytes=80 << 30,
        utilization_mean_pct=50.0,
        links={**NO_LINKS, "pcie_tx": {"mean": 2e9, "peak": 8e9}},
        links_over="load",
    )
    figures = dataclasses.replace(
        folded(description(dp=4), []).figures(),
        headroom_bytes=79 << 30,
        server=ServerFigures(scrapes=2, series=5, gauges={}, counters={"prompt_tokens": 12.0}),
        gpus=(gpu,),
        breakdown=Breakdown(parts={}, per_rank={}, steps=0, slowest_in={}),
        stragglers=(straggler(1, 3.0, None), straggler(2, 1.5, "data"), straggler(3, 2.0, "compute")),
    )
    found = figures.to_json()
    assert found["headroom_bytes"] == 79 << 30
    assert found["server"] == {"scrapes": 2, "series": 5, "prompt_tokens": 12.0}
    assert found["gpus"] == [
        {
            "node": 0,
            "gpu": 0,
            "name": "NVIDIA H100 80GB HBM3",
            "samples": 3,
            "peak_used_bytes": 1 << 30,
            "total_bytes": 80 << 30,
            "utilization_mean_pct": 50.0,
            "links": {**NO_LINKS, "pcie_tx": {"mean": 2e9, "peak": 8e9}},
            "links_over": "load",
        }
    ]
    breakdown = found["breakdown"]
    assert isinstance(breakdown, dict)
    assert breakdown["straggler"] == {
        "rank": 3,
        "stage": 0,
        "compute_s": pytest.approx(0.2),
        "peers_compute_s": 0.1,
        "ratio": 2.0,
        "slowest_in": 0.8,
        "cause": "compute",
        "cause_share": 0.4,
        "peers_cause_share": 0.1,
        "verdict": "rank 3 is the slowest in 80 % of steps: compute 40 % of its step vs 10 % on the others",
    }


def test_the_bus_bandwidth_column_is_exact_and_silent_where_it_is_undefined() -> None:
    """1 GB in 0.5 s at factor 1: 2 GB/s exactly. 1 MiB in no time (a division by zero) and nothing in no time
    (0 / 0, invalid) are NaN, and numpy warns of neither."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        column = busbw_column(
            np.array([1_000_000_000, 1 << 20, 0]), np.array([0.5, 0.0, 0.0]), np.array([1.0, 1.5, 1.5])
        )
    assert column[0] == 2.0 and np.isnan(column[1]) and np.isnan(column[2])
