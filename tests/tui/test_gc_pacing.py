"""Full garbage collections run between frames, never automatically inside one; Python's setting comes back."""

from __future__ import annotations

import asyncio
import gc
import weakref

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
        due = []
        for _ in range(7):
            due.append(pacer.frame_drawn())
            if due[-1]:
                assert pacer.collect()
        assert due == [False, False, True, False, False, True, False]
    finally:
        pacer.stop()
        gc.unfreeze()
    assert gc.get_threshold() == before


def test_a_collection_due_after_a_heavy_frame_waits_for_a_light_one_or_for_its_limit() -> None:
    pacer = GcPacer(every_frames=4, light_frame_s=0.010, wait_frames=3)
    pacer.start()
    try:
        assert [pacer.frame_drawn() for _ in range(4)] == [False, False, False, True]  # due at frame 4
        assert not pacer.collect(0.030)  # after a heavy frame: put off
        assert pacer.frame_drawn() and pacer.collect(0.004)  # frame 5, a light one, takes it
        assert (pacer.full_collections, pacer.postponed) == (1, 1)
        assert [pacer.frame_drawn() for _ in range(3)] == [False, False, True]  # due at frame 8
        for _ in range(3):  # frames 8, 9 and 10: heavy, put off
            assert not pacer.collect(0.030) and pacer.frame_drawn()
        assert pacer.collect(0.030)  # frame 11: it waited 3 frames, its limit, so it runs after a heavy one too
        assert (pacer.full_collections, pacer.postponed) == (2, 4)
    finally:
        pacer.stop()
        gc.unfreeze()


class Cycle:
    """An object that refers to itself: only a collection frees it."""

    def __init__(self) -> None:
        self.me = self


def test_a_paced_collection_freezes_its_survivors_and_each_reclaim_frees_the_cycles_among_them() -> None:
    pacer = GcPacer(every_frames=1, reclaim_every=3)
    pacer.start()
    try:
        frozen_at_start = gc.get_freeze_count()
        kept = [Cycle() for _ in range(1000)]
        pacer.collect()  # 1: they survive, and are frozen
        assert gc.get_freeze_count() >= frozen_at_start + 1000
        assert all(gc.is_tracked(cycle) for cycle in kept)
        dropped = weakref.ref(kept[0])
        young = weakref.ref(Cycle())
        del kept
        pacer.collect()  # 2: the young cycle goes; the frozen ones wait
        assert young() is None and dropped() is not None
        assert pacer.whole_collections == 0
        pacer.collect()  # 3: the reclaim, over the frozen objects too
        assert dropped() is None
        assert (pacer.full_collections, pacer.whole_collections) == (3, 1)
    finally:
        pacer.stop()
        gc.unfreeze()


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
            # About 40 frames: full collections due every 10 (and none automatic). Frames come slower on a loaded
            # machine: past the second, wait for the first paced collection rather than fail for want of frames.
            await asyncio.sleep(1.0)
            deadline = asyncio.get_running_loop().time() + 20.0
            while app.gc_pacer.full_collections < 1 and asyncio.get_running_loop().time() < deadline:
                await asyncio.sleep(0.1)
            assert app.gc_pacer.full_collections >= 1
            assert len(full) - started == app.gc_pacer.full_collections
    finally:
        gc.callbacks.remove(count_full)
        gc.unfreeze()
    assert gc.get_threshold() == before
