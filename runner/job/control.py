"""Requests from the user's side (the dashboard, ``record``'s signals, a relay) to a running job."""

from __future__ import annotations

import threading
from collections.abc import Iterable

from meshtop.probes.events import HangDetected


class JobControl:
    """Requests from the user's side to a running job, safe to make from any thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._stacks: set[int] | None = None
        self._stacks_asked = False
        self.stop = threading.Event()
        """Set to stop every rank; the job then ends ``interrupted`` (``failed`` after a hang report)."""
        self.finish = threading.Event()
        """Set to end a run until stopped after a step, as one with a fixed number of steps ends (it then
        completes; stopped as by ``stop`` where the ranks do not end it in time, or before its first step:
        :class:`meshtop.runner.rank.until.FinishRequest`). Other jobs are stopped."""
        self.stop_on_hang = True
        """Stop the job when a hang is detected (headless); else report it and keep waiting (the dashboard asks)."""
        self.hang: HangDetected | None = None
        """The last hang reported, if any."""

    def ask_stacks(self, ranks: Iterable[int] | None = None) -> None:
        """A py-spy dump of ``ranks`` (every rank when ``None``) at the next delivery."""
        with self._lock:
            if ranks is None or (self._stacks_asked and self._stacks is None):
                self._stacks = None
            else:
                self._stacks = (self._stacks or set()) | set(ranks)
            self._stacks_asked = True

    @property
    def stacks_asked(self) -> bool:
        """A stack dump is asked for and not yet taken."""
        with self._lock:
            return self._stacks_asked

    def take_stack_request(self, pids: dict[int, int]) -> dict[int, int] | None:
        """The ``{rank: pid}`` to dump now, of those in ``pids`` (this node's); ``None`` when nothing was asked."""
        with self._lock:
            asked, ranks = self._stacks_asked, self._stacks
            self._stacks_asked, self._stacks = False, None
        if not asked:
            return None
        return dict(pids) if ranks is None else {rank: pid for rank, pid in pids.items() if rank in ranks}
