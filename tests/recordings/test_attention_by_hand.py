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
