"""The run a user asks for, its defaults, and every check made before launch.

:func:`resolve` turns a :class:`RunSpec` (what was typed, ``None`` where it was
left out) into a :class:`ResolvedRun` (every value concrete) or raises a
:class:`PlanError` whose one line says what to change. Nothing here imports
torch, so a bad command line is refused at once.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from probes.errors import MeshtopError
from runner.presets import ModelShape, preset

SCHEDULES = ("gpipe", "1f1b", "interleaved-1f1b")
DTYPES = ("fp32", "bf16")
DEVICES = ("auto", "cpu", "cuda")
MAX_CPU_RANKS = 64
"""More gloo ranks than this on one host only measures the scheduler."""


class PlanError(MeshtopError):
    """The asked-for run cannot be launched; the message names the fix."""


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
    model: str = "tiny"
    """Model preset name."""
    dtype: str | None = None
    """Parameter and compute dtype: fp32 or bf16 (default fp32 on CPU, bf16 on CUDA)."""
    device: str = "auto"
    """auto (cuda when a GPU is visible), cpu or cuda."""
    steps: int = 20
    """Training steps to run."""
    batch_size: int | None = None
    """Global batch in sequences (default 4 per microbatch per replica)."""
    seq_len: int | None = None
    """Tokens per sequence (default: the preset's)."""
    seed: int = 0
    """Seed of the weights and of the synthetic data."""
    instrument: bool = True
    """Install the worker hooks (collectives, pipeline stages, memory); step timing stays either way."""


@dataclass(frozen=True, kw_only=True, slots=True)
class ResolvedRun:
    """A validated run with every value concrete: what the workers execute."""

    dp: int
    tp: int
    pp: int
    fsdp: bool
    schedule: str | None
    """``None`` when there is no pipeline (pp = 1)."""
    microbatches: int
    virtual_stages: int
    """Pipeline stages per pp rank (2 for interleaved-1f1b, else 1)."""
    shape: ModelShape
    dtype: str
    device: str
    steps: int
    batch_size: int
    seq_len: int
    seed: int
    instrument: bool = True
    stage_layers: tuple[tuple[int, ...], ...] = field(default=())
    """Layer indices of each pipeline stage, stage 0 first."""

    @property
    def world_size(self) -> int:
        return self.dp * self.tp * self.pp

    @property
    def num_stages(self) -> int:
        return self.pp * self.virtual_stages

    @property
    def microbatch_size(self) -> int:
        return self.batch_size // (self.dp * self.microbatches)

    def plan_label(self) -> str:
        """``dp2 x tp2 x pp2 (1f1b, 4 mb)`` style label for headers and logs."""
        dp = f"fsdp{self.dp}" if self.fsdp else f"dp{self.dp}"
        label = f"{dp} x tp{self.tp} x pp{self.pp}"
        if self.pp > 1:
            label += f" ({self.schedule}, {self.microbatches} mb)"
        return label

    def to_json(self) -> dict[str, object]:
        fields = asdict(self)
        fields["shape"] = self.shape.name
        fields["stage_layers"] = [list(layers) for layers in self.stage_layers]
        return fields

    @classmethod
    def from_json(cls, fields: dict[str, object]) -> ResolvedRun:
        values = dict(fields)
        values["shape"] = preset(str(values["shape"]))
        values["stage_layers"] = tuple(tuple(layers) for layers in values["stage_layers"])  # type: ignore[union-attr]
        return cls(**values)  # type: ignore[arg-type]

    def describe(self) -> dict[str, object]:
        """The full run description for a manifest."""
        return {
            "plan": {
                "dp": self.dp, "tp": self.tp, "pp": self.pp, "fsdp": self.fsdp,
                "world_size": self.world_size, "schedule": self.schedule,
                "microbatches": self.microbatches, "virtual_stages": self.virtual_stages,
                "stage_layers": [list(layers) for layers in self.stage_layers],
                "label": self.plan_label(),
            },
            "mode": "train",
            "model": self.shape.describe(),
            "dtype": self.dtype,
            "device": self.device,
            "steps": self.steps,
            "batch_size": self.batch_size,
            "microbatch_size": self.microbatch_size,
            "seq_len": self.seq_len,
            "seed": self.seed,
            "instrumented": self.instrument,
        }


def _positive(name: str, value: int | None) -> None:
    if value is not None and value < 1:
        raise PlanError(f"{name} must be at least 1, got {value}")


def _divides(tp: int, count: int, what: str, model: str) -> None:
    if count % tp:
        raise PlanError(f"--tp {tp} does not divide the {count} {what} of model {model}: use a --tp that divides {count}")


def split_layers(n_layers: int, n_stages: int) -> tuple[tuple[int, ...], ...]:
    """Consecutive layers per stage, as even as possible, earlier stages taking the remainder."""
    base, extra = divmod(n_layers, n_stages)
    stages, start = [], 0
    for stage in range(n_stages):
        count = base + (1 if stage < extra else 0)
        stages.append(tuple(range(start, start + count)))
        start += count
    return tuple(stages)


def resolve(spec: RunSpec, *, gpus_visible: int) -> ResolvedRun:
    """Fill in defaults and check that the run can be launched on this host."""
    for name, value in (("--dp", spec.dp), ("--tp", spec.tp), ("--pp", spec.pp),
                        ("--microbatches", spec.microbatches), ("--steps", spec.steps),
                        ("--batch-size", spec.batch_size), ("--seq-len", spec.seq_len)):
        _positive(name, value)
    if spec.seed < 0:
        raise PlanError(f"--seed must be 0 or more, got {spec.seed}")
    if spec.device not in DEVICES:
        raise PlanError(f"unknown --device {spec.device!r}: use one of {', '.join(DEVICES)}")
    if spec.device == "cuda" and gpus_visible == 0:
        raise PlanError("--device cuda asked for but no CUDA GPU is visible: use --device cpu or auto")
    device = "cuda" if spec.device == "cuda" or (spec.device == "auto" and gpus_visible > 0) else "cpu"
    shape = preset(spec.model)

    if spec.dp is not None:
        dp = spec.dp
    elif spec.tp == 1 and spec.pp == 1:
        dp = gpus_visible if device == "cuda" else 2
    else:
        dp = 1
    world = dp * spec.tp * spec.pp
    if device == "cuda" and world > gpus_visible:
        raise PlanError(
            f"dp {dp} x tp {spec.tp} x pp {spec.pp} = {world} ranks but {gpus_visible} GPU(s) are visible: "
            f"lower the degrees so their product is at most {gpus_visible} (nccl needs one GPU per rank)"
        )
    if device == "cpu" and world > MAX_CPU_RANKS:
        raise PlanError(f"dp {dp} x tp {spec.tp} x pp {spec.pp} = {world} CPU ranks: lower the degrees to at most {MAX_CPU_RANKS} ranks")
    if spec.fsdp and dp < 2:
        raise PlanError("--fsdp shards over the data-parallel ranks: give --dp 2 or more")

    if spec.tp > 1:
        _divides(spec.tp, shape.n_heads, "attention heads", shape.name)
        _divides(spec.tp, shape.n_kv_heads, "key/value heads", shape.name)
        _divides(spec.tp, shape.ffn_dim, "MLP hidden units", shape.name)
        _divides(spec.tp, shape.vocab_size, "vocabulary entries", shape.name)

    dtype = spec.dtype or ("bf16" if device == "cuda" else "fp32")
    if dtype not in DTYPES:
        raise PlanError(f"unknown --dtype {dtype!r}: use one of {', '.join(DTYPES)}")

    schedule, microbatches, virtual = _resolve_pipeline(spec)
    if shape.n_layers < spec.pp * virtual:
        stages = f"{spec.pp * virtual} pipeline stages" + (f" ({virtual} per rank for {schedule})" if virtual > 1 else "")
        raise PlanError(f"model {shape.name} has {shape.n_layers} layers, fewer than the {stages}: lower --pp or pick a deeper --model")

    batch = spec.batch_size if spec.batch_size is not None else 4 * dp * microbatches
    if batch % (dp * microbatches):
        split = f"dp {dp} x {microbatches} microbatches" if microbatches > 1 else f"dp {dp} replicas"
        raise PlanError(f"--batch-size {batch} cannot be split evenly into {split}: use a multiple of {dp * microbatches}")
    return ResolvedRun(
        dp=dp, tp=spec.tp, pp=spec.pp, fsdp=spec.fsdp, schedule=schedule,
        microbatches=microbatches, virtual_stages=virtual, shape=shape, dtype=dtype,
        device=device, steps=spec.steps, batch_size=batch,
        seq_len=spec.seq_len or shape.default_seq_len, seed=spec.seed, instrument=spec.instrument,
        stage_layers=split_layers(shape.n_layers, spec.pp * virtual),
    )


def _resolve_pipeline(spec: RunSpec) -> tuple[str | None, int, int]:
    """Schedule, microbatches and virtual stages per rank; checks that they fit pp."""
    if spec.schedule is not None and spec.schedule not in SCHEDULES:
        raise PlanError(f"unknown --schedule {spec.schedule!r}: use one of {', '.join(SCHEDULES)}")
    if spec.pp == 1:
        if spec.schedule is not None:
            raise PlanError(f"--schedule {spec.schedule} orders pipeline stages: it needs --pp 2 or more")
        if spec.microbatches not in (None, 1):
            raise PlanError("--microbatches splits the batch between pipeline stages: it needs --pp 2 or more")
        return None, 1, 1
    schedule = spec.schedule or "1f1b"
    microbatches = spec.microbatches or 2 * spec.pp
    if schedule in ("1f1b", "interleaved-1f1b") and microbatches < spec.pp:
        raise PlanError(
            f"--schedule {schedule} needs at least one microbatch per stage: use --microbatches {spec.pp} or more"
        )
    if schedule == "interleaved-1f1b" and microbatches % spec.pp:
        raise PlanError(f"--schedule interleaved-1f1b needs --microbatches a multiple of --pp {spec.pp}")
    return schedule, microbatches, 2 if schedule == "interleaved-1f1b" else 1

