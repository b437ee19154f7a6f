"""Full garbage collections run between frames, never automatically inside one; Python's setting comes back."""

from __future__ import annotations

import asyncio
import gc

import pytest

from meshtop.recordings.reader import open_recording
from meshtop.recordings.samples import SAMPLE
from meshtop.tui.app import MeshtopApp
from meshtop.tui.gc_pacing import NO_AUTOMATIC_FULL, GcPacer
from meshtop.tui.sources import ReplaySource


def test_the_pacer_stops_automatic_full_collections_and_restores_the_setting() -> None:
    before = gc.get_threshold()
    pacer = GcPacer(every_frames=3)
    pacer.start()
    try:
        assert gc.get_threshold()[:2] == before[:2]  # young collections stay automatic
        assert gc.get_threshold()[2] == NO_AUTOMATIC_FULL
        assert [pacer.frame_drawn() for _ in range(7)] == [False, False, True, False, False, True, False]
    finally:
        pacer.stop()
        gc.unfreeze()
    assert gc.get_threshold() == before


@pytest.mark.screen
async def test_the_dashboard_collects_after_frames_and_restores_python_on_exit() -> None:
    before = gc.get_threshold()
    full: list[int] = []

    def count_full(phase: str, info: dict[str, int]) -> None:
        if phase == "stop" and info["generation"] == 2:
            full.append(1)

    app = MeshtopApp(ReplaySource(open_recording(SAMPLE), clock=lambda: 0.0), frame_hz=40.0)
    app.gc_pacer.every_frames = 10
    gc.callbacks.append(count_full)
    try:
        async with app.run_test(size=(80, 24)):
            started = len(full)  # the collection before the freeze at start
            assert gc.get_threshold()[2] == NO_AUTOMATIC_FULL
            await asyncio.sleep(1.0)  # about 40 frames: full collections due every 10 (and none automatic)
            assert app.gc_pacer.full_collections >= 1
            assert len(full) - started == app.gc_pacer.full_collections
    finally:
        gc.callbacks.remove(count_full)
        gc.unfreeze()
    assert gc.get_threshold() == before
