"""The measured pipeline bubble follows (p - 1) / (m + p - 1) for balanced GPipe and 1F1B."""

from __future__ import annotations

import pytest

from tests.bench.accuracy import measure_bubble

pytestmark = pytest.mark.slow

# On gloo each microbatch also spends ~3-4 ms outside the stage actions (P2P
# transfer, loss, schedule bookkeeping): about 3.5% of its ~100 ms of compute
# for this model and length. That time is idle by definition, so the measured
# bubble sits above theory by about m c / ((m + 1) t) < 0.04 for p = 2 (0.04
# seen on an idle machine), and never below it by more than timer noise; the
# bound allows 2.5 times that, since a busy machine stretches the P2P time.
ABOVE, BELOW = 0.10, 0.02


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_bubble_follows_theory_as_microbatches_grow(schedule: str) -> None:
    rows = [measure_bubble(schedule, m) for m in (2, 4, 8)]
    for row in rows:
        for stage, measured in row["measured_by_stage"].items():
            assert row["theory"] - BELOW <= measured <= row["theory"] + ABOVE, (schedule, row["microbatches"], stage)
    worst = [row["measured_max"] for row in rows]
    assert worst[0] > worst[1] > worst[2]
