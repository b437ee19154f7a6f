"""Garbage collections between frames instead of inside them, and short ones.

Python starts a full (generation 2) collection whenever enough objects have
survived the younger ones, wherever the allocation that tips it happens to
be: in the dashboard that is the middle of a frame, and a full collection of
the objects a running dashboard holds (Textual's render caches, the state's
windows, the events in flight) takes 20-40 ms on the 2-core test machine,
on top of a 15-25 ms frame. The pacer keeps the young collections automatic
(they take well under a millisecond) and stops the automatic full ones.

It runs its own right after a frame has been drawn, every ``every_frames``
frames (the dashboard's: every second), so that the pause falls in the idle
time before the next frame, and keeps that pause short: what survives a paced
collection is frozen (``gc.freeze``), so the next one looks only at what came
since, a second of objects, not the dashboard's whole long-lived state again. Frozen
objects are still freed when nothing refers to them; only a cycle among them
waits: every ``reclaim_every`` paced collections (the dashboard's: once a
minute), the frozen objects are unfrozen and one whole collection (the long
pause, 20-40 ms, rarely) takes their cycles too.

A frame that took long already (drawn and rendered in more than
``light_frame_s``: a step closed, many rows changed) is not also made to
wait for the collector: a collection due then waits for the next light
frame, ``wait_frames`` at most. At 64 ranks a paced pause is 4-15 ms (the
objects that survived a second: most of them Textual's strips, with their
seven caches each) and a heavy frame 20-30 ms.
"""

from __future__ import annotations

import gc

NO_AUTOMATIC_FULL = 1_000_000
"""A threshold for generation 2 that the young collections never reach."""


class GcPacer:
    """Freezes what exists at start, then schedules full collections; :meth:`stop` restores Python's setting."""

    def __init__(
        self, *, every_frames: int, reclaim_every: int = 12, light_frame_s: float = 0.015, wait_frames: int = 0
    ) -> None:
        self.every_frames = every_frames
        self.reclaim_every = reclaim_every
        """Every this many paced collections, one over the frozen objects too."""
        self.light_frame_s = light_frame_s
        """A frame that took longer does not also take a collection's pause (see the module's docstring)."""
        self.wait_frames = wait_frames or every_frames
        """How many frames a due collection may wait for a light one."""
        self.postponed = 0
        """Collections put off to a later frame, in all."""
        self._due_at: int | None = None
        """The frame a collection fell due at (and has not run since)."""
        self.full_collections = 0
        self.whole_collections = 0
        """Of :attr:`full_collections`, those that unfroze everything first."""
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
        """Count a frame; whether a full collection is due now (then call :meth:`collect` once the frame is on
        screen)."""
        self._frames += 1
        if self._saved is None:
            return False
        if self._due_at is None and self._frames % self.every_frames == 0:
            self._due_at = self._frames
        return self._due_at is not None

    def collect(self, frame_s: float = 0.0) -> bool:
        """A paced collection: of what came since the last one (each ``reclaim_every``-th: of everything
        since the app started), its survivors frozen after it; put off instead (``False``) where the frame just
        drawn took ``frame_s``, more than a light one, and the collection may still wait."""
        if self._due_at is not None and frame_s > self.light_frame_s and self._frames - self._due_at < self.wait_frames:
            self.postponed += 1
            return False
        self._due_at = None
        self.full_collections += 1
        if self.full_collections % self.reclaim_every == 0:
            self.whole_collections += 1
            gc.unfreeze()  # everything, what was loaded before the app started included
        gc.collect()
        gc.freeze()
        return True

    def stop(self) -> None:
        if self._saved is not None:
            gc.set_threshold(*self._saved)
            self._saved = None
