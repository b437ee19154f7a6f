"""Model FLOPs utilisation: the FLOP/s a training run achieves over its GPUs' peak.

- FLOPs per token = 6 N for the forward and backward pass of N parameters,
  plus attention's 12 L d T for L layers of width d over T tokens of context
  (PaLM, Chowdhery et al. 2022, appendix B);
- N counts the parameters a token multiplies: not the token embedding's
  matrix where it is only looked up (an untied model, whose output projection
  has a matrix of its own: V d fewer); tied, the one matrix is the output
  projection's matmul and counts. torchtitan counts the same way (6 N less the
  ``nn.Embedding``'s), so the figures compare; counting the lookup too had
  read 54.7 % for the ``1b`` preset on an H200 where 45.9 % is the work done;
- MFU = tokens/s (the p50 over the job's steps) x FLOPs per token /
  (the GPU's dense peak for the run's dtype x the ranks' GPUs).

A user's script gives its tokens per step (``--tokens-per-step``) and its
compute dtype (``--dtype``); N is what its optimizers train
(:func:`script_parameters`), and the attention term is left out, since the
script's layers and context are not known (and an untied token embedding,
only looked up, is in N: neither is known).

Peaks are the vendors' datasheet figures for dense tensor-core math
(:data:`PEAKS`), told apart by NVML's name and the default power limit (an
H200 or H100 whose name does not say NVL or PCIe but whose limit is a card's
is the card). A GPU or a dtype not in the table has no MFU, and the reason
says so: a guess would be worse than none.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from meshtop.recordings.manifest import ModelShape, RunDescription


@dataclass(frozen=True, slots=True)
class GpuModel:
    """What a GPU is, for its peak: NVML's name, and its default power limit (one name can cover a chip's SXM
    module and its PCIe card, whose peaks differ)."""

    name: str
    power_limit_w: float | None = None


@dataclass(frozen=True, slots=True)
class Peak:
    """A GPU's dense tensor-core peak in bf16 (fp16 runs at the same rate on each of these)."""

    fragment: str
    """Part of NVML's name (the longest that matches wins: "A100" over "A10", "H200 NVL" over "H200")."""
    flops_per_s: float
    max_power_w: float | None = None
    """Where a name is ambiguous: this row is the part whose default power limit is at most this."""


PEAKS: tuple[Peak, ...] = (
    Peak("B200", 2250e12),
    Peak("GH200", 989e12),
    Peak("H200 NVL", 835e12),
    Peak("H200", 835e12, max_power_w=650),  # the NVL card (600 W) where its name does not say so
    Peak("H200", 989e12),  # SXM (700 W)
    Peak("H100 NVL", 835e12),
    Peak("H100 PCIe", 756e12),
    Peak("H100", 756e12, max_power_w=450),  # a PCIe card (350 W) where its name does not say so
    Peak("H100", 989e12),  # SXM (700 W)
    Peak("A100", 312e12),
    Peak("L40S", 362e12),
    Peak("L4", 121e12),
    Peak("A10", 125e12),
    Peak("RTX 4090", 165.2e12),  # with fp32 accumulation, as training runs
)
"""Datasheet dense peaks (no sparsity)."""
TENSOR_DTYPES = frozenset({"bf16", "fp16"})


def peak_flops(gpu: GpuModel | str, dtype: str) -> float | None:
    """The dense peak of ``gpu`` in ``dtype``, where known (``None`` for a dtype without a tensor-core rate
    here, or a GPU not in :data:`PEAKS`). NVIDIA names the PCIe and NVL parts so (``NVIDIA H200 NVL``); a
    name that does not is the SXM module unless its default power limit says it is a card."""
    model = gpu if isinstance(gpu, GpuModel) else GpuModel(gpu)
    matching = [peak for peak in PEAKS if peak.fragment in model.name]
    if dtype not in TENSOR_DTYPES or not matching:
        return None
    longest = max(len(peak.fragment) for peak in matching)
    rows = [peak for peak in matching if len(peak.fragment) == longest]
    limit = model.power_limit_w
    return next(
        (
            peak.flops_per_s
            for peak in sorted(rows, key=lambda peak: peak.max_power_w or float("inf"))
            if peak.max_power_w is None or (limit is not None and limit <= peak.max_power_w)
        ),
        None,
    )


def flops_per_token(*, parameters: int, n_layers: int, dim: int, seq_len: int, looked_up: int = 0) -> float:
    """Training FLOPs per token: 6 N + 12 L d T, N the ``parameters`` less the ``looked_up`` ones
    (:func:`looked_up_parameters`)."""
    return 6 * (parameters - looked_up) + 12 * n_layers * dim * seq_len


def looked_up_parameters(*, vocab_size: int, dim: int, tie_embeddings: bool) -> int:
    """The token embedding's elements where the model only looks them up (untied: V d); none where the same
    matrix is the output projection's (tied), which multiplies every token."""
    return 0 if tie_embeddings else vocab_size * dim


@dataclass(frozen=True, slots=True, kw_only=True)
class Mfu:
    value: float | None
    why_not: str | None
    """Why there is no value (``None`` when there is one)."""
    tokens_per_s: float | None = None
    flops_per_token: float | None = None
    peak_flops_per_s: float | None = None
    """Per GPU."""
    gpus: int | None = None


def script_parameters(trained: Iterable[tuple[int, int]]) -> int | None:
    """A script's model size N from what each rank's optimizer trains, as (pipeline rank, elements at their
    global size): the most any rank of a pipeline rank trains (its replicas and tensor-parallel peers train
    the same parameters), summed over the pipeline ranks; ``None`` before any rank said it."""
    most: dict[int, int] = {}
    for pipeline_rank, parameters in trained:
        most[pipeline_rank] = max(parameters, most.get(pipeline_rank, 0))
    return sum(most.values()) if most else None


def mfu(
    run: RunDescription, *, gpus: Iterable[GpuModel], tokens_per_s: float | None, script_parameters: int | None = None
) -> Mfu:
    """The run's MFU, or why it has none (``script_parameters``: a script's N, :func:`script_parameters`)."""
    if run.inference:
        return Mfu(value=None, why_not="MFU is a training figure (6N FLOPs per token is forward and backward)")
    if run.device != "cuda":
        return Mfu(value=None, why_not=f"no peak FLOP/s for a {run.device} device")
    if run.script is not None:
        if run.script.tokens_per_step is None or run.dtype is None:
            return Mfu(value=None, why_not="a script's MFU needs --tokens-per-step and --dtype (its compute dtype)")
        if script_parameters is None:
            return Mfu(value=None, why_not="the script's parameter count comes with its first optimizer step")
        per_token = 6.0 * script_parameters
    elif run.model is None or run.dtype is None or run.seq_len is None:
        return Mfu(value=None, why_not="the run description has no model shape or sequence length")
    else:
        per_token = model_flops_per_token(run.model, run.seq_len)
    models = sorted(set(gpus), key=lambda model: (model.name, model.power_limit_w or 0.0))
    if not models:
        return Mfu(value=None, why_not="no GPU seen yet", flops_per_token=per_token)
    peaks = {model: peak_flops(model, run.dtype) for model in models}
    unknown = [model for model, peak in peaks.items() if peak is None]
    if unknown:
        return Mfu(value=None, why_not=f"no {run.dtype} peak known for {unknown[0].name}", flops_per_token=per_token)
    peak = min(p for p in peaks.values() if p is not None)
    if tokens_per_s is None:
        return Mfu(value=None, why_not="no complete step yet", flops_per_token=per_token, peak_flops_per_s=peak)
    devices = run.world_size
    return Mfu(
        value=tokens_per_s * per_token / (peak * devices),
        why_not=None,
        tokens_per_s=tokens_per_s,
        flops_per_token=per_token,
        peak_flops_per_s=peak,
        gpus=devices,
    )


def achieved_flops_per_rank(run: RunDescription, tokens_per_s: float | None) -> float | None:
    """FLOP/s one rank achieved: tokens/s x FLOPs per token / ranks (built-in training runs; else ``None``).
    The planner takes it from a recording to put a step-time share on its predicted communication."""
    if run.inference or run.model is None or run.seq_len is None or tokens_per_s is None:
        return None
    return tokens_per_s * model_flops_per_token(run.model, run.seq_len) / run.world_size


def model_flops_per_token(model: ModelShape, seq_len: int) -> float:
    """:func:`flops_per_token` of a recorded built-in model's shape."""
    looked_up = looked_up_parameters(vocab_size=model.vocab_size, dim=model.dim, tie_embeddings=model.tie_embeddings)
    return flops_per_token(
        parameters=model.parameter_count(), n_layers=model.n_layers, dim=model.dim, seq_len=seq_len, looked_up=looked_up
    )
