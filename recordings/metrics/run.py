"""One run's figures, folded from its event tables: what the dashboard, ``summary``, ``compare``, ``export``
and the metrics endpoint all read.

:class:`RunFold` takes a run's events a table at a time, in any grouping: the
dashboard gives it what arrived since the last frame, ``summary`` a
recording's whole tables. Collectives and stage actions, the bulk of a run,
are folded column-wise. Steps and memory, process and GPU samples are folded
column-wise too when they come as tables (:meth:`RunFold.apply`: ``summary``),
or as events (:meth:`RunFold.apply_events`: the dashboard); both ways meet in
the same functions per job step and per rank (:func:`~meshtop.recordings.metrics.steps.job_step`,
:class:`~meshtop.recordings.metrics.steps.StepSpans`, :class:`~meshtop.recordings.metrics.memory.MemoryFold`),
so they give the same figures. Anything decided per step (exposed
communication, stage bubbles) is decided when the step closes: two job steps
after it completes, or when the job ends (:meth:`RunFold.finish`), so
operations that arrive a little after their step still count, and the result
does not depend on how the events were grouped.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass
from itertools import islice
from typing import TypeVar, cast

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from meshtop.probes.events import (
    CLIENT_RANK,
    Event,
    GpuSample,
    JobEnded,
    MemorySnapshot,
    ProcessSample,
    RankStarted,
    RequestDone,
    ServerMetric,
    StepTiming,
)
from meshtop.recordings.manifest import GpuInfo, RunDescription
from meshtop.recordings.metrics.attention import STEP_MEASURES, Attention, RankRecent, attention
from meshtop.recordings.metrics.breakdown import PARTS, Breakdown, BreakdownFold, step_cells
from meshtop.recordings.metrics.collectives import CollectiveFold, Waits
from meshtop.recordings.metrics.figures import RunFigures
from meshtop.recordings.metrics.gpus import GpuFold, first_sample_of_each_gpu
from meshtop.recordings.metrics.memory import MemoryFold
from meshtop.recordings.metrics.mfu import GpuModel, mfu, script_parameters
from meshtop.recordings.metrics.pipeline import StageFold, step_bubbles
from meshtop.recordings.metrics.requests import RequestFold
from meshtop.recordings.metrics.server import ServerFold
from meshtop.recordings.metrics.steps import (
    JobStep,
    StepFolder,
    StepRows,
    StepSpans,
    StepStats,
    WholeSteps,
    Windows,
)
from meshtop.recordings.metrics.stragglers import ComputeTimes, Straggler
from meshtop.recordings.schema import events_of

_Part = TypeVar("_Part")

HISTORY = 240
"""Closed steps kept for the dashboard's sparklines."""
STEPS_KEPT = 4096
"""Completed job steps kept for readers that take them as they come (the console, the dashboard's charts)."""
CLOSE_AFTER = 2
"""A job step's per-step figures are decided when the step this many later completes."""
COLUMNAR = frozenset({"collective", "stage_action"})
"""Kinds folded column-wise (:meth:`RunFold.apply` with a table)."""
COLUMNS_READ = {
    "collective": (
        "rank",
        "step",
        "op",
        "group",
        "group_size",
        "bytes",
        "start_ns",
        "end_ns",
        "waited_ns",
        "overlapped",
    ),
    "stage_action": ("rank", "step", "stage", "start_ns", "end_ns"),
}
"""The columns the fold reads of the :data:`COLUMNAR` kinds (a reader of a whole recording may load only
these); the other kinds' tables are taken whole."""
EVENT_KINDS = frozenset({"step", "rank_started", "memory", "process", "request", "gpu", "job_ended", "server_metric"})
"""Kinds folded as events; the others do not change a figure."""
TABLE_KINDS = frozenset({"step", "memory", "process", "gpu"})
"""Kinds of :data:`EVENT_KINDS` that :meth:`RunFold.apply` folds column-wise (steps falling back to events
where a table is not plain: see :meth:`StepFolder.add_rows`)."""


@dataclass(frozen=True, slots=True)
class ClosedStep:
    """A training step whose per-step figures are decided."""

    step: int
    duration_s: float
    exposed_by_op: dict[tuple[str, str], float]
    """The job's exposed communication seconds per (group, op)."""
    exposed_by_rank: dict[int, float]
    """Each rank's exposed communication seconds, every op."""
    rank_durations_s: dict[int, float]
    span_s: float
    """The pipeline's step (training with stages): the slowest rank's forward + backward, or the busiest stage."""
    bubbles: dict[int, float]
    """Each pipeline stage's idle share of the span."""


class RunFold:
    """Folds a run's events into its figures."""

    def __init__(self, run: RunDescription) -> None:
        self.run = run
        self.training = not run.inference
        self.collectives = CollectiveFold(per_step=self.training)
        self.stages = StageFold(pp=run.stage_period)
        self.memory = MemoryFold()
        self.requests = (
            RequestFold(run.load, replicas=run.plan.dp, sent_by_client=run.endpoint is not None)
            if run.inference
            else None
        )
        self.gpus = GpuFold()
        self.server = ServerFold() if run.endpoint is not None else None
        """An endpoint's engine, from its ``/metrics``."""
        self.steps = StepStats()
        self.positions: dict[int, tuple[int, int, int]] = {}
        """(pp, dp, tp) of each rank that reported its start."""
        self.nodes: dict[int, int] = {}
        """The node of each rank that reported its start."""
        self.hosts: dict[int, str] = {}
        """The host of each node whose ranks reported their start."""
        self.trained: dict[int, tuple[int, int]] = {}
        """A script's ranks: (pipeline rank, parameter elements its optimizer trains at their global size)."""
        self.gpu_models: dict[tuple[int, int], GpuModel] = {}
        """Each GPU's model by (node, index), for MFU's peak."""
        self.rejected: Counter[str] = Counter()
        """Rows left out by kind: well-formed, but not this job's (a rank outside it, an end before its start)."""
        self.recent_steps: deque[JobStep] = deque(maxlen=STEPS_KEPT)
        """The last job steps completed, oldest first (readers take them by position: :meth:`steps_since`)."""
        self.closed: deque[ClosedStep] = deque(maxlen=HISTORY)
        """The last steps closed, oldest first."""
        self.closed_count = 0
        """Steps closed so far."""
        self.closed_torn = 0
        """Steps closed without their breakdown and compute times: a live fold left collectives and stage
        actions out while their events came (:class:`WholeSteps`)."""
        self._whole = WholeSteps()
        self.compute = ComputeTimes()
        """Each rank's compute time in its last closed steps: the straggler rule's input."""
        self.breakdown = BreakdownFold()
        self.recent_by_rank = RankRecent()
        """Each rank's last closed steps' step time and parts: what the rank grid's attention is over."""
        """Each rank's step parts, as steps close."""
        self.version = 0
        """Grows with every change, so a caller can tell whether its figures are stale."""
        self._folder = StepFolder(1 if run.inference else run.world_size)
        self._rank_limit = run.world_size
        """Ranks of the job are below this: its world size, or the largest a start of its ranks said."""
        self.starts: dict[int, tuple[int, int]] = {}
        """Each start of the job's ranks, by torchrun's restart count: (its ranks, its first step)."""
        self._spans: dict[int, StepSpans] = {}
        self._completed: dict[int, JobStep] = {}
        self._figures: tuple[int, RunFigures] | None = None
        self._starts_seen = 0
        """Ranks' starts folded: a rank's position (and so its stage peers) may change with one."""
        self._parts: dict[str, tuple[Hashable, object]] = {}
        """Figures that change with only some of the input, by name: (what they were computed for, them)."""

    # -- input ---------------------------------------------------------------------------------
    def apply(self, kind: str, table: pa.Table) -> None:
        """Fold a table of ``kind``'s events."""
        if kind in COLUMNAR:
            self.apply_table(kind, table)
        elif kind in TABLE_KINDS and len(table):
            self._apply_samples(kind, table)
        elif kind in EVENT_KINDS and len(table):
            self.apply_events(events_of(kind, table))

    def _apply_samples(self, kind: str, table: pa.Table) -> None:
        """Fold a ``step``, ``memory``, ``process`` or ``gpu`` table column-wise: as :meth:`apply_events` of
        its rows would."""
        self.version += 1
        if kind == "gpu":
            self._know_gpu_samples(table)
            self.gpus.add_table(table)
            return
        table = self._of_the_job(kind, table)
        if kind == "memory":
            self.memory.add_table(table)
        elif kind == "process":
            self.memory.add_process_table(table)
            if self.server is not None and self.requests is not None:
                client = table.filter(pc.equal(table.column("rank"), CLIENT_RANK)).select(["wall_ns", "cpu_pct"])
                for wall_ns, cpu_pct in zip(*client.to_pydict().values(), strict=True):
                    self.requests.add_client_cpu(wall_ns, cpu_pct)
        elif not self._add_step_rows(StepRows.of(table)):
            self.apply_events(events_of(kind, table))

    def _of_the_job(self, kind: str, table: pa.Table) -> pa.Table:
        """The rows :meth:`_fits` keeps: a rank of the job, a step time no less than 0 (the rest counted)."""
        return self._kept(kind, table, self._job_rows(kind, table))

    def rows_of_the_job(self, kind: str, table: pa.Table) -> pa.Table:
        """The rows of a ``step``, ``memory`` or ``process`` table that :meth:`of_the_job` keeps, the others
        left out and not counted again: for a reader beside the fold (a live session's screen)."""
        keep = self._job_rows(kind, table)
        return table if (pc.sum(keep).as_py() or 0) == len(table) else table.filter(keep)

    def _job_rows(self, kind: str, table: pa.Table) -> pa.ChunkedArray:
        keep = self._of_a_rank(table)
        if kind == "step":
            keep = pc.and_(keep, pc.greater_equal(table.column("duration_s"), 0))
        return keep

    def _of_a_rank(self, table: pa.Table) -> pa.ChunkedArray:
        rank = table.column("rank")
        return pc.and_(pc.greater_equal(rank, 0), pc.less(rank, self._rank_limit))

    def _kept(self, kind: str, table: pa.Table, keep: pa.ChunkedArray) -> pa.Table:
        """``table``'s rows where ``keep``; the others counted as rejected."""
        kept = pc.sum(keep).as_py() or 0
        if kept == len(table):
            return table
        self.rejected[kind] += len(table) - kept
        return table.filter(keep)

    def _add_step_rows(self, rows: StepRows) -> bool:
        """Fold a training run's step table as :meth:`_on_step` of each row would; False (nothing folded)
        where it cannot be done a table at a time."""
        if not self.training or not self._completed.keys().isdisjoint(rows.step):
            return False  # inference, or a late report of a step completed but not yet closed
        completed = self._folder.add_rows(rows)
        if completed is None:
            return False
        for step, indexes in rows.by_step.items():
            rows.add_spans(self._spans_of(step), indexes)
        self._complete_steps(completed)
        return True

    def _know_gpu_samples(self, table: pa.Table) -> None:
        """Each GPU's model from its first sample that names it (as :meth:`apply_events` takes them)."""
        named = table.filter(pc.fill_null(pc.not_equal(table.column("name"), ""), False))
        for key, (name, power_limit_w) in first_sample_of_each_gpu(named, ["name", "power_limit_w"]).items():
            if key not in self.gpu_models:
                self.gpu_models[key] = GpuModel(name, power_limit_w)

    def apply_table(self, kind: str, table: pa.Table) -> None:
        """Fold a ``collective`` or ``stage_action`` table (rows that cannot be this job's left out, counted)."""
        self.version += 1
        table = self._plausible(kind, table)
        if kind == "collective":
            self.collectives.add(table)
        elif self.training:
            self.stages.add_actions(table)

    def _plausible(self, kind: str, table: pa.Table) -> pa.Table:
        """The rows that can be this job's: a rank of the job, a group of one rank or more, an end no
        earlier than the start (a line can be well-formed and still not describe the job)."""
        return self._kept(kind, table, self._plausible_rows(kind, table))

    def plausible(self, kind: str, table: pa.Table) -> pa.Table:
        """The rows of a ``collective`` or ``stage_action`` table the fold keeps (those it folds), the others
        left out and not counted again: for a reader that counts what the fold counts (``/metrics``)."""
        keep = self._plausible_rows(kind, table)
        return table if (pc.sum(keep).as_py() or 0) == len(table) else table.filter(keep)

    def _plausible_rows(self, kind: str, table: pa.Table) -> pa.ChunkedArray:
        keep = pc.and_(self._of_a_rank(table), pc.greater_equal(table.column("end_ns"), table.column("start_ns")))
        if kind == "collective":
            return pc.and_(keep, pc.greater_equal(table.column("group_size"), 1))
        return pc.and_(keep, pc.greater_equal(table.column("stage"), 0))

    def of_the_job(self, event: Event) -> bool:
        """Whether ``event`` can be this job's: a rank of the job (or none), a step time no less than 0."""
        rank = getattr(event, "rank", None)
        return (rank is None or 0 <= rank < self._rank_limit) and not (
            isinstance(event, StepTiming) and event.duration_s < 0
        )

    def _fits(self, event: Event) -> bool:
        """:meth:`of_the_job`, counting what is not."""
        if not self.of_the_job(event):
            self.rejected[event.kind] += 1
            return False
        return True

    def apply_events(self, events: Iterable[Event]) -> list[Event]:
        """Fold events of any kinds (those of :data:`EVENT_KINDS` count); those that cannot be this job's are
        left out and counted. The events kept."""
        self.version += 1
        kept = []
        for event in events:
            if isinstance(event, RankStarted):  # how many ranks there are: before a rank is checked against it
                self._started(event)
            if self._fits(event):
                kept.append(event)
        for event in kept:
            if isinstance(event, StepTiming):
                self._on_step(event)
            elif isinstance(event, RankStarted):
                self.positions[event.rank] = (event.pp_rank, event.dp_rank, event.tp_rank)
                self._starts_seen += 1
                self.nodes[event.rank], self.hosts[event.node] = event.node, event.host
                if event.model_parameters is not None:
                    self.trained[event.rank] = (event.pp_rank, event.model_parameters)
            elif isinstance(event, MemorySnapshot):
                self.memory.add(event)
            elif isinstance(event, ProcessSample):
                self.memory.add_process(event)
                if self.server is not None and self.requests is not None and event.rank == CLIENT_RANK:
                    self.requests.add_client_cpu(event.wall_ns, event.cpu_pct)
            elif isinstance(event, RequestDone) and self.requests is not None:
                self.requests.add(event)
            elif isinstance(event, ServerMetric) and self.server is not None:
                self.server.add(event)
            elif isinstance(event, GpuSample):
                self.gpus.add(event)
                if event.name:
                    self.gpu_models.setdefault((event.node, event.gpu), GpuModel(event.name, event.power_limit_w))
            elif isinstance(event, JobEnded):
                self.finish(event.status)
        return kept

    def _started(self, event: RankStarted) -> None:
        """The ranks say how many they are: an elastic script's were counted for MAX nodes until then, and a
        start after a restart may have another number of them from its first step on."""
        self.run = self.run.started_with(event.world_size)
        self._rank_limit = max(self._rank_limit, event.world_size)
        self.starts.setdefault(event.restart, (event.world_size or self.run.world_size, event.first_step))
        if self.training:
            for step in self._folder.started(event.world_size, event.first_step):
                self._complete(step)

    def know_gpus(self, gpus: Iterable[GpuInfo]) -> None:
        """The GPUs a recording's manifest names (its GPU samples may be gone): what MFU's peak is looked up by."""
        for gpu in gpus:
            if gpu.name:
                self.gpu_models.setdefault((gpu.node, gpu.gpu), GpuModel(gpu.name, gpu.power_limit_w))

    @property
    def steps_completed(self) -> int:
        """Job steps completed so far."""
        return self.steps.count

    def steps_since(self, seen: int) -> list[JobStep]:
        """The job steps completed after the first ``seen``, in order (at most :data:`STEPS_KEPT`: a reader that
        fell further behind takes the latest)."""
        fresh = min(len(self.recent_steps), self.steps_completed - seen)
        return list(islice(self.recent_steps, len(self.recent_steps) - fresh, None)) if fresh > 0 else []

    def attention(self, measure: str, node_of: dict[int, int] | None = None) -> Attention:
        """The ranks and nodes (``node_of``: each rank's; by default the node each reported at its start) that
        stand out on ``measure`` (:mod:`~meshtop.recordings.metrics.attention`): a step measure over each rank's
        last closed steps, or each rank's memory headroom (GPU ranks only)."""
        node_of = self.nodes if node_of is None else node_of
        if measure in STEP_MEASURES:
            values = self.recent_by_rank.medians(measure)
        else:
            values = {
                rank: float(headroom)
                for rank in self.memory.peaks()
                if (headroom := self.memory.headroom(rank)) is not None
            }
        return attention(measure, values, node_of)

    def attention_input(self, measure: str) -> int:
        """Grows when what :meth:`attention` of ``measure`` reads changes: the steps closed (a step measure)
        or the ranks' memory (headroom)."""
        return self.closed_count if measure in STEP_MEASURES else self.memory.changes

    def position(self, rank: int) -> tuple[int, int, int]:
        """(pp, dp, tp) of ``rank``: as it reported, else where the plan puts it."""
        return self.positions.get(rank) or self.run.plan.coordinates(rank)

    def _on_step(self, timing: StepTiming) -> None:
        if not self.training:
            pp, dp, tp = self.position(timing.rank)
            if timing.pipeline_wait_s is not None and self.run.plan.pp > 1:
                self.stages.add_iteration(pp, timing.duration_s, timing.pipeline_wait_s, shown=dp == 0 and tp == 0)
            if timing.rank == 0 and (step := self._folder.add(timing)) is not None:
                self._complete(step)
            return
        self._spans_of(timing.step).add(
            timing.rank, timing.start_ns, timing.duration_s, timing.forward_backward_s, Windows.of(timing)
        )
        if (step := self._folder.add(timing)) is not None:
            self._complete(step)

    def next_batch(self, *, bulk_left_out: bool) -> None:
        """A live session's next batch follows (``bulk_left_out``: without the collectives and stage actions it
        brought, or this fold reads none): only whole steps are broken down (:class:`WholeSteps`)."""
        self._whole.next_batch(bulk_left_out=bulk_left_out)

    def _spans_of(self, step: int) -> StepSpans:
        spans = self._spans.get(step)
        if spans is None:
            spans = self._spans[step] = StepSpans()
            self._whole.first_report(step)
        return spans

    def _complete(self, step: JobStep) -> None:
        self._complete_steps([step])

    def _complete_steps(self, steps: list[JobStep]) -> None:
        """Take job steps as they completed, in order, and close each step :data:`CLOSE_AFTER` behind one."""
        closing = []
        for step in steps:
            self.steps.add(step)
            self.recent_steps.append(step)
            if self.training:
                self._completed[step.step] = step
                self._whole.completed(step.step)
                closing += [
                    self._completed.pop(number)
                    for number in sorted(self._completed)
                    if number <= step.step - CLOSE_AFTER
                ]
        self._close(closing)

    def _close(self, steps: list[JobStep]) -> None:
        """Decide the per-step figures of completed job steps (together: one pass over their collectives)."""
        spans = [self._spans.pop(step.step, StepSpans()) for step in steps]
        exposures = self.collectives.close_steps(
            [(step.step, step.duration_s, ranks) for step, ranks in zip(steps, spans, strict=True)]
        )
        for step, ranks, (by_op, by_rank, waits) in zip(steps, spans, exposures, strict=True):
            whole = self._whole.closes_whole(step.step)
            parts = self._break_down(ranks, waits) if whole else None
            durations = ranks.durations_s()
            self.recent_by_rank.add_many("step", durations.keys(), durations.values())
            span_s, bubbles = self.stages.close(step.step, ranks.forward_backward_max_s())
            if whole:
                self.compute.add_step(
                    durations,
                    by_rank,
                    span_ns=(min(ranks.start_ns, default=0), max(ranks.end_ns, default=0)),
                    stage_of=lambda rank: self.position(rank)[0],
                    parts=parts,
                )
            self.closed_count += 1
            self.closed_torn += not whole
            self.closed.append(ClosedStep(step.step, step.duration_s, by_op, by_rank, durations, span_s, bubbles))

    def _break_down(self, ranks: StepSpans, waits: Waits) -> tuple[list[int], np.ndarray] | None:
        """Each rank's parts of a closed step (ranks that measured their phases, all at once), and its slowest
        ranks: the ranks and a row of parts each (``None`` where none measured them)."""
        phased = list(ranks.windows)
        if not phased:
            return None
        parts = self.breakdown.add_cells(phased, step_cells(ranks, phased, waits))
        self.breakdown.add_step(phased, parts, [self.position(rank)[0] for rank in phased])
        for measure in STEP_MEASURES[1:]:
            self.recent_by_rank.add_many(measure, phased, parts[:, PARTS.index(measure)].tolist())
        return phased, parts

    def _closed_figures(self) -> tuple[Breakdown, tuple[Straggler, ...]]:
        """The figures that change only when a step closes (or a rank's start moves it): the breakdown and
        the stragglers, each with its cause where the ranks measured their phases."""
        return self.breakdown.figures(), tuple(self.compute.stragglers())

    def step_bubbles(self, number: int) -> tuple[float, dict[int, float]]:
        """A completed step's span and stage bubbles: as decided if it closed (recently), else as far as its
        events have come."""
        for closed in reversed(self.closed):
            if closed.step == number:
                return closed.span_s, closed.bubbles
        return step_bubbles(
            self.stages.busy_by_stage(number), self._spans.get(number, StepSpans()).forward_backward_max_s()
        )

    def finish(self, status: str) -> None:
        """The job ended (``status``): decide every completed step, forget the steps it never completed, and
        count the load's requests it never served."""
        self.version += 1
        self._close([self._completed.pop(number) for number in sorted(self._completed)])
        for number in self.collectives.open_steps():
            self.collectives.drop(number)
        for number in self.stages.open_steps():
            self.stages.drop(number)
        self._spans.clear()
        self._whole.clear()
        if self.requests is not None:
            self.requests.ended_status = status

    # -- output --------------------------------------------------------------------------------
    def _part(self, name: str, key: Hashable, compute: Callable[[], _Part]) -> _Part:
        """``compute()``, computed again only when ``key`` (what it depends on) changed: a live dashboard asks
        for the figures after every batch, and at a thousand ranks the per-rank ones (memory, the breakdown,
        the stragglers) cost 10-20 ms, where most batches change none of them."""
        held = self._parts.get(name)
        if held is None or held[0] != key:
            held = self._parts[name] = (key, compute())
        return cast(_Part, held[1])

    def figures(self) -> RunFigures:
        """Every figure now (computed again only after a change)."""
        if self._figures is not None and self._figures[0] == self.version:
            return self._figures[1]
        requests = self.requests.figures() if self.requests is not None else None
        steps = self.steps.figures(tokens_per_s=requests.output_tokens_per_s if requests is not None else None)
        memory, most_loaded_rank, headroom_bytes = self._part(
            "memory",
            self.memory.changes,
            lambda: (tuple(self.memory.rows()), self.memory.most_loaded_rank(), self.memory.headroom_bytes()),
        )
        breakdown, stragglers = self._part("closed steps", (self.closed_count, self._starts_seen), self._closed_figures)
        figures = RunFigures(
            steps=steps,
            collectives=tuple(self.collectives.rows()),
            stages=tuple(self.stages.rows()),
            memory=memory,
            most_loaded_rank=most_loaded_rank,
            headroom_bytes=headroom_bytes,
            requests=requests,
            mfu=mfu(
                self.run,
                gpus=self.gpu_models.values(),
                tokens_per_s=steps.tokens_per_s,
                script_parameters=script_parameters(self.trained.values()),
            ),
            stragglers=stragglers,
            server=self.server.figures() if self.server is not None else None,
            gpus=tuple(self.gpus.rows()),
            breakdown=breakdown if breakdown.steps else None,
        )
        self._figures = (self.version, figures)
        return figures


def fold_tables(run: RunDescription, tables: Iterable[tuple[str, Iterable[pa.Table]]], *, status: str) -> RunFold:
    """A whole run's tables folded, the job ended with ``status``: each kind's batches (a table, or its parts
    in any number; read only as they are folded) in turn, the ranks' starts first and the steps after the
    operations they close."""
    fold = RunFold(run)
    order = {"rank_started": 0, "collective": 1, "stage_action": 1, "step": 2, "job_ended": 3}
    for kind, batches in sorted(tables, key=lambda item: order.get(item[0], 1)):
        if kind != "job_ended":
            for batch in batches:
                fold.apply(kind, batch)
    fold.finish(status)
    return fold
