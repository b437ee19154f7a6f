"""The manifest of a recording: its schema version, the full run description, and how the run ended.

Typed: :class:`Manifest` and the dataclasses it holds are what every reader
uses, and :func:`read_manifest` refuses, in one line, a file with a field it
does not know, a field of the wrong type or a required field missing, so no
reader guesses with ``.get(...) or 1`` (:mod:`meshtop.recordings.typed_json`). On disk it is one JSON object; the run
description's fields sit at its top level beside the manifest's own.

The run description's types (:class:`Plan`, :class:`ModelShape`, :class:`Load`, :class:`ServerInfo`) are the
runner's own: the presets, the planner, the built-in inference and serving use these, so what runs is what is
recorded, field for field. Each rank's end is the launcher's :class:`RankExit`; the GPUs' links and whether
GPU sampling worked are the probes' events (:class:`~meshtop.probes.events.GpuLink`,
:class:`~meshtop.probes.events.NvmlState`). The module imports no pandas and no pyarrow, so a rank can import it.
"""

from __future__ import annotations

import ast
import contextlib
import importlib.util
import json
import os
import platform
import socket
import sys
import time
from dataclasses import dataclass, field, fields, replace
from importlib import metadata
from pathlib import Path
from typing import Any

from meshtop.probes.events import GpuLink, NvmlState
from meshtop.recordings.typed_json import RecordingError, dump, load

SCHEMA_VERSION = 3
"""2: collective events carry ``waited_ns`` and ``overlapped``; the manifest is checked field by field.
3: a user's script (``script``; ``model``, ``dtype`` and ``seed`` may be null), ``model_parameters`` on
``rank_started``."""
READABLE_VERSIONS = (1, 2, 3)
MANIFEST_NAME = "manifest.json"
INFER_MODE = "infer"


@dataclass(frozen=True, kw_only=True, slots=True)
class Plan:
    """The parallel plan (a script's, or an endpoint's load generator: its ranks alone, each a replica)."""

    dp: int
    tp: int = 1
    pp: int = 1
    fsdp: bool = False
    world_size: int
    schedule: str | None = None
    """``None`` without a pipeline."""
    microbatches: int | None = None
    virtual_stages: int = 1
    stage_layers: tuple[tuple[int, ...], ...] = ()
    label: str
    """``dp2 x tp1 x pp2 (1f1b, 4 mb)``."""

    @property
    def num_stages(self) -> int:
        return self.pp * self.virtual_stages

    def coordinates(self, rank: int) -> tuple[int, int, int]:
        """(pp, dp, tp) of ``rank`` in the runner's mesh: tp innermost, then dp, then pp
        (rank = (pp x dp_degree + dp) x tp_degree + tp)."""
        return rank // (self.dp * self.tp), (rank // self.tp) % self.dp, rank % self.tp

    def stages_of(self, pp_rank: int) -> list[int]:
        """Stage indices held by pipeline rank ``pp_rank``, in execution order (looped for interleaved 1F1B;
        ``[0]`` without a pipeline, whose one stage is the whole model)."""
        return [pp_rank + loop * self.pp for loop in range(self.virtual_stages)]


@dataclass(frozen=True, kw_only=True, slots=True)
class ModelShape:
    """The shape of a Llama-style decoder (RMSNorm, rotary attention, SwiGLU): a preset's, a ``config.json``'s,
    or the one a recording ran."""

    name: str
    """The preset's name, as given to ``--model`` (a config's: its model's)."""
    n_layers: int
    """Number of transformer blocks."""
    dim: int
    """Width of the residual stream."""
    n_heads: int
    """Attention (query) heads."""
    n_kv_heads: int
    """Key / value heads (grouped-query attention when fewer than ``n_heads``)."""
    ffn_dim: int
    """Hidden width of the SwiGLU MLP."""
    vocab_size: int
    """Number of token ids."""
    default_seq_len: int
    """Sequence length used when ``--seq-len`` is not given."""
    norm_eps: float = 1e-5
    """Epsilon of every RMSNorm."""
    rope_theta: float = 10000.0
    """Base of the rotary position embedding."""
    tie_embeddings: bool = False
    """The output projection is the token embedding's matrix (one parameter, as ``tie_word_embeddings``)."""
    parameters: int | None = None
    """Parameter elements of the whole model as a recording states them (``None``: counted from the shape)."""

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_heads

    def parameter_count(self) -> int:
        """Parameters of the whole model (embedding and output counted apart unless tied), or the count the
        recording states."""
        if self.parameters is not None:
            return self.parameters
        attention = self.dim * self.head_dim * (2 * self.n_heads + 2 * self.n_kv_heads)
        mlp = 3 * self.dim * self.ffn_dim
        norms = 2 * self.dim
        per_layer = attention + mlp + norms
        ends = (1 if self.tie_embeddings else 2) * self.vocab_size * self.dim
        return self.n_layers * per_layer + ends + self.dim

    def counted(self) -> ModelShape:
        """This shape with its parameter count stated, as a recording keeps it."""
        return replace(self, parameters=self.parameter_count())


DEFAULT_PROMPT_LEN = (32, 32)
DEFAULT_OUTPUT_LEN = (32, 32)


@dataclass(frozen=True, kw_only=True, slots=True)
class Load:
    """The requests of an inference run and how they arrive: the built-in model's (``--mode infer``) or those
    meshtop sends to a serving endpoint (``--endpoint``).

    Closed loop (``concurrency``: C clients, each sends its next request when the previous one is answered)
    or open loop (``request_rate_per_s``: gaps drawn from a gamma distribution of mean 1/R and shape
    ``burstiness``, :func:`meshtop.runner.load.arrival_offsets_s`)."""

    requests: int
    concurrency: int | None
    """Closed loop: requests in flight at once (``None`` in open loop)."""
    request_rate_per_s: float | None
    """Open loop: the mean arrival rate (``None`` in closed loop)."""
    prompt_len: tuple[int, int] = DEFAULT_PROMPT_LEN
    """Lowest and highest prompt length (equal for a fixed length): tokens for the built-in model, words of a
    generated prompt for an endpoint (unused with a prompts file)."""
    output_len: tuple[int, int] = DEFAULT_OUTPUT_LEN
    """Lowest and highest tokens to generate (an endpoint's ``max_tokens``)."""
    max_batch: int = 0
    """The built-in model's: requests one replica decodes together, at most. An endpoint's: its concurrency (0
    in open loop), the most meshtop has in flight."""
    seed: int = 0
    slo_ttft_ms: float | None = None
    slo_tpot_ms: float | None = None
    burstiness: float | None = None
    """Open loop: the gamma shape of the gaps (1: Poisson, below 1 burstier, above 1 more even; ``None``: 1)."""
    warmup: int = 0
    """An endpoint's: requests sent first and left out of every figure."""
    prompts: str | None = None
    """An endpoint's prompts file (``None``: generated prompts of ``prompt_len`` words)."""
    timeout_s: float | None = None
    """An endpoint's: per request, from its send to its last byte."""
    ignore_eos: bool = False
    duration_s: float | None = None
    """An endpoint's ``--duration``: sent for this long at most (from the first of the load's own requests); a
    request due later is not sent, and the load is the requests sent."""

    @property
    def max_sequence(self) -> int:
        """Prompt plus output, the longest (the built-in model's KV cache holds this many positions a slot)."""
        return self.prompt_len[1] + self.output_len[1]


@dataclass(frozen=True, kw_only=True, slots=True)
class ServerInfo:
    """A server meshtop started for the load (the command after ``--``), as it ran."""

    command: tuple[str, ...]
    version: str | None = None
    """The version its log said, where it said one."""
    environment: dict[str, str] = field(default_factory=dict)
    """What decides its devices and network: ``CUDA_VISIBLE_DEVICES``, ``NCCL_*``, the engine's own."""
    log_tail: tuple[str, ...] = ()
    exit_code: int | None = None
    """As it ended (negative: the signal that ended it)."""
    startup_s: float | None = None
    """From its start to its first answer."""
    cpu_s: float | None = None
    """CPU seconds of its process tree, as last seen."""
    peak_rss_bytes: int | None = None
    """The largest resident memory of its process tree seen."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Endpoint:
    """A serving endpoint meshtop loaded (``--endpoint``): the server, not meshtop, ran the model."""

    url: str
    """As given: replicas' URLs comma-separated."""
    api: str
    """``completions`` or ``chat``."""
    model: str
    models: tuple[str, ...] = ()
    """Every model the server listed."""
    replicas: tuple[str, ...] = ()
    """Each replica's URL (``--endpoint URL1,URL2``), in the order the load's requests went round them; empty:
    one server, ``url``."""
    same_load: str | None = None
    """The recording whose load this repeated (``--same-load``)."""
    server_metrics: str | None = None
    """Where the server's Prometheus metrics were scraped (replicas: each replica's, comma-separated)."""
    server: ServerInfo | None = None
    """The server meshtop started, where it started one."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Script:
    """A user's own script that meshtop launched under torchrun: enough to run it again, and to tell two
    runs of different code apart."""

    command: tuple[str, ...]
    """What followed ``--`` on meshtop's command line."""
    launcher_args: tuple[str, ...]
    """The launcher's arguments as meshtop passed them on: torchrun's (its own ``--standalone --nproc-per-node``
    where the command gave none), or accelerate's (what follows ``accelerate launch``), the script and its
    arguments included."""
    path: str | None
    """Absolute path of the script (``None`` for ``-m MODULE``)."""
    module: str | None
    args: tuple[str, ...]
    sha256: str | None
    """Of the script file when it was launched."""
    working_dir: str
    environment: dict[str, str] = field(default_factory=dict)
    """The ranks' ``*_NUM_THREADS``, ``NCCL_*``, ``TORCH_*``, ``PYTORCH_*`` and ``CUDA_VISIBLE_DEVICES``, and a
    scheduler's node variables (``PET_*``, ``MASTER_ADDR``, ``MASTER_PORT``, four of ``SLURM_*``)."""
    tokens_per_step: int | None = None
    activations: bool = False
    """Whether the activations saved for backward were measured (a hook on every saved tensor)."""
    loss: bool = True
    """Whether the script's losses were read (``--no-loss`` turns it off)."""
    launcher: str = "torchrun"
    """What started its ranks: ``torchrun``, or ``accelerate`` (``accelerate launch``, through torchrun)."""

    @property
    def name(self) -> str:
        """``train.py`` or ``-m pkg.train``."""
        return Path(self.path).name if self.path is not None else f"-m {self.module}"


LOAD_FILE = "load.jsonl"
"""An endpoint's load as sent, one request a line, in its recording (written by the runner, read by
``compare`` and ``--same-load``)."""
LOAD_WORK = ("requests", "concurrency", "request_rate_per_s", "prompt_len", "output_len", "max_batch")
"""What makes two loads the same work (the seed and the SLOs do not change the work done)."""


def script_plan(name: str, world_size: int, launcher: str = "torchrun") -> Plan:
    """A script's plan: its world size alone (meshtop does not know how the script splits it), labelled with its
    launcher."""
    return Plan(dp=world_size, world_size=world_size, label=f"{launcher} {name} ({world_size} ranks)")


@dataclass(frozen=True, kw_only=True, slots=True)
class RunDescription:
    """What ran: plan, model, lengths, load; or a user's script (then the plan is its world size alone,
    and the model, lengths and dtype are the script's own, not known here)."""

    plan: Plan
    mode: str
    """``train`` or ``infer``."""
    model: ModelShape | None
    """``None`` for a script."""
    dtype: str | None
    """The compute dtype; a script's: the one the user named for MFU, else ``None``."""
    device: str
    steps: int | None
    """Training steps asked for (``None`` for inference, a script, and a run until stopped)."""
    batch_size: int | None
    microbatch_size: int | None
    seq_len: int | None
    seed: int | None
    instrumented: bool
    precision: str | None = None
    """The built-in runner's number formats: fp32, bf16 or mixed (``None``: a script, or a recording from
    before recipes, whose precision is its dtype)."""
    checkpoint: str | None = None
    """The built-in runner's activation checkpointing: none, full or selective (``None`` as ``precision``)."""
    load: Load | None = None
    script: Script | None = None
    endpoint: Endpoint | None = None

    @property
    def name(self) -> str:
        """What ran, in a word: the model preset, the script, or the endpoint's model."""
        if self.script is not None:
            return self.script.name
        if self.endpoint is not None:
            return self.endpoint.model
        return self.model.name if self.model is not None else "?"

    @property
    def inference(self) -> bool:
        return self.mode == INFER_MODE

    @property
    def until_stopped(self) -> bool:
        """The built-in model trained with no fixed number of steps: until q (``meshtop run`` without
        ``--steps``, :mod:`meshtop.runner.rank.until`)."""
        return self.mode == "train" and self.script is None and self.steps is None

    @property
    def may_pipeline(self) -> bool:
        """Whether stage actions can come: a training pipeline plan, or a script (it may use pipelining)."""
        return not self.inference and (self.plan.pp > 1 or self.script is not None)

    @property
    def stage_period(self) -> int | None:
        """A stage's pipeline rank is its index modulo this (the runner's interleaved stages); ``None`` for
        a script, whose stages' places meshtop does not know: each stage index is then its own."""
        return self.plan.pp if self.script is None else None

    @property
    def world_size(self) -> int:
        return self.plan.world_size

    def started_with(self, world_size: int) -> RunDescription:
        """This run as torchrun started its ranks with ``world_size`` (a :class:`RankStarted`'s): an elastic
        script's (``--nnodes MIN:MAX``) ranks are known only then, and were counted for MAX nodes until
        then; the built-in runner's plan fixes its own. ``self`` where nothing changes."""
        if self.script is None or world_size <= 0 or world_size == self.plan.world_size:
            return self
        return replace(self, plan=script_plan(self.script.name, world_size, self.script.launcher))


@dataclass(frozen=True, kw_only=True, slots=True)
class Software:
    meshtop: str | None
    python: str | None
    torch: str | None
    cuda: str | None
    nccl: str | None


@dataclass(frozen=True, kw_only=True, slots=True)
class Host:
    hostname: str
    platform: str
    cpu_count: int | None


@dataclass(frozen=True, kw_only=True, slots=True)
class SampleRates:
    """The node samplers' rates."""

    gpu_hz: float
    process_hz: float


@dataclass(frozen=True, kw_only=True, slots=True)
class RankExit:
    """How one rank ended: the launcher's, the head's view of another node's, and the manifest's."""

    rank: int
    exit_code: int | None
    """The process's exit code (negative for a signal); ``None`` if it was stopped by the launcher."""
    signal: str | None
    error: str | None
    """The rank's last error line, or why it was stopped."""


@dataclass(frozen=True, kw_only=True, slots=True)
class GpuInfo:
    gpu: int
    name: str | None
    memory_total_bytes: int | None
    node: int = 0
    power_limit_w: float | None = None
    """The default power limit (W), which tells an SXM module from a PCIe card of the same name."""


@dataclass(frozen=True, kw_only=True, slots=True)
class NodeInfo:
    """One machine of the job: its host, the ranks and GPUs it ran, and how its clock stood to the head's."""

    node: int
    host: str | None
    ranks: tuple[int, ...]
    gpus: tuple[int, ...]
    clock_offset_ns: int | None
    """The head's clock minus this node's (0 on the head), as last measured; every time in the recording is
    on the head's clock."""
    clock_rtt_ns: int | None
    """The round trip of that measurement: the offset is right within half of it."""


MANIFEST_OWN = ("schema_version", "status", "started_at", "command_line")
"""The manifest's own fields that come before the run description on disk."""
NVML_KEPT = ("state", "detail", "driver_version", "gpu_count")
"""What the manifest keeps of :class:`~meshtop.probes.events.NvmlState`, in this order on disk: whether GPU sampling
worked in the run, not when or on which node it was said (read back, at ``wall_ns`` 0 on node 0)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Manifest:
    """A recording's manifest: written when the run starts (status ``running``), completed when it ends."""

    schema_version: int = SCHEMA_VERSION
    status: str = "running"
    """running, completed, failed or interrupted (``running`` left behind: the session was cut short)."""
    started_at: str | None = None
    command_line: tuple[str, ...] = ()
    run: RunDescription
    software: Software | None = None
    host: Host | None = None
    node_probes: SampleRates | None = None
    ended_at: str | None = None
    duration_s: float | None = None
    steps_completed: int | None = None
    ranks: tuple[RankExit, ...] = ()
    root_cause_rank: int | None = None
    hang: str | None = None
    reason: str | None = None
    """Why the session broke, where it did (a full disk, say)."""
    rank_devices: dict[str, str] = field(default_factory=dict)
    nvml: NvmlState | None = None
    gpus: tuple[GpuInfo, ...] = ()
    topology: tuple[GpuLink, ...] = ()
    nodes: tuple[NodeInfo, ...] = ()
    """The machines of the job (one entry on one machine)."""
    terminal_lost: str | None = None
    """When and how the dashboard's terminal went away (``2026-12-01T15:02:11+0000: SIGHUP``), where it did:
    the session went on headless from then."""

    def to_json(self) -> dict[str, Any]:
        """The JSON object on disk: the manifest's first fields, the run description, then the rest."""
        data = dump(self)
        if self.nvml is not None:
            data["nvml"] = {name: data["nvml"][name] for name in NVML_KEPT}
        run = data.pop("run")
        first = {name: data.pop(name) for name in MANIFEST_OWN}
        return {**first, **run, **data}

    @classmethod
    def from_json(cls, data: Any, *, where: str = MANIFEST_NAME) -> Manifest:
        if not isinstance(data, dict):
            raise RecordingError(f"{where}: not a JSON object")
        run_names = {f.name for f in fields(RunDescription)}
        rest = {key: value for key, value in data.items() if key not in run_names and key != "run"}
        rest["run"] = {key: value for key, value in data.items() if key in run_names}
        if isinstance(rest.get("nvml"), dict):
            rest["nvml"] = {"wall_ns": 0, **rest["nvml"]}
        try:
            return load(cls, rest, flat=("run",), whole="the manifest")  # the run description is flat on disk
        except RecordingError as error:
            raise RecordingError(f"{where}: {error}") from None


def software_versions() -> Software:
    """Versions of what the run depends on (CUDA / NCCL when torch was built with them).

    torch's version and its CUDA build are read from torch's generated ``version.py`` as text: importing torch
    would cost meshtop's own process some 2.5 s of CPU at each start, taken from the ranks starting beside it.
    Only a CUDA build is imported, to ask NCCL's version.
    """
    build = torch_build()
    nccl = None
    if build.get("cuda"):
        import torch

        if torch.cuda.is_available():
            nccl = ".".join(str(part) for part in torch.cuda.nccl.version())
    return Software(
        meshtop=_version("meshtop"),
        python=platform.python_version(),
        torch=build.get("__version__"),
        cuda=build.get("cuda"),
        nccl=nccl,
    )


def torch_build() -> dict[str, str]:
    """The string constants of the installed torch's ``torch/version.py`` (``__version__``, ``cuda``...), read
    without importing torch; empty when torch is not installed or the file cannot be read."""
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        return {}
    try:
        tree = ast.parse((Path(spec.submodule_search_locations[0]) / "version.py").read_text())
    except (OSError, SyntaxError, ValueError):
        return {}
    found = {}
    for statement in tree.body:
        targets: list[ast.expr] = []
        if isinstance(statement, ast.AnnAssign):
            targets = [statement.target]
        elif isinstance(statement, ast.Assign):
            targets = statement.targets
        value = getattr(statement, "value", None)
        constant = value.value if isinstance(value, ast.Constant) else None
        if len(targets) == 1 and isinstance(targets[0], ast.Name) and isinstance(constant, str):
            found[targets[0].id] = constant
    return found


def _version(distribution: str) -> str | None:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


def host_description() -> Host:
    return Host(hostname=socket.gethostname(), platform=platform.platform(), cpu_count=os.cpu_count())


def new_recording(directory: Path, *, command: str = "record") -> None:
    """Make ``directory`` for a new recording (or a sweep of them, made by ``command``); refuses one that already
    holds files."""
    if directory.exists() and not directory.is_dir():
        raise RecordingError(f"{directory} is a file: give {command} a new directory")
    if directory.is_dir() and any(directory.iterdir()):
        raise RecordingError(f"{directory} is not empty: give {command} a new directory (nothing was overwritten)")
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise RecordingError(f"cannot create {directory}: {error.strerror}") from None


ROOM_NAME = ".manifest-room"
ROOM_BYTES = 256 * 1024
"""Kept free, in the recording, for its last manifest (a few KiB; a thousand ranks' fit): a disk that fills
during the run still takes the manifest that says it failed, and why."""


def keep_room(directory: Path) -> None:
    """Set :data:`ROOM_BYTES` aside in ``directory`` (blocks really taken, not a sparse file); best effort: a
    disk too full for it has no room to give back either."""
    path = directory / ROOM_NAME
    try:
        with path.open("wb") as room:
            room.write(bytes(ROOM_BYTES))
            room.flush()
            os.fsync(room.fileno())
    except OSError:
        path.unlink(missing_ok=True)


def release_room(directory: Path) -> None:
    """Give the room back, for the last manifest."""
    with contextlib.suppress(OSError):
        (directory / ROOM_NAME).unlink(missing_ok=True)


def manifest_bytes(manifest: Manifest) -> bytes:
    return (json.dumps(manifest.to_json(), indent=2) + "\n").encode()


def write_manifest(directory: Path, manifest: Manifest) -> None:
    """Write (or replace) the manifest atomically: a reader sees the old or the new one whole.

    An OSError (no room, the folder gone) leaves the old one in place and is raised to the caller.
    """
    path = directory / MANIFEST_NAME
    tmp = path.with_suffix(".json.tmp")
    try:
        tmp.write_bytes(manifest_bytes(manifest))
        os.replace(tmp, path)
    except OSError:
        tmp.unlink(missing_ok=True)
        raise


def note_terminal_lost(directory: Path, note: str | None) -> None:
    """Say in the closed recording's manifest when and how the dashboard's terminal went away (best effort:
    the recording is whole without it)."""
    with contextlib.suppress(RecordingError, OSError):
        write_manifest(directory, replace(read_manifest(directory), terminal_lost=note))


def start_manifest(run: RunDescription, *, command_line: list[str], node_probes: SampleRates | None = None) -> Manifest:
    """The manifest of a run that is starting: description, software, host, status ``running``."""
    return Manifest(
        started_at=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        command_line=("meshtop", *command_line) if command_line else (Path(sys.argv[0]).name,),
        run=run,
        software=software_versions(),
        host=host_description(),
        node_probes=node_probes,
    )


def read_manifest(directory: Path) -> Manifest:
    """The manifest of the recording in ``directory``; a :class:`RecordingError` (one line) if it is missing,
    damaged, of another schema version, or holds what this meshtop does not know."""
    path = directory / MANIFEST_NAME
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise RecordingError(f"{directory} is not a meshtop recording: no {MANIFEST_NAME}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise RecordingError(f"{path} is damaged: {getattr(error, 'msg', error)}") from None
    version = data.get("schema_version") if isinstance(data, dict) else None
    if version not in READABLE_VERSIONS:
        raise RecordingError(
            f"{directory} has recording schema version {version!r}; this meshtop reads "
            f"versions {', '.join(map(str, READABLE_VERSIONS))}"
        )
    return Manifest.from_json(data, where=str(path))
