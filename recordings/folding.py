"""A live session's fold, on a thread of its own: the thread that receives the events never waits for it.

The session thread drains the collector, writes each batch into the recording, and hands it to this thread,
which folds it into the session's fold and passes it on (``/metrics``, the console, the dashboard). Were the
two one thread, a fold that falls behind (a thousand ranks' steps to break down) would hold the next drain
back, the collector would fill, and what it refuses would be lost to the recording too.

Rules:

- batches are folded in the order they came, each once; the fold takes every batch waiting at once;
- the events waiting for the fold are bounded (:data:`FOLD_BACKLOG`): past the bound, the waiting batches'
  bulk kinds (:data:`~meshtop.probes.kinds.BULK_KINDS`) are left out of the fold, oldest first, and so out of
  the live view (already on disk: counted in the session's ``left_out``, which the dashboard says); no other
  kind is ever left out (a lost start or step would be a hole in every figure);
- an error raised on the fold thread is raised again by the next :meth:`FoldThread.put` or by
  :meth:`FoldThread.close`, which waits for every batch handed over to be folded.
"""

from __future__ import annotations

import threading
from collections import Counter, deque
from collections.abc import Callable

from meshtop.probes.arrivals import Arrivals, event_count
from meshtop.probes.kinds import BULK_KINDS
from meshtop.recordings.recorder import SessionRecorder
from meshtop.recordings.session_fold import Folded

FOLD_BACKLOG = 100_000
"""Events waiting for the fold past which the bulk kinds' blocks waiting are left out of it. The live view is
then at most as late as the fold takes over this many events; a small job never has so many waiting (64 ranks
send about 10,000 a second), so it keeps its collectives on a busy machine, where a fold held up for a moment
(a collection, a test beside others) would otherwise lose them."""


class FoldThread:
    """Folds a live session's recorded batches on a thread of its own, in order, then hands each to ``on_folded``."""

    def __init__(
        self,
        recorder: SessionRecorder,
        on_folded: Callable[[Arrivals, Folded], None],
        *,
        backlog: int = FOLD_BACKLOG,
    ) -> None:
        self.recorder = recorder
        self.on_folded = on_folded
        self.backlog = backlog
        self._waiting: deque[Arrivals] = deque()
        self._count = 0
        self._left_out: Counter[str] = Counter()
        """Bulk events left out of waiting batches, not yet counted in the session's ``left_out``: the fold's
        thread adds them when it takes the next batch (counted here, :meth:`put` never waits for the session's
        lock, which the fold holds while it folds a batch)."""
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

    def _leave_out_bulk(self) -> None:
        """Drop the waiting batches' bulk blocks, oldest first, until the backlog is within its bound."""
        kinds = self.recorder.session.kinds
        for index, arrivals in enumerate(self._waiting):
            if self._count <= self.backlog:
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
            self._waiting[index] = Arrivals(kept)  # a batch of its own: the caller's stays whole

    def _run(self) -> None:
        while True:
            with self._changed:
                while not self._waiting and not self._closing:
                    self._changed.wait()
                if not self._waiting:
                    return
                batch = Arrivals(item for arrivals in self._waiting for item in arrivals.items)
                self._waiting.clear()
                self._count = 0
                left_out, self._left_out = self._left_out, Counter()
            if left_out:
                with self.recorder.session.lock:
                    self.recorder.session.left_out.update(left_out)
            try:
                self.on_folded(batch, self.recorder.fold(batch, bulk_left_out=bool(left_out)))
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
