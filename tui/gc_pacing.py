"""Full garbage collections between frames instead of inside them.

Python starts a full (generation 2) collection whenever enough objects have
survived the younger ones, wherever the allocation that tips it happens to
be: in the dashboard that is the middle of a frame, and a full collection of
the objects a running dashboard holds (Textual's render caches, the state's
windows, the events in flight) takes 20-40 ms on the 2-core test machine,
on top of a 15-25 ms frame. The pacer keeps the young collections automatic
(they take well under a millisecond), stops the automatic full ones, and
runs one itself right after a frame has been drawn, every ``every_frames``
frames: the pause then falls in the idle time before the next frame, and
memory is still reclaimed every few seconds.
"""

from __future__ import annotations

import gc

NO_AUTOMATIC_FULL = 1_000_000
"""A threshold for generation 2 that the young collections never reach."""


class GcPacer:
    """Freezes what exists at start, then schedules full collections; :meth:`stop` restores Python's setting."""

    def __init__(self, *, every_frames: int) -> None:
        self.every_frames = every_frames
        self.full_collections = 0
        self._frames = 0
        self._saved: tuple[int, int, int] | None = None

    def start(self) -> None:
        # Everything loaded so far (Textual, and torch for a live job) lives as long as the app: frozen,
        # no collection looks at it again.
        gc.collect()
        gc.freeze()
        self._saved = gc.get_threshold()
        young, middle, _ = self._saved
        gc.set_threshold(young, middle, NO_AUTOMATIC_FULL)

    def frame_drawn(self) -> bool:
        """Count a frame; whether a full collection is due now (call right after the frame is on screen)."""
        self._frames += 1
        return self._saved is not None and self._frames % self.every_frames == 0

    def collect(self) -> None:
        gc.collect()
        self.full_collections += 1

    def stop(self) -> None:
        if self._saved is not None:
            gc.set_threshold(*self._saved)
            self._saved = None
