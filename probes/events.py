"""Event types: what the probes measure, one frozen dataclass per kind.

Units are in the field names (``_ns``, ``_s``, ``bytes``); a value that is
not known is ``None``, never a sentinel.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from types import MappingProxyType
from typing import Any, ClassVar, TypeVar

NOT_FINITE_KEPT = MappingProxyType({"finite": False})
"""A float field's metadata: its NaN or infinity is a measurement (a loss that diverged), kept where events are
read. Every other float that is not finite is refused there as a malformed event
(:mod:`meshtop.recordings.schema`)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Event:
    """Base of every event; ``kind`` names the type on the wire and on disk."""

    kind: ClassVar[str] = "event"

    def to_record(self) -> dict[str, Any]:
        """A flat dict of JSON-ready values, with ``kind``."""
        record = {name: getattr(self, name) for name in _field_names(type(self))}
        record["kind"] = self.kind
        return record


_FIELD_NAMES: dict[type, tuple[str, ...]] = {}


def _field_names(cls: type) -> tuple[str, ...]:
    """The dataclass fields of ``cls``, once a kind (a dict rather than ``functools.cache``: mypy takes a
    frozen dataclass's class for unhashable)."""
    names = _FIELD_NAMES.get(cls)
    if names is None:
        names = _FIELD_NAMES[cls] = tuple(f.name for f in fields(cls))
    return names


@dataclass(frozen=True, slots=True, kw_only=True)
class RankStarted(Event):
    """A worker joined the job: where it sits in the mesh and what it runs on.

    A rank of a user's script sends it again when it first runs a pipeline stage (its place is known then)."""

    kind: ClassVar[str] = "rank_started"
    rank: int
    pid: int
    host: str
    device: str
    pp_rank: int
    dp_rank: int
    tp_rank: int
    stages: tuple[int, ...]
    """Pipeline stages this rank holds (empty without a pipeline)."""
    local_parameters: int
    """Parameter elements this rank stores (its shards only)."""
    wall_ns: int
    node: int = 0
    """The meshtop node the rank runs on (its ``--node-rank``; 0 on one machine): ``host`` may repeat."""
    world_size: int = 0
    """Ranks in the job as torchrun started it (its ``WORLD_SIZE``): what an elastic job (``--nnodes MIN:MAX``)
    settled on; 0 where the recording does not say."""
    restart: int = 0
    """torchrun's count of restarts of the ranks before this start (``TORCHELASTIC_RESTART_COUNT``): after a
    failure (``--max-restarts``), or when an elastic job's nodes changed."""
    first_step: int = 0
    """The recording's number of this start's first step: a later start's ranks count their steps from 0 again,
    and the head numbers them on after the steps before (:mod:`meshtop.runner.job.rounds`)."""
    model_parameters: int | None = None
    """A script's rank, from its first optimizer step on: parameter elements its optimizer trains, DTensors at
    their global size (the whole model on a data or tensor parallel rank, a stage's part on a pipeline rank);
    ``None`` for the built-in runner, whose model is in the manifest."""


@dataclass(frozen=True, slots=True, kw_only=True)
class StepTiming(Event):
    """One optimizer step as one rank saw it."""

    kind: ClassVar[str] = "step"
    rank: int
    step: int
    start_ns: int
    """Wall-clock time (``time.time_ns``) at the start of the step."""
    duration_s: float
    tokens: int
    """Tokens of the global batch consumed by this step; 0 where not known (a script run without
    ``--tokens-per-step``)."""
    loss: float | None = field(metadata=NOT_FINITE_KEPT)
    """This rank's loss in the step; ``None`` where the rank computes no loss; NaN or infinite where it
    diverged. A user's script's is the sum of the losses it differentiated in the step
    (:mod:`meshtop.probes.losses`)."""
    forward_backward_s: float | None = None
    """Time in forward and backward (the pipeline schedule's step), without the optimizer."""
    instrumented: bool = True
    """Whether the worker hooks were on during this step."""
    pipeline_wait_s: float | None = None
    """Time blocked on pipeline P2P during the step (instrumented pipeline ranks only)."""
    cpu_s: float | None = None
    """CPU time the rank's process used during the step, all its threads (training, shipper, backend)."""
    phases: str | None = None
    """The step's phase windows, a letter each (``d`` data, ``f`` forward, ``b`` backward, ``o`` optimizer;
    :mod:`meshtop.probes.phases`), their times in ``phase_start_ns`` and ``phase_end_ns``; ``None`` where not
    measured (``--no-instrument``, or a probe that is off)."""
    phase_start_ns: tuple[int, ...] = ()
    phase_end_ns: tuple[int, ...] = ()
    losses: int | None = None
    """A user's script: how many losses ``loss`` is made of (its backward calls in the step, or a pipeline
    schedule's microbatches; :mod:`meshtop.probes.losses`); ``None`` for the built-in runner's, or where the
    script's losses are not read (``--no-loss``)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class CollectiveTiming(Event):
    """One collective or point-to-point operation as one rank issued it.

    ``bytes`` is the size S of nccl-tests: the whole buffer, so for all-gather
    and reduce-scatter ``group_size`` times the per-rank part.
    """

    kind: ClassVar[str] = "collective"
    rank: int
    step: int | None
    op: str
    """all_reduce, all_gather, reduce_scatter, broadcast, reduce, gather, scatter, all_to_all, send, recv or barrier."""
    group: str
    """The mesh dim the process group spans (dp, tp, pp, or a script's own dim names), or ``embedding`` (a
    pipeline's tied-embedding ends, :mod:`meshtop.runner.rank.pipeline`), or ``world``, or its
    global ranks (``ranks 0,2``), or ``other`` (a group c10d no longer knew when the operation was read)."""
    group_size: int
    peer: int | None
    """Global rank at the other end of a send or recv."""
    bytes: int
    dtype: str | None
    start_ns: int
    """Wall clock when the rank issued it."""
    end_ns: int
    """Wall clock when it completed (start plus the device-side duration on CUDA)."""
    clock: str
    """How the end was taken: ``completion`` (host saw it finish) or ``cuda_events`` (device timing)."""
    waited_ns: int | None = None
    """How long the issuing thread was blocked waiting for it before it completed: from the start of a
    ``Work.wait`` on it (the ``torch.distributed`` Python API, synchronous calls included, pipelining,
    FSDP2, a script's ``async_op=True`` code) to its end. ``None`` where no such wait began while it was
    in flight: it completed before anyone waited, or its waiter is out of the probe's sight (DDP's
    reducer and functional collectives wait inside C++)."""
    overlapped: bool | None = None
    """Whether another operation on the same process group was in flight on this rank during it (its
    in-flight time then includes queueing behind the other); ``None`` where not known."""

    @property
    def duration_s(self) -> float:
        """In-flight time: issue to completion."""
        return (self.end_ns - self.start_ns) / 1e9


@dataclass(frozen=True, slots=True, kw_only=True)
class StageAction(Event):
    """Pipeline work of one stage on one microbatch."""

    kind: ClassVar[str] = "stage_action"
    rank: int
    step: int | None
    stage: int
    microbatch: int
    action: str
    """forward, backward or backward_weight."""
    start_ns: int
    end_ns: int


@dataclass(frozen=True, slots=True, kw_only=True)
class MemorySnapshot(Event):
    """One rank's memory at the end of a step, by what holds it."""

    kind: ClassVar[str] = "memory"
    rank: int
    step: int
    wall_ns: int
    weights_bytes: int
    grads_bytes: int
    optimizer_bytes: int
    activations_bytes: int | None
    """Peak during the step minus weights, gradients and optimizer state (CUDA only)."""
    kv_cache_bytes: int | None
    allocated_bytes: int | None
    reserved_bytes: int | None
    peak_allocated_bytes: int | None
    device_used_bytes: int | None
    device_total_bytes: int | None
    rss_bytes: int | None


@dataclass(frozen=True, slots=True, kw_only=True)
class GpuSample(Event):
    """One NVML reading of one GPU."""

    kind: ClassVar[str] = "gpu"
    gpu: int
    wall_ns: int
    name: str | None
    memory_used_bytes: int | None
    memory_total_bytes: int | None
    utilization_pct: float | None
    memory_utilization_pct: float | None
    power_w: float | None
    sm_clock_mhz: float | None
    temperature_c: float | None
    pcie_tx_bytes_per_s: float | None
    """PCIe rates over NVML's 20 ms window, read once a second a GPU (:data:`meshtop.probes.nvml.PCIE_PERIOD_S`):
    the samples between repeat the last reading."""
    pcie_rx_bytes_per_s: float | None
    nvlink_tx_bytes_per_s: float | None
    nvlink_rx_bytes_per_s: float | None
    node: int = 0
    """The node whose GPU it is (GPU indexes repeat from one node to the next)."""
    uuid: str | None = None
    """NVML's ``GPU-...`` identifier: the ``UUID`` label of the DCGM exporter's series."""
    power_limit_w: float | None = None
    """The GPU's default power limit: tells an SXM module from a PCIe card of the same name (its peak FLOP/s)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class GpuLink(Event):
    """How two GPUs reach each other."""

    kind: ClassVar[str] = "gpu_link"
    gpu_a: int
    gpu_b: int
    path: str
    """NVLink, or the PCIe path: same board, switch, host bridge, CPU or system."""
    nvlinks: int | None
    """NVLink connections between the two, where known."""
    node: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class NvmlState(Event):
    """Whether GPU sampling works here, and if not, why."""

    kind: ClassVar[str] = "nvml_state"
    wall_ns: int
    state: str
    """ok, no_library, no_gpu or error."""
    gpu_count: int
    detail: str | None
    driver_version: str | None
    node: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class ProcessSample(Event):
    """One psutil reading of one rank's process."""

    kind: ClassVar[str] = "process"
    rank: int
    pid: int
    wall_ns: int
    cpu_pct: float | None
    rss_bytes: int | None
    threads: int | None


@dataclass(frozen=True, slots=True, kw_only=True)
class RankExited(Event):
    """A rank's process ended."""

    kind: ClassVar[str] = "rank_exited"
    rank: int
    wall_ns: int
    exit_code: int | None
    signal: str | None
    error: str | None


@dataclass(frozen=True, slots=True, kw_only=True)
class JobEnded(Event):
    """The whole job ended."""

    kind: ClassVar[str] = "job_ended"
    wall_ns: int
    status: str
    """completed, failed or interrupted."""
    duration_s: float
    root_cause_rank: int | None


@dataclass(frozen=True, slots=True, kw_only=True)
class EventsDropped(Event):
    """Events lost because a bounded buffer was full: counted, never silent."""

    kind: ClassVar[str] = "events_dropped"
    wall_ns: int
    rank: int | None
    """The worker whose buffer overflowed; ``None`` for the collector."""
    where: str
    count: int
    """Dropped since the previous report."""


@dataclass(frozen=True, slots=True, kw_only=True)
class FramesRefused(Event):
    """Messages the collector refused unread (:class:`meshtop.probes.collector.CollectorCounts`): not the job's
    events, since its ranks' frames carry the session's token and are well formed, but a stray or hostile client
    on the collector's port, counted so that it is never silent."""

    kind: ClassVar[str] = "frames_refused"
    wall_ns: int
    reason: str
    """bad token, malformed, oversized or unknown node."""
    count: int
    """Refused for that reason since the previous report."""


@dataclass(frozen=True, slots=True, kw_only=True)
class SamplerError(Event):
    """A probe or sampler failed one reading; it goes on."""

    kind: ClassVar[str] = "sampler_error"
    wall_ns: int
    sampler: str
    message: str


@dataclass(frozen=True, slots=True, kw_only=True)
class StackDump(Event):
    """py-spy's stack dump of one rank."""

    kind: ClassVar[str] = "stack_dump"
    rank: int
    pid: int
    wall_ns: int
    text: str | None
    error: str | None


@dataclass(frozen=True, slots=True, kw_only=True)
class ProbeOff(Event):
    """A worker probe that could not be installed on this rank (a torch internal it needs is missing, or
    installing it raised): the job runs on without it."""

    kind: ClassVar[str] = "probe_off"
    rank: int
    wall_ns: int
    probe: str
    """Which probe: ``collectives``, ``pipeline stages``, ``memory``, ``loss`` or ``step phases``."""
    reason: str
    """Why, in one line (the missing attribute and the torch release, or the error)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class RankProgress(Event):
    """A rank's heartbeat, sent with every shipment (4 a second): where it is, for hang reports."""

    kind: ClassVar[str] = "rank_progress"
    rank: int
    wall_ns: int
    step: int | None
    """The step in progress (``None`` between steps, during set-up or tear-down)."""
    in_flight: int
    """Collectives issued and not yet complete (0 where the hooks are off)."""
    oldest_op: str | None
    """The oldest of those: its op, group and peer, and when it was issued."""
    oldest_group: str | None
    oldest_peer: int | None
    oldest_start_ns: int | None


@dataclass(frozen=True, slots=True, kw_only=True)
class HangDetected(Event):
    """No rank made progress for the hang timeout: where each rank was."""

    kind: ClassVar[str] = "hang"
    wall_ns: int
    timeout_s: float
    silent_s: float
    """Seconds since the last step or collective completed on any rank."""
    report: str
    """One line per rank: inside which collective on which group since when, or not in one."""


@dataclass(frozen=True, slots=True, kw_only=True)
class FlightVerdict(Event):
    """torch's flight-recorder analyzer on every rank's dump, taken at a hang or with a stack dump asked for
    (:mod:`meshtop.runner.job.flight`): where the ranks' collectives diverge, beside meshtop's own report."""

    kind: ClassVar[str] = "flight_verdict"
    wall_ns: int
    verdict: str | None
    """The analyzer's findings, a line each (``rank 1 never entered all_reduce #4 of group 0 (default_pg)``),
    or one line saying the collectives it saw all match; ``None`` where it could not run."""
    error: str | None
    """Why there is no verdict, in one line (a rank's dump missing, the analyzer missing or failing)."""
    dumps: str
    """The folder of the dumps, as torch's ``torchfrtrace`` reads them."""

    def lines(self) -> list[str]:
        """The verdict as the lines shown beside meshtop's own (a hang report, the alerts, the console)."""
        if self.verdict is not None:
            return self.verdict.splitlines()
        return [f"torch's flight recorder: no verdict: {self.error}"]


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeClock(Event):
    """One measurement of a node's clock against the head's, by a ping exchange over the stream.

    The node sends its time ``t0``, the head answers with its own ``t1``, the answer arrives at the node's
    ``t2``; of a round of exchanges the one with the shortest round trip ``rtt = t2 - t0`` gives
    ``offset = t1 - (t0 + t2) / 2``, what the head's clock reads minus what the node's reads at one instant,
    wrong by at most ``rtt / 2``. The node adds it to every time it streams, so the recording holds the
    head's clock only.
    """

    kind: ClassVar[str] = "node_clock"
    node: int
    host: str
    wall_ns: int
    """When the node measured it, on the head's clock."""
    offset_ns: int
    rtt_ns: int


CLIENT_RANK = 0
"""An endpoint's load generator is rank 0 of its recording: its requests' events and its process samples."""


@dataclass(frozen=True, slots=True, kw_only=True)
class RequestDone(Event):
    """One request of an inference load, served or failed, as its replica's leader rank saw it, or as
    meshtop's load generator saw a serving endpoint answer it (``--endpoint``).

    Times are wall clock (``time.time_ns``) on the leader (dp replica's first
    rank): arrival is when the load generator released the request to the
    replica, each token time when the token's logits reached the leader. For
    an endpoint, on the load generator: arrival is when the request was
    written to its connection, each token time when a streamed chunk with
    text arrived (a chunk can hold several tokens: ``token_ns`` then has
    fewer entries than ``output_tokens``).
    """

    kind: ClassVar[str] = "request"
    rank: int
    replica: int
    """The dp index of the replica that served it."""
    request: int
    """The request's id in the load (0 .. requests - 1)."""
    arrival_ns: int
    first_token_ns: int | None
    """``None`` when it failed before its first token."""
    end_ns: int
    """Its last token, or the moment it failed."""
    prompt_tokens: int
    output_tokens: int
    """Tokens generated (the first comes from the prefill)."""
    token_ns: tuple[int, ...]
    """The time of each generated token, the first included (inter-token latency = the gaps)."""
    output_ids: tuple[int, ...]
    """The generated token ids (greedy, so the same under every plan)."""
    status: str
    """``completed`` or ``failed``."""
    error: str | None
    error_kind: str | None = None
    """An endpoint's failed request: ``http``, ``timeout``, ``refused``, ``reset``, ``protocol`` or
    ``interrupted``."""
    scheduled_ns: int | None = None
    """An endpoint's: when the load meant to send it (the send lag is ``arrival_ns`` less this)."""
    warmup: bool = False
    """Sent before the load to warm the server: recorded, left out of every figure."""
    tokens_from: str | None = None
    """An endpoint's token counts: ``usage`` (the server's own count) or ``chunks`` (the streamed chunks
    with text, where the server reported no usage)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ServerMetric(Event):
    """One series of a serving endpoint's Prometheus ``/metrics`` at one scrape (``--endpoint``): every
    numeric series the server publishes, a series that did not change since the last scrape left out."""

    kind: ClassVar[str] = "server_metric"
    wall_ns: int
    """When the scrape's answer arrived (the same for every series of one scrape)."""
    name: str
    """The series' name as the server wrote it (``vllm:num_requests_waiting``)."""
    labels: str
    """Its labels as the server wrote them (``model_name="m",engine="0"``); empty for none."""
    value: float
    common: str | None = None
    """meshtop's name for a series of a known engine (``requests_waiting``, ``kv_cache_usage``, ...)."""
    replica: int = 0
    """The replica whose ``/metrics`` it is (``--endpoint URL1,URL2``: its place in the list)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ServerState(Event):
    """How a server meshtop started goes (``--endpoint URL -- SERVER COMMAND``): starting (said every few
    seconds with its last log line), ready, failed, stopped."""

    kind: ClassVar[str] = "server_state"
    wall_ns: int
    state: str
    """``starting``, ``ready``, ``failed`` or ``stopped``."""
    elapsed_s: float
    """Since it was started."""
    line: str | None
    """Its last log line (``starting``), or why it failed."""


EVENT_TYPES: dict[str, type[Event]] = {
    cls.kind: cls
    for cls in (
        RankStarted,
        StepTiming,
        CollectiveTiming,
        StageAction,
        MemorySnapshot,
        GpuSample,
        GpuLink,
        NvmlState,
        ProcessSample,
        RankExited,
        JobEnded,
        EventsDropped,
        FramesRefused,
        SamplerError,
        StackDump,
        RankProgress,
        HangDetected,
        FlightVerdict,
        RequestDone,
        ProbeOff,
        NodeClock,
        ServerMetric,
        ServerState,
    )
}
TUPLE_FIELDS = {"stages", "token_ns", "output_ids", "phase_start_ns", "phase_end_ns"}
_WITH_TUPLES = frozenset(cls for cls in EVENT_TYPES.values() if TUPLE_FIELDS.intersection(_field_names(cls)))


def event_from_record(record: dict[str, Any]) -> Event:
    """Rebuild an event from :meth:`Event.to_record`'s output; a KeyError names an unknown kind, a
    TypeError a field the kind does not have (or a required one missing).

    The live dashboard's session calls this for every event a worker sends, so it does the least it
    can: the record's fields straight into the class.
    """
    values = dict(record)
    cls = EVENT_TYPES[values.pop("kind")]
    if cls in _WITH_TUPLES:
        for name in TUPLE_FIELDS.intersection(values):
            values[name] = tuple(int(v) for v in values[name])
    return cls(**values)


DURATION_FIELDS = frozenset({"waited_ns", "offset_ns", "rtt_ns"})
"""Fields in nanoseconds that hold a length of time, not a time on a clock."""
E = TypeVar("E", bound=Event)


_CLOCK_FIELDS: dict[type, tuple[tuple[str, ...], tuple[str, ...], bool]] = {}


def clock_fields(cls: type) -> tuple[tuple[str, ...], tuple[str, ...], bool]:
    """(times, tuples of times, whether the kind names a node) of ``cls``, once a kind."""
    found = _CLOCK_FIELDS.get(cls)
    if found is None:
        names = [name for name in _field_names(cls) if name.endswith("_ns") and name not in DURATION_FIELDS]
        found = _CLOCK_FIELDS[cls] = (
            tuple(n for n in names if n not in TUPLE_FIELDS),
            tuple(n for n in names if n in TUPLE_FIELDS),
            "node" in _field_names(cls),
        )
    return found


def on_node(event: E, *, offset_ns: int, node: int) -> E:
    """``event`` as the head records it: every time it holds moved by ``offset_ns`` onto the head's clock
    (:class:`NodeClock`), and ``node`` set where the kind has one."""
    times, tuples, has_node = clock_fields(type(event))
    changes: dict[str, Any] = {}
    for name in times:
        if (value := getattr(event, name)) is not None:
            changes[name] = value + offset_ns
    for name in tuples:
        changes[name] = tuple(value + offset_ns for value in getattr(event, name))
    if has_node:
        changes["node"] = node
    return replace(event, **changes)
