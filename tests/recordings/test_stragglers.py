"""The straggler rule (recordings/metrics/stragglers.py) against numbers worked out by hand: beyond chance by
the one-sided binomial test, by enough, for long enough, and a cause only where one part of a rank's work grew
beyond the rest of it by at least half of its extra compute time.

Every step here is 1 s long; a rank computes the milliseconds given and waits in its collectives for the rest
(its exposed communication), so the hold of HOLD_S = 10 s is ten closed steps."""

from __future__ import annotations

import warnings
from collections.abc import Sequence

import numpy as np
import pytest
from scipy.stats import binomtest

from meshtop.recordings.metrics.breakdown import PARTS
from meshtop.recordings.metrics.stragglers import (
    ALPHA,
    HOLD_S,
    MIN_STEPS,
    WINDOW,
    ComputeTimes,
    Straggler,
    compute_seconds,
    fewest_beyond_chance,
    median_without,
)

STEP_S = 1.0
SECOND_NS = 1_000_000_000


def add(times: ComputeTimes, compute_ms: dict[int, float], parts_s: dict[int, dict[str, float]] | None = None) -> None:
    """One closed step of 1 s: each rank computes ``compute_ms[rank]`` and waits the rest; with ``parts_s``,
    the ranks measured their phases (seconds of each part, the rest of the step communication)."""
    exposed = {rank: STEP_S - ms / 1e3 for rank, ms in compute_ms.items()}
    parts = None
    if parts_s is not None:
        ranks = sorted(parts_s)
        rows = np.zeros((len(ranks), len(PARTS)))
        for row, rank in enumerate(ranks):
            for part, seconds in parts_s[rank].items():
                rows[row, PARTS.index(part)] = seconds
            rows[row, PARTS.index("communication")] = STEP_S - sum(parts_s[rank].values())
        parts = (ranks, rows)
    span_ns = (times.steps * SECOND_NS, (times.steps + 1) * SECOND_NS)  # 1 s steps, one after another
    times.add_step(dict.fromkeys(compute_ms, STEP_S), exposed, span_ns=span_ns, parts=parts)


def run(steps: Sequence[dict[int, float]]) -> tuple[ComputeTimes, list[list[Straggler]]]:
    """The rule fed ``steps`` (each rank's compute ms, a dict a step): the stragglers after each."""
    times = ComputeTimes()
    named = []
    for compute_ms in steps:
        add(times, compute_ms)
        named.append(times.stragglers())
    return times, named


def periodic(slowest_in: int, steps: int) -> list[dict[int, float]]:
    """Two ranks; in the first ``slowest_in`` of every 20 steps rank 1 computes 20 ms and rank 0 10 ms, in the
    rest the other way round: any 20 steps in a row have rank 1 the slowest in exactly ``slowest_in``, at
    twice its peer's compute time in them."""
    return [{0: 10.0, 1: 20.0} if number % 20 < slowest_in else {0: 20.0, 1: 10.0} for number in range(steps)]


def test_the_binomial_boundary_of_two_ranks_worked_by_hand() -> None:
    """Two alike ranks: each is the slowest of a step with chance 1/2, and each is tested at ALPHA / 2 = 0.0005.
    Of 20 steps: P(X >= 18) = (C(20,18) + C(20,19) + C(20,20)) / 2^20 = (190 + 20 + 1) / 1048576 = 0.000201,
    beyond chance; P(X >= 17) = (1140 + 211) / 1048576 = 0.001288, not. Of 10 steps even all ten are not
    (1 / 1024 = 0.000977); of 11, all eleven are (1 / 2048 = 0.000488)."""
    assert ALPHA / 2 == 0.0005
    assert binomtest(18, 20, 0.5, alternative="greater").pvalue == pytest.approx(211 / 2**20)
    assert binomtest(17, 20, 0.5, alternative="greater").pvalue == pytest.approx(1351 / 2**20)
    assert fewest_beyond_chance(20, 2) == 18
    assert fewest_beyond_chance(10, 2) == 11  # more than the steps: never
    assert fewest_beyond_chance(11, 2) == 11
    # four ranks, of 20 steps: P(X >= 13) = sum C(20,j) 3^(20-j) / 4^20 over j >= 13 = 0.000184 <= 0.00025;
    # P(X >= 12) = 0.000935
    assert fewest_beyond_chance(20, 4) == 13


def test_two_ranks_where_one_is_the_slowest_in_12_of_20_steps_name_no_straggler() -> None:
    """Rank 1 is the slowest in 12 of every 20 steps, at twice its peer's compute time in them: its median is
    20 ms against 10 (2x and 10 ms more: by enough), but P(X >= 12) = (125970 + 77520 + 38760 +
    15504 + 4845 + 1140 + 190 + 20 + 1) / 2^20 = 263950 / 1048576 = 0.25 for one of two alike ranks: chance."""
    assert binomtest(12, 20, 0.5, alternative="greater").pvalue == pytest.approx(263950 / 2**20)
    times, named = run(periodic(12, 200))
    assert named == [[]] * 200 and times.suspects() == {}


@pytest.mark.parametrize(("slowest_in", "expected"), [(17, []), (18, [1])])
def test_the_slowest_in_17_of_20_steps_is_chance_and_in_18_is_not(slowest_in: int, expected: list[int]) -> None:
    """As above, at the boundary worked out by hand: 17 of 20 steps (p = 0.0013) never names rank 1; 18 of 20
    (p = 0.0002) does, once it has held for 10 s of steps."""
    _, named = run(periodic(slowest_in, 100))
    assert [straggler.rank for straggler in named[-1]] == expected
    assert named[-1] == [] or named[-1][0].slowest_in == pytest.approx(0.9)


def test_a_rank_the_slowest_in_every_step_at_twice_the_compute_is_named_with_its_ratio_after_the_hold() -> None:
    """Rank 1 computes 20 ms a step, rank 0 10 ms. After 10 steps it is not yet beyond chance (10 of 10: p =
    1/1024 > 0.0005); after 11 it is (p = 1/2048), a suspect from step 11 on; its hold reaches 10 s at step
    20: named then, not at step 19."""
    times, named = run([{0: 10.0, 1: 20.0}] * 24)
    assert all(found == [] for found in named[:19])
    assert times.suspects() == {1: pytest.approx(14.0)}  # steps 11-24
    [straggler] = named[19]
    assert named[-1] == [straggler]
    assert (straggler.rank, straggler.stage, straggler.slowest_in, straggler.cause) == (1, 0, 1.0, None)
    assert (straggler.compute_s, straggler.peers_compute_s, straggler.ratio) == pytest.approx((0.020, 0.010, 2.0))
    assert straggler.verdict == "rank 1 is the slowest in 100 % of steps: 2.00x its peers' compute time, cause unknown"


def test_a_slow_spell_shorter_than_the_hold_is_not_named_and_one_that_lasts_is() -> None:
    """Rank 0 computes 20 ms for its first 15 steps, then 10 ms; rank 1 11 ms throughout (after the spell it
    is the slowest in every step, but at 1.1x: not by enough). Rank 0 is a suspect from step 11 (11 of 11)
    to step 16 (15 of 16: p = 17 / 65536 = 0.00026), not at step 17 (15 of 17: p = 154 / 131072 = 0.0012):
    6 s, under the hold. Were its spell 18 steps, it would be a suspect until step 20 (18 of 20): 10 s, named."""
    short = [{0: 20.0 if number < 15 else 10.0, 1: 11.0} for number in range(60)]
    times, named = run(short)
    assert all(found == [] for found in named)
    assert times.suspects() == {}
    longest = 0.0
    times = ComputeTimes()
    for number, compute_ms in enumerate(short):
        add(times, compute_ms)
        longest = max([longest, *times.suspects().values()])
        assert (0 in times.suspects()) == (10 <= number <= 15), number
    assert longest == 6.0
    _, named = run([{0: 20.0 if number < 18 else 10.0, 1: 11.0} for number in range(30)])
    assert [[straggler.rank for straggler in found] for found in named[18:21]] == [[], [0], []]


@pytest.mark.parametrize(
    ("compute_ms", "expected"),
    [
        ({0: 10, 1: 10, 2: 20}, [(2, 2.0)]),  # 20 ms against 10: 2x, 10 ms more
        ({0: 10, 1: 10, 2: 12.5}, []),  # 1.25x is not more than 1.25x
        ({0: 10, 1: 10, 2: 13}, [(2, 1.3)]),  # 1.3x and 3 ms more
        ({0: 1, 1: 1, 2: 2}, []),  # 2x, but 1 ms more is within the 2 ms gap
        ({0: 10, 1: 10, 2: 20, 3: 20.5}, [(3, 2.05)]),  # rank 2's compute is its peers' median (10, 10, 20.5)
    ],
)
def test_beyond_chance_is_not_enough_without_the_ratio_and_the_gap(
    compute_ms: dict[int, float], expected: list[tuple[int, float]]
) -> None:
    """The last rank is the slowest in every one of 24 steps (beyond chance from step 10 for three ranks:
    (1/3)^10 = 0.000017 <= 0.00033); it is named where its median exceeds its peers' median by both rules."""
    _, named = run([compute_ms] * 24)
    assert [(s.rank, s.ratio) for s in named[-1]] == [(rank, pytest.approx(ratio)) for rank, ratio in expected]


def test_a_rank_is_judged_once_it_has_ten_steps() -> None:
    """Of eight ranks, the slowest in 5 of 5 steps is already beyond chance ((1/8)^5 = 0.00003 <= 0.001 / 8),
    but a rank is judged from its 10th step on: a suspect at step 10, for that step's 1 s."""
    times = ComputeTimes()
    for _ in range(MIN_STEPS - 1):
        add(times, {rank: 20.0 if rank == 7 else 10.0 for rank in range(8)})
    assert times.suspects() == {} and fewest_beyond_chance(5, 8) == 5
    add(times, {rank: 20.0 if rank == 7 else 10.0 for rank in range(8)})
    assert times.suspects() == {7: 1.0}


def test_a_rank_is_judged_over_the_last_window_of_steps_only() -> None:
    """Slow at first (50 ms), then as fast as its peers: after a window of steps, nothing of the start is left."""
    times, named = run([{0: 50.0 if number < 30 else 10.0, 1: 10.0, 2: 10.0} for number in range(60)])
    assert [straggler.rank for straggler in named[29]] == [0] and named[-1] == []
    assert times.recent[0] == pytest.approx([0.010] * WINDOW) and MIN_STEPS <= WINDOW


def test_ranks_of_different_stages_are_not_peers() -> None:
    """Stage 1 (ranks 2, 3) computes 20 ms a step and stage 0 (ranks 0, 1) 10 ms: different work. Rank 3 is
    the slowest of its stage in every step (of two alike, the higher rank), but at 1x its peer: no straggler."""
    times = ComputeTimes()
    for number in range(30):
        times.add_step(
            dict.fromkeys(range(4), STEP_S),
            {0: 0.99, 1: 0.99, 2: 0.98, 3: 0.98},
            span_ns=(number * SECOND_NS, (number + 1) * SECOND_NS),
            stage_of=lambda rank: rank // 2,
        )
    assert times.stragglers() == []


WORK_S = {"data": 0.01, "forward": 0.10, "backward": 0.20, "optimizer": 0.05, "other": 0.04}
"""Rank 0's work in each 1 s step: 400 ms of compute, data 1 % of its step."""


def slower_rank(extra_s: dict[str, float], *, times: float = 1.0) -> Straggler:
    """Rank 0 works :data:`WORK_S`; rank 1 ``times`` as long in each part and ``extra_s`` more, for 24 steps:
    the straggler named (rank 1)."""
    rule = ComputeTimes()
    slower = {part: seconds * times + extra_s.get(part, 0.0) for part, seconds in WORK_S.items()}
    for _ in range(24):
        add(rule, {0: sum(WORK_S.values()) * 1e3, 1: sum(slower.values()) * 1e3}, {0: WORK_S, 1: slower})
    [straggler] = rule.stragglers()
    assert straggler.rank == 1
    return straggler


def test_an_extra_spread_over_its_work_is_no_cause() -> None:
    """Rank 1 computes 700 ms against 400 (1.75x): 100 ms more of each of forward, backward and optimizer, and
    data 1 % of its step as on the other rank (the issue's "data 1 % of its step vs 1 % on the others"). Its
    extra is 30 points of its step; each part's own extra, beyond the growth of the rest of its work: forward
    20 - 10 x (50 / 30) = 3.3 points, backward 30 - 20 x (40 / 20) = -10, optimizer 15 - 5 x (55 / 35) = 7.1,
    data 1 - 1 x (69 / 39) = -0.8: none is half of 30. Cause unknown."""
    straggler = slower_rank({"forward": 0.10, "backward": 0.10, "optimizer": 0.10})
    assert (straggler.ratio, straggler.cause) == (pytest.approx(1.75), None)
    assert straggler.verdict == "rank 1 is the slowest in 100 % of steps: 1.75x its peers' compute time, cause unknown"


def test_a_rank_slowed_whole_has_no_cause() -> None:
    """Every part of rank 1's work takes 1.75x as long (its process slowed whole, as a busy machine does):
    backward holds 35 - 20 = 15 of its 30 points of extra, half, but it grew as the rest of its work did
    (35 / 20 = 1.75 = 35 / 20): its own extra is 0, as every part's."""
    straggler = slower_rank({}, times=1.75)
    assert (straggler.ratio, straggler.cause) == (pytest.approx(1.75), None)


def test_a_part_that_explains_most_of_the_extra_is_the_cause() -> None:
    """Rank 1's data takes 300 ms more: 31 % of its step against 1 %, the rest of its work as its peer's (g =
    1): its own extra is 31 - 1 = 30 points, the whole of its extra."""
    straggler = slower_rank({"data": 0.30})
    assert (straggler.cause, straggler.cause_share, straggler.peers_cause_share) == (
        "data",
        pytest.approx(0.31),
        pytest.approx(0.01),
    )
    assert straggler.verdict == "rank 1 is the slowest in 100 % of steps: data 31 % of its step vs 1 % on the others"


def test_the_largest_part_slowed_alone_is_the_cause() -> None:
    """Backward alone takes 300 ms more: 50 % of its step against 20 %, the rest of its work unchanged (g = 1):
    its own extra is 30 points, all of the extra."""
    straggler = slower_rank({"backward": 0.30})
    assert (straggler.cause, straggler.cause_share, straggler.peers_cause_share) == (
        "backward",
        pytest.approx(0.50),
        pytest.approx(0.20),
    )


@pytest.mark.parametrize(
    ("extra_s", "cause"),
    [
        # 30 points of extra. Data's own extra: 18 - 1 x (52 / 39) = 16.7 points, over half
        ({"data": 0.17, "forward": 0.13}, "data"),
        # 16 - 1 x (54 / 39) = 14.6, under half (forward's: 25 - 10 x (45 / 30) = 10)
        ({"data": 0.15, "forward": 0.15}, None),
    ],
)
def test_the_cause_has_at_least_half_of_the_extra_as_its_own(extra_s: dict[str, float], cause: str | None) -> None:
    assert slower_rank(extra_s).cause == cause


def test_no_phases_measured_is_cause_unknown() -> None:
    times, _ = run([{0: 400.0, 1: 700.0}] * 24)
    [straggler] = times.stragglers()
    assert straggler.cause is None and straggler.verdict.endswith("1.75x its peers' compute time, cause unknown")


@pytest.mark.parametrize(("every_s", "named_at"), [(0.5, 30), (1.0, 21), (2.0, 16)])
def test_the_hold_is_in_seconds_of_the_steps_own_clock(every_s: float, named_at: int) -> None:
    """Steps of 0.5 s, ``every_s`` apart: rank 1 is beyond chance from step 11, which starts at 10 x every_s;
    it is named at the first step that ends 10 s after that or later. 0.5 s apart: from 5 s, step 30 (it ends
    at 29 x 0.5 + 0.5 = 15 s); 1 s apart: from 10 s, step 21 (20.5 s; step 20 ends at 19.5 s); 2 s apart (an
    evaluation between steps): from 20 s, step 16 (30.5 s; step 15 ends at 28.5 s)."""
    times = ComputeTimes()
    named = []
    for number in range(40):
        start = round(number * every_s * SECOND_NS)
        times.add_step({0: 0.5, 1: 0.5}, {0: 0.49, 1: 0.48}, span_ns=(start, start + SECOND_NS // 2))
        named.append([straggler.rank for straggler in times.stragglers()])
    assert named[named_at - 2] == [] and named[named_at - 1] == [1] and HOLD_S == 10.0


def test_compute_time_is_the_step_less_its_exposed_communication_and_all_of_it_where_none_was_measured() -> None:
    assert compute_seconds({0: 1.0, 1: 2.0}, {0: 0.25}) == {0: 0.75, 1: 2.0}


@pytest.mark.parametrize(
    ("ordered", "index", "median"),
    [
        ([1.0, 2.0, 3.0, 4.0, 5.0], 0, 3.5),  # 2 3 4 5
        ([1.0, 2.0, 3.0, 4.0, 5.0], 2, 3.0),  # 1 2 4 5: (2 + 4) / 2
        ([1.0, 2.0, 3.0, 4.0, 5.0], 4, 2.5),  # 1 2 3 4
        ([1.0, 2.0, 3.0, 4.0], 0, 3.0),  # 2 3 4
        ([1.0, 2.0, 3.0, 4.0], 1, 3.0),  # 1 3 4
        ([1.0, 2.0, 3.0, 4.0], 3, 2.0),  # 1 2 3
        ([1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0], 6, 6.0),  # 1 2 4 8 16 32: (4 + 8) / 2
    ],
)
def test_the_median_without_one_element_worked_by_hand(ordered: list[float], index: int, median: float) -> None:
    assert median_without(ordered, index) == median


def test_a_one_rank_job_and_a_rank_that_joins_later_are_judged_without_error() -> None:
    """One rank has no peers: never a straggler. A third rank that first closes a step at step 5 is judged
    from its own 10th step, at twice its peers' compute time: a suspect at step 14 (its 10th), for that 1 s."""
    alone = ComputeTimes()
    for _ in range(30):
        add(alone, {0: 10.0})
    assert alone.steps == 30 and alone.suspects() == {} and alone.stragglers() == []
    times = ComputeTimes()
    for number in range(14):
        add(times, {0: 10.0, 1: 10.0} if number < 4 else {0: 10.0, 1: 10.0, 2: 20.0})
        if number == 12:
            assert times.suspects() == {}
    assert times.steps == 14 and times.suspects() == {2: 1.0}


def test_the_ratio_and_the_gap_are_strictly_above_their_bounds() -> None:
    """Binary fractions, so the bounds are met exactly: 0.3125 s is exactly 1.25 x 0.25 s (not above it);
    0.004 s is exactly 2 ms above 0.002 s (not more); a hair more of each is a suspect, at step 11 (of two
    ranks, the slowest in 11 of 11 steps is beyond chance, in 10 of 10 not)."""

    def suspects(own_s: float, peer_s: float) -> dict[int, float]:
        times = ComputeTimes()
        for number in range(11):
            times.add_step({0: peer_s, 1: own_s}, {}, span_ns=(number * SECOND_NS, (number + 1) * SECOND_NS))
        return times.suspects()

    assert suspects(0.3125, 0.25) == {} and suspects(0.3125 + 2**-20, 0.25) == {1: 1.0}
    assert suspects(0.004, 0.002) == {} and suspects(0.004 + 2**-20, 0.002) == {1: 1.0}


def test_peers_that_computed_nothing_make_no_suspect() -> None:
    """Rank 0 waits the whole of every step (its compute time 0): there is no ratio to take."""
    times = ComputeTimes()
    for number in range(24):
        times.add_step({0: 1.0, 1: 1.0}, {0: 1.0, 1: 0.98}, span_ns=(number * SECOND_NS, (number + 1) * SECOND_NS))
    assert times.suspects() == {} and times.stragglers() == []


def test_a_straggler_in_the_second_of_two_stages_is_named() -> None:
    """Stage 0 (ranks 0, 1) alike; in stage 1 (ranks 2, 3) rank 3 computes 40 ms against 20 ms: named, at 2x."""
    times = ComputeTimes()
    for number in range(24):
        times.add_step(
            dict.fromkeys(range(4), STEP_S),
            {0: 0.99, 1: 0.99, 2: 0.98, 3: 0.96},
            span_ns=(number * SECOND_NS, (number + 1) * SECOND_NS),
            stage_of=lambda rank: rank // 2,
        )
    assert [(s.rank, s.stage, s.ratio) for s in times.stragglers()] == [(3, 1, pytest.approx(2.0))]


def test_the_hold_is_exact_at_epoch_nanoseconds() -> None:
    """Steps on the wall clock of 2026 (1.8e18 ns, where a float64 is exact to 256 ns only): a suspect whose
    first step starts 255 ns past a multiple of 256 and whose last ends exactly HOLD_S later is held exactly
    10 s, and named."""
    epoch = 1_800_000_000_000_000_000 // 256 * 256 + 255
    times = ComputeTimes()
    for number in range(20):  # a suspect from step 10 (its 10th), named at step 19 (10 steps of 1 s later)
        start = epoch + number * SECOND_NS
        times.add_step({0: 1.0, 1: 1.0}, {0: 0.99, 1: 0.98}, span_ns=(start, start + SECOND_NS))
    assert times.suspects() == {1: 10.0} and [s.rank for s in times.stragglers()] == [1]


def test_a_cause_is_looked_for_in_the_steps_and_ranks_that_measured_their_phases_only() -> None:
    """Rank 1 is the straggler of :func:`test_a_part_that_explains_most_of_the_extra_is_the_cause` (data 31 % of
    its step against 1 %), but only every other step measured its phases, and in those rank 2 (a third rank,
    alike to rank 0) did not: the shares are of the measured steps and ranks alone, the same 31 % and 1 %."""
    slower = {**WORK_S, "data": 0.31}
    compute_ms = {0: 400.0, 1: 700.0, 2: 400.0}
    times = ComputeTimes()
    for number in range(24):
        add(times, compute_ms, {0: WORK_S, 1: slower} if number % 2 else None)
    [straggler] = times.stragglers()
    assert (straggler.rank, straggler.cause, straggler.cause_share, straggler.peers_cause_share) == (
        1,
        "data",
        pytest.approx(0.31),
        pytest.approx(0.01),
    )


def test_a_part_the_peers_spend_all_their_work_in_grew_alone_is_the_cause() -> None:
    """Rank 0's work is data only (10 ms of its 1 s step); rank 1's data 40 ms and forward 2 ms. Data: s = 4 %,
    p = 1 %, the rest of the peers' work 0, so g = 1 and its own extra is 3 points; forward: s = 0.2 %, p = 0,
    g = 4 / 1, own extra 0.2 points. The extra is 4.2 - 1 = 3.2 points, and data's 3 is over half of it."""
    times = ComputeTimes()
    for _ in range(24):
        add(times, {0: 10.0, 1: 42.0}, {0: {"data": 0.010}, 1: {"data": 0.040, "forward": 0.002}})
    [straggler] = times.stragglers()
    assert (straggler.cause, straggler.cause_share, straggler.peers_cause_share) == (
        "data",
        pytest.approx(0.04),
        pytest.approx(0.01),
    )


def test_a_rank_slowed_whole_whose_work_is_mostly_one_part_has_no_cause() -> None:
    """Rank 0: forward 60 ms, backward 40 ms; rank 1 twice each. Forward holds 12 - 6 = 6 of the 10 points of
    extra, but it grew as the rest did (g = 8 / 4 = 2): its own extra is 12 - 6 x 2 = 0."""
    times = ComputeTimes()
    for _ in range(24):
        add(
            times,
            {0: 100.0, 1: 200.0},
            {0: {"forward": 0.060, "backward": 0.040}, 1: {"forward": 0.120, "backward": 0.080}},
        )
    [straggler] = times.stragglers()
    assert (straggler.ratio, straggler.cause) == (pytest.approx(2.0), None)


def test_a_rank_whose_shares_are_its_peers_has_no_cause() -> None:
    """Rank 1's steps take 2 s and its work twice rank 0's (forward and backward 20 ms each against 10 ms, in
    1 s): the same 1 % shares, an extra of exactly 0 points: slowed whole, no cause."""
    times = ComputeTimes()
    rows = np.zeros((2, len(PARTS)))
    for row, (forward_s, step_s) in enumerate([(0.01, 1.0), (0.02, 2.0)]):
        rows[row, PARTS.index("forward")] = rows[row, PARTS.index("backward")] = forward_s
        rows[row, PARTS.index("communication")] = step_s - 2 * forward_s
    for number in range(24):
        times.add_step(
            {0: 1.0, 1: 2.0},
            {0: 0.98, 1: 1.96},
            span_ns=(2 * number * SECOND_NS, 2 * (number + 1) * SECOND_NS),
            parts=([0, 1], rows),
        )
    [straggler] = times.stragglers()
    assert (straggler.rank, straggler.ratio, straggler.cause) == (1, pytest.approx(2.0), None)


def test_a_part_with_exactly_half_of_the_extra_as_its_own_is_the_cause() -> None:
    """Binary fractions of 1 s steps, exact: rank 0 spends 0.125 s in each of data, forward and backward; rank
    1 0.375, 0.25 and 0.125. Its extra is 0.75 - 0.375 = 0.375; data's own extra 0.375 - 0.125 x (0.375 /
    0.25) = 0.1875, exactly half of it: at least half, the cause."""
    times = ComputeTimes()
    peer = {"data": 0.125, "forward": 0.125, "backward": 0.125}
    for _ in range(24):
        add(times, {0: 375.0, 1: 750.0}, {0: peer, 1: {"data": 0.375, "forward": 0.25, "backward": 0.125}})
    [straggler] = times.stragglers()
    assert (straggler.cause, straggler.cause_share) == ("data", 0.375)


def test_a_cause_is_found_in_steps_shorter_than_a_second() -> None:
    """Steps of 40 ms (the window's 20 add up to 0.8 s): rank 1 spends 16 ms in data against rank 0's 0.8 ms,
    forward 8 ms on both: data 40 % of its step vs 2 %. Beyond chance from its 11th step (0.4 s in), named
    once that has lasted 10 s: by step 300 (12 s)."""
    times = ComputeTimes()
    step_ns = SECOND_NS // 25
    rows = np.zeros((2, len(PARTS)))
    for row, data_s in enumerate([0.0008, 0.016]):
        rows[row, PARTS.index("data")], rows[row, PARTS.index("forward")] = data_s, 0.008
        rows[row, PARTS.index("communication")] = 0.04 - data_s - 0.008
    for number in range(300):
        times.add_step(
            {0: 0.04, 1: 0.04},
            {0: 0.0312, 1: 0.016},
            span_ns=(number * step_ns, (number + 1) * step_ns),
            parts=([0, 1], rows),
        )
    [straggler] = times.stragglers()
    assert (straggler.cause, straggler.cause_share, straggler.peers_cause_share) == (
        "data",
        pytest.approx(0.40),
        pytest.approx(0.02),
    )


def test_an_extra_in_parts_the_peers_do_not_do_spread_over_three_is_no_cause() -> None:
    """Rank 0's work is data only, 30 ms; rank 1's data 30 ms too and 10 ms of each of forward, backward and
    optimizer. Data did not grow (its own extra 3 - 3 x 1 = 0, g = 1 where the peers have no other work);
    each of the others' own extra is 1 point of the 3 of extra, under half: no cause."""
    times = ComputeTimes()
    spread = {"data": 0.030, "forward": 0.010, "backward": 0.010, "optimizer": 0.010}
    for _ in range(24):
        add(times, {0: 30.0, 1: 60.0}, {0: {"data": 0.030}, 1: spread})
    [straggler] = times.stragglers()
    assert (straggler.ratio, straggler.cause) == (pytest.approx(2.0), None)


def test_no_phases_measured_warns_nothing() -> None:
    """The shares of a rank with no measured step are NaN, quietly: a warning would print into the dashboard."""
    times, _ = run([{0: 400.0, 1: 700.0}] * 24)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        [straggler] = times.stragglers()
    assert straggler.cause is None
