"""Where the dashboard's events come from: a live job or a recording, behind one interface.

Once a frame the app hands its state to ``source.poll(state)``, which gives
it what the source has (``DashboardState.apply``, typed tables from
:mod:`meshtop.recordings.schema`'s decoder either way) and returns the state to draw:
the same one, or for a replay that moved back, an earlier snapshot carried
forward. The figures come from the source's session fold (:attr:`Source.session`;
the state reads it): a live session's fold thread feeds it, a replay as it plays.
The app cannot tell a live job from a replay, except that a replay also offers
:class:`Playback` controls.
"""

from __future__ import annotations

import copy
import threading
import time
from bisect import bisect_right
from collections import deque
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, TextIO

import pyarrow as pa

from meshtop.probes.arrivals import Arrivals
from meshtop.probes.errors import MeshtopError
from meshtop.probes.kinds import COALESCIBLE_KINDS, SHOWN_KINDS
from meshtop.recordings.manifest import Manifest, RunDescription
from meshtop.recordings.metrics.steps import JobStep
from meshtop.recordings.prometheus import RunMetrics
from meshtop.recordings.reader import Recording
from meshtop.recordings.replay import Timeline, in_kind_order, load_timeline
from meshtop.recordings.session_fold import Folded, SessionFold, arrival_tables
from meshtop.recordings.summary import job_status
from meshtop.runner.job.control import JobControl
from meshtop.runner.job.files import PHASE_NAME
from meshtop.runner.results import JobResult
from meshtop.runner.session.console import ProgressPrinter
from meshtop.runner.session.session import SessionOptions, Work, run_session
from meshtop.tui.state import DashboardState

SCREEN_BACKLOG = 200_000
"""Events a live source holds for the screen between two frames; beyond it the oldest high-rate events are
skipped, for the screen only (the recording keeps every event), and counted."""
ROWS_PER_FRAME = 250_000
"""A replay folds at most this many rows a frame; a longer seek goes on over the next frames."""
SNAPSHOT_ROWS = 200_000
"""A replay keeps a copy of its state after about this many rows, to seek back from."""
MAX_SNAPSHOTS = 32

Batch = tuple[str, pa.Table]


class Source(Protocol):
    description: RunDescription
    """What runs: plan, model, device, lengths, load."""
    error: BaseException | None
    """What broke the session (a full disk, say), once it did; the app quits and the CLI reports it."""

    @property
    def recording(self) -> str | None:
        """Where the session is recorded, if it is."""

    @property
    def session(self) -> SessionFold:
        """The session's fold, which the dashboard's state reads (a replay's state after a jump back reads a
        snapshot's copy)."""

    def start(self) -> None: ...
    def poll(self, state: DashboardState) -> DashboardState:
        """Fold what arrived into ``state``; the state to draw."""

    def now_ns(self) -> int: ...
    def started_ns(self) -> int | None:
        """Where the dashboard's elapsed time counts from (``None`` until known)."""

    def stop(self) -> None: ...
    def finish(self) -> None:
        """End the work as it ends by itself where it can (a live run until stopped ends after its next steps
        and completes, :mod:`meshtop.runner.rank.until`); else stop it."""

    def wait(self, timeout_s: float | None = None) -> bool:
        """Wait until the source is done (a live session's recording closed); whether it is."""

    def ask_stacks(self, ranks: Iterable[int] | None) -> str | None:
        """Ask for py-spy dumps; a reason when this source cannot take them."""

    def ask_stop(self) -> str | None:
        """Stop the job as a run with a fixed number of steps is stopped; a reason when this source cannot."""

    @property
    def owns_job(self) -> bool:
        """Whether closing the dashboard ends the job (``run``), or leaves it as it is (a replay, a viewer)."""

    def launcher_phase(self) -> str | None:
        """What a live job's launcher does before the ranks report (``None``: nothing to say)."""

    @property
    def finished(self) -> bool: ...
    @property
    def status(self) -> str: ...
    @property
    def playback(self) -> Playback | None: ...


class ScreenBacklog:
    """Batches of events waiting for the next frame, safe across threads.

    Beyond ``limit`` events the oldest batches of the coalescible kinds (:data:`meshtop.probes.kinds.KINDS`)
    are skipped, for the screen only, and counted; every other batch waits whatever the count, and order is kept.
    """

    def __init__(self, limit: int = SCREEN_BACKLOG) -> None:
        self.limit = limit
        self.skipped = 0
        self.peak = 0
        """The most events ever waiting at once."""
        self._batches: deque[Batch] = deque()
        self._steps: list[JobStep] = []
        """Job steps the session's fold completed with these batches (never skipped)."""
        self._count = 0
        self._lock = threading.Lock()

    def put(self, batches: list[Batch], steps: list[JobStep] | None = None) -> None:
        with self._lock:
            self._batches.extend(batches)
            self._steps.extend(steps or ())
            self._count += sum(len(table) for _, table in batches)
            if self._count > self.limit:
                self._coalesce()
            self.peak = max(self.peak, self._count)

    def _coalesce(self) -> None:
        """Skip the oldest skippable batches until the backlog is within its limit (or none is left)."""
        kept: deque[Batch] = deque()
        while self._batches:
            kind, table = self._batches.popleft()
            if self._count > self.limit and kind in COALESCIBLE_KINDS:
                self._count -= len(table)
                self.skipped += len(table)
            else:
                kept.append((kind, table))
        self._batches = kept

    @property
    def waiting(self) -> bool:
        """Whether anything waits for the next frame."""
        with self._lock:
            return bool(self._batches or self._steps)

    def show_on(self, state: DashboardState) -> None:
        """Apply every batch waiting to ``state`` (kinds in the fold's order), then the job steps they completed."""
        batches, steps = self.take_with_steps()
        for kind, table in in_kind_order(batches):
            state.apply(kind, table)
        state.take_steps(steps)

    def take_with_steps(self) -> tuple[list[Batch], list[JobStep]]:
        """Every batch waiting, oldest first, and the job steps they completed, at once."""
        with self._lock:
            batches, self._batches, self._count = list(self._batches), deque(), 0
            steps, self._steps = self._steps, []
        return batches, steps


def screen_batches(
    arrivals: Arrivals, decoded: list[Batch] | None = None, *, left_out: Collection[str] = ()
) -> list[Batch]:
    """What the screen reads of ``arrivals``, a table a kind: those of ``decoded`` (the tables the session's fold
    already decoded) as they are, the rest decoded here (each kind's blocks together) but ``left_out``, the
    kinds the session's fold left out to keep up (the screen would fall behind on them too)."""
    taken = [(kind, table) for kind, table in decoded or () if kind in SHOWN_KINDS]
    return [*taken, *arrival_tables(arrivals, SHOWN_KINDS - {kind for kind, _ in taken} - set(left_out))]


class LiveSource:
    """A job launched now: runs the session on a background thread and hands its events to the screen."""

    def __init__(
        self,
        run: Work,
        *,
        directory: Path,
        manifest: Manifest | None,
        options: SessionOptions = SessionOptions(),
        backlog: int = SCREEN_BACKLOG,
    ) -> None:
        self.run = run
        self.options = options
        self.directory = directory
        self.manifest = manifest
        self.description = manifest.run if manifest is not None else run.describe()
        self.session = SessionFold(self.description)
        """The session's fold: the session thread feeds it, the dashboard and ``/metrics`` read it."""
        self.recording = str(directory) if manifest is not None else None
        self.control = JobControl()
        self.control.stop_on_hang = False  # the dashboard shows the report and asks
        self.result: JobResult | None = None
        self.error: BaseException | None = None
        self.backlog = ScreenBacklog(backlog)
        self._thread = threading.Thread(target=self._run, name="meshtop-session", daemon=True)
        self._started_ns: int | None = None
        self._screen = True
        self._printer: ProgressPrinter | None = None
        """``record``'s progress lines, once detached."""
        self._ended_ns: int | None = None
        self._ended = threading.Event()
        """Set when the session thread has ended: waited on instead of ``Thread.join``, which a signal's
        exception (SIGTERM, Ctrl-C) can leave believing a running thread has ended (CPython 3.11)."""

    def _run(self) -> None:
        try:
            self._run_session()
        finally:
            self._ended_ns = time.time_ns()
            self._ended.set()

    def _run_session(self) -> None:
        try:
            self.result = run_session(
                self.run,
                directory=self.directory,
                manifest=self.manifest,
                on_events=self._take,
                options=self.options,
                control=self.control,
                session=self.session,
            )
        except BaseException as error:  # handed to the app, which reports it and exits
            self.error = error

    def _take(self, arrivals: Arrivals, folded: Folded) -> None:
        """The session thread's callback: decode what the screen reads there, not in the screen's frames."""
        if self._screen:
            self.backlog.put(screen_batches(arrivals, folded.tables, left_out=folded.left_out), folded.steps)
        elif self._printer is not None:
            self._printer.take(arrivals, folded)

    def headless(self, console: TextIO | None = None) -> None:
        """No screen reads the events any more (its terminal went away, or it was detached): the session records
        them, a hang stops the job as in ``record``, and ``console`` (where given) takes ``record``'s progress."""
        self.control.stop_on_hang = True
        if console is not None:
            running_s = (time.time_ns() - (self._started_ns or time.time_ns())) / 1e9
            self._printer = ProgressPrinter(self.run.total_steps(), self.session, console, running_s=running_s)
        self._screen = False

    def start(self) -> None:
        self._started_ns = time.time_ns()
        self._thread.start()

    def started_ns(self) -> int | None:
        return self._started_ns

    def poll(self, state: DashboardState) -> DashboardState:
        self.backlog.show_on(state)
        state.coalesced = self.backlog.skipped + self.session.left_out.total()
        return state

    def launcher_phase(self) -> str | None:
        return launcher_phase_in(self.directory)

    def now_ns(self) -> int:
        """Wall time, until the session ended: its end from then (the elapsed clock stops with the job)."""
        return self._ended_ns if self._ended_ns is not None else time.time_ns()

    def stop(self) -> None:
        self.control.stop.set()

    def finish(self) -> None:
        self.control.finish.set()

    def wait(self, timeout_s: float | None = None) -> bool:
        """Whether the session ended, waiting up to ``timeout_s`` for it (one never started has nothing to end)."""
        return self._thread.ident is None or self._ended.wait(timeout_s)

    def ask_stacks(self, ranks: Iterable[int] | None) -> str | None:
        if self.finished:
            return "the job has ended: no process to dump"
        self.control.ask_stacks(ranks)
        return None

    def ask_stop(self) -> str | None:
        self.stop()
        return None

    @property
    def finished(self) -> bool:
        return self._ended.is_set()

    @property
    def status(self) -> str:
        if self.result is not None:
            return self.result.status
        if self.error is not None:
            return "failed"
        return "stopping" if self.control.stop.is_set() or self.control.finish.is_set() else "running"

    @property
    def playback(self) -> None:
        return None

    @property
    def owns_job(self) -> bool:
        return True


def launcher_phase_in(directory: Path) -> str | None:
    """What a live job's launcher in ``directory`` does before its ranks report, in words."""
    try:
        return (directory / PHASE_NAME).read_text()[:200] or None
    except OSError:  # not written yet
        return None


class Playback:
    """A replay's position in its recording and how it moves: pause, speed, step and seek."""

    SPEEDS = (0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0)

    def __init__(self, timeline: Timeline, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.timeline = timeline
        self.start_ns, self.end_ns = timeline.start_ns, timeline.end_ns
        self.position_ns = timeline.data_start_ns()
        """Opens where the job's data starts, not at the launch (Home goes there)."""
        self.speed = 1.0
        self.paused = False
        self._clock = clock
        self._ticked = clock()
        self._step_ends = timeline.step_ends()

    @property
    def steps(self) -> int:
        return len(self._step_ends)

    @property
    def fraction(self) -> float:
        length = self.end_ns - self.start_ns
        return (self.position_ns - self.start_ns) / length if length > 0 else 1.0

    @property
    def at_end(self) -> bool:
        return self.position_ns >= self.end_ns

    def advance(self) -> None:
        """Move the position by the time since the last call, at the playback speed."""
        now = self._clock()
        if not self.paused and not self.at_end:
            self.position_ns = min(self.end_ns, self.position_ns + int((now - self._ticked) * 1e9 * self.speed))
        self._ticked = now

    def toggle_pause(self) -> None:
        self.paused = not self.paused

    def faster(self) -> None:
        self.speed = next((s for s in self.SPEEDS if s > self.speed), self.speed)

    def slower(self) -> None:
        self.speed = next((s for s in reversed(self.SPEEDS) if s < self.speed), self.speed)

    def current_step(self) -> int | None:
        """The last step finished at the position."""
        index = bisect_right(self._step_ends, (self.position_ns, 1 << 62)) - 1
        return self._step_ends[index][1] if index >= 0 else None

    def to_start(self) -> None:
        """Pause at the recording's first event (the launch)."""
        self.paused = True
        self.position_ns = self.start_ns

    def to_end(self) -> None:
        """Jump to the end: everything recorded, shown at once."""
        self.position_ns = self.end_ns

    def step_forward(self) -> None:
        """Pause at the end of the next step."""
        self.paused = True
        following = next((end for end, _ in self._step_ends if end > self.position_ns), self.end_ns)
        self.position_ns = following

    def step_back(self) -> None:
        """Pause at the end of the previous step (or the start)."""
        self.paused = True
        earlier = [end for end, _ in self._step_ends if end < self.position_ns]
        self.position_ns = earlier[-1] if earlier else self.start_ns

    def seek_step(self, step: int) -> None:
        """Position at the end of ``step`` (0-based); a :class:`MeshtopError` if the recording has no such step."""
        for end, number in self._step_ends:
            if number == step:
                self.position_ns = end
                return
        last = self._step_ends[-1][1] + 1 if self._step_ends else 0
        raise MeshtopError(f"no step {step + 1} in this recording (it has steps 1 to {last})")

    def seek_time(self, seconds: float) -> None:
        """Position ``seconds`` after the start, within the recording."""
        self.position_ns = max(self.start_ns, min(self.end_ns, self.start_ns + int(seconds * 1e9)))

    def seek_fraction(self, fraction: float) -> None:
        self.position_ns = self.start_ns + int(max(0.0, min(1.0, fraction)) * (self.end_ns - self.start_ns))


@dataclass(frozen=True, slots=True)
class _Snapshot:
    folded_ns: int | None
    """The state holds every row up to this time (``None``: none yet)."""
    state: DashboardState


class ReplaySource:
    """A recording played back through the same door as a live job: its tables' rows up to the playback
    position, folded a bounded number a frame, with snapshots to seek back from."""

    def __init__(
        self,
        recording: Recording,
        *,
        clock: Callable[[], float] = time.monotonic,
        rows_per_frame: int = ROWS_PER_FRAME,
        snapshot_rows: int = SNAPSHOT_ROWS,
        metrics: bool = False,
        metrics_per_rank: bool = False,
    ) -> None:
        self.description = recording.manifest.run
        self.session = SessionFold(self.description)
        """The fold of what has been played, for the first state (``poll`` folds into the state's own: after a
        jump, a snapshot's copy)."""
        self._per_rank = metrics_per_rank
        self.metrics = RunMetrics(self.description, per_rank=metrics_per_rank) if metrics else None
        """The Prometheus series of what has been played (``--metrics-port``), started anew at each jump; they
        read the state's fold."""
        self.recording = str(recording.path)
        self._gpus = recording.manifest.gpus
        self.error: BaseException | None = None
        self.problems = recording.problems
        self.timeline = load_timeline(recording)
        self._playback = Playback(self.timeline, clock=clock)
        self._recorded_status = job_status(recording)
        self.rows_per_frame = rows_per_frame
        self.snapshot_rows = max(snapshot_rows, self.timeline.rows // MAX_SNAPSHOTS)
        self._folded_ns: int | None = None
        """The state holds every row up to this time (``None``: none yet)."""
        self._since_snapshot = 0
        self._snapshots: list[_Snapshot] = []

    def start(self) -> None:
        self._playback.advance()

    @property
    def caught_up(self) -> bool:
        """Whether the state shows the playback position (a long seek takes a few frames)."""
        return self._folded_ns is not None and self._folded_ns >= self._playback.position_ns

    def poll(self, state: DashboardState) -> DashboardState:
        self._playback.advance()
        target = self._playback.position_ns
        if not self._snapshots:
            with state.session.reading() as fold:
                fold.know_gpus(self._gpus)  # as summary does: the GPUs the session saw
            self._snapshots.append(_Snapshot(None, copy.deepcopy(state)))
        nearest = [s for s in self._snapshots if s.folded_ns is None or s.folded_ns <= target][-1]
        behind = self._folded_ns is not None and target < self._folded_ns
        ahead = nearest.folded_ns is not None and (self._folded_ns is None or nearest.folded_ns > self._folded_ns)
        if behind or ahead:  # moved back, or far ahead past a snapshot: carry on from the nearest
            state, self._folded_ns, self._since_snapshot = copy.deepcopy(nearest.state), nearest.folded_ns, 0
            if self.metrics is not None:  # counters only grow: the series start again, up to the snapshot
                restarted = RunMetrics(self.description, per_rank=self._per_rank)  # published whole, never half-built
                restarted.follow(state.session)  # first: the collectives counted again are labelled by its nodes
                if nearest.folded_ns is not None:
                    restarted.count(self.timeline.between(None, nearest.folded_ns))
                self.metrics = restarted
        if self.metrics is not None:
            self.metrics.follow(state.session)  # the state's fold: a jump carries on from a copy
        after = self._folded_ns
        if after is not None and after >= target:
            return state
        until = self.timeline.time_within(after if after is not None else -1, target, self.rows_per_frame)
        played = self.timeline.between(after, until)
        state.play(played)
        self._since_snapshot += sum(len(table) for _, table in played)
        if self.metrics is not None:
            self.metrics.count(played)
        self._folded_ns = until
        if until >= self.timeline.end_ns and state.ended is None:
            state.finish(self._recorded_status)
        if self._since_snapshot >= self.snapshot_rows:
            self._keep(state)
        return state

    def _keep(self, state: DashboardState) -> None:
        """Keep a copy of ``state`` to seek to (thinned out past :data:`MAX_SNAPSHOTS`, keeping the first)."""
        snapshot = _Snapshot(self._folded_ns, copy.deepcopy(state))
        self._snapshots = sorted([*self._snapshots, snapshot], key=lambda s: -1 if s.folded_ns is None else s.folded_ns)
        if len(self._snapshots) > MAX_SNAPSHOTS:
            del self._snapshots[1::2]
        self._since_snapshot = 0

    def now_ns(self) -> int:
        return self._playback.position_ns

    def started_ns(self) -> int | None:
        return self._playback.start_ns

    def stop(self) -> None:
        self._playback.paused = True

    def finish(self) -> None:
        self.stop()

    def wait(self, timeout_s: float | None = None) -> bool:
        return True

    def launcher_phase(self) -> None:
        return None

    def ask_stacks(self, ranks: Iterable[int] | None) -> str | None:
        return "a replay shows the stack dumps taken while recording; it cannot take new ones"

    def ask_stop(self) -> str | None:
        return "a replay has no job to stop"

    @property
    def owns_job(self) -> bool:
        return False

    @property
    def finished(self) -> bool:
        return self._playback.at_end

    @property
    def status(self) -> str:
        if not self.caught_up:
            return "seeking"
        return self._recorded_status if self.finished else "replaying"

    @property
    def playback(self) -> Playback:
        return self._playback
