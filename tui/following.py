"""``meshtop watch``'s source: a job that another meshtop (``run`` or ``record``) is recording, followed as its
recording grows, without owning it.

A thread of its own reads what the writer added (:class:`meshtop.recordings.follow.RecordingTail`), from the
recording's first event, folds it into the viewer's own session fold and hands the screen its kinds, as a live
session's fold thread does (:class:`meshtop.tui.sources.LiveSource`): the dashboard draws a viewer's frames
at the same cost as the writer's own. Closing the viewer ends nothing; acting on the job goes through the
writer's control socket (:mod:`meshtop.runner.session.control_socket`), for its owner only.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable
from datetime import datetime
from pathlib import Path

from meshtop.probes.kinds import SHOWN_KINDS
from meshtop.recordings.follow import Batch, RecordingTail
from meshtop.recordings.manifest import RecordingError, read_manifest
from meshtop.recordings.reader import Recording
from meshtop.recordings.session_fold import SessionFold
from meshtop.recordings.writers import read_writer, running_status, writer_state
from meshtop.runner.session.control_socket import ControlRefused, ask
from meshtop.tui.sources import SCREEN_BACKLOG, ScreenBacklog, launcher_phase_in
from meshtop.tui.state import DashboardState

FOLLOW_S = 0.2
"""How often the viewer reads what the writer added: the writer flushes five times a second."""
WRITER_CHECK_S = 1.0
"""How often it asks whether the writer still lives (a writer killed leaves its manifest saying running)."""
GONE = "writer gone"
"""The status of a recording whose writer died without closing it."""


class WatchSource:
    """A recording being written, followed from its start until its writer closes it (or is gone)."""

    def __init__(self, recording: Recording, *, backlog: int = SCREEN_BACKLOG, follow_s: float = FOLLOW_S) -> None:
        self.directory = recording.path
        self.description = recording.manifest.run
        self.session = SessionFold(self.description)
        self.recording = str(recording.path)
        self.error: BaseException | None = None
        self.backlog = ScreenBacklog(backlog)
        self.tail = RecordingTail(recording.path)
        self.follow_s = follow_s
        self.writer = read_writer(recording.path)
        self._started_ns = _started_ns(recording)
        self._ended_ns: int | None = None
        self._status = "running"
        self._closing = threading.Event()
        self._ended = threading.Event()
        self._thread = threading.Thread(target=self._follow, name="meshtop-watch", daemon=True)

    def _follow(self) -> None:
        checked = 0.0
        try:
            while not self._closing.is_set():
                status = self._recorded_status()
                if status == "running" and time.monotonic() - checked >= WRITER_CHECK_S:
                    checked = time.monotonic()
                    if self.writer is not None and writer_state(self.writer) == "gone":
                        status = GONE
                ended = status != "running"
                self._take(self.tail.read(to_end=ended))
                if ended:
                    self._status = status
                    return
                self._closing.wait(self.follow_s)
        except BaseException as error:  # handed to the app, which reports it and exits
            self.error = error
        finally:
            self.tail.close()
            self._ended_ns = time.time_ns()
            self._ended.set()

    def _recorded_status(self) -> str:
        try:
            return read_manifest(self.directory).status
        except RecordingError:  # replaced as it was read (it is written by rename): read again next time
            return "running"

    def _take(self, tables: list[Batch]) -> None:
        """Fold what was read (in the fold's order already) and hand the screen its kinds."""
        steps = self.session.take_tables([(kind, table) for kind, table in tables if kind in self.session.kinds])
        self.backlog.put([(kind, table) for kind, table in tables if kind in SHOWN_KINDS], steps)

    def start(self) -> None:
        self._thread.start()

    def poll(self, state: DashboardState) -> DashboardState:
        self.backlog.show_on(state)
        state.coalesced = self.backlog.skipped
        if self.finished and state.ended is None and not self.backlog.waiting:
            state.finish("interrupted" if self._status == GONE else self._status)
        return state

    def now_ns(self) -> int:
        return self._ended_ns if self._ended_ns is not None else time.time_ns()

    def started_ns(self) -> int | None:
        return self._started_ns

    def launcher_phase(self) -> str | None:
        return launcher_phase_in(self.directory)

    def stop(self) -> None:
        """Stop following (the job goes on)."""
        self._closing.set()

    def finish(self) -> None:
        self.stop()

    def wait(self, timeout_s: float | None = None) -> bool:
        return self._thread.ident is None or self._ended.wait(timeout_s)

    def ask_stacks(self, ranks: Iterable[int] | None) -> str | None:
        return self._ask("stacks", None if ranks is None else sorted(ranks))

    def ask_stop(self) -> str | None:
        return self._ask("stop", None)

    def _ask(self, action: str, ranks: list[int] | None) -> str | None:
        if self.finished:
            return "the job has ended: nothing to act on"
        try:
            ask(self.directory, action, ranks)
        except ControlRefused as refused:
            return str(refused)
        return None

    @property
    def finished(self) -> bool:
        return self._ended.is_set()

    @property
    def status(self) -> str:
        return self._status if self.finished else "watching"

    @property
    def playback(self) -> None:
        return None

    @property
    def owns_job(self) -> bool:
        return False


def _started_ns(recording: Recording) -> int | None:
    """When the job started, by its manifest."""
    started = recording.manifest.started_at
    try:
        return int(datetime.fromisoformat(started).timestamp() * 1e9) if started else None
    except ValueError:
        return None


def writer_note(directory: Path) -> str | None:
    """Why a recording that says running is not live (:func:`~meshtop.recordings.writers.running_status`'s rule),
    in words; ``None`` where its writer lives, or runs on another host and cannot be asked."""
    writer = read_writer(directory)
    if running_status(writer) == "running":
        return None
    if writer is None:
        return "no writer named (an older meshtop's recording, cut short): what it wrote"
    return f"writer gone (pid {writer.pid} on {writer.host}): what it wrote"
