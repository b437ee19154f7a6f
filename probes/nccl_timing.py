"""nccl's operations, timed by their CUDA events (an nccl future completes when the work is queued) and read
by a watcher thread once done, so the host never blocks on the device."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from torch._C._distributed_c10d import Work

from meshtop.probes.device_clock import StreamSpan
from meshtop.probes.in_flight import Issued

DEVICE_POLL_S = 0.002
"""How often the watcher asks the pending works whether they are done."""


class NcclTimings:
    """A watcher thread that ends each pending nccl operation once its CUDA events say it finished."""

    def __init__(self, *, completed: Callable[..., None], on_error: Callable[[str], None]) -> None:
        self.completed = completed
        """Takes a finished operation, with ``end_ns`` and ``clock`` (``None`` where its timing failed)."""
        self.on_error = on_error
        self.pending: list[tuple[Work | StreamSpan, Issued]] = []
        """Issued, in the order issued, and not yet seen done."""
        self._lock = threading.Lock()
        self._watcher: threading.Thread | None = None
        self._stopping = threading.Event()

    def add(self, work: Work | StreamSpan, issued: Issued) -> None:
        with self._lock:
            self.pending.append((work, issued))

    def start(self) -> None:
        """Start the watcher, unless it runs."""
        self._stopping.clear()
        if self._watcher is None or not self._watcher.is_alive():
            self._watcher = threading.Thread(target=self._watch, name="meshtop-nccl-timing", daemon=True)
            self._watcher.start()

    def stop(self) -> None:
        self._stopping.set()

    def _watch(self) -> None:
        while not self._stopping.is_set():
            with self._lock:
                pending, self.pending = self.pending, []
            still = []
            for work, issued in pending:
                try:
                    if not work.is_completed():
                        still.append((work, issued))
                        continue
                    duration_ms = work._get_duration()  # type: ignore[union-attr]  # Work's is not in its stubs
                    self.completed(issued, end_ns=issued.start_ns + int(duration_ms * 1e6), clock="cuda_events")
                except Exception as error:
                    self.on_error(f"nccl timing ({issued.shape.op}): {error!r}")
                    self.completed(issued)
            if still:
                with self._lock:
                    self.pending[:0] = still
            time.sleep(DEVICE_POLL_S)
