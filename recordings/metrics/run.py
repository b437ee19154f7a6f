"""One run's figures, folded from its event tables: what the dashboard, ``summary``, ``compare``, ``export``
and the metrics endpoint all read.

:class:`RunFold` takes a run's events a table at a time (:meth:`RunFold.apply`), in any grouping: the
dashboard gives it what arrived since the last frame, ``summary`` a recording's whole tables. Events made as
objects become a table where they come in (:func:`meshtop.recordings.schema.tables_of`): the fold has one
path. Collectives and stage actions, the bulk of a run, are folded column-wise, and so are steps and memory,
process and GPU samples. Anything decided per step (exposed communication, stage bubbles) is decided when the
step closes: two job steps after it completes, or when the job ends (:meth:`RunFold.finish`), so operations
that arrive a little after their step still count, and the result does not depend on how the events were
grouped.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass
from functools import reduce
from itertools import islice
from typing import TypeVar, cast

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from meshtop.probes.events import CLIENT_RANK, RequestDone, ServerMetric
from meshtop.probes.kinds import BULK_KINDS, FOLD_ORDER, FOLDED_KINDS
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
"""The columns the fold reads of the bulk kinds (a reader of a whole recording may load only these); the other
kinds' tables are taken whole."""


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
            RequestFold(
                run.load,
                replicas=(len(run.endpoint.replicas) or 1) if run.endpoint is not None else run.plan.dp,
                sent_by_client=run.endpoint is not None,
            )
            if run.inference
            else None
        )
        self.gpus = GpuFold(keeps_samples=run.inference)
        self.server = ServerFold() if run.endpoint is not None else None
        """An endpoint's engine, from its ``/metrics``."""
        self.steps = StepStats()
        self.positions: dict[int, tuple[int, int, int]] = {}
        """(pp, dp, tp) of each rank that reported its start."""
        self.nodes: dict[int, int] = {}
        """The node of each rank that reported its start."""
        self.hosts: dict[int, str] = {}
        """The host of each node whose ranks reported their start."""
        self.exits: dict[int, int | None] = {}
        """Each rank that exited: its exit code (negative: a signal; ``None`` where not known)."""
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
        actions out while their events came (:meth:`apply_torn`)."""
        self._torn: set[int] = set()
        """Steps not closed yet that a batch without the bulk kinds tore (:meth:`apply_torn`; forgotten once
        closed)."""
        self._tearing = False
        """The tables folded now come without the bulk kinds (:meth:`apply_torn`)."""
        self._last_reported = -1
        """The highest step a rank reported."""
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
        """Fold a table of ``kind``'s events (a kind of :data:`FOLDED_KINDS`; the others change no figure); rows
        that cannot be this job's (:meth:`of_the_job`) are left out and counted in :attr:`rejected`."""
        if kind not in FOLDED_KINDS or not len(table):
            return
        self.version += 1
        if kind == "rank_started":  # how many ranks there are: before a rank is checked against it
            self._started(table)
        table = self._counted_out(kind, table)
        if kind == "collective":
            self.collectives.add(table)
        elif kind == "stage_action":
            if self.training:
                self.stages.add_actions(table)
        elif kind == "step":
            self._on_steps(table)
        elif kind == "memory":
            self.memory.add(table)
        elif kind == "process":
            self.memory.add_process(table)
            if self.server is not None and self.requests is not None:
                client = table.filter(pc.equal(table.column("rank"), CLIENT_RANK)).select(["wall_ns", "cpu_pct"])
                for wall_ns, cpu_pct in zip(*client.to_pydict().values(), strict=True):
                    self.requests.add_client_cpu(wall_ns, cpu_pct)
        elif kind == "gpu":
            self._know_gpu_samples(table)
            self.gpus.add(table)
        elif kind == "rank_started":
            self._placed(table)
        elif kind == "request":
            if self.requests is not None:
                for done in events_of(kind, table):
                    self.requests.add(cast(RequestDone, done))
        elif kind == "server_metric":
            if self.server is not None:
                for metric in events_of(kind, table):
                    self.server.add(cast(ServerMetric, metric))
        elif kind == "rank_exited":
            columns = table.select(["rank", "exit_code"]).to_pydict()
            self.exits.update(zip(columns["rank"], columns["exit_code"], strict=True))
        elif kind == "job_ended":
            for status in table.column("status").to_pylist():
                self.finish(status)

    def of_the_job(self, kind: str, table: pa.Table) -> pa.Table:
        """The rows of ``table`` that can be this job's, the others left out and not counted: for a reader beside
        the fold that leaves out what the fold leaves out (a live screen, ``/metrics``)."""
        keep = self._of_the_job(kind, table)
        return table if keep is None else table.filter(keep)

    def _counted_out(self, kind: str, table: pa.Table) -> pa.Table:
        """:meth:`of_the_job`, counting in :attr:`rejected` the rows left out."""
        keep = self._of_the_job(kind, table)
        if keep is None:
            return table
        kept = table.filter(keep)
        self.rejected[kind] += len(table) - len(kept)
        return kept

    def _of_the_job(self, kind: str, table: pa.Table) -> pa.ChunkedArray | None:
        """Which rows can be this job's (``None``: all): a rank of the job, where the kind has one; a step time
        no less than 0; an operation that ends no earlier than it starts, a collective of a group of one rank or
        more, a stage action of a stage. A line can be well-formed and still not describe the job."""
        checks = []
        if "rank" in table.column_names:  # a rank of none (the collector's) is the job's
            rank = table.column("rank")
            in_job = pc.and_(pc.greater_equal(rank, 0), pc.less(rank, self._rank_limit))
            checks.append(pc.fill_null(in_job, True) if rank.null_count else in_job)
        if kind == "step":
            checks.append(pc.greater_equal(table.column("duration_s"), 0))
        if kind in BULK_KINDS:
            checks.append(pc.greater_equal(table.column("end_ns"), table.column("start_ns")))
        if kind == "collective":
            checks.append(pc.greater_equal(table.column("group_size"), 1))
        if kind == "stage_action":
            checks.append(pc.greater_equal(table.column("stage"), 0))
        if not checks:
            return None
        keep = reduce(pc.and_, checks)
        return None if (pc.sum(keep).as_py() or 0) == len(table) else keep

    def _on_steps(self, table: pa.Table) -> None:
        """A training run's step reports into their steps' spans and the job's steps; an inference run's are its
        engine's iterations: rank 0's make the job's steps, and a pipeline's each stage's idle share."""
        if self.training:
            rows = StepRows.of(table)
            for step, indexes in rows.by_step.items():
                rows.add_spans(self._spans_of(step), indexes)
            self._complete_steps(self._folder.add(rows))
            return
        if self.run.plan.pp > 1:
            waits = table.filter(pc.is_valid(table.column("pipeline_wait_s")))
            columns = waits.select(["rank", "duration_s", "pipeline_wait_s"]).to_pydict()
            for rank, duration_s, wait_s in zip(*columns.values(), strict=True):
                pp, dp, tp = self.position(rank)
                self.stages.add_iteration(pp, duration_s, wait_s, shown=dp == 0 and tp == 0)
        self._complete_steps(self._folder.add(StepRows.of(table.filter(pc.equal(table.column("rank"), 0)))))

    def _know_gpu_samples(self, table: pa.Table) -> None:
        """Each GPU's model from its first sample that names it."""
        named = table.filter(pc.fill_null(pc.not_equal(table.column("name"), ""), False))
        for key, (name, power_limit_w) in first_sample_of_each_gpu(named, ["name", "power_limit_w"]).items():
            if key not in self.gpu_models:
                self.gpu_models[key] = GpuModel(name, power_limit_w)

    def _placed(self, table: pa.Table) -> None:
        """Where each rank that started sits: its mesh position, node and host, and a script's trained
        parameters."""
        columns = table.select(["rank", "pp_rank", "dp_rank", "tp_rank", "node", "host", "model_parameters"])
        for rank, pp, dp, tp, node, host, parameters in zip(*columns.to_pydict().values(), strict=True):
            self.positions[rank] = (pp, dp, tp)
            self._starts_seen += 1
            self.nodes[rank], self.hosts[node] = node, host
            if parameters is not None:
                self.trained[rank] = (pp, parameters)

    def _started(self, table: pa.Table) -> None:
        """The ranks say how many they are: an elastic script's were counted for MAX nodes until then, and a
        start after a restart may have another number of them from its first step on."""
        columns = table.select(["world_size", "restart", "first_step"]).to_pydict()
        for world_size, restart, first_step in zip(*columns.values(), strict=True):
            self.run = self.run.started_with(world_size)
            self._rank_limit = max(self._rank_limit, world_size)
            self.starts.setdefault(restart, (world_size or self.run.world_size, first_step))
            if self.training:
                self._complete_steps(self._folder.started(world_size, first_step))

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

    def apply_torn(self, tables: Iterable[tuple[str, pa.Table]]) -> None:
        """Fold a live batch's tables that come without its collectives and stage actions (left out to keep up,
        or a fold that reads none). A rank sends a step's work between its reports of the step before and of the
        step, so the work of these steps may be missing: those the batch completes, those still open after it
        (reported, not completed) and the one after the last reported. Such a torn step is closed without its
        breakdown and its ranks' compute times: without its communication, that time would count as compute."""
        self._tearing = self.training
        try:
            for kind, table in tables:
                self.apply(kind, table)
        finally:
            self._tearing = False
        if self.training:
            self._torn |= self._spans.keys() - self._completed.keys()
            self._torn.add(self._last_reported + 1)

    def _spans_of(self, step: int) -> StepSpans:
        spans = self._spans.get(step)
        if spans is None:
            spans = self._spans[step] = StepSpans()
            self._last_reported = max(self._last_reported, step)
        return spans

    def _complete_steps(self, steps: list[JobStep]) -> None:
        """Take job steps as they completed, in order, and close each step :data:`CLOSE_AFTER` behind one."""
        closing = []
        for step in steps:
            self.steps.add(step)
            self.recent_steps.append(step)
            if self.training:
                self._completed[step.step] = step
                if self._tearing:
                    self._torn.add(step.step)
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
            whole = step.step not in self._torn
            self._torn.discard(step.step)
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
        self._torn.clear()
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

    def _load_ns(self) -> tuple[int, int] | None:
        """The load's window: its first request's arrival and its last completed request's end (ns)."""
        requests = self.requests
        if requests is None or requests.first_arrival_ns is None or requests.last_end_ns is None:
            return None
        return requests.first_arrival_ns, requests.last_end_ns

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
            server=self.server.figures(self.requests.sending_ns if self.requests is not None else None)
            if self.server is not None
            else None,
            gpus=tuple(self.gpus.rows(self._load_ns())),
            breakdown=breakdown if breakdown.steps else None,
        )
        self._figures = (self.version, figures)
        return figures


def fold_tables(run: RunDescription, tables: Iterable[tuple[str, Iterable[pa.Table]]], *, status: str) -> RunFold:
    """A whole run's tables folded, the job ended with ``status``: each kind's batches (a table, or its parts
    in any number; read only as they are folded) in turn, in the fold's order
    (:data:`~meshtop.probes.kinds.FOLD_ORDER`: the ranks' starts first, the steps after the operations they
    close)."""
    fold = RunFold(run)
    for kind, batches in sorted(tables, key=lambda item: FOLD_ORDER.get(item[0], 0)):
        if kind != "job_ended":
            for batch in batches:
                fold.apply(kind, batch)
    fold.finish(status)
    return fold
