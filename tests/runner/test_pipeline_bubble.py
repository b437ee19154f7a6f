"""The measured pipeline bubble follows (p - 1) / (m + p - 1) for balanced GPipe and 1F1B."""

from __future__ import annotations

import pytest

from tests.bench.accuracy import ANY_ABOVE, BELOW, SLOWEST_ABOVE, measure_bubble

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_bubble_follows_theory_as_microbatches_grow(schedule: str) -> None:
    rows = [measure_bubble(schedule, m) for m in (2, 4, 8)]
    for row in rows:
        theory, m = row["theory"], row["microbatches"]
        assert theory - BELOW <= row["measured_slowest"] <= theory + SLOWEST_ABOVE, (schedule, m)
        for stage, measured in row["measured_by_stage"].items():
            assert theory - BELOW <= measured <= theory + ANY_ABOVE, (schedule, m, stage)
    slowest = [row["measured_slowest"] for row in rows]  # the bottleneck's: a faster stage's idle is imbalance too
    assert slowest[0] > slowest[1] > slowest[2], slowest
