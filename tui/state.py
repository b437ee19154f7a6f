"""The dashboard's analysis state: plain Python, fed events, read by the screen at its frame rate.

Everything here is bounded: per-rank and per-GPU histories are rolling
windows, collective durations keep the last few hundred, pipeline timelines
the last few steps. So memory stays flat however long a run goes, and a
frame costs the same at step 10 and at step 10,000. No Textual here: tests
and benchmarks drive it directly.
"""

from __future__ import annotations

import statistics
from collections import Counter, defaultdict, deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from probes.bandwidth import bus_factor
from probes.events import (
    CollectiveTiming, Event, EventsDropped, GpuSample, HangDetected, JobEnded, MemorySnapshot, NvmlState,
    ProcessSample, RankExited, RankStarted, RequestDone, SamplerError, StackDump, StageAction, StepTiming,
)
from recordings.requests import INFER_MODE, Slo, load_of, quantile, unserved_reason
from recordings.steps import JobStep, StepFolder
from tui.request_stats import RequestStats, RequestsView

HISTORY = 240
"""Points kept for each chart (steps, utilisation, power, CPU)."""
DURATIONS_KEPT = 512
"""Recent durations kept per collective (group, op) for the percentiles."""
TIMELINE_STEPS = 3
"""Steps of pipeline timeline kept."""
STRAGGLER_RATIO = 1.25
"""A rank is a straggler when its compute time (step minus time in collectives) exceeds its peers' median by this."""
STRAGGLER_MIN_S = 0.002
STRAGGLER_WINDOW = 5
DEFAULT_HEADROOM_ALERT = 0.10
"""Alert when a GPU has less than this share of its memory free."""
PEAK_BF16_FLOPS = {"H200": 989e12, "H100": 989e12, "GH200": 989e12, "B200": 2250e12, "A100": 312e12,
                   "L40S": 362e12, "L4": 121e12, "A10": 125e12}
"""Dense bf16 tensor-core peaks by GPU name fragment (vendor datasheets), for MFU."""


def peak_bf16_flops(gpu_name: str) -> float | None:
    """The dense bf16 peak of the GPU called ``gpu_name``, where it is known."""
    return next((value for key, value in PEAK_BF16_FLOPS.items() if key in gpu_name), None)


@dataclass(frozen=True, slots=True)
class RunInfo:
    """What the header says about the run, from its description (the manifest, live or recorded)."""

    label: str
    model: str
    parameters: int | None
    flops_per_token: float | None
    device: str
    dtype: str
    world_size: int
    steps: int | None
    mode: str
    pp: int
    microbatches: int | None
    instrumented: bool
    recording: str | None
    requests: int | None = None
    """The inference load's request count (``None`` for training, or a load not described)."""
    slo: Slo = field(default_factory=Slo)

    @property
    def inference(self) -> bool:
        return self.mode == INFER_MODE

    @classmethod
    def from_description(cls, description: dict[str, Any], recording: str | None) -> RunInfo:
        plan, model = description.get("plan", {}), description.get("model", {})
        parameters = model.get("parameters")
        flops = None
        if parameters and model.get("n_layers") and model.get("dim") and description.get("seq_len"):
            # 6N per token for forward + backward, plus attention's 12 L d T (PaLM's appendix B).
            flops = 6 * parameters + 12 * model["n_layers"] * model["dim"] * description["seq_len"]
        return cls(
            label=str(plan.get("label", "?")), model=str(model.get("name", "?")), parameters=parameters,
            flops_per_token=flops, device=str(description.get("device", "?")),
            dtype=str(description.get("dtype", "?")), world_size=int(plan.get("world_size") or 1),
            steps=description.get("steps"), mode=str(description.get("mode", "train")),
            pp=int(plan.get("pp") or 1), microbatches=plan.get("microbatches"),
            instrumented=bool(description.get("instrumented", True)), recording=recording,
            requests=load_of(description).get("requests"),
            slo=Slo.of(description),
        )


@dataclass(slots=True)
class RankView:
    """One rank as the dashboard knows it."""

    rank: int
    pid: int | None = None
    device: str | None = None
    pp_rank: int = 0
    dp_rank: int = 0
    tp_rank: int = 0
    cpu_pct: float | None = None
    rss_bytes: int | None = None
    threads: int | None = None
    cpu_history: deque[float] = field(default_factory=lambda: deque(maxlen=HISTORY))
    memory: MemorySnapshot | None = None
    exited: RankExited | None = None
    stack: StackDump | None = None
    compute_s: deque[float] = field(default_factory=lambda: deque(maxlen=STRAGGLER_WINDOW))
    """Recent steps' time outside collectives: what a straggler has more of."""

    @property
    def status(self) -> str:
        if self.exited is None:
            return "running" if self.pid is not None else "starting"
        if self.exited.exit_code == 0:
            return "exited 0"
        if self.exited.signal:
            return f"killed by {self.exited.signal}"
        if self.exited.exit_code is None:
            return "stopped"
        return f"exit {self.exited.exit_code}"


@dataclass(slots=True)
class GpuView:
    """One GPU's latest NVML reading and its recent history."""

    gpu: int
    sample: GpuSample
    utilization: deque[float] = field(default_factory=lambda: deque(maxlen=HISTORY))
    power_w: deque[float] = field(default_factory=lambda: deque(maxlen=HISTORY))


@dataclass(slots=True)
class CollectiveStats:
    """One (group, op): running totals and recent durations."""

    group: str
    op: str
    group_size: int
    count: int = 0
    bytes: int = 0
    total_s: float = 0.0
    durations_s: deque[float] = field(default_factory=lambda: deque(maxlen=DURATIONS_KEPT))
    busbw_gbps: deque[float] = field(default_factory=lambda: deque(maxlen=DURATIONS_KEPT))
    per_step_s: dict[int, float] = field(default_factory=dict)
    """Seconds summed over ranks, per step (recent steps only)."""
    history: deque[float] = field(default_factory=lambda: deque(maxlen=HISTORY))
    """Per completed step: mean seconds per rank."""


@dataclass(frozen=True, slots=True)
class CollectiveRow:
    group: str
    op: str
    count: int
    bytes: int
    p50_s: float | None
    p99_s: float | None
    busbw_gbps: float | None
    step_share: float | None
    """Mean time per rank per step in this op, over the mean step time (recent steps)."""
    history: tuple[float, ...]


@dataclass(frozen=True, slots=True)
class Segment:
    """One stage action on the timeline, in seconds from the start of its step."""

    start_s: float
    end_s: float
    action: str
    microbatch: int


@dataclass(frozen=True, slots=True)
class PipelineStep:
    step: int
    span_s: float
    lanes: dict[int, tuple[Segment, ...]]
    """Segments per pipeline rank (its first dp / tp copy)."""
    bubble: dict[int, float]
    """Idle share of the step per pipeline rank (mean over its copies)."""


@dataclass(frozen=True, slots=True)
class Alert:
    severity: str
    """error, warning or info."""
    text: str
    wall_ns: int


def percentile(values: Iterable[float], q: float) -> float | None:
    ordered = sorted(values)
    if not ordered:
        return None
    index = min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))
    return ordered[index]


def median_without(ordered: list[float], index: int) -> float:
    """The median of sorted ``ordered`` less its element at ``index`` (in O(1): the stragglers check per rank)."""
    def at(k: int) -> float:  # k-th of the list without ``index``
        return ordered[k if k < index else k + 1]

    n = len(ordered) - 1
    middle = n // 2
    return at(middle) if n % 2 else (at(middle - 1) + at(middle)) / 2


class DashboardState:
    """Folds events into what the screen shows. ``apply`` is cheap; the views compute on demand."""

    def __init__(self, description: dict[str, Any], *, recording: str | None = None,
                 headroom_alert: float = DEFAULT_HEADROOM_ALERT) -> None:
        self.info = RunInfo.from_description(description, recording)
        self.headroom_alert = headroom_alert
        self.events = 0
        self._requests_view: tuple[tuple[int, int | None], RequestsView] | None = None
        self.first_ns: int | None = None
        """Where elapsed time counts from: the session's start live, the recording's start in a replay."""
        self.clock_ns: int | None = None
        """The dashboard's now: wall time live, the playback position in a replay."""
        self.ranks: dict[int, RankView] = {}
        self.gpus: dict[int, GpuView] = {}
        self.nvml: NvmlState | None = None
        self.steps: deque[JobStep] = deque(maxlen=HISTORY)
        self.steps_done = 0
        self.collectives: dict[tuple[str, str], CollectiveStats] = {}
        self.dropped = 0
        self.sampler_errors = 0
        self.last_sampler_error: str | None = None
        self.ended: JobEnded | None = None
        self.hang: HangDetected | None = None
        """The hang reported last, until progress resumes."""
        self.stacks_wall_ns: int | None = None
        self.requests = RequestStats(self.info.slo)
        # Inference: iterations of different replicas are unrelated, so the job's steps are rank 0's (as in
        # the summary).
        self._folder = StepFolder(1 if self.info.inference else self.info.world_size)
        self._step_fb: dict[int, float] = {}
        self._busy: dict[int, dict[int, float]] = defaultdict(lambda: defaultdict(float))
        self._lanes: dict[int, dict[int, list[StageAction]]] = defaultdict(lambda: defaultdict(list))
        self._comm_by_rank: dict[int, dict[int, float]] = defaultdict(lambda: defaultdict(float))
        self._timeline: deque[PipelineStep] = deque(maxlen=TIMELINE_STEPS)
        self._bubble_history: dict[int, deque[float]] = defaultdict(lambda: deque(maxlen=HISTORY))
        self._rank_durations: dict[int, dict[int, float]] = defaultdict(dict)

    # -- input -----------------------------------------------------------------

    def apply(self, events: Iterable[Event]) -> None:
        for event in events:
            self.events += 1
            handler = self._HANDLERS.get(type(event))
            if handler is not None:
                handler(self, event)

    def set_clock(self, now_ns: int, origin_ns: int | None) -> None:
        self.clock_ns, self.first_ns = now_ns, origin_ns

    def _rank(self, rank: int) -> RankView:
        view = self.ranks.get(rank)
        if view is None:
            view = self.ranks[rank] = RankView(rank=rank)
        return view

    def _on_started(self, event: RankStarted) -> None:
        view = self._rank(event.rank)
        view.pid, view.device = event.pid, event.device
        view.pp_rank, view.dp_rank, view.tp_rank = event.pp_rank, event.dp_rank, event.tp_rank

    def _on_collective(self, event: CollectiveTiming) -> None:
        if event.step is None:  # set-up and tear-down (barriers, DDP's first broadcast): not the job's steps
            return
        key = (event.group, event.op)
        stats = self.collectives.get(key)
        if stats is None:
            stats = self.collectives[key] = CollectiveStats(group=event.group, op=event.op, group_size=event.group_size)
        seconds = (event.end_ns - event.start_ns) / 1e9
        stats.count += 1
        stats.bytes += event.bytes
        stats.total_s += seconds
        stats.durations_s.append(seconds)
        if seconds > 0 and event.bytes > 0:
            stats.busbw_gbps.append(event.bytes / seconds / 1e9 * bus_factor(event.op, event.group_size))
        stats.per_step_s[event.step] = stats.per_step_s.get(event.step, 0.0) + seconds
        self._comm_by_rank[event.step][event.rank] += seconds

    def _on_stage_action(self, event: StageAction) -> None:
        if event.step is None:
            return
        self._busy[event.step][event.rank] += (event.end_ns - event.start_ns) / 1e9
        view = self.ranks.get(event.rank)
        if view is None or (view.dp_rank == 0 and view.tp_rank == 0):
            self._lanes[event.step][event.rank].append(event)

    def _on_step(self, event: StepTiming) -> None:
        if self.info.inference:
            self._on_iteration(event)
            return
        if event.forward_backward_s is not None:
            self._step_fb[event.step] = max(self._step_fb.get(event.step, 0.0), event.forward_backward_s)
        self._rank_durations[event.step][event.rank] = event.duration_s
        step = self._folder.add(event)
        if step is not None:
            self._complete(step)

    def _on_iteration(self, event: StepTiming) -> None:
        """An inference engine iteration: replica 0's ranks give each stage's bubble (the share of the
        iteration spent waiting for a pipeline neighbour); rank 0's iterations are the job's steps."""
        view = self.ranks.get(event.rank)
        if (event.pipeline_wait_s is not None and event.duration_s > 0 and view is not None
                and view.dp_rank == 0 and view.tp_rank == 0):
            self._bubble_history[view.pp_rank].append(event.pipeline_wait_s / event.duration_s)
        if event.rank == 0 and (step := self._folder.add(event)) is not None:
            self._complete(step)

    def _on_request(self, event: RequestDone) -> None:
        self.requests.add(event)

    def _complete(self, step: JobStep) -> None:
        self.hang = None  # progress again
        self.steps.append(step)
        self.steps_done = max(self.steps_done, step.step + 1)
        for stats in self.collectives.values():
            seconds = stats.per_step_s.pop(step.step, 0.0)
            stats.history.append(seconds / self.info.world_size)
            for old in [s for s in stats.per_step_s if s < step.step - 8]:
                del stats.per_step_s[old]
        comm = self._comm_by_rank.pop(step.step, {})
        for rank, duration in self._rank_durations.pop(step.step, {}).items():
            self._rank(rank).compute_s.append(duration - comm.get(rank, 0.0))
        self._fold_pipeline(step.step)
        for old in [s for s in self._rank_durations if s < step.step - 8]:
            del self._rank_durations[old]

    def _fold_pipeline(self, step: int) -> None:
        busy = self._busy.pop(step, None)
        lanes = self._lanes.pop(step, {})
        for old in [s for s in self._busy if s < step - 8]:
            del self._busy[old]
            self._lanes.pop(old, None)
        span = self._step_fb.pop(step, None)
        if not busy or not span:
            return
        per_stage: dict[int, list[float]] = defaultdict(list)
        for rank, seconds in busy.items():
            per_stage[self._rank(rank).pp_rank].append(seconds)
        span = max(span, max(busy.values()))
        bubble = {stage: 1 - statistics.fmean(values) / span for stage, values in sorted(per_stage.items())}
        for stage, fraction in bubble.items():
            self._bubble_history[stage].append(fraction)
        origin = min((a.start_ns for actions in lanes.values() for a in actions), default=0)
        drawn = {
            self._rank(rank).pp_rank: tuple(
                Segment((a.start_ns - origin) / 1e9, (a.end_ns - origin) / 1e9, a.action, a.microbatch)
                for a in sorted(actions, key=lambda a: a.start_ns))
            for rank, actions in sorted(lanes.items())
        }
        self._timeline.append(PipelineStep(step=step, span_s=span, lanes=drawn, bubble=bubble))

    def _on_memory(self, event: MemorySnapshot) -> None:
        self._rank(event.rank).memory = event

    def _on_gpu(self, event: GpuSample) -> None:
        view = self.gpus.get(event.gpu)
        if view is None:
            view = self.gpus[event.gpu] = GpuView(gpu=event.gpu, sample=event)
        view.sample = event
        if event.utilization_pct is not None:
            view.utilization.append(event.utilization_pct)
        if event.power_w is not None:
            view.power_w.append(event.power_w)

    def _on_nvml(self, event: NvmlState) -> None:
        self.nvml = event

    def _on_process(self, event: ProcessSample) -> None:
        view = self._rank(event.rank)
        view.pid = event.pid
        view.cpu_pct, view.rss_bytes, view.threads = event.cpu_pct, event.rss_bytes, event.threads
        if event.cpu_pct is not None:
            view.cpu_history.append(event.cpu_pct)

    def _on_exited(self, event: RankExited) -> None:
        self._rank(event.rank).exited = event

    def _on_ended(self, event: JobEnded) -> None:
        self.ended = event

    def _on_dropped(self, event: EventsDropped) -> None:
        self.dropped += event.count

    def _on_sampler_error(self, event: SamplerError) -> None:
        self.sampler_errors += 1
        self.last_sampler_error = f"{event.sampler}: {event.message}"

    def _on_hang(self, event: HangDetected) -> None:
        self.hang = event

    def _on_stack(self, event: StackDump) -> None:
        self._rank(event.rank).stack = event
        self.stacks_wall_ns = event.wall_ns

    _HANDLERS: dict[type, Any] = {
        RankStarted: _on_started, CollectiveTiming: _on_collective, StageAction: _on_stage_action,
        StepTiming: _on_step, MemorySnapshot: _on_memory, GpuSample: _on_gpu, NvmlState: _on_nvml,
        ProcessSample: _on_process, RankExited: _on_exited, JobEnded: _on_ended, EventsDropped: _on_dropped,
        SamplerError: _on_sampler_error, StackDump: _on_stack, HangDetected: _on_hang, RequestDone: _on_request,
    }

    # -- views -------------------------------------------------------------------

    @property
    def elapsed_s(self) -> float:
        if self.first_ns is None or self.clock_ns is None:
            return 0.0
        return max(0.0, (self.clock_ns - self.first_ns) / 1e9)

    @property
    def last_step(self) -> JobStep | None:
        return self.steps[-1] if self.steps else None

    def tokens_per_s(self, window: int = 10) -> float | None:
        recent = list(self.steps)[-window:]
        return statistics.median(s.tokens_per_s for s in recent) if recent else None

    def mfu(self) -> float | None:
        """Model FLOP/s over the GPUs' dense bf16 peak, where the GPU and the model are known."""
        if self.info.inference:  # 6N per token is training's forward and backward
            return None
        rate, flops = self.tokens_per_s(), self.info.flops_per_token
        if rate is None or flops is None or self.info.device != "cuda" or self.info.dtype != "bf16" or not self.gpus:
            return None
        peak = peak_bf16_flops(next(iter(self.gpus.values())).sample.name or "")
        if peak is None:
            return None
        return rate * flops / (peak * min(self.info.world_size, len(self.gpus)))

    def requests_view(self) -> RequestsView:
        """The inference requests so far; those the load never got served count as failed once the job ended.

        Built once per state of the events and the clock (the header and the overview both show it)."""
        key = (self.events, self.clock_ns)
        if self._requests_view is None or self._requests_view[0] != key:
            self._requests_view = (key, self._fold_requests_view())
        return self._requests_view[1]

    def _fold_requests_view(self) -> RequestsView:
        stats = self.requests
        failures = Counter(stats.failures)
        failed = stats.failed
        total = self.info.requests
        if self.ended is not None and total is not None and total > stats.completed + stats.failed:
            unserved = total - stats.completed - stats.failed
            failures[unserved_reason(self.ended.status)] += unserved
            failed += unserved
        now = self.clock_ns if self.clock_ns is not None else stats.last_end_ns
        rates = stats.rates(now) if now is not None else None
        slo_given = self.info.slo.given
        latencies = {}
        for name, values in stats.recent.items():
            ordered = sorted(values)
            latencies[name] = (quantile(ordered, 0.5), quantile(ordered, 0.99)) if ordered else (None, None)
        return RequestsView(
            total=total, completed=stats.completed, failed=failed, failures=tuple(failures.most_common()),
            latencies=latencies, history={name: tuple(values) for name, values in stats.recent.items()},
            requests_per_s=rates[0] if rates else None, output_tokens_per_s=rates[1] if rates else None,
            goodput_per_s=rates[2] if rates and slo_given else None,
            slo_met=sum(stats.good) / len(stats.good) if slo_given and stats.good else None,
        )

    def collective_rows(self) -> list[CollectiveRow]:
        """Per (group, op), the busiest first."""
        recent_steps = list(self.steps)[-20:]
        mean_step = statistics.fmean(s.duration_s for s in recent_steps) if recent_steps else None
        rows = []
        for stats in sorted(self.collectives.values(), key=lambda s: -s.total_s):
            recent = list(stats.history)[-20:]
            share = statistics.fmean(recent) / mean_step if recent and mean_step else None
            rows.append(CollectiveRow(
                group=stats.group, op=stats.op, count=stats.count, bytes=stats.bytes,
                p50_s=percentile(stats.durations_s, 0.5), p99_s=percentile(stats.durations_s, 0.99),
                busbw_gbps=statistics.median(stats.busbw_gbps) if stats.busbw_gbps else None,
                step_share=share, history=tuple(stats.history),
            ))
        return rows

    def pipeline_steps(self) -> list[PipelineStep]:
        return list(self._timeline)

    def bubble_history(self) -> dict[int, tuple[float, ...]]:
        return {stage: tuple(values) for stage, values in sorted(self._bubble_history.items())}

    def rank_peak_bytes(self, view: RankView) -> int | None:
        memory = view.memory
        if memory is None:
            return view.rss_bytes
        return memory.peak_allocated_bytes if memory.peak_allocated_bytes is not None else memory.rss_bytes

    def most_loaded_rank(self) -> int | None:
        loads = {rank: peak for rank, view in self.ranks.items() if (peak := self.rank_peak_bytes(view)) is not None}
        return max(loads, key=loads.__getitem__) if loads else None

    def stragglers(self) -> list[tuple[int, float]]:
        """(rank, its compute time over its stage peers' median) for ranks that lag their peers."""
        peers: dict[int, list[RankView]] = defaultdict(list)
        for view in self.ranks.values():
            if len(view.compute_s) >= 3:
                peers[view.pp_rank].append(view)
        found = []
        for group in peers.values():
            if len(group) < 2:
                continue
            medians = sorted((statistics.median(view.compute_s), view.rank) for view in group)
            ordered = [m for m, _ in medians]
            for index, (own, rank) in enumerate(medians):
                others = median_without(ordered, index)
                if others > 0 and own > STRAGGLER_RATIO * others and own - others > STRAGGLER_MIN_S:
                    found.append((rank, own / others))
        return sorted(found)

    def alerts(self) -> list[Alert]:
        """What needs the user's eye now, the worst first."""
        now = self.clock_ns or 0
        alerts = []
        for view in sorted(self.ranks.values(), key=lambda v: v.rank):
            exited = view.exited
            if exited is not None and exited.exit_code not in (0, None):
                why = f": {exited.error}" if exited.error else ""
                alerts.append(Alert("error", f"rank {view.rank} {view.status}{why}", exited.wall_ns))
        if self.hang is not None:
            verdict = self.hang.report.splitlines()[0]
            alerts.append(Alert("error", f"hang: no progress for {self.hang.silent_s:.0f} s; {verdict}",
                                self.hang.wall_ns))
        if self.ended is not None and self.ended.status == "failed" and self.ended.root_cause_rank is not None:
            alerts.append(Alert("error", f"job failed; rank {self.ended.root_cause_rank} failed first",
                                self.ended.wall_ns))
        for rank, ratio in self.stragglers():
            alerts.append(Alert("warning", f"rank {rank} is a straggler: {ratio:.2f}x its peers' compute time", now))
        for gpu in sorted(self.gpus.values(), key=lambda g: g.gpu):
            used, total = gpu.sample.memory_used_bytes, gpu.sample.memory_total_bytes
            if used is not None and total and 1 - used / total < self.headroom_alert:
                alerts.append(Alert("warning", f"GPU {gpu.gpu} memory headroom {1 - used / total:.0%} "
                                               f"(below {self.headroom_alert:.0%})", gpu.sample.wall_ns))
        if self.requests.failed:
            reason, count = self.requests.failures.most_common(1)[0]
            text = f"failed requests: {self.requests.failed:,}; most often ({count:,}): {reason}"
            alerts.append(Alert("warning", text, now))
        if self.dropped:
            alerts.append(Alert("warning", f"{self.dropped:,} telemetry events dropped (buffers full)", now))
        if self.sampler_errors:
            alerts.append(Alert("info", f"{self.sampler_errors} sampler errors; last: {self.last_sampler_error}", now))
        return alerts
