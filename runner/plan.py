"""The run a user asks for, its defaults, and every check made before launch.

:func:`resolve` turns a :class:`RunSpec` (what was typed, ``None`` where it was
left out) into a :class:`ResolvedRun` (every value concrete) or raises a
:class:`PlanError` whose one line says what to change. Nothing here imports
torch, so a bad command line is refused at once.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from meshtop.recordings import typed_json
from meshtop.recordings.manifest import (
    DEFAULT_OUTPUT_LEN,
    DEFAULT_PROMPT_LEN,
    INFER_MODE,
    Load,
    ModelShape,
    Plan,
    RunDescription,
)
from meshtop.runner.errors import PlanError
from meshtop.runner.load import DEFAULT_CONCURRENCY, DEFAULT_MAX_BATCH, DEFAULT_REQUESTS, MAX_REQUESTS, MAX_SEQUENCE
from meshtop.runner.model_config import load_model_config
from meshtop.runner.presets import preset

SCHEDULES = ("gpipe", "1f1b", "interleaved-1f1b")
DTYPES = ("fp32", "bf16")
PRECISIONS = ("fp32", "bf16", "mixed")
"""Training recipes of number formats: every tensor in fp32, every tensor in bf16, or mixed: bf16 compute over
fp32 master weights and fp32 optimizer state (:mod:`meshtop.runner.rank.precision`)."""
CHECKPOINTS = ("none", "full", "selective")
"""Activation checkpointing: none, every block recomputed in backward, or each block's feed-forward
(:mod:`meshtop.runner.rank.model`)."""
DEVICES = ("auto", "cpu", "cuda")
MODES = ("train", "infer")
DEFAULT_MODEL = "tiny"
"""The preset of a run that names no model (neither ``--model`` nor ``--model-config``)."""
DEFAULT_STEPS = 20
"""Training steps of ``meshtop record`` (and of any spec) without ``--steps``."""
WATCH_LIMIT_S = 300.0
"""``meshtop run`` without ``--steps`` trains until q, this long at most: a run worth watching, that ends by
itself where nobody watches it (a lost terminal's session goes on headless)."""
MAX_CPU_RANKS = 64
"""More gloo ranks than this on one host only measures the scheduler."""


@dataclass(frozen=True, kw_only=True, slots=True)
class RunSpec:
    """A run as the user asked for it; ``None`` means "choose for me"."""

    dp: int | None = None
    """Data-parallel degree; by default every GPU (2 ranks on CPU) when no other degree is given."""
    tp: int = 1
    """Tensor-parallel degree (attention heads and MLP split Megatron-style)."""
    pp: int = 1
    """Pipeline-parallel degree (ranks that hold consecutive layers)."""
    fsdp: bool = False
    """Shard parameters, gradients and optimizer state over dp (FSDP2) instead of replicating."""
    schedule: str | None = None
    """Pipeline schedule: gpipe, 1f1b or interleaved-1f1b (default 1f1b)."""
    microbatches: int | None = None
    """Microbatches per step for the pipeline (default 2 x pp)."""
    model: str = DEFAULT_MODEL
    """Model preset name."""
    model_config: str | None = None
    """A Hugging Face style ``config.json`` of a Llama-family decoder: its shape instead of a preset's."""
    dtype: str | None = None
    """Parameter and compute dtype: fp32 or bf16 (default fp32 on CPU, bf16 on CUDA)."""
    precision: str | None = None
    """Training: fp32, bf16 or mixed (:data:`PRECISIONS`); fp32 and bf16 are ``dtype``'s, named as a recipe."""
    checkpoint: str | None = None
    """Training: activation checkpointing, none (the default), full or selective (:data:`CHECKPOINTS`)."""
    device: str = "auto"
    """auto (cuda when a GPU is visible), cpu or cuda."""
    steps: int | None = None
    """Training steps to run (default 20; training only)."""
    time_limit_s: float | None = None
    """Train with no fixed number of steps: until asked to stop (the dashboard's q), this long at most
    (``meshtop run`` without ``--steps``: :data:`WATCH_LIMIT_S`)."""
    batch_size: int | None = None
    """Global batch in sequences (default 4 per microbatch per replica)."""
    seq_len: int | None = None
    """Tokens per sequence (default: the preset's)."""
    seed: int = 0
    """Seed of the weights and of the synthetic data."""
    instrument: bool = True
    """Install the worker hooks (collectives, pipeline stages, memory); step timing stays either way."""
    activations: bool = False
    """Measure the bytes each step saves for backward (:mod:`meshtop.probes.activations`)."""
    mode: str = "train"
    """train, or infer: serve a load of generation requests."""
    requests: int | None = None
    """Inference: requests in the load (default 64)."""
    concurrency: int | None = None
    """Inference, closed loop: requests in flight at once (default 8 when no --request-rate)."""
    request_rate: float | None = None
    """Inference, open loop: Poisson arrivals per second."""
    prompt_len: str | None = None
    """Inference: prompt tokens, ``N`` or a range ``LO-HI`` (default 32)."""
    output_len: str | None = None
    """Inference: tokens to generate, ``N`` or ``LO-HI`` (default 32)."""
    max_batch: int | None = None
    """Inference: requests one replica decodes together, at most (default 16)."""
    slo_ttft_ms: float | None = None
    slo_tpot_ms: float | None = None


TRAIN_ONLY: tuple[str, ...] = (
    "fsdp",
    "schedule",
    "microbatches",
    "steps",
    "time_limit_s",
    "batch_size",
    "seq_len",
    "activations",
    "precision",
    "checkpoint",
)
INFER_ONLY: tuple[str, ...] = (
    "requests",
    "concurrency",
    "request_rate",
    "prompt_len",
    "output_len",
    "max_batch",
    "slo_ttft_ms",
    "slo_tpot_ms",
)


def option(name: str) -> str:
    """The command-line spelling of a ``RunSpec`` field."""
    return "--" + name.replace("_", "-")


@dataclass(frozen=True, kw_only=True, slots=True)
class ResolvedRun:
    """A validated run with every value concrete: what the workers execute."""

    plan: Plan
    """The mesh and its pipeline (no schedule and 1 microbatch without one; serving's is a plain plan)."""
    shape: ModelShape
    dtype: str
    """The compute dtype (bf16 under mixed precision)."""
    device: str
    steps: int | None
    """``None``: until asked to stop, ``time_limit_s`` at most (:mod:`meshtop.runner.rank.until`)."""
    batch_size: int
    seq_len: int
    seed: int
    time_limit_s: float | None = None
    instrument: bool = True
    activations: bool = False
    """Measure the bytes saved for backward per step (training)."""
    mode: str = "train"
    load: Load | None = None
    """The requests to serve (inference only)."""
    mixed: bool = False
    """Mixed precision: bf16 compute over fp32 master weights and fp32 optimizer state (training)."""
    checkpoint: str = "none"
    """Activation checkpointing (:data:`CHECKPOINTS`; training)."""

    @property
    def precision(self) -> str:
        """fp32, bf16 or mixed (:data:`PRECISIONS`)."""
        return "mixed" if self.mixed else self.dtype

    @property
    def master_weights(self) -> bool:
        """Mixed precision kept by the optimizer: the model's parameters in bf16, an fp32 copy of each in the
        optimizer (every plan but FSDP2's, which keeps fp32 shards and computes in bf16 by its policy)."""
        return self.mixed and not self.plan.fsdp

    @property
    def parameter_dtype(self) -> str:
        """The dtype of the model's parameters (and so of their gradients): fp32 shards under FSDP2's mixed
        precision, else the compute dtype."""
        return "fp32" if self.mixed and self.plan.fsdp else self.dtype

    @property
    def microbatches(self) -> int:
        """Microbatches per step: the pipeline's, 1 without one."""
        return self.plan.microbatches or 1

    @property
    def microbatch_size(self) -> int:
        return self.batch_size // (self.plan.dp * self.microbatches)

    def to_json(self) -> dict[str, Any]:
        """What a rank is handed (``run.json``): every field as plain JSON."""
        return typed_json.dump(self)

    @classmethod
    def from_json(cls, fields: dict[str, Any]) -> ResolvedRun:
        return typed_json.load(cls, fields, whole="the run")

    def describe(self) -> RunDescription:
        """The run description a recording of this run holds (inference has no steps, batch or length of
        training: its load says what ran)."""
        serving = self.mode == INFER_MODE
        return RunDescription(
            plan=self.plan,
            mode=self.mode,
            model=self.shape.counted(),
            dtype=self.dtype,
            precision=self.precision,
            checkpoint=self.checkpoint,
            device=self.device,
            steps=None if serving else self.steps,
            batch_size=None if serving else self.batch_size,
            microbatch_size=None if serving else self.microbatch_size,
            seq_len=None if serving else self.seq_len,
            seed=self.seed,
            instrumented=self.instrument,
            load=self.load,
        )


def mesh_plan(
    *,
    dp: int,
    tp: int,
    pp: int,
    n_layers: int,
    fsdp: bool = False,
    schedule: str | None = None,
    microbatches: int = 1,
    serving: bool = False,
) -> Plan:
    """The plan of a built-in run: its label (``dp2 x tp2 x pp2 (1f1b, 4 mb)``, or ``(serving)``) and each
    stage's layers, interleaved 1F1B looping two stages a rank; ``schedule`` ``None`` without a pipeline."""
    virtual = 2 if schedule == "interleaved-1f1b" else 1
    label = f"{'fsdp' if fsdp else 'dp'}{dp} x tp{tp} x pp{pp}"
    if serving:
        label += " (serving)"
    elif schedule is not None:
        label += f" ({schedule}, {microbatches} mb)"
    return Plan(
        dp=dp,
        tp=tp,
        pp=pp,
        fsdp=fsdp,
        world_size=dp * tp * pp,
        schedule=schedule,
        microbatches=microbatches,
        virtual_stages=virtual,
        stage_layers=split_layers(n_layers, pp * virtual),
        label=label,
    )


def recipe_words(dtype: str | None, precision: str | None, checkpoint: str | None) -> str:
    """A run's recipe as the console and ``summary`` say it: ``fp32``, ``mixed (bf16 compute)``, with
    ``· checkpoint full`` where it checkpoints (``None``: a recording from before recipes)."""
    words = f"mixed ({dtype} compute)" if precision == "mixed" else str(dtype)
    return words + (f" · checkpoint {checkpoint}" if checkpoint not in (None, "none") else "")


def check_positive(name: str, value: int | None) -> None:
    """A count the user gave (``name`` is its option) is at least 1."""
    if value is not None and value < 1:
        raise PlanError(f"{name} must be at least 1, got {value}")


def _divides(tp: int, count: int, what: str, model: str) -> None:
    if count % tp:
        raise PlanError(
            f"--tp {tp} does not divide the {count} {what} of model {model}: use a --tp that divides {count}"
        )


def split_layers(n_layers: int, n_stages: int) -> tuple[tuple[int, ...], ...]:
    """Consecutive layers per stage, as even as possible, earlier stages taking the remainder."""
    base, extra = divmod(n_layers, n_stages)
    stages, start = [], 0
    for stage in range(n_stages):
        count = base + (1 if stage < extra else 0)
        stages.append(tuple(range(start, start + count)))
        start += count
    return tuple(stages)


def model_shape(model: str, model_config: str | None) -> ModelShape:
    """The shape of preset ``model``, or the one a ``config.json`` at ``model_config`` describes (naming both,
    a preset other than the default and a config, is refused)."""
    if model_config is None:
        return preset(model)
    if model != DEFAULT_MODEL:
        raise PlanError(f"--model {model} and --model-config {model_config} each name the model: give one of them")
    return load_model_config(model_config)


def resolve(spec: RunSpec, *, gpus_visible: int, nodes: int = 1) -> ResolvedRun:
    """Fill in defaults and check that the run can be launched on this host (on each of ``nodes`` hosts, each
    with ``gpus_visible`` GPUs, running an equal share of the ranks)."""
    check_hooks(instrument=spec.instrument, activations=spec.activations)
    for name in ("dp", "tp", "pp", "microbatches", "steps", "batch_size", "seq_len"):
        check_positive(option(name), getattr(spec, name))
    if spec.seed < 0:
        raise PlanError(f"--seed must be 0 or more, got {spec.seed}")
    if spec.time_limit_s is not None and (spec.steps is not None or not 0 < spec.time_limit_s < float("inf")):
        raise PlanError("a run until stopped has no --steps and a time limit above 0")
    if spec.device not in DEVICES:
        raise PlanError(f"unknown --device {spec.device!r}: use one of {', '.join(DEVICES)}")
    if spec.mode not in MODES:
        raise PlanError(f"unknown --mode {spec.mode!r}: use one of {', '.join(MODES)}")
    check_mode_options(spec)
    if spec.device == "cuda" and gpus_visible == 0:
        raise PlanError("--device cuda asked for but no CUDA GPU is visible: use --device cpu or auto")
    device = "cuda" if spec.device == "cuda" or (spec.device == "auto" and gpus_visible > 0) else "cpu"
    shape = model_shape(spec.model, spec.model_config)

    if spec.dp is not None:
        dp = spec.dp
    elif spec.tp == 1 and spec.pp == 1:
        dp = (gpus_visible if device == "cuda" else 2) * nodes
    else:
        dp = 1
    world = dp * spec.tp * spec.pp
    product = f"dp {dp} x tp {spec.tp} x pp {spec.pp} = {world}"
    if world % nodes:
        raise PlanError(
            f"{product} ranks do not split evenly over {nodes} nodes: make the product a multiple of {nodes}"
        )
    if device == "cuda" and world > gpus_visible * nodes:
        where = "are visible" if nodes == 1 else f"are visible on this node ({world // nodes} ranks each)"
        raise PlanError(
            f"{product} ranks but {gpus_visible} GPU(s) {where}: lower the degrees so their product is at most "
            f"{gpus_visible * nodes} (nccl needs one GPU per rank)"
        )
    if device == "cpu" and world // nodes > MAX_CPU_RANKS:
        each = "" if nodes == 1 else f" ({world // nodes} on each of {nodes} nodes)"
        raise PlanError(f"{product} CPU ranks{each}: lower the degrees to at most {MAX_CPU_RANKS * nodes} ranks")
    if spec.fsdp and dp < 2:
        raise PlanError("--fsdp shards over the data-parallel ranks: give --dp 2 or more")

    if spec.tp > 1:
        _divides(spec.tp, shape.n_heads, "attention heads", shape.name)
        _divides(spec.tp, shape.n_kv_heads, "key/value heads", shape.name)
        _divides(spec.tp, shape.ffn_dim, "MLP hidden units", shape.name)
        _divides(spec.tp, shape.vocab_size, "vocabulary entries", shape.name)

    if spec.precision is not None and spec.precision not in PRECISIONS:
        raise PlanError(f"unknown --precision {spec.precision!r}: use one of {', '.join(PRECISIONS)}")
    if spec.checkpoint is not None and spec.checkpoint not in CHECKPOINTS:
        raise PlanError(f"unknown --checkpoint {spec.checkpoint!r}: use one of {', '.join(CHECKPOINTS)}")
    if spec.precision is not None and spec.dtype is not None:
        raise PlanError(
            f"--dtype {spec.dtype} and --precision {spec.precision} both name the training's number format: "
            "give --precision alone"
        )
    mixed = spec.precision == "mixed"
    dtype = "bf16" if mixed else spec.precision or spec.dtype or ("bf16" if device == "cuda" else "fp32")
    if dtype not in DTYPES:
        raise PlanError(f"unknown --dtype {dtype!r}: use one of {', '.join(DTYPES)}")

    load = _resolve_load(spec, dp=dp) if spec.mode == "infer" else None
    schedule, microbatches = _resolve_pipeline(spec) if load is None else (None, 1)
    plan = mesh_plan(
        dp=dp,
        tp=spec.tp,
        pp=spec.pp,
        n_layers=shape.n_layers,
        fsdp=spec.fsdp,  # refused with --mode infer
        schedule=schedule,
        microbatches=microbatches,
        serving=load is not None,
    )
    if shape.n_layers < plan.num_stages:
        per_rank = f" ({plan.virtual_stages} per rank for {plan.schedule})" if plan.virtual_stages > 1 else ""
        raise PlanError(
            f"model {shape.name} has {shape.n_layers} layers, fewer than the {plan.num_stages} pipeline "
            f"stages{per_rank}: lower --pp or pick a deeper --model"
        )
    if load is not None:
        return ResolvedRun(
            plan=plan,
            shape=shape,
            dtype=dtype,
            device=device,
            steps=0,
            batch_size=load.max_batch * dp,
            seq_len=load.max_sequence,
            seed=spec.seed,
            instrument=spec.instrument,
            mode="infer",
            load=load,
        )

    batch = spec.batch_size if spec.batch_size is not None else 4 * dp * microbatches
    if batch % (dp * microbatches):
        split = f"dp {dp} x {microbatches} microbatches" if microbatches > 1 else f"dp {dp} replicas"
        raise PlanError(
            f"--batch-size {batch} cannot be split evenly into {split}: use a multiple of {dp * microbatches}"
        )
    return ResolvedRun(
        plan=plan,
        shape=shape,
        dtype=dtype,
        device=device,
        steps=None if spec.time_limit_s is not None else spec.steps or DEFAULT_STEPS,
        time_limit_s=spec.time_limit_s,
        batch_size=batch,
        seq_len=spec.seq_len or shape.default_seq_len,
        seed=spec.seed,
        instrument=spec.instrument,
        activations=spec.activations,
        mixed=mixed,
        checkpoint=spec.checkpoint or "none",
    )


def check_hooks(*, instrument: bool, activations: bool) -> None:
    """``--activations`` measures through the worker hooks that ``--no-instrument`` leaves out (the built-in
    model's and a script's alike)."""
    if activations and not instrument:
        raise PlanError("--activations needs the hooks: leave out --no-instrument")


def _resolve_pipeline(spec: RunSpec) -> tuple[str | None, int]:
    """Schedule and microbatches; checks that they fit pp."""
    if spec.schedule is not None and spec.schedule not in SCHEDULES:
        raise PlanError(f"unknown --schedule {spec.schedule!r}: use one of {', '.join(SCHEDULES)}")
    if spec.pp == 1:
        if spec.schedule is not None:
            raise PlanError(f"--schedule {spec.schedule} orders pipeline stages: it needs --pp 2 or more")
        if spec.microbatches not in (None, 1):
            raise PlanError("--microbatches splits the batch between pipeline stages: it needs --pp 2 or more")
        return None, 1
    schedule = spec.schedule or "1f1b"
    microbatches = spec.microbatches or 2 * spec.pp
    if schedule in ("1f1b", "interleaved-1f1b") and microbatches < spec.pp:
        raise PlanError(
            f"--schedule {schedule} needs at least one microbatch per stage: use --microbatches {spec.pp} or more"
        )
    if schedule == "interleaved-1f1b" and microbatches % spec.pp:
        raise PlanError(f"--schedule interleaved-1f1b needs --microbatches a multiple of --pp {spec.pp}")
    return schedule, microbatches


def check_mode_options(spec: RunSpec) -> None:
    """Options of the other mode are refused, not silently ignored."""
    if spec.mode == "infer":
        other, fix = TRAIN_ONLY, "a training option: leave it out with --mode infer"
    else:
        other, fix = INFER_ONLY, "an inference option: add --mode infer"
    for name in other:
        if getattr(spec, name) not in (None, False):
            raise PlanError(f"{option(name)} is {fix}")


def parse_length(name: str, text: str | None, default: tuple[int, int]) -> tuple[int, int]:
    """``N`` or ``LO-HI`` (or ``LO:HI``) tokens, each at least 1."""
    if text is None:
        return default
    low, _, high = text.partition(":" if ":" in text else "-")
    try:
        bounds = (int(low), int(high or low))
    except ValueError:
        raise PlanError(f"{name} takes a number of tokens or a range LO-HI (or LO:HI), got {text!r}") from None
    if bounds[0] < 1 or bounds[1] < bounds[0]:
        raise PlanError(f"{name} {text}: lengths must be at least 1, and LO at most HI")
    return bounds


def _resolve_load(spec: RunSpec, *, dp: int) -> Load:
    """The load of an inference run; checks that its counts, rates and lengths can be served by ``dp`` replicas."""
    for name in ("requests", "concurrency", "max_batch"):
        check_positive(option(name), getattr(spec, name))
    for name in ("request_rate", "slo_ttft_ms", "slo_tpot_ms"):
        value = getattr(spec, name)
        if value is not None and not 0 < value < float("inf"):
            raise PlanError(f"{option(name)} must be above 0, got {value:g}")
    if spec.concurrency is not None and spec.request_rate is not None:
        raise PlanError("--concurrency (closed loop) and --request-rate (open loop) exclude each other: give one")
    requests = spec.requests or DEFAULT_REQUESTS
    if requests > MAX_REQUESTS:
        raise PlanError(f"--requests {requests} is more than {MAX_REQUESTS:,}: split the load into several runs")
    concurrency = spec.concurrency or (None if spec.request_rate is not None else DEFAULT_CONCURRENCY)
    if concurrency is not None and concurrency < dp:
        raise PlanError(
            f"--concurrency {concurrency} leaves some of the {dp} replicas without a client: "
            f"use --concurrency {dp} or more, or fewer replicas"
        )
    load = Load(
        requests=requests,
        concurrency=concurrency,
        request_rate_per_s=spec.request_rate,
        prompt_len=parse_length("--prompt-len", spec.prompt_len, DEFAULT_PROMPT_LEN),
        output_len=parse_length("--output-len", spec.output_len, DEFAULT_OUTPUT_LEN),
        max_batch=spec.max_batch or DEFAULT_MAX_BATCH,
        seed=spec.seed,
        slo_ttft_ms=spec.slo_ttft_ms,
        slo_tpot_ms=spec.slo_tpot_ms,
    )
    if load.max_sequence > MAX_SEQUENCE:
        raise PlanError(
            f"prompt plus output can reach {load.max_sequence} tokens, more than {MAX_SEQUENCE}: "
            f"shorten --prompt-len or --output-len"
        )
    return load
