"""The dashboard's state: the metrics core's figures, and what only a screen needs (histories, the
pipeline timeline, per-rank and per-GPU views, the session's notices; the alerts read them:
:mod:`meshtop.tui.alerts`). Plain Python, fed event tables, read by the screen at its frame rate.

Every figure (step time, p50 / p99, busbw, exposed share, bubbles, peaks,
stragglers, request latencies, MFU) comes from :class:`meshtop.recordings.metrics.run.RunFold`,
the same fold ``meshtop summary`` runs, held by the source's
:class:`~meshtop.recordings.session_fold.SessionFold`. A live session's fold thread feeds it, and the source
hands the state the same tables and the job steps they completed; a replay plays its tables through
:meth:`DashboardState.play`, which feeds the fold first. The state keeps only what a screen shows beside the
figures, in bounded windows, so memory stays flat however long a run goes. No Textual here: tests and
benchmarks drive it directly.
"""

from __future__ import annotations

import time
from collections import defaultdict, deque
from collections.abc import Callable, Iterable, Mapping
from typing import ClassVar

import pyarrow as pa
import pyarrow.compute as pc

from meshtop.probes.events import (
    Event,
    GpuSample,
    JobEnded,
    NvmlState,
    RankExited,
    RankStarted,
    SamplerError,
    StackDump,
)
from meshtop.probes.kinds import PRINTED_KINDS
from meshtop.recordings.manifest import RunDescription
from meshtop.recordings.metrics.attention import Attention
from meshtop.recordings.metrics.figures import RunFigures
from meshtop.recordings.metrics.memory import MemoryRow
from meshtop.recordings.metrics.mfu import Mfu
from meshtop.recordings.metrics.requests import LATENCIES
from meshtop.recordings.metrics.run import RunFold
from meshtop.recordings.metrics.steps import JobStep
from meshtop.recordings.metrics.stragglers import Straggler
from meshtop.recordings.notices import Notices
from meshtop.recordings.schema import events_of, tables_of
from meshtop.recordings.session_fold import Batch, SessionFold
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
        """The fold the figures come from (read it through ``session.reading()``): the source's."""
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
        self.notices = Notices()
        """What the session said to the user: stacks, a hang, telemetry lost, probes off, a server's state."""
        self.coalesced = 0
        """Events the screen skipped to keep up (the recording has them)."""
        self.sampler_errors = 0
        self.last_sampler_error: str | None = None
        self.ended: JobEnded | None = None
        self._lanes: dict[int, dict[int, list[tuple[int, int, str, int]]]] = defaultdict(lambda: defaultdict(list))
        """Per open step and pipeline lane rank: (start_ns, end_ns, action, microbatch)."""
        self._timeline: deque[PipelineStep] = deque(maxlen=TIMELINE_STEPS)
        self.figures_every_s = figures_every_s
        """While the run goes on, figures are at most this old (0: always fresh, as a replay's are)."""
        self._figures: tuple[int, float, RunFigures] | None = None
        """(fold version, when computed, the figures)."""
        self._attention: tuple[tuple[str, int, int], Attention] | None = None
        """((measure, the fold's attention input, ranks' starts read), the Grid view's attention)."""
        self._low_headroom: tuple[tuple[MemoryRow, ...], list[tuple[MemoryRow, float]]] | None = None
        """(the memory rows, :meth:`low_headroom` of them)."""
        self._starts_read = 0
        """Ranks' starts this state read: a rank's node may change with one."""
        self._hosts: tuple[int, dict[int, str]] | None = None
        """(starts read, :meth:`hosts`) as they were last read."""
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
        """Take a table of ``kind``'s events the session's fold has folded (live: what arrived since the last
        frame; replay: a slice), for what the screen keeps beside the figures (a kind the screen keeps nothing
        of, a request say, is only counted)."""
        if not len(table):
            return
        self.events += len(table)
        read = self._READERS.get(kind)
        if read is not None:
            read(self, kind, table)

    def play(self, tables: Iterable[Batch]) -> None:
        """Fold ``tables`` into the session's fold and show them, a table at a time: how a source without a
        session thread feeds the screen (a replay's slice; tests' and benchmarks' events)."""
        for kind, table in tables:
            steps = self.session.take_tables([(kind, table)])
            self.apply(kind, table)
            self.take_steps(steps)

    def apply_events(self, events: Iterable[Event]) -> None:
        """Play event objects (tests, benchmarks' warm-up) through the door they come in by: one table a kind, in
        the fold's order, as a replay plays a slice."""
        self.play(tables_of(events))

    def finish(self, status: str) -> None:
        """The run is over with ``status`` (a replay reached the end of a recording with no end event): the
        session's fold decides what is left."""
        if self.ended is None:
            self.take_steps(self.session.finish(status))
        self.final = True

    def set_clock(self, now_ns: int, origin_ns: int | None) -> None:
        self.clock_ns, self.first_ns = now_ns, origin_ns

    def take_steps(self, steps: Iterable[JobStep]) -> None:
        """Job steps completed, in order (a live session's come with the batches that completed them)."""
        for step in steps:
            self.notices.progressed()
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
            positions = {rank: fold.positions.get(rank) for rank in lanes}
        if not lanes or span <= 0:
            return
        origin = min(start for actions in lanes.values() for start, _, _, _ in actions)
        by_stage: dict[int, tuple[Segment, ...]] = {}
        for rank, actions in sorted(lanes.items()):
            position = positions[rank]  # a rank whose start the fold has not taken (or not of the job): no lane
            if position is None:
                continue
            by_stage.setdefault(
                position[0],
                tuple(
                    Segment(start_s=(start - origin) / 1e9, end_s=(end - origin) / 1e9, action=action, microbatch=mb)
                    for start, end, action, mb in sorted(actions)
                ),
            )
        self._timeline.append(PipelineStep(step=step, span_s=span, lanes=by_stage, bubble=bubble))

    # -- what the screen reads of each kind, beside the fold ------------------------------------------

    def _rank(self, rank: int) -> RankView:
        view = self.ranks.get(rank)
        if view is None:
            view = self.ranks[rank] = RankView(rank=rank)
        return view

    def _keep_lanes(self, kind: str, table: pa.Table) -> None:
        """The stage actions of each pipeline rank's first dp / tp copy, for the timeline."""
        if not self.info.may_pipeline:
            return
        columns = table.select(["rank", "step", "start_ns", "end_ns", "action", "microbatch"]).to_pydict()
        with self.session.reading() as fold:
            positions = dict(fold.positions)
        for rank, step, start, end, action, microbatch in zip(*columns.values(), strict=True):
            _, dp_rank, tp_rank = positions.get(rank, (0, 0, 0))
            if step is None or end < start or dp_rank or tp_rank:
                continue
            self._lanes[step][rank].append((start, end, action, microbatch))

    def _see_ranks(self, kind: str, table: pa.Table) -> None:
        """A step or memory snapshot tells the screen of its rank (the fold has the rest)."""
        with self.session.reading() as fold:
            table = fold.of_the_job(kind, table)
        for rank in pc.unique(table.column("rank")).to_pylist():
            self._rank(rank)

    def _read_processes(self, kind: str, table: pa.Table) -> None:
        """Each rank's process samples, a column at a time (the kind a live screen reads most)."""
        with self.session.reading() as fold:
            table = fold.of_the_job(kind, table)
        columns = table.select(["rank", "pid", "cpu_pct", "rss_bytes", "threads"]).to_pydict()
        for rank, pid, cpu_pct, rss_bytes, threads in zip(*columns.values(), strict=True):
            view = self._rank(rank)
            view.pid, view.cpu_pct, view.rss_bytes, view.threads = pid, cpu_pct, rss_bytes, threads
            if cpu_pct is not None:
                view.cpu_history.append(cpu_pct)

    def _read_gpus(self, kind: str, table: pa.Table) -> None:
        """Each GPU's readings, a column at a time: an event object for each GPU's last sample only."""
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
            view = self.gpus.get(key)
            if view is None:
                view = self.gpus[key] = GpuView(gpu=sample.gpu, sample=sample, node=sample.node)
            view.sample = sample
            view.utilization.extend(utilization[key])
            view.power_w.extend(power[key])

    def _read_events(self, kind: str, table: pa.Table) -> None:
        """The kinds the screen keeps as events: the rows that can be this job's, decoded (outside the lock: a
        live session's thread folds meanwhile); the notices' kinds go to :attr:`notices`."""
        with self.session.reading() as fold:
            table = fold.of_the_job(kind, table)
        events = events_of(kind, table)
        self.notices.take(events)
        for event in events:
            if isinstance(event, RankStarted):
                view = self._rank(event.rank)
                view.pid, view.device, view.host, view.node = event.pid, event.device, event.host, event.node
                view.pp_rank, view.dp_rank, view.tp_rank = event.pp_rank, event.dp_rank, event.tp_rank
                self._starts_read += 1
            elif isinstance(event, RankExited):
                self._rank(event.rank).exited = event
            elif isinstance(event, JobEnded):
                self.ended, self.final = event, True
            elif isinstance(event, NvmlState):
                self.nvml = event
            elif isinstance(event, SamplerError):
                self.sampler_errors += 1
                self.last_sampler_error = f"{event.sampler}: {event.message}"
            elif isinstance(event, StackDump):  # a rank that dumped its stack is one to list
                self._rank(event.rank)

    _READERS: ClassVar[dict[str, Callable[[DashboardState, str, pa.Table], None]]] = {
        "stage_action": _keep_lanes,
        "step": _see_ranks,
        "memory": _see_ranks,
        "process": _read_processes,
        "gpu": _read_gpus,
        **dict.fromkeys(("rank_started", "rank_exited", "job_ended", "nvml_state", "sampler_error"), _read_events),
        **dict.fromkeys(PRINTED_KINDS, _read_events),
    }
    """What the screen reads of each kind beside the fold, and how: the kinds it reads most a column at a time
    (a thousand ranks send tens of thousands a second), the rare ones as events. The others (collectives,
    requests, a server's metrics) only the fold reads."""

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

    def rank_views(self, shown: Callable[[RankView], bool]) -> list[RankView]:
        """The ranks the screen knows that ``shown`` keeps (the rank filter), by rank."""
        return [view for view in sorted(self.ranks.values(), key=lambda view: view.rank) if shown(view)]

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
        """The host of each node the ranks reported their start from (one entry on one machine), as the fold has
        them when this state last read a start (the grid labels each of 128 nodes a frame)."""
        if self._hosts is None or self._hosts[0] != self._starts_read:
            with self.session.reading() as fold:
                self._hosts = (self._starts_read, dict(fold.hosts))
        return self._hosts[1]

    def host_label(self, node: int) -> str:
        return node_label(node, self.hosts())

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
        with self.session.reading() as fold:
            key = (measure, fold.attention_input(measure), self._starts_read)
            if self._attention is None or self._attention[0] != key:
                self._attention = (key, fold.attention(measure))  # by the node each rank started on
            return self._attention[1]


def node_label(node: int, hosts: Mapping[int, str]) -> str:
    """``vm`` on one machine; ``n1 vm`` on many (two nodes may share a host name); ``hosts``: node -> host."""
    return hosts.get(node, "?") if len(hosts) <= 1 else f"n{node} {hosts.get(node, '?')}"
