"""The step breakdown's rules (recordings/metrics/breakdown.py) against steps worked out by hand, in ms."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

from meshtop.recordings.metrics.breakdown import (
    PARTS,
    BreakdownFold,
    RankStep,
    StepCells,
    cells_parts,
    rank_intervals,
    step_cells,
    step_parts,
)
from meshtop.recordings.metrics.collectives import Waits
from meshtop.recordings.metrics.steps import StepSpans, Windows

MS = 1_000_000


def rank_step(
    end: int,
    windows: list[tuple[str, int, int]],
    *,
    start: int = 0,
    schedule_end: int | None = None,
    comm: list[tuple[int, int]] = (),  # type: ignore[assignment]
    p2p: list[tuple[int, int]] = (),  # type: ignore[assignment]
) -> RankStep:
    return RankStep(
        start_ns=start * MS,
        end_ns=end * MS,
        schedule_end_ns=None if schedule_end is None else schedule_end * MS,
        phases="".join(kind for kind, _, _ in windows),
        phase_start_ns=[s * MS for _, s, _ in windows],
        phase_end_ns=[e * MS for _, _, e in windows],
        communication=[(s * MS, e * MS) for s, e in comm],
        pipeline_waits=[(s * MS, e * MS) for s, e in p2p],
    )


def ms(parts: dict[str, float]) -> dict[str, float]:
    return {part: pytest.approx(seconds * 1e3) for part, seconds in parts.items() if seconds}


def test_a_data_parallel_step_gives_each_moment_to_one_part() -> None:
    """Data 0-20, forward 20-45, backward 45-85, optimizer 85-95, the all-reduce waited 80-88: communication
    takes 80-88 out of backward (80-85) and optimizer (85-88): 8; backward 45-80 = 35; optimizer 88-95 = 7;
    95-100 is the loop's own: other 5. 20 + 25 + 35 + 7 + 8 + 5 = 100."""
    step = rank_step(100, [("d", 0, 20), ("f", 20, 45), ("b", 45, 85), ("o", 85, 95)], comm=[(80, 88)])
    parts = step_parts(step)
    assert ms(parts) == {"data": 20, "forward": 25, "backward": 35, "optimizer": 7, "communication": 8, "other": 5}
    assert sum(parts.values()) == pytest.approx(0.100)


def test_a_pipelined_step_idles_in_its_bubble_between_its_stage_actions() -> None:
    """Schedule 0-80: forward 0-10 and 30-40, backward 50-70, a receive waited 10-25; optimizer 82-90.
    Bubble: the wait 10-25 and the schedule's uncovered 25-30, 40-50, 70-80 = 15 + 5 + 10 + 10 = 40; other:
    80-82 and 90-100 = 12."""
    step = rank_step(100, [("f", 0, 10), ("f", 30, 40), ("b", 50, 70), ("o", 82, 90)], schedule_end=80, p2p=[(10, 25)])
    assert ms(step_parts(step)) == {"forward": 20, "backward": 20, "optimizer": 8, "bubble": 40, "other": 12}


def test_a_closed_steps_cells_from_its_reports_split_a_pipelined_and_a_data_parallel_rank_by_hand() -> None:
    """The fold's own path, from the ranks' reports (``step_cells``), not a hand-made :class:`RankStep`.
    Rank 1 (a pipeline stage, 100 ms from t = 1,000 ms): forward_backward_s 0.080, so its schedule runs
    1,000-1,080 ms; forward 1,000-1,010 and 1,030-1,040, backward 1,050-1,070, optimizer 1,082-1,090; it waited
    in a receive 1,010-1,025 (pipeline_wait_s 0.015). Bubble: the wait 15 + the schedule's idle 1,025-1,030,
    1,040-1,050, 1,070-1,080 = 40 ms; forward 20, backward 20, optimizer 8, other 1,080-1,082 and 1,090-1,100 =
    12 ms. Its bubble share 40 / 100 = 0.40 (a schedule end read in the wrong unit gives 15 / 100).
    Rank 0 (data parallel, no pipeline wait measured, 50 ms from 1,000): forward 0-20, backward 20-45 and an
    all-reduce waited 1,040-1,048: communication 8, backward 20 - 5 = 20, the rest other 50 - 20 - 20 - 8 = 2,
    and no bubble though it has a forward_backward_s."""
    t0 = 1_000 * MS
    spans = StepSpans()
    spans.add(0, t0, 0.050, 0.045, Windows("fb", (t0, t0 + 20 * MS), (t0 + 20 * MS, t0 + 45 * MS), None))
    pipelined = Windows(
        "ffbo",
        tuple(t0 + ms_ * MS for ms_ in (0, 30, 50, 82)),
        tuple(t0 + ms_ * MS for ms_ in (10, 40, 70, 90)),
        0.015,
    )
    spans.add(1, t0, 0.100, 0.080, pipelined)
    waits = Waits(
        rank=np.array([0, 1]),
        start_ns=np.array([t0 + 40 * MS, t0 + 10 * MS]),
        end_ns=np.array([t0 + 48 * MS, t0 + 25 * MS]),
        pipeline=np.array([False, True]),
    )
    data_parallel, stage = (
        dict(zip(PARTS, row.tolist(), strict=True)) for row in cells_parts(step_cells(spans, [0, 1], waits))
    )
    assert ms(data_parallel) == {"forward": 20, "backward": 20, "communication": 8, "other": 2}
    assert ms(stage) == {"forward": 20, "backward": 20, "optimizer": 8, "bubble": 40, "other": 12}
    assert stage["bubble"] / 0.100 == pytest.approx(0.40)


def test_which_ranks_are_pipelined_and_which_waits_are_theirs_by_hand() -> None:
    """Six ranks' reports from t = 1,000 ms (``step_cells``), a rule each:

    - rank 0, data parallel (no pipeline wait measured), 50 ms, forward_backward_s 0.048: forward 0-20, backward
      20-45, an all-reduce waited 46-48. Not pipelined, so its forward_backward_s makes no bubble: communication 2,
      other 45-46 and 48-50 = 3.
    - rank 1, pipelined, 100 ms (as above), and an all-reduce waited 90-95: a collective's wait is communication
      (5) even on a pipelined rank, its receive's wait bubble: bubble 40, other 80-82 and 95-100 = 7.
    - rank 2, a wait of 0.0 measured but a send waited 10-12: pipelined by that send; 40 ms, schedule to 30,
      forward 0-10, backward 15-25: bubble 2 + 12-15 + 25-30 = 10, other 30-40 = 10.
    - rank 3, a wait of 0.0 and no send or receive: not pipelined; 30 ms, forward 0-10, backward 10-20: other 10.
    - rank 4, a wait of 0.010 and no send or receive seen: pipelined by its wait; 30 ms, schedule to 25, forward
      0-10: bubble 10-25 = 15, other 5.
    - rank 5, 10 ms, phases "f" 0-5 and a letter no rule knows ("é", 2-8: hostile input): forward 5, other 5.

    An all-reduce of rank 9, not among the ranks, covers the whole step: it belongs to no one here."""
    t0 = 1_000 * MS

    def windows(phases: str, spans: list[tuple[int, int]], wait_s: float | None) -> Windows:
        return Windows(phases, tuple(t0 + s * MS for s, _ in spans), tuple(t0 + e * MS for _, e in spans), wait_s)

    steps = StepSpans()
    steps.add(0, t0, 0.050, 0.048, windows("fb", [(0, 20), (20, 45)], None))
    steps.add(1, t0, 0.100, 0.080, windows("ffbo", [(0, 10), (30, 40), (50, 70), (82, 90)], 0.015))
    steps.add(2, t0, 0.040, 0.030, windows("fb", [(0, 10), (15, 25)], 0.0))
    steps.add(3, t0, 0.030, 0.030, windows("fb", [(0, 10), (10, 20)], 0.0))
    steps.add(4, t0, 0.030, 0.025, windows("f", [(0, 10)], 0.010))
    steps.add(5, t0, 0.010, None, windows("f\u00e9", [(0, 5), (2, 8)], None))
    waited = [(0, 46, 48, False), (1, 10, 25, True), (1, 90, 95, False), (2, 10, 12, True), (9, -10, 200, False)]
    waits = Waits(
        rank=np.array([rank for rank, _, _, _ in waited]),
        start_ns=np.array([t0 + start * MS for _, start, _, _ in waited]),
        end_ns=np.array([t0 + end * MS for _, _, end, _ in waited]),
        pipeline=np.array([pipeline for _, _, _, pipeline in waited]),
    )
    rows = cells_parts(step_cells(steps, [0, 1, 2, 3, 4, 5], waits))
    parts = [ms(dict(zip(PARTS, row.tolist(), strict=True))) for row in rows]
    assert parts == [
        {"forward": 20, "backward": 25, "communication": 2, "other": 3},
        {"forward": 20, "backward": 20, "optimizer": 8, "bubble": 40, "communication": 5, "other": 7},
        {"forward": 10, "backward": 10, "bubble": 10, "other": 10},
        {"forward": 10, "backward": 10, "other": 10},
        {"forward": 10, "bubble": 15, "other": 5},
        {"forward": 5, "other": 5},
    ]


def test_recomputation_is_backward_and_windows_are_clipped_to_the_step() -> None:
    """Backward 10-50 with a forward 20-30 inside it (checkpointing's recompute): backward 40, no forward.
    A data window -10-5 began before the step (0-60): data 5. A collective waited 55-70 ends past it: 5."""
    step = rank_step(60, [("d", -10, 5), ("b", 10, 50), ("f", 20, 30)], comm=[(55, 70)])
    assert ms(step_parts(step)) == {"data": 5, "backward": 40, "communication": 5, "other": 10}


def test_a_closures_forward_and_backward_inside_the_optimizer_step_are_forward_and_backward() -> None:
    """``optimizer.step(closure)`` (Lightning, LBFGS): the optimizer's window 5-95 holds the closure's forward
    10-30 and backward 30-70, whose all-reduce waited 60-75. Forward 20, backward 30-60 = 30, communication 15,
    optimizer 5-10 and 75-95 = 25; other 0-5 and 95-100 = 10. 20 + 30 + 15 + 25 + 10 = 100."""
    step = rank_step(100, [("o", 5, 95), ("f", 10, 30), ("b", 30, 70)], comm=[(60, 75)])
    assert ms(step_parts(step)) == {"forward": 20, "backward": 30, "communication": 15, "optimizer": 25, "other": 10}


def test_a_step_of_no_time_has_no_parts() -> None:
    assert step_parts(rank_step(0, [("f", 0, 10)])) == dict.fromkeys(PARTS, 0.0)


def test_the_fold_gives_each_part_per_step_and_share_per_rank_and_over_the_job() -> None:
    """Rank 0: two steps of 100 ms, data 20 then 40; rank 1: one of 50 ms, data 10, forward 40. Rank 0's data:
    30 ms a step, share 60 / 200; the job's: (20 + 40 + 10) / 3 steps, share 70 / 250. Biggest: other
    (140 + 0 of 250)."""
    fold = BreakdownFold()
    fold.add(0, rank_step(100, [("d", 0, 20)]))
    fold.add(0, rank_step(100, [("d", 0, 40)]))
    fold.add(1, rank_step(50, [("d", 0, 10), ("f", 10, 50)]))
    figures = fold.figures()
    assert figures.per_rank[0]["data"] == {"s_per_step": pytest.approx(0.030), "share": pytest.approx(0.3)}
    assert figures.per_rank[1]["forward"] == {"s_per_step": pytest.approx(0.040), "share": pytest.approx(0.8)}
    assert figures.parts["data"] == {"s_per_step": pytest.approx(0.070 / 3), "share": pytest.approx(70 / 250)}
    assert figures.parts["other"]["share"] == pytest.approx(140 / 250)
    assert figures.biggest() == "other" and figures.steps == 3
    assert BreakdownFold().figures().biggest() is None


def by_each_moment(step: RankStep) -> dict[str, float]:
    """The rules read literally, one nanosecond at a time: each moment of the step goes to the first rule
    (lowest level) that covers it. Slow, so for steps of a few hundred ns only."""
    parts = dict.fromkeys(PARTS, 0.0)
    intervals = rank_intervals(step)
    labels = ("communication", "bubble", "backward", "forward", "optimizer", "data", "bubble", "other")
    for moment in range(step.start_ns, step.end_ns):
        level = min((lvl for s, e, lvl in intervals if s <= moment < e), default=len(labels) - 1)
        parts[labels[level]] += 1e-9
    return parts


def test_many_rank_steps_at_once_split_as_each_moment_would_one_at_a_time() -> None:
    rng = np.random.default_rng(3)
    steps = []
    for _ in range(300):
        start = int(rng.integers(-50, 50))
        end = start + int(rng.integers(-5, 200))  # some of no time, or ending before they start

        def spans(count: int, start: int = start, end: int = end) -> list[tuple[int, int]]:
            return [(int(a), int(a + rng.integers(0, 60))) for a in rng.integers(start - 30, end + 30, count)]

        windows = [(str(rng.choice(list("dfbo"))), s, e) for s, e in spans(int(rng.integers(0, 6)))]
        steps.append(
            RankStep(
                start_ns=start,
                end_ns=end,
                schedule_end_ns=int(rng.integers(start, end + 30)) if rng.random() < 0.4 and end > start else None,
                phases="".join(kind for kind, _, _ in windows),
                phase_start_ns=[s for _, s, _ in windows],
                phase_end_ns=[e for _, _, e in windows],
                communication=spans(int(rng.integers(0, 4))),
                pipeline_waits=spans(int(rng.integers(0, 3))),
            )
        )
    together = cells_parts(StepCells.of(steps))
    for step, row in zip(steps, together, strict=True):
        assert row == pytest.approx([by_each_moment(step)[part] for part in PARTS], abs=1e-12)
        assert row.sum() == pytest.approx(max(step.end_ns - step.start_ns, 0) / 1e9)


def test_a_step_with_no_window_and_no_wait_is_all_the_loops_own() -> None:
    """Nothing covered any moment of the 50 ms step: it is all other."""
    assert ms(step_parts(rank_step(50, []))) == {"other": 50}


def test_a_rank_steps_phase_letters_and_times_must_pair_up() -> None:
    """Two letters and one window: refused, not cut to the shorter."""
    torn = RankStep(
        start_ns=0,
        end_ns=100 * MS,
        schedule_end_ns=None,
        phases="fb",
        phase_start_ns=[0],
        phase_end_ns=[10 * MS],
        communication=[],
        pipeline_waits=[],
    )
    with pytest.raises(ValueError, match="zip"):
        step_parts(torn)


def test_a_closed_step_on_a_real_wall_clock_splits_to_the_nanosecond() -> None:
    """Wall-clock nanoseconds of today's size (1.7e18 ns: past 2**53, so a float would round them to 256 ns),
    offsets in ns from t0:

    - rank 0, pipelined by its measured wait (0.25 s, no send or receive seen), 3 s from t0, forward_backward_s
      2.0: its schedule is 0-2,000,000,000. Forward 0-1,000,000,001, backward 1,200,000,000-2,000,000,000,
      optimizer 2,500,000,000-2,999,999,999. Bubble: the schedule's idle 1,000,000,001-1,200,000,000 =
      199,999,999; other 2,000,000,000-2,500,000,000 and the last 1 ns = 500,000,001 (none of it bubble: the
      schedule ends at 2 s, not a ns later); backward 800,000,000, optimizer 499,999,999.
    - rank 1, data parallel, 1 s from t0 + 5, measured phases but no window (``""``), an all-reduce waited
      t0 + 100 to t0 + 400,000,103: communication 400,000,003, other 1,000,000,000 - 400,000,003 = 599,999,997.
    """
    t0 = 1_700_000_000_000_000_001
    spans = StepSpans()
    offsets = ((0, 1_000_000_001), (1_200_000_000, 2_000_000_000), (2_500_000_000, 2_999_999_999))
    phases = Windows("fbo", tuple(t0 + s for s, _ in offsets), tuple(t0 + e for _, e in offsets), 0.25)
    spans.add(0, t0, 3.0, 2.0, phases)
    spans.add(1, t0 + 5, 1.0, None, Windows("", (), (), None))
    waits = Waits(
        rank=np.array([1]),
        start_ns=np.array([t0 + 100]),
        end_ns=np.array([t0 + 400_000_103]),
        pipeline=np.array([False]),
    )
    rows = cells_parts(step_cells(spans, [0, 1], waits))
    # data, forward, backward, optimizer, communication, bubble, other (seconds: exact, ns / 1e9)
    assert rows.tolist() == [
        [0.0, 1.000000001, 0.8, 0.499999999, 0.0, 0.199999999, 0.500000001],
        [0.0, 0.0, 0.0, 0.0, 0.400000003, 0.0, 0.599999997],
    ]


def test_a_step_of_ranks_with_torn_windows_and_no_waits_is_all_other() -> None:
    """Rank 0's windows are torn (two letters, one start): no phases. No operation waited in the step. Its
    30 ms are all the loop's own."""
    t0 = 1_000 * MS
    spans = StepSpans()
    spans.add(0, t0, 0.030, 0.020, Windows("fb", (t0,), (t0 + 10 * MS, t0 + 20 * MS), None))
    rows = cells_parts(step_cells(spans, [0], Waits.none()))
    assert [ms(dict(zip(PARTS, row.tolist(), strict=True))) for row in rows] == [{"other": 30}]


def test_a_rank_above_the_jobs_share_by_exactly_one_point_is_named() -> None:
    """Two ranks, a step of 100 ms each: rank 0 measured nothing (other 100), rank 1 loaded data 0-2 ms. The
    job's data share 2 / 200 = 0.01, rank 1's 2 / 100 = 0.02: one point above, the bound itself, which counts
    (0.02 - 0.01 is 0.01 in floats too). Rank 0: other 100 / 100 against the job's 198 / 200 = 0.99: one point
    above too. A rank that reported no step has no row."""
    fold = BreakdownFold()
    fold.add(0, rank_step(100, []))
    fold.add(1, rank_step(100, [("d", 0, 2)]))
    figures = fold.figures()
    assert figures.above_mean(1) == ("data", 0.02, 0.01)
    assert figures.above_mean(0) == ("other", 1.0, pytest.approx(0.99))
    assert figures.above_mean(7) is None


def test_a_rank_alone_is_above_no_mean_and_its_biggest_part_is_data() -> None:
    """One rank, two steps of 100 ms: data 0-80 then 0-70: data 150 of 200 ms (s_per_step 0.075, share 0.75),
    other 50 (0.025, 0.25). Its shares are the job's: above the mean in nothing. Biggest: data."""
    fold = BreakdownFold()
    fold.add(0, rank_step(100, [("d", 0, 80)]))
    fold.add(0, rank_step(100, [("d", 0, 70)]))
    figures = fold.figures()
    assert figures.above_mean(0) is None
    assert figures.biggest() == "data"
    exact = {"rel": 1e-12}  # a step's seconds are its ns / 1e9: off by a part in 1e9 is wrong
    as_json = figures.to_json()
    assert list(as_json) == ["parts", "per_rank", "biggest", "slowest_in"]
    assert (as_json["biggest"], as_json["slowest_in"], list(as_json["per_rank"])) == ("data", {}, ["0"])
    for parts in (as_json["parts"], as_json["per_rank"]["0"]):
        assert parts["data"] == {"s_per_step": pytest.approx(0.075, **exact), "share": pytest.approx(0.75, **exact)}
        assert parts["other"] == {"s_per_step": pytest.approx(0.025, **exact), "share": pytest.approx(0.25, **exact)}


def test_the_slowest_rank_of_each_stage_of_two_or_more_by_its_compute_time() -> None:
    """Five ranks in stages 0, 0, 1, 1, 2 (rows: data, forward, backward, optimizer, communication, bubble,
    other; ms). Compute is the step less communication and bubble.

    - step 1: stage 0: rank 0 computes 10, rank 1 20: rank 1. Stage 1: rank 2 10 (and 50 of communication),
      rank 3 10: alike, so the higher rank, 3. Rank 4 is alone in stage 2: slowest in nothing, not counted.
    - step 2: stage 0: rank 0 30, rank 1 20: rank 0. Stage 1: rank 2 10 + 5 other (and 100 of bubble) = 15,
      rank 3 10 + 2 = 12: rank 2.

    Each of ranks 0-3 was the slowest in 1 of its stage's 2 steps. The forward's mean over the ranks: (10 + 20 +
    10 + 10 + 30) / 5 = 16, then (30 + 20 + 10 + 10 + 30) / 5 = 20."""

    def row(forward: int, communication: int = 0, bubble: int = 0, other: int = 0) -> list[float]:
        return [0.0, forward / 1e3, 0.0, 0.0, communication / 1e3, bubble / 1e3, other / 1e3]

    fold = BreakdownFold()
    stages = [0, 0, 1, 1, 2]
    fold.add_step([0, 1, 2, 3, 4], np.array([row(10), row(20), row(10, communication=50), row(10), row(30)]), stages)
    fold.add_step(
        [0, 1, 2, 3, 4], np.array([row(30), row(20), row(10, bubble=100, other=5), row(10, other=2), row(30)]), stages
    )
    figures = fold.figures()
    assert figures.slowest_in == {0: 0.5, 1: 0.5, 2: 0.5, 3: 0.5}
    assert figures.history["forward"] == pytest.approx((0.016, 0.020))


def test_a_steps_parts_must_be_a_row_of_every_part() -> None:
    """Six numbers for seven parts: refused (a part left out is not taken for zero)."""
    with pytest.raises(ValueError, match="zip"):
        BreakdownFold().add_step([0], np.zeros((1, len(PARTS) - 1)), [0])


def test_a_long_runs_fold_keeps_a_row_a_rank_not_a_row_a_step() -> None:
    """A rank's 16 more steps leave the fold no bigger than its first did (within 64 KiB of Python's own
    churn): its sums are a row a rank, summed in place."""
    fold = BreakdownFold()
    step = rank_step(100, [("f", 0, 50)])
    fold.add(0, step)
    tracemalloc.start()
    try:
        before, _ = tracemalloc.get_traced_memory()
        for _ in range(16):
            fold.add(0, step)
        after, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert after - before < 64 * 1024
    assert fold.figures().per_rank[0]["forward"]["share"] == pytest.approx(0.5)
