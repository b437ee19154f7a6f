"""A live session's fold, on a thread of its own: the thread that receives the events never waits for it.

The session thread drains the collector, writes each batch into the recording, and hands it to this thread,
which folds it into the session's fold and passes it on (``/metrics``, the console, the dashboard). Were the
two one thread, a fold that falls behind (a thousand ranks' steps to break down) would hold the next drain
back, the collector would fill, and what it refuses would be lost to the recording too (the fleet benchmark
lost a quarter of what 16 nodes sent, with the dashboard on).

Rules:

- batches are folded in the order they came, each once; the fold takes every batch waiting at once;
- past :data:`FOLD_BACKLOG` events waiting, the waiting batches' :data:`BULK_KINDS` blocks are left out of the
  fold (already on disk: counted in the session's ``left_out``, which the dashboard says), oldest first; no
  other kind is ever left out (a lost start or step would be a hole in every figure);
- batches that waited longer than :data:`FOLD_LAG_S` for the fold, more than :data:`FOLD_LAG_EVENTS` events of
  them, are folded without their bulk kinds, counted the same way: the dashboard's steps are then at most
  about that late. The session fold's own share of its thread's time
  (:data:`~meshtop.recordings.session_fold.FOLD_SHARE`) counts only its
  CPU, not the interpreter's lock it waits for behind the collector and the screen: at a thousand ranks and
  250,000 events a second its fold kept within its share while the screen showed steps 2-3 s late;
- an error raised on the fold thread is raised again by the next :meth:`FoldThread.put` or by
  :meth:`FoldThread.close`, which waits for every batch handed over to be folded.
"""

from __future__ import annotations

import threading
import time
from collections import Counter, deque
from collections.abc import Callable

from meshtop.probes.arrivals import Arrivals, event_count
from meshtop.probes.events import BULK_KINDS
from meshtop.recordings.recorder import SessionRecorder
from meshtop.recordings.session_fold import Folded

FOLD_BACKLOG = 1_000_000
"""Events waiting for the fold past which the bulk kinds' blocks waiting are left out of it (the collector's
own bound: a backlog as long as its queue)."""
FOLD_LAG_S = 0.25
"""How long batches may wait for the fold before their bulk kinds are left out (with more than
:data:`FOLD_LAG_EVENTS` events waiting). The fleet benchmark at 250,000 events a second, three runs each:
dashboard lag p99 1.10-1.37 s at 0.25, 1.37-1.55 at 0.5, 1.71-2.33 without this rule."""
FOLD_LAG_EVENTS = 20_000
"""Events waiting below which a late fold takes every kind all the same: two seconds of a 64-rank job's, so a
small job on a busy machine (a fold held up by a collection, a test beside others) keeps its collectives."""


class FoldThread:
    """Folds a live session's recorded batches on a thread of its own, in order, then hands each to ``then``."""

    def __init__(
        self,
        recorder: SessionRecorder,
        then: Callable[[Arrivals, Folded], None],
        *,
        backlog: int = FOLD_BACKLOG,
        lag_s: float = FOLD_LAG_S,
        lag_events: int = FOLD_LAG_EVENTS,
    ) -> None:
        self.recorder = recorder
        self.then = then
        self.backlog = backlog
        self.lag_s, self.lag_events = lag_s, lag_events
        self._waiting: deque[Arrivals] = deque()
        self._since: float | None = None
        """When the oldest batch waiting was handed over."""
        self._count = 0
        self._left_out: Counter[str] = Counter()
        """Bulk events left out of waiting batches, not yet counted in the session's ``left_out``: the fold's
        thread adds them when it takes the next batch (counted here, :meth:`put` never waits for the session's
        lock, which the fold holds while it folds: the session thread's puts waited 5.8 s in a 20 s run at a
        million events a second)."""
        self._closing = False
        self._error: BaseException | None = None
        self._changed = threading.Condition()
        self._thread = threading.Thread(target=self._run, name="meshtop-fold", daemon=True)
        self._thread.start()

    def put(self, arrivals: Arrivals) -> None:
        """Hand over a batch already on disk (an error of the fold thread's is raised here)."""
        self._raise()
        with self._changed:
            self._waiting.append(arrivals)
            self._since = self._since or time.monotonic()
            self._count += arrivals.count
            if self._count > self.backlog:
                self._leave_out_bulk()
            self._changed.notify()

    def close(self) -> None:
        """Fold every batch handed over, then stop the thread (raising its error, if it had one)."""
        with self._changed:
            self._closing = True
            self._changed.notify()
        self._thread.join()
        self._raise()

    def _leave_out_bulk(self, bound: int | None = None) -> None:
        """Drop the waiting batches' bulk blocks, oldest first, until the backlog is within ``bound`` (its own
        bound when ``None``; 0: all of them)."""
        kinds = self.recorder.session.kinds
        bound = self.backlog if bound is None else bound
        for arrivals in self._waiting:
            if self._count <= bound:
                return
            kept = []
            for item in arrivals.items:
                if item.kind in BULK_KINDS:
                    count = event_count(item)
                    self._count -= count
                    if item.kind in kinds:
                        self._left_out[item.kind] += count
                else:
                    kept.append(item)
            arrivals.items = kept

    def _run(self) -> None:
        while True:
            with self._changed:
                while not self._waiting and not self._closing:
                    self._changed.wait()
                if not self._waiting:
                    return
                if self._count > self.lag_events and time.monotonic() - (self._since or 0.0) > self.lag_s:
                    self._leave_out_bulk(0)
                batch = Arrivals(item for arrivals in self._waiting for item in arrivals.items)
                self._waiting.clear()
                self._count, self._since = 0, None
                left_out, self._left_out = self._left_out, Counter()
            if left_out:
                with self.recorder.session.lock:
                    self.recorder.session.left_out.update(left_out)
            try:
                self.then(batch, self.recorder.fold(batch, bulk_left_out=bool(left_out)))
            except BaseException as error:  # raised again on the session's thread
                self._error = error
                with self._changed:
                    self._waiting.clear()
                    self._closing = True
                return

    def _raise(self) -> None:
        if self._error is not None:
            error, self._error = self._error, None
            raise error
