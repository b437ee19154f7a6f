"""Where the dashboard's events come from: a live job or a recording, behind one interface.

The app calls ``poll()`` once a frame and folds what it gets into its
state; it cannot tell a live job from a replay, except that a replay also
offers :class:`Playback` controls.
"""

from __future__ import annotations

import threading
import time
from bisect import bisect_right
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from probes.arrivals import Arrivals
from probes.errors import MeshtopError
from probes.events import Event, RequestDone, StepTiming
from recordings.reader import Recording
from recordings.replay import Timeline, event_time_ns, load_timeline
from recordings.steps import JobStep
from runner.launch import JobControl, JobResult, NodeProbes
from runner.plan import ResolvedRun
from tui.console import RequestTally
from tui.session import run_session

SCREEN_BACKLOG = 200_000
"""Events a live source holds for the screen between two frames; beyond it the oldest are dropped for
the screen only (the recording keeps every event) and counted."""


@dataclass(frozen=True, slots=True)
class Update:
    """What a source has for the next frame."""

    events: list[Event]
    reset: bool = False
    """Start the state afresh before applying ``events`` (a replay seeking backwards)."""


class ScreenBacklog:
    """Event batches waiting for the next frame, at most ``limit`` events (safe across threads).

    Beyond the limit the oldest batches are dropped, for the screen only, and counted.
    """

    def __init__(self, limit: int = SCREEN_BACKLOG) -> None:
        self.limit = limit
        self.dropped = 0
        self.peak = 0
        """The most events ever waiting at once."""
        self._batches: deque[list[Event]] = deque()
        self._count = 0
        self._lock = threading.Lock()

    def put(self, events: list[Event]) -> None:
        with self._lock:
            self._batches.append(events)
            self._count += len(events)
            while self._count > self.limit and len(self._batches) > 1:
                oldest = self._batches.popleft()
                self._count -= len(oldest)
                self.dropped += len(oldest)
            self.peak = max(self.peak, self._count)

    def take(self) -> list[Event]:
        """Everything waiting, oldest first."""
        with self._lock:
            batches, self._batches, self._count = self._batches, deque(), 0
        return [event for batch in batches for event in batch]


class Source(Protocol):
    description: dict[str, Any]
    """The run description (a manifest's fields: plan, model, device, ...)."""
    recording: str | None
    """Where the session is recorded, if it is."""

    def start(self) -> None: ...
    def poll(self) -> Update: ...
    def now_ns(self) -> int: ...
    def started_ns(self) -> int | None:
        """Where the dashboard's elapsed time counts from (``None`` until known)."""
    def stop(self) -> None: ...
    def ask_stacks(self, ranks: Iterable[int] | None) -> str | None:
        """Ask for py-spy dumps; a reason when this source cannot take them."""
    @property
    def finished(self) -> bool: ...
    @property
    def status(self) -> str: ...
    @property
    def playback(self) -> Playback | None: ...


class LiveSource:
    """A job launched now: runs the session on a background thread and hands its events to the screen."""

    def __init__(self, run: ResolvedRun, *, directory: Path, manifest: dict[str, Any] | None,
                 node_probes: NodeProbes = NodeProbes(), backlog: int = SCREEN_BACKLOG,
                 hang_timeout_s: float | None = None) -> None:
        self.run = run
        self.directory = directory
        self.manifest = manifest
        self.description: dict[str, Any] = manifest if manifest is not None else run.describe()
        self.recording = str(directory) if manifest is not None else None
        self.node_probes = node_probes
        self.control = JobControl()
        self.control.stop_on_hang = False  # the dashboard shows the report and asks
        self.hang_timeout_s = hang_timeout_s
        self.result: JobResult | None = None
        self.error: BaseException | None = None
        self.backlog = ScreenBacklog(backlog)
        self.steps: list[JobStep] = []
        """The job's steps as they completed (for the closing verdict)."""
        self.requests = RequestTally(run.load.requests) if run.load is not None else None
        """An inference load's answered requests (for the closing verdict)."""
        self._thread = threading.Thread(target=self._run, name="meshtop-session", daemon=True)
        self._started_ns: int | None = None

    def _run(self) -> None:
        try:
            self.result = run_session(self.run, directory=self.directory, manifest=self.manifest,
                                      on_events=self._take, node_probes=self.node_probes, control=self.control,
                                      hang_timeout_s=self.hang_timeout_s)
        except BaseException as error:  # noqa: BLE001 - handed to the app, which reports it and exits
            self.error = error

    def _take(self, arrivals: Arrivals, steps: list[JobStep]) -> None:
        events = arrivals.events()  # on this session thread, not in the screen's frames
        self.steps.extend(steps)
        if self.requests is not None:
            for event in events:
                if isinstance(event, RequestDone):
                    self.requests.add(event)
        self.backlog.put(events)

    @property
    def dropped_for_screen(self) -> int:
        return self.backlog.dropped

    def start(self) -> None:
        self._started_ns = time.time_ns()
        self._thread.start()

    def started_ns(self) -> int | None:
        return self._started_ns

    def poll(self) -> Update:
        return Update(self.backlog.take())

    def now_ns(self) -> int:
        return time.time_ns()

    def stop(self) -> None:
        self.control.stop.set()

    def wait(self, timeout_s: float | None = None) -> bool:
        """Wait for the session to end (recording closed); whether it has."""
        if self._thread.ident is not None:
            self._thread.join(timeout_s)
        return not self._thread.is_alive()

    def ask_stacks(self, ranks: Iterable[int] | None) -> str | None:
        if self.finished:
            return "the job has ended: no process to dump"
        self.control.ask_stacks(ranks)
        return None

    @property
    def finished(self) -> bool:
        return self._thread.ident is not None and not self._thread.is_alive()

    @property
    def status(self) -> str:
        if self.result is not None:
            return self.result.status
        if self.error is not None:
            return "failed"
        return "stopping" if self.control.stop.is_set() else "running"

    @property
    def playback(self) -> None:
        return None


class Playback:
    """A replay's position in its recording and how it moves: pause, speed, step and seek."""

    SPEEDS = (0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0)

    def __init__(self, timeline: Timeline, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.timeline = timeline
        self.start_ns, self.end_ns = timeline.start_ns, timeline.end_ns
        self.position_ns = self.start_ns
        self.speed = 1.0
        self.paused = False
        self._clock = clock
        self._ticked = clock()
        self._step_ends = self._job_step_ends(timeline.events)

    @staticmethod
    def _job_step_ends(events: list[Event]) -> list[tuple[int, int]]:
        """(end time, step) of each step, once its last rank finished it."""
        ends: dict[int, int] = {}
        for event in events:
            if isinstance(event, StepTiming):
                ends[event.step] = max(ends.get(event.step, 0), event_time_ns(event))
        return sorted((end, step) for step, end in ends.items())

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


class ReplaySource:
    """A recording played back through the same door as a live job."""

    def __init__(self, recording: Recording, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.description: dict[str, Any] = recording.manifest
        self.recording = str(recording.path)
        self.problems = recording.problems
        timeline = load_timeline(recording)
        self.timeline = timeline
        self._playback = Playback(timeline, clock=clock)
        self._delivered = 0
        self._recorded_status = recording.status

    def start(self) -> None:
        self._playback.advance()

    def poll(self) -> Update:
        self._playback.advance()
        target = bisect_right(self.timeline.times_ns, self._playback.position_ns)
        if target < self._delivered:  # moved back: rebuild from the start
            self._delivered = target
            return Update(self.timeline.events[:target], reset=True)
        events = self.timeline.events[self._delivered:target]
        self._delivered = target
        return Update(events)

    def now_ns(self) -> int:
        return self._playback.position_ns

    def started_ns(self) -> int | None:
        return self._playback.start_ns

    def stop(self) -> None:
        self._playback.paused = True

    def ask_stacks(self, ranks: Iterable[int] | None) -> str | None:
        return "a replay shows the stack dumps taken while recording; it cannot take new ones"

    @property
    def finished(self) -> bool:
        return self._playback.at_end

    @property
    def status(self) -> str:
        return self._recorded_status if self.finished else "replaying"

    @property
    def playback(self) -> Playback:
        return self._playback
