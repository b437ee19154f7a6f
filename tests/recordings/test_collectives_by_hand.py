"""The collective fold's figures against numbers worked out by hand: busbw over the operations that ran alone
and moved bytes, exposed time per (group, op) and per rank (a seen wait, the in-flight union, each clipped to
the rank's step), the steps bounded by in-flight time, late operations, and each operation's exposed interval
(:func:`exposed_intervals`, the step breakdown's input).

Times sit at a wall clock of ``T`` (1.7e18 ns, as in a real recording): a float64 there is only good to 256 ns,
so an interval computed in floats would show."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from meshtop.probes.events import CollectiveTiming
from meshtop.recordings.metrics.collectives import CollectiveFold, Waits, exposed_intervals
from meshtop.recordings.metrics.steps import StepSpans, Windows
from meshtop.recordings.schema import table_of
from tests.kit.events import collective

T = 1_700_000_000_000_000_000
MS = 1_000_000
PHASED = Windows("fb", [T, T + 1], [T + 1, T + 2], None)
"""A rank that measured its step's phases: only its operations' intervals are the breakdown's."""


def op(
    rank: int,
    start_ns: int,
    end_ns: int,
    name: str = "all_reduce",
    *,
    waited_ns: int | None = None,
    step: int = 0,
    group: str = "dp",
    nbytes: int = 1 << 20,
) -> CollectiveTiming:
    return dataclasses.replace(
        collective(rank, step, op=name, group=group, bytes=nbytes),
        start_ns=start_ns,
        end_ns=end_ns,
        waited_ns=waited_ns,
    )


def spans(*reports: tuple[int, int, float, Windows | None]) -> StepSpans:
    """Each (rank, start ns, seconds, windows)."""
    found = StepSpans()
    for rank, start_ns, seconds, windows in reports:
        found.add(rank, start_ns, seconds, None, windows)
    return found


def columns(waits: Waits) -> list[tuple[int, int, int, bool]]:
    return list(
        zip(waits.rank.tolist(), waits.start_ns.tolist(), waits.end_ns.tolist(), waits.pipeline.tolist(), strict=True)
    )


# -- busbw and in-flight time ------------------------------------------------------------------------------


def test_busbw_leaves_out_an_operation_that_moved_no_bytes_and_keeps_one_of_a_single_byte() -> None:
    """Two all-reduces alone in a group of 2 (bus factor 2 x 1 / 2 = 1), 0.5 s each: 0 bytes (no bandwidth to
    speak of: left out) and 1 byte (1 / 0.5 / 1e9 x 1 = 2e-9 GB/s). In flight: p50 of [0.5, 0.5] = 0.5 s,
    exactly (500,000,000 ns / 1e9)."""
    fold = CollectiveFold(per_step=False)
    fold.add(table_of([op(0, 0, 500 * MS, nbytes=0), op(0, 0, 500 * MS, nbytes=1)]))
    [row] = fold.rows()
    assert (row.count, row.bytes, row.busbw_ops) == (2, 1, 1)
    assert row.busbw_p50_gbps == pytest.approx(2e-9)
    assert row.in_flight_p50_s == 0.5
    assert row.in_flight_total_s == 1.0


# -- exposed time ------------------------------------------------------------------------------------------


def test_a_step_without_operations_has_empty_waits_of_integer_ranks_and_times() -> None:
    """The breakdown indexes with a step's waits' ranks and pipeline flags: integers and booleans even when
    the step had no operation."""
    fold = CollectiveFold(per_step=True)
    by_op, by_rank, waits = fold.close(0, 1.0, spans((0, T, 1.0, PHASED)))
    assert (by_op, by_rank) == ({}, {})
    for column, dtype in ((waits.rank, np.int64), (waits.start_ns, np.int64), (waits.end_ns, np.int64)):
        assert column.dtype == dtype
        assert len(column) == 0
    assert waits.pipeline.dtype == np.bool_
    assert len(waits.pipeline) == 0


@pytest.mark.filterwarnings("error")  # numpy warning of a cast: printed over the dashboard
def test_a_seen_wait_counts_only_the_waits_and_the_breakdown_gets_only_phased_ranks_intervals() -> None:
    """One 1 s step from ``T``; only rank 1 measured its phases. Rank 1: an all-reduce in flight
    [100 ms, 600 ms + 123 ns) of which it waited 250 ms, then one never waited on (its cell saw a wait:
    it counts 0), then a send never waited on [900, 950) ms (no wait seen: its in-flight 50 ms, a bound).
    Ranks 0 and 2: an all-reduce [0, 100) ms, no wait: 100 ms each, a bound.

    all_reduce: the most of (100, 250, 100) ms = 0.25 s; send 0.05 s. Per rank: 0.1, 0.25 + 0.05 = 0.3, 0.1.
    Rank 1's intervals: its wait [600 ms + 123 - 250 ms, 600 ms + 123) (not its whole in-flight time) and
    the send's [900, 950) ms, a pipeline one; the unwaited all-reduce has none."""
    fold = CollectiveFold(per_step=True)
    fold.add(
        table_of(
            [
                op(0, T, T + 100 * MS),
                op(1, T + 100 * MS, T + 600 * MS + 123, waited_ns=250 * MS),
                op(1, T + 700 * MS, T + 800 * MS),
                op(1, T + 900 * MS, T + 950 * MS, "send", group="pp"),
                op(2, T, T + 100 * MS),
            ]
        )
    )
    by_op, by_rank, waits = fold.close(0, 1.0, spans((0, T, 1.0, None), (1, T, 1.0, PHASED), (2, T, 1.0, None)))
    assert by_op == {("dp", "all_reduce"): 0.25, ("pp", "send"): 0.05}
    assert by_rank == {0: 0.1, 1: 0.3, 2: 0.1}
    assert columns(waits) == [
        (1, T + 350 * MS + 123, T + 600 * MS + 123, False),
        (1, T + 900 * MS, T + 950 * MS, True),
    ]
    assert [(stats.op, stats.bounded_steps) for stats in fold.stats] == [("all_reduce", 1), ("send", 1)]


def test_waits_are_clipped_to_the_ranks_step_and_ranks_without_operations_are_no_error() -> None:
    """Rank 0's step is 200 ms from ``T``; it waited on an all-reduce all of its 500 ms: exposed 200 ms (the
    step's length), its interval clipped to [0, 200) ms. A broadcast of [300, 400) ms falls past its step:
    clipped to nothing, exposed 0 and no interval. Rank 1 reported its step (and phases) but ran nothing."""
    fold = CollectiveFold(per_step=True)
    fold.add(table_of([op(0, T, T + 500 * MS, waited_ns=500 * MS), op(0, T + 300 * MS, T + 400 * MS, "broadcast")]))
    by_op, by_rank, waits = fold.close(0, 0.2, spans((0, T, 0.2, PHASED), (1, T, 0.2, PHASED)))
    assert by_op == {("dp", "all_reduce"): 0.2, ("dp", "broadcast"): 0.0}
    assert by_rank == {0: 0.2}
    assert columns(waits) == [(0, T, T + 200 * MS, False)]


def test_a_rank_whose_step_is_not_known_is_not_clipped() -> None:
    """No span for rank 0: its waited 500 ms all-reduce counts 500 ms, its all-gather of 100 ms, no wait,
    its in-flight 100 ms."""
    fold = CollectiveFold(per_step=True)
    fold.add(table_of([op(0, T, T + 500 * MS, waited_ns=500 * MS), op(0, T, T + 100 * MS, "all_gather")]))
    by_op, by_rank, _ = fold.close(0, 1.0, StepSpans())
    assert by_op == {("dp", "all_reduce"): 0.5, ("dp", "all_gather"): 0.1}
    assert by_rank == {0: 0.6}


def test_in_flight_unions_are_per_rank_however_their_intervals_lie() -> None:
    """No waits, no spans, so each rank's exposed time is the union of its intervals: rank 0 [1000, 2000) ns
    and [1010, 1020) inside it: 1000 ns; rank 1 [0, 1500): 1500 ns (it starts before rank 0's)."""
    fold = CollectiveFold(per_step=True)
    fold.add(table_of([op(0, 1000, 2000), op(0, 1010, 1020), op(1, 0, 1500)]))
    by_op, by_rank, _ = fold.close(0, 1.0, StepSpans())
    assert by_op == {("dp", "all_reduce"): 1.5e-6}
    assert by_rank == {0: 1e-6, 1: 1.5e-6}


def test_in_flight_unions_of_many_ranks_at_a_real_wall_clock_stay_apart() -> None:
    """Seven ranks, each one all-reduce [T18, T18 + 1000) ns, no waits, no spans: 1000 ns each. The clock
    (September 2018) is one where six of its doubles add up past int64 (12 x T18 + 6,006 = 2^64 + 2), so
    laying ranks' intervals side by side must not take a width of the clock itself."""
    t18 = 1_537_228_672_809_128_801
    fold = CollectiveFold(per_step=True)
    fold.add(table_of([op(rank, t18, t18 + 1000) for rank in range(7)]))
    by_op, by_rank, _ = fold.close(0, 1.0, StepSpans())
    assert by_op == {("dp", "all_reduce"): 1e-6}
    assert by_rank == dict.fromkeys(range(7), 1e-6)


def test_a_step_names_only_the_ops_it_ran_and_counts_its_bounded_steps() -> None:
    """Step 0: a dp all-reduce, no wait (bounded); step 1: a tp all-gather, no wait (bounded); step 2: the
    all-reduce again, fully waited (measured). Closing step 1 names the all-gather alone, though the
    all-reduce came first; the all-reduce has 2 closed steps, 1 of them bounded."""
    fold = CollectiveFold(per_step=True)
    fold.add(
        table_of(
            [
                op(0, T, T + 10 * MS),
                op(0, T + 1000 * MS, T + 1020 * MS, "all_gather", step=1, group="tp"),
                op(0, T + 2000 * MS, T + 2030 * MS, waited_ns=30 * MS, step=2),
            ]
        )
    )
    assert fold.close(0, 1.0, StepSpans())[0] == {("dp", "all_reduce"): 0.01}
    assert fold.close(1, 1.0, StepSpans())[0] == {("tp", "all_gather"): 0.02}
    assert fold.close(2, 1.0, StepSpans())[0] == {("dp", "all_reduce"): 0.03}
    assert [(stats.op, stats.bounded_steps) for stats in fold.stats] == [("all_reduce", 1), ("all_gather", 1)]
    rows = {row.op: row for row in fold.rows()}
    assert rows["all_reduce"].exposed_per_step_s == pytest.approx(0.02)  # (10 + 30) / 2 ms
    assert rows["all_reduce"].exposed_measured is False
    assert rows["all_gather"].exposed_per_step_s == pytest.approx(0.02)


def test_two_bounded_steps_count_two() -> None:
    fold = CollectiveFold(per_step=True)
    fold.add(table_of([op(0, T, T + 10 * MS), op(0, T + 1000 * MS, T + 1010 * MS, step=1)]))
    fold.close_steps([(0, 1.0, StepSpans()), (1, 1.0, StepSpans())])
    assert fold.stats[0].bounded_steps == 2


def test_a_late_operation_of_a_closed_step_counts_in_the_totals_and_leaves_later_steps_open() -> None:
    """Step 0 closes; then a table with one more of step 0 and one of step 1: both count, step 1 stays open."""
    fold = CollectiveFold(per_step=True)
    fold.add(table_of([op(0, T, T + 10 * MS)]))
    fold.close(0, 1.0, StepSpans())
    fold.add(table_of([op(0, T + 20 * MS, T + 30 * MS), op(0, T + 1000 * MS, T + 1010 * MS, step=1)]))
    assert fold.open_steps() == [1]
    [row] = fold.rows()
    assert row.count == 3


# -- exposed intervals -------------------------------------------------------------------------------------


def test_exposed_intervals_follow_the_rule_per_operation_and_give_one_waits_a_step() -> None:
    """Step 0: [0, 10) not waited on in a cell that saw a wait (its 5 ns are no wait): none; [10, 20) in a
    cell that saw none: all of it. Step 1: [20, 30) waited 3 ns: [27, 30)."""
    found = exposed_intervals(
        step=np.array([0, 0, 1]),
        rank=np.array([0, 1, 2]),
        start=np.array([0, 10, 20]),
        end=np.array([10, 20, 30]),
        waited_ns=np.array([5, 0, 3]),
        waited=np.array([False, False, True]),
        seen=np.array([True, False, True]),
        pipeline=np.array([False, False, True]),
        steps=2,
    )
    assert [columns(waits) for waits in found] == [[(1, 10, 20, False)], [(2, 27, 30, True)]]
