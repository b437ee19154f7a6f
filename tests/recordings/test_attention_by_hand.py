"""The attention rule of recordings/metrics/attention.py, worked by hand."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from meshtop.recordings.metrics.attention import WINDOW, RankRecent, attention, scored
from meshtop.recordings.reader import open_recording
from meshtop.recordings.summary import fold_recording
from tests.kit.recordings import fleet_recording

MS = 1e-3


def test_one_slow_rank_among_sixteen_stands_out_by_its_modified_z_score() -> None:
    # 15 ranks at 99, 100 or 101 ms, one at 130 ms
    values = {rank: (100 + (rank % 3) - 1) * MS for rank in range(15)} | {15: 130 * MS}
    found = attention("step", values, node_of={rank: rank // 4 for rank in range(16)})
    # the 16 values: five 99, five 100, five 101 and 130 ms: median 100, MAD 1 ms (9 of 16 within 1 ms)
    assert found.median == pytest.approx(100 * MS)
    worst = found.ranks[0]
    assert worst.key == 15 and worst.z == pytest.approx(0.6745 * 30) and worst.flagged
    assert found.flagged_ranks == (15,)
    # nodes of 4: medians 99.5, 100, 100.5 and 100.5 ms (its node: 99, 100, 101 and 130): median 100.25, MAD
    # 0.25, its node's z 0.67: a node is not an outlier for one rank of four
    assert found.flagged_nodes == ()
    assert found.nodes[0].z == pytest.approx(0.6745)
    assert found.top(2)[0].key == 15


def test_a_slow_node_stands_out_whole_though_its_ranks_match_each_other() -> None:
    node_of = {rank: rank // 8 for rank in range(64)}
    values = {rank: (200 if node_of[rank] == 5 else 100 + rank % 2) * MS for rank in range(64)}
    found = attention("step", values, node_of)
    assert found.flagged_nodes == (5,)
    assert set(found.flagged_ranks) == set(range(40, 48))


def test_ranks_alike_to_the_microsecond_are_not_told_apart_by_a_tiny_mad() -> None:
    values = {rank: 0.100 + rank * 1e-7 for rank in range(8)} | {8: 0.1005}  # 0.5 ms off: under 1 ms and 5 %
    assert attention("step", values, {}).flagged_ranks == ()


@pytest.mark.parametrize(("off_ms", "flagged"), [(3, False), (6, True)])
def test_a_rank_off_by_more_than_1_ms_but_less_than_5_percent_of_the_median_is_not_flagged(
    off_ms: float, flagged: bool
) -> None:
    """Eight ranks at 100 ms (0.1 us apart: a MAD of 0.35 us, so z is in the thousands) and one 3 ms off:
    past 1 ms but not past 5 % of 100 ms = 5 ms, the larger of the two: not flagged. 6 ms off is past both."""
    values = {rank: 0.100 + rank * 1e-7 for rank in range(8)} | {8: 0.100 + off_ms * MS}
    found = attention("step", values, {})
    assert found.ranks[0].key == 8 and found.ranks[0].z > 1000
    assert found.flagged_ranks == ((8,) if flagged else ())


def test_with_no_spread_a_rank_waiting_on_data_alone_is_flagged_with_an_infinite_z() -> None:
    values = dict.fromkeys(range(7), 0.0) | {7: 40 * MS}
    rows = scored("data", values)
    assert rows[0].key == 7 and math.isinf(rows[0].z) and rows[0].flagged
    assert all(row.z == 0 for row in rows[1:])


def test_headroom_is_bad_when_low_and_too_few_ranks_are_not_scored() -> None:
    gib = float(1 << 30)
    values = {rank: 40 * gib + rank * (1 << 20) for rank in range(7)} | {7: 2 * gib}
    assert attention("headroom", values, {}).flagged_ranks == (7,)
    assert scored("step", {0: 1.0, 1: 5.0}) == ()


def test_a_ranks_value_is_its_median_over_its_last_window_of_steps() -> None:
    recent = RankRecent()
    for step in range(WINDOW + 5):
        for rank in range(3):
            slow = rank == 2 and step < 5  # rank 2 was slow early on, then not: out of the window
            recent.add(rank, "step", 0.5 if slow else 0.1)
    recent.add(0, "data", 0.02)
    for value in (0.3, 0.1, 0.2):  # a rank that joined late: fewer steps kept, its own median
        recent.add(3, "step", value)
    assert recent.medians("step") == pytest.approx({0: 0.1, 1: 0.1, 2: 0.1, 3: 0.2})
    assert recent.medians("data") == {0: 0.02}


def test_a_recorded_job_with_a_slow_node_has_that_node_and_its_ranks_flagged(tmp_path: Path) -> None:
    recording = fleet_recording(tmp_path / "rec", ranks=64, nodes=8, slow_node=5)
    fold = fold_recording(open_recording(recording))
    found = fold.attention("step", {rank: rank // 8 for rank in range(64)})
    assert found.median == pytest.approx(0.1, rel=0.02)
    assert found.flagged_nodes == (5,) and set(found.flagged_ranks) == set(range(40, 48))
    assert fold.attention("data", {}).ranks == ()  # no phases measured: nothing to score


def test_three_ranks_are_enough_to_be_scored() -> None:
    # median 0.1 s, deviations 0, 0 and 0.4 s: a MAD of 0, and 0.4 s is past 1 ms and 5 % of 0.1 s
    rows = scored("step", {0: 0.1, 1: 0.1, 2: 0.5})
    assert [(row.key, row.z, row.flagged) for row in rows] == [(2, math.inf, True), (0, 0.0, False), (1, 0.0, False)]


MIB = float(1 << 20)
GIB = float(1 << 30)


def test_headroom_exactly_64_mib_under_the_median_is_not_far_enough_to_be_flagged() -> None:
    """1 GiB of median headroom: 5 % of it is 51.2 MiB, less than 64 MiB, so a rank needs more than 64 MiB less.
    Deviations 64, 1, 0, 1 and 1 MiB: a MAD of 1 MiB, z = 0.6745 x 64 MiB / 1 MiB = 43.168 (on the low side,
    positive) but only 64 MiB off."""
    values = {0: GIB - 64 * MIB, 1: GIB - MIB, 2: GIB, 3: GIB + MIB, 4: GIB + MIB}
    rows = scored("headroom", values)
    assert rows[0].key == 0 and rows[0].z == pytest.approx(43.168) and not rows[0].flagged
    assert [row.key for row in rows] == [0, 1, 2, 3, 4]  # z 0.6745, 0, -0.6745 twice: the lowest headroom first
    assert rows[1].z == pytest.approx(0.6745) and rows[3].z == pytest.approx(-0.6745)


@pytest.mark.parametrize(("under", "z"), [(64 * MIB, 0.0), (64 * MIB + 1, math.inf)])
def test_with_no_spread_headroom_64_mib_under_is_alike_and_a_byte_more_is_infinitely_off(
    under: float, z: float
) -> None:
    values = dict.fromkeys(range(4), GIB) | {4: GIB - under}  # median 1 GiB, MAD 0
    low = {row.key: row for row in scored("headroom", values)}[4]
    assert (low.z, low.flagged) == (z, z > 0)


def test_a_z_of_exactly_3_5_is_not_past_the_limit() -> None:
    """Headroom around a median of 8 GiB (5 %: 409.6 MiB) with deviations of 0, 256 MiB four times and 512 MiB:
    a MAD of 256 MiB (2^28 bytes). The low rank is 1,392,919,341.73 bytes under (about 1.3 GiB, far enough),
    where 0.6745 x off comes to exactly 3.5 x 2^28 in floating point: z = 3.5, at the limit, not past it."""
    median, mad = 8 * GIB, 256 * MIB
    low = 7197015250.265382  # about 8 GiB - 3.5 x 2^28 / 0.6745: the double there whose z rounds to 3.5
    values = {
        0: low,
        1: median - mad,
        2: median - mad,
        3: median,
        4: median + mad,
        5: median + mad,
        6: median + 2 * mad,
    }
    rows = scored("headroom", values)
    assert (rows[0].key, rows[0].z, rows[0].flagged) == (0, 3.5, False)


def test_ranks_missing_from_the_node_map_are_on_node_0_with_its_own_ranks() -> None:
    """Ranks 0 and 1 have no node, ranks 2 and 3 are node 0's: node 0 is ranks 0 to 3, all at 200 ms, its median
    200 ms; nodes 1 and 2 are at 100 ms. Three nodes: the median 100 ms, a MAD of 0, node 0 100 ms off."""
    node_of = {2: 0, 3: 0, 4: 1, 5: 1, 6: 2, 7: 2}
    values = dict.fromkeys(range(4), 200 * MS) | dict.fromkeys(range(4, 8), 100 * MS)
    found = attention("step", values, node_of)
    assert [(node.key, node.value, node.z) for node in found.nodes] == [
        (0, 200 * MS, math.inf),
        (1, 100 * MS, 0.0),
        (2, 100 * MS, 0.0),
    ]
    assert found.flagged_nodes == (0,)
