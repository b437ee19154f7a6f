"""The watch-against-run benchmark's machinery (``python -m tests.bench.watch_frames``, docs/benchmarks.md): a
writer process fills a real recording, and the dashboard on a viewer of it is measured frame by frame."""

from __future__ import annotations

import math

import pytest

from tests.bench.watch_frames import one_round

pytestmark = pytest.mark.screen


async def test_a_viewer_of_a_recording_being_written_keeps_up_and_its_frames_are_measured() -> None:
    row = await one_round("watch", 8, (80, 24), 1.0, 2_000.0, 200_000, 0.2, warm_events=2_000)
    assert row["source"] == "watch"
    assert row["frames"] >= 4  # 8 Hz over a second
    assert math.isfinite(row["frame_ms"]["p99"]) and row["frame_ms"]["p99"] > 0  # seven views a second: every
    assert math.isfinite(row["switch_ms"]["max"]) and row["switches"] >= 3  # frame a view's switch, timed as such
    assert row["offered_per_s"] > 1_000
    assert row["applied_per_s"] > 0.5 * row["offered_per_s"]  # the viewer reads every 0.2 s: a read may be due
    assert row["dropped"] == 0
    assert row["reads"] >= 3
    assert 0 < row["steps_folded"] <= row["steps_written"]
    assert row["lag_s"]["max"] < 1.0
