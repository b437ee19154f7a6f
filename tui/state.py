"""The dashboard's state: the metrics core's figures, and what only a screen needs (histories, the
pipeline timeline, per-rank and per-GPU views; the alerts read them: :mod:`meshtop.tui.alerts`). Plain
Python, fed event tables, read by the screen at its frame rate.

Every figure (step time, p50 / p99, busbw, exposed share, bubbles, peaks,
stragglers, request latencies, MFU) comes from :class:`meshtop.recordings.metrics.run.RunFold`,
the same fold ``meshtop summary`` runs: a live session's own
(:class:`meshtop.recordings.session_fold.SessionFold`, fed by the session
thread and read here), or in a replay one this state feeds with what it is
given; this module only keeps what a screen shows beside them, in bounded
windows, so memory stays flat however long a run goes. No Textual here: tests
and benchmarks drive it directly.
"""

from __future__ import annotations

import time
from collections import defaultdict, deque
from collections.abc import Iterable, Mapping
from typing import Any, ClassVar

import pyarrow as pa
import pyarrow.compute as pc

from meshtop.probes.events import (
    BULK_KINDS,
    Event,
    EventsDropped,
    FlightVerdict,
    FramesRefused,
    GpuSample,
    HangDetected,
    JobEnded,
    MemorySnapshot,
    NvmlState,
    ProbeOff,
    ProcessSample,
    RankExited,
    RankStarted,
    SamplerError,
    ServerState,
    StackDump,
    StepTiming,
)
from meshtop.recordings.manifest import RunDescription
from meshtop.recordings.metrics.attention import Attention
from meshtop.recordings.metrics.figures import RunFigures
from meshtop.recordings.metrics.memory import MemoryRow
from meshtop.recordings.metrics.mfu import Mfu
from meshtop.recordings.metrics.requests import LATENCIES
from meshtop.recordings.metrics.run import RunFold
from meshtop.recordings.metrics.steps import JobStep
from meshtop.recordings.metrics.stragglers import Straggler
from meshtop.recordings.replay import in_kind_order
from meshtop.recordings.schema import events_of, table_of
from meshtop.recordings.session_fold import SessionFold
from meshtop.tui.view_records import (
    HISTORY,
    CollectiveLine,
    GpuView,
    PipelineStep,
    RankView,
    RequestsView,
    Segment,
)

TIMELINE_STEPS = 3
"""Steps of pipeline timeline kept."""
DEFAULT_HEADROOM_ALERT = 0.10
"""Alert when a rank's GPU had less than this share of its memory left at the rank's peak (the core's
headroom: :mod:`meshtop.recordings.metrics.memory`)."""
LIVE_FIGURES_EVERY_S = 0.25
"""A live dashboard computes its figures again at most this often while the job runs (the folds take every
event at once; the quantiles over a long run's values are what costs)."""
UI_KINDS = frozenset(
    {
        "rank_started",
        "step",
        "memory",
        "gpu",
        "nvml_state",
        "process",
        "rank_exited",
        "job_ended",
        "events_dropped",
        "frames_refused",
        "sampler_error",
        "hang",
        "flight_verdict",
        "stack_dump",
        "request",
        "probe_off",
        "server_state",
        "server_metric",
    }
)
"""Kinds the screen reads as events, beside the figures."""
ROW_KINDS = frozenset({"step", "memory", "process"})
"""Kinds a live screen reads a column at a time (a thousand ranks send tens of thousands a second): the
rank of a step or a memory snapshot (the session's fold has the rest), a process sample's few fields."""
FOLDED_ONLY = frozenset({"request", "server_metric"})
"""Kinds of :data:`UI_KINDS` that only the fold reads: a state that feeds its fold (a replay) decodes them for
it; a live screen, whose session folds them, leaves them be."""


class DashboardState:
    """Folds event tables into what the screen shows. ``apply`` is cheap; the views compute on demand."""

    def __init__(
        self,
        run: RunDescription,
        *,
        recording: str | None = None,
        headroom_alert: float = DEFAULT_HEADROOM_ALERT,
        figures_every_s: float = 0.0,
        session: SessionFold | None = None,
    ) -> None:
        self.recording = recording
        """Where the session is recorded, if it is."""
        self.session = session if session is not None else SessionFold(run)
        """The fold the figures come from: a live session's, which its thread feeds; else this state's own,
        which it feeds with what it is given (a replay, tests)."""
        self.feeds_fold = session is None
        self._steps_seen = self.session.steps_completed
        """Job steps of its own fold this state took (a live session's come with its batches)."""
        self.headroom_alert = headroom_alert
        self.events = 0
        self.first_ns: int | None = None
        """Where elapsed time counts from: the session's start live, the recording's start in a replay."""
        self.clock_ns: int | None = None
        """The dashboard's now: wall time live, the playback position in a replay."""
        self.ranks: dict[int, RankView] = {}
        self.gpus: dict[tuple[int, int], GpuView] = {}
        """By (node, GPU index): a GPU's index repeats from one node to the next."""
        self.nvml: NvmlState | None = None
        self.steps: deque[JobStep] = deque(maxlen=HISTORY)
        self.steps_done = 0
        self.launcher_phase: str | None = None
        """A live job's launcher's phase, until its first step (the app sets it from the source)."""
        self.dropped = 0
        """Telemetry events lost before meshtop got them (full worker or collector buffers)."""
        self.refused: dict[str, int] = {}
        """Messages the collector refused, by reason (:class:`meshtop.probes.events.FramesRefused`)."""
        self.coalesced = 0
        """Events the screen skipped to keep up (the recording has them)."""
        self.sampler_errors = 0
        self.last_sampler_error: str | None = None
        self.probes_off: dict[tuple[str, str], set[int]] = {}
        """(probe, reason) -> the ranks it is off on."""
        self.ended: JobEnded | None = None
        self.hang: HangDetected | None = None
        """The hang reported last, until progress resumes."""
        self.stacks_wall_ns: int | None = None
        self.flight: FlightVerdict | None = None
        """torch's flight-recorder analyzer, last taken (at a hang, or with a stack dump asked for)."""
        self.server_state: ServerState | None = None
        """A server meshtop started for an endpoint's load: how it goes, last said."""
        self._lanes: dict[int, dict[int, list[tuple[int, int, str, int]]]] = defaultdict(lambda: defaultdict(list))
        """Per open step and pipeline lane rank: (start_ns, end_ns, action, microbatch)."""
        self._timeline: deque[PipelineStep] = deque(maxlen=TIMELINE_STEPS)
        self.figures_every_s = figures_every_s
        """While the run goes on, figures are at most this old (0: always fresh, as a replay's are)."""
        self._figures: tuple[int, float, RunFigures] | None = None
        """(fold version, when computed, the figures)."""
        self._attention: tuple[tuple[str, int, int], Attention] | None = None
        """((measure, the fold's attention input, ranks' changes), the Grid view's attention)."""
        self._low_headroom: tuple[tuple[MemoryRow, ...], list[tuple[MemoryRow, float]]] | None = None
        """(the memory rows, :meth:`low_headroom` of them)."""
        self._ranks_changed = 0
        """Grows when a rank is first seen or reports its start (its node and host)."""
        self._placed: tuple[int, dict[int, str], dict[int, int]] | None = None
        """(ranks' changes, :meth:`hosts`, :meth:`node_of`) as they were computed for."""
        self.final = False
        """The run is over and every step decided: figures are always fresh."""

    # -- input -----------------------------------------------------------------

    @property
    def fold(self) -> RunFold:
        """The run's fold (a live session's changes under its lock: read it through ``session.reading()``)."""
        return self.session.fold

    @property
    def info(self) -> RunDescription:
        """What runs: plan, model, device, lengths, load (the manifest's description, live or recorded; an
        elastic script's world size once its ranks started)."""
        return self.session.run

    def apply(self, kind: str, table: pa.Table) -> None:
        """Take a table of ``kind``'s events (live: what arrived since the last frame; replay: a slice), folding
        it where this state feeds its fold."""
        if not len(table):
            return
        self.events += len(table)
        if kind in BULK_KINDS:
            if self.feeds_fold:
                self.session.apply(kind, table)
            if kind == "stage_action" and self.info.may_pipeline:
                self._keep_lanes(table)
            return
        if kind not in UI_KINDS:
            return
        if not self.feeds_fold and kind in FOLDED_ONLY:
            return
        if kind in ROW_KINDS and not self.feeds_fold:  # the kinds a live screen reads most: a column at a time
            with self.session.reading() as fold:
                table = fold.of_the_job(kind, table)
            if kind == "process":
                self._on_process_rows(table)
            else:  # a step or memory snapshot tells the screen of its rank, the session's fold the rest
                for rank in pc.unique(table.column("rank")).to_pylist():
                    self._rank(rank)
            return
        if kind == "gpu" and not self.feeds_fold:
            self._on_gpu_rows(table)
            return
        with self.session.reading() as fold:  # the rows that can be this job's
            if self.feeds_fold:
                fold.apply(kind, table)
            table = fold.of_the_job(kind, table)
        for event in events_of(kind, table):
            handler = self._HANDLERS.get(type(event))
            if handler is not None:
                handler(self, event)
        if self.feeds_fold:
            self._take_steps()

    def apply_events(self, events: Iterable[Event]) -> None:
        """Fold event objects (tests, benchmarks' warm-up), one table per kind, as a replay folds a slice."""
        by_kind: dict[str, list[Event]] = {}
        for event in events:  # one table a kind, not one a run of a kind: a job's kinds interleave
            by_kind.setdefault(event.kind, []).append(event)
        for kind, table in in_kind_order((kind, table_of(listed)) for kind, listed in by_kind.items()):
            self.apply(kind, table)

    def finish(self, status: str) -> None:
        """The run is over with ``status`` (a replay reached the end of a recording with no end event)."""
        if self.ended is None:
            self.session.finish(status)
            if self.feeds_fold:
                self._take_steps()
        self.final = True

    def set_clock(self, now_ns: int, origin_ns: int | None) -> None:
        self.clock_ns, self.first_ns = now_ns, origin_ns

    def _rank(self, rank: int) -> RankView:
        view = self.ranks.get(rank)
        if view is None:
            view = self.ranks[rank] = RankView(rank=rank)
            self._ranks_changed += 1
        return view

    def _keep_lanes(self, table: pa.Table) -> None:
        """The stage actions of each pipeline rank's first dp / tp copy, for the timeline."""
        columns = table.select(["rank", "step", "start_ns", "end_ns", "action", "microbatch"]).to_pydict()
        for rank, step, start, end, action, microbatch in zip(*columns.values(), strict=True):
            view = self.ranks.get(rank)
            if step is None or end < start or (view is not None and (view.dp_rank or view.tp_rank)):
                continue
            self._lanes[step][rank].append((start, end, action, microbatch))

    def _on_started(self, event: RankStarted) -> None:
        view = self._rank(event.rank)
        view.pid, view.device, view.host, view.node = event.pid, event.device, event.host, event.node
        self._ranks_changed += 1
        view.pp_rank, view.dp_rank, view.tp_rank = event.pp_rank, event.dp_rank, event.tp_rank

    def _take_steps(self) -> None:
        """Take the job steps this state's own fold completed since the last look."""
        with self.session.reading() as fold:
            steps = fold.steps_since(self._steps_seen)
            self._steps_seen = fold.steps_completed
        self.take_steps(steps)

    def take_steps(self, steps: Iterable[JobStep]) -> None:
        """Job steps completed, in order (a live session's come with the batches that completed them)."""
        for step in steps:
            self._complete(step)

    def _complete(self, step: JobStep) -> None:
        self.hang = None  # progress again
        self.steps.append(step)
        self.steps_done = max(self.steps_done, step.step + 1)
        if self.info.may_pipeline:
            self._draw_pipeline(step.step)

    def _draw_pipeline(self, step: int) -> None:
        lanes = self._lanes.pop(step, {})
        for old in [s for s in self._lanes if s < step - 8]:
            del self._lanes[old]
        with self.session.reading() as fold:
            span, bubble = fold.step_bubbles(step)
        if not lanes or span <= 0:
            return
        origin = min(start for actions in lanes.values() for start, _, _, _ in actions)
        by_stage: dict[int, tuple[Segment, ...]] = {}
        for rank, actions in sorted(lanes.items()):
            view = self.ranks.get(rank)  # a rank whose start this screen has not read (or not of the job): no lane
            if view is None or view.pid is None:
                continue
            stage = view.pp_rank
            by_stage.setdefault(
                stage,
                tuple(
                    Segment(start_s=(start - origin) / 1e9, end_s=(end - origin) / 1e9, action=action, microbatch=mb)
                    for start, end, action, mb in sorted(actions)
                ),
            )
        self._timeline.append(PipelineStep(step=step, span_s=span, lanes=by_stage, bubble=bubble))

    def _on_memory(self, event: MemorySnapshot) -> None:
        self._rank(event.rank)

    def _on_gpu(self, event: GpuSample) -> None:
        self._gpu_sampled(
            event,
            [] if event.utilization_pct is None else [event.utilization_pct],
            [] if event.power_w is None else [event.power_w],
        )

    def _gpu_sampled(self, last: GpuSample, utilization: list[float], power_w: list[float]) -> None:
        """A GPU's samples: the ``last`` of them, and the readings of each that had them, in order."""
        view = self.gpus.get((last.node, last.gpu))
        if view is None:
            view = self.gpus[last.node, last.gpu] = GpuView(gpu=last.gpu, sample=last, node=last.node)
        view.sample = last
        view.utilization.extend(utilization)
        view.power_w.extend(power_w)

    def _on_nvml(self, event: NvmlState) -> None:
        self.nvml = event

    def _on_process(self, event: ProcessSample) -> None:
        self._process_sampled(event.rank, event.pid, event.cpu_pct, event.rss_bytes, event.threads)

    def _on_process_rows(self, table: pa.Table) -> None:
        """:meth:`_on_process` of each row of a ``process`` table, without an event object a row."""
        columns = table.select(["rank", "pid", "cpu_pct", "rss_bytes", "threads"]).to_pydict()
        for row in zip(*columns.values(), strict=True):
            self._process_sampled(*row)

    def _on_gpu_rows(self, table: pa.Table) -> None:
        """:meth:`_on_gpu` of each row of a ``gpu`` table: an event object for each GPU's last sample only."""
        columns = table.select(["node", "gpu", "utilization_pct", "power_w"]).to_pydict()
        last: dict[tuple[int, int], int] = {}
        utilization: dict[tuple[int, int], list[float]] = defaultdict(list)
        power: dict[tuple[int, int], list[float]] = defaultdict(list)
        for index, (node, gpu, utilization_pct, power_w) in enumerate(zip(*columns.values(), strict=True)):
            last[node, gpu] = index
            if utilization_pct is not None:
                utilization[node, gpu].append(utilization_pct)
            if power_w is not None:
                power[node, gpu].append(power_w)
        samples = events_of("gpu", table.take(list(last.values())))
        for key, sample in zip(last, samples, strict=True):
            assert isinstance(sample, GpuSample)
            self._gpu_sampled(sample, utilization[key], power[key])

    def _process_sampled(
        self, rank: int, pid: int, cpu_pct: float | None, rss_bytes: int | None, threads: int | None
    ) -> None:
        view = self._rank(rank)
        view.pid, view.cpu_pct, view.rss_bytes, view.threads = pid, cpu_pct, rss_bytes, threads
        if cpu_pct is not None:
            view.cpu_history.append(cpu_pct)

    def _on_exited(self, event: RankExited) -> None:
        self._rank(event.rank).exited = event

    def _on_ended(self, event: JobEnded) -> None:
        self.ended = event
        self.final = True

    def _on_dropped(self, event: EventsDropped) -> None:
        self.dropped += event.count

    def _on_refused(self, event: FramesRefused) -> None:
        self.refused[event.reason] = self.refused.get(event.reason, 0) + event.count

    def _on_sampler_error(self, event: SamplerError) -> None:
        self.sampler_errors += 1
        self.last_sampler_error = f"{event.sampler}: {event.message}"

    def _on_probe_off(self, event: ProbeOff) -> None:
        self.probes_off.setdefault((event.probe, event.reason), set()).add(event.rank)

    def _on_server(self, event: ServerState) -> None:
        self.server_state = event

    def _on_hang(self, event: HangDetected) -> None:
        self.hang = event

    def _on_flight(self, event: FlightVerdict) -> None:
        self.flight = event

    def _on_stack(self, event: StackDump) -> None:
        self._rank(event.rank).stack = event
        self.stacks_wall_ns = event.wall_ns

    def _on_step(self, event: StepTiming) -> None:
        self._rank(event.rank)

    _HANDLERS: ClassVar[dict[type, Any]] = {
        RankStarted: _on_started,
        MemorySnapshot: _on_memory,
        GpuSample: _on_gpu,
        NvmlState: _on_nvml,
        ProcessSample: _on_process,
        RankExited: _on_exited,
        JobEnded: _on_ended,
        EventsDropped: _on_dropped,
        FramesRefused: _on_refused,
        SamplerError: _on_sampler_error,
        StackDump: _on_stack,
        HangDetected: _on_hang,
        FlightVerdict: _on_flight,
        ProbeOff: _on_probe_off,
        StepTiming: _on_step,
        ServerState: _on_server,
    }

    # -- views -------------------------------------------------------------------

    def figures(self) -> RunFigures:
        """Every figure of the run so far: the metrics core's, the same as ``meshtop summary``'s (up to
        :attr:`figures_every_s` old while the run goes on)."""
        cached = self._figures
        now = time.monotonic()
        if cached is not None and (
            cached[0] == self.fold.version or (not self.final and now - cached[1] < self.figures_every_s)
        ):
            return cached[2]
        with self.session.reading() as fold:
            version, figures = fold.version, fold.figures()
        self._figures = (version, now, figures)
        return figures

    @property
    def elapsed_s(self) -> float:
        if self.first_ns is None or self.clock_ns is None:
            return 0.0
        return max(0.0, (self.clock_ns - self.first_ns) / 1e9)

    def ranks_started(self) -> int:
        """Ranks that reported their start."""
        return sum(1 for rank in self.ranks.values() if rank.pid is not None)

    def startup(self) -> str | None:
        """What a live job does before its first step, in words: the launcher's phase (building the C++ probe,
        starting the ranks), then how many ranks reported; ``None`` once a step is done, or in a replay."""
        if self.steps_done or self.final or self.launcher_phase is None:
            return None
        started = self.ranks_started()
        if not started:
            return self.launcher_phase
        world = self.info.world_size
        if started < world:
            return f"{started} of {world} ranks started"
        return "every rank started, waiting for the first " + ("iteration" if self.info.inference else "step")

    @property
    def last_step(self) -> JobStep | None:
        return self.steps[-1] if self.steps else None

    def tokens_per_s(self) -> float | None:
        """p50 of the job steps' tokens/s (the summary's figure)."""
        return self.figures().steps.tokens_per_s

    def mfu(self) -> Mfu:
        return self.figures().mfu

    def requests_view(self) -> RequestsView | None:
        """The inference requests so far (``None`` for training)."""
        figures = self.figures().requests
        with self.session.reading() as fold:
            if figures is None or fold.requests is None:
                return None
            history = {name: tuple(fold.requests.recent[name]) for name in LATENCIES}
            server = {name: tuple(values) for name, values in fold.server.recent.items()} if fold.server else {}
        return RequestsView(
            figures=figures,
            total=self.info.load.requests if self.info.load else None,
            history=history,
            server=self.figures().server,
            server_history=server,
        )

    def collective_rows(self) -> list[CollectiveLine]:
        """Per (group, op), the most in-flight time first, with each one's recent exposed times."""
        with self.session.reading() as fold:
            closed = list(fold.closed)
        return [
            CollectiveLine(row, tuple(step.exposed_by_op.get((row.group, row.op), 0.0) for step in closed))
            for row in self.figures().collectives
        ]

    def pipeline_steps(self) -> list[PipelineStep]:
        return list(self._timeline)

    def bubble_history(self) -> dict[int, tuple[float, ...]]:
        """Per stage, its bubble in each recent step (iteration), oldest first."""
        with self.session.reading() as fold:
            stages = fold.stages.stages
            return {stage: tuple(stages[stage].recent) for stage in sorted(stages) if stages[stage].recent}

    def hosts(self) -> dict[int, str]:
        """The host of each node the ranks reported from (one entry on one machine)."""
        return self._placement()[1]

    def node_of(self) -> dict[int, int]:
        """Each rank's node."""
        return self._placement()[2]

    def _placement(self) -> tuple[int, dict[int, str], dict[int, int]]:
        """:meth:`hosts` and :meth:`node_of`, computed again only when a rank was added or started (the grid
        labels each of 128 nodes a frame: a thousand ranks sorted each time was 20 ms)."""
        if self._placed is None or self._placed[0] != self._ranks_changed:
            views = sorted(self.ranks.values(), key=lambda v: v.rank)
            hosts = {view.node: view.host or "?" for view in views}
            self._placed = (self._ranks_changed, hosts, {view.rank: view.node for view in views})
        return self._placed

    def host_label(self, node: int) -> str:
        return node_label(node, self.hosts())

    def gpu_label(self, gpu: GpuView) -> str:
        return f"GPU {gpu.gpu}" if len(self.hosts()) <= 1 else f"GPU {gpu.gpu} of {self.host_label(gpu.node)}"

    def most_loaded_rank(self) -> int | None:
        return self.figures().most_loaded_rank

    def memory_rows(self) -> dict[int, MemoryRow]:
        """Each rank's memory as the core has it (its peak over the run, what held it at its last snapshot,
        its headroom): what the bars draw and the most loaded rank is chosen by."""
        return {row.rank: row for row in self.figures().memory}

    def low_headroom(self) -> list[tuple[MemoryRow, float]]:
        """The ranks whose headroom at their peak is below :attr:`headroom_alert`, with it (the alerts read
        them each frame: kept while the memory figures are, a thousand ranks' rows looked at once)."""
        memory = self.figures().memory
        if self._low_headroom is None or self._low_headroom[0] is not memory:
            shares = ((row, row.headroom_share) for row in memory)
            low = [(row, share) for row, share in shares if share is not None and share < self.headroom_alert]
            self._low_headroom = (memory, low)
        return self._low_headroom[1]

    def stragglers(self) -> list[Straggler]:
        """Ranks whose recent compute time exceeds their stage peers' (the core's rule, as ``summary``'s)."""
        return list(self.figures().stragglers)

    def attention(self, measure: str) -> Attention:
        """The ranks and nodes that stand out on ``measure`` (the core's rule,
        :mod:`meshtop.recordings.metrics.attention`), scored again only when what it reads has changed."""
        node_of = self.node_of()
        with self.session.reading() as fold:
            key = (measure, fold.attention_input(measure), self._ranks_changed)
            if self._attention is None or self._attention[0] != key:
                self._attention = (key, fold.attention(measure, node_of))
            return self._attention[1]


def node_label(node: int, hosts: Mapping[int, str]) -> str:
    """``vm`` on one machine; ``n1 vm`` on many (two nodes may share a host name); ``hosts``: node -> host."""
    return hosts.get(node, "?") if len(hosts) <= 1 else f"n{node} {hosts.get(node, '?')}"


def ranks_text(ranks: Iterable[int]) -> str:
    """``0-3,7`` for {0, 1, 2, 3, 7}."""
    ordered = sorted(ranks)
    parts, start = [], None
    for index, rank in enumerate(ordered):
        if start is None:
            start = rank
        if index + 1 == len(ordered) or ordered[index + 1] != rank + 1:
            parts.append(str(start) if start == rank else f"{start}-{rank}")
            start = None
    return ",".join(parts)
