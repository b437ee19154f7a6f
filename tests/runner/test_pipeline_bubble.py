"""The measured pipeline bubble follows (p - 1) / (m + p - 1) for balanced 1F1B (the default schedule).

GPipe's bubble has the same formula and is measured by the same code (the stage actions of each schedule,
folded alike); the suite's accuracy rows (``python -m tests.bench.suite --only accuracy``) measure it beside
1F1B's. Here one schedule, for the CI machine's time: each run of m = 2, 4 and 8 costs it about a minute."""

from __future__ import annotations

from typing import Any

import pytest

from tests.bench.accuracy import ANY_ABOVE, BELOW, SLOWEST_ABOVE, measure_bubble

pytestmark = pytest.mark.slow


def within_bounds(row: dict[str, Any]) -> bool:
    theory, slowest, by_stage = row["theory"], row["measured_slowest"], row["measured_by_stage"]
    return theory - BELOW <= slowest <= theory + SLOWEST_ABOVE and all(
        theory - BELOW <= measured <= theory + ANY_ABOVE for measured in by_stage.values()
    )


def test_bubble_follows_theory_as_microbatches_grow() -> None:
    """Each m's bubble within the bounds of tests/bench/accuracy.py, measured a second time where the first run
    strays: one run on a shared 2-core VM can (-0.104 for m = 2 once, against -0.1 allowed), where a bubble
    computed wrongly strays in both."""
    schedule = "1f1b"
    rows = []
    for m in (2, 4, 8):
        row = measure_bubble(schedule, m)
        rows.append(row if within_bounds(row) else measure_bubble(schedule, m))
    for row in rows:
        theory, m = row["theory"], row["microbatches"]
        assert theory - BELOW <= row["measured_slowest"] <= theory + SLOWEST_ABOVE, (schedule, m)
        for stage, measured in row["measured_by_stage"].items():
            assert theory - BELOW <= measured <= theory + ANY_ABOVE, (schedule, m, stage)
    # The bottleneck's trend (a faster stage's idle is imbalance too), over the widest step only: theory falls
    # 0.133 from m = 2 to 4 and 0.089 from 4 to 8, inside the noise the bounds above allow for one run on a
    # loaded 2-core VM; from 2 to 8 it falls 0.222, more than that noise either way.
    slowest = [row["measured_slowest"] for row in rows]
    assert slowest[0] > slowest[2], slowest
