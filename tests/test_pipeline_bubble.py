"""The measured pipeline bubble follows (p - 1) / (m + p - 1) for balanced GPipe and 1F1B."""

from __future__ import annotations

import pytest

from tests.bench.accuracy import measure_bubble

pytestmark = pytest.mark.slow

# The formula describes the pipeline's bottleneck: the slowest stage. On gloo
# each microbatch also spends ~3-4 ms outside the stage actions (P2P transfer,
# loss, schedule bookkeeping), about 3.5% of its ~100 ms of compute for this
# model and length; that time is idle by definition, so the slowest stage's
# bubble sits above theory by about m c / ((m + 1) t) < 0.04 for p = 2
# (-0.001 to +0.056 seen over four quiet runs). A faster stage also waits for
# the slower one (stage 1 carries the output projection and the loss, ~5% more
# work), which adds up to ~0.04 more. On the 2-core CI VM single runs of 3
# steady steps strayed further (-0.034 for the slowest stage, +0.113 for a
# faster one, 2026-11-29), so the steady part is now 5 steps and the bounds
# allow for that VM: +0.08 for the slowest stage, +0.12 for any, -0.04 below.
# The trend (falling with m) is checked on top.
SLOWEST_ABOVE, ANY_ABOVE, BELOW = 0.08, 0.12, 0.04


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_bubble_follows_theory_as_microbatches_grow(schedule: str) -> None:
    rows = [measure_bubble(schedule, m) for m in (2, 4, 8)]
    for row in rows:
        theory, m = row["theory"], row["microbatches"]
        assert theory - BELOW <= row["measured_slowest"] <= theory + SLOWEST_ABOVE, (schedule, m)
        for stage, measured in row["measured_by_stage"].items():
            assert theory - BELOW <= measured <= theory + ANY_ABOVE, (schedule, m, stage)
    worst = [row["measured_max"] for row in rows]
    assert worst[0] > worst[1] > worst[2]
