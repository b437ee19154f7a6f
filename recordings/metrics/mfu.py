"""Model FLOPs utilisation: the FLOP/s a training run achieves over its GPUs' peak.

- FLOPs per token = 6 N for the forward and backward pass of N parameters,
  plus attention's 12 L d T for L layers of width d over T tokens of context
  (PaLM, Chowdhery et al. 2022, appendix B);
- MFU = tokens/s (the p50 over the job's steps) x FLOPs per token /
  (the GPU's dense peak for the run's dtype x the ranks' GPUs).

A user's script gives its tokens per step (``--tokens-per-step``) and its
compute dtype (``--dtype``); N is what its optimizers train
(:func:`script_parameters`), and the attention term is left out, since the
script's layers and context are not known: its MFU is a lower bound by
12 L d T / (6 N + 12 L d T).

Peaks are the vendors' datasheet figures for dense tensor-core math (SXM
parts). A GPU or a dtype not in the table has no MFU, and the reason says so:
a guess would be worse than none.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from recordings.manifest import RunDescription

PEAK_FLOPS: dict[str, dict[str, float]] = {
    "bf16": {"B200": 2250e12, "H200": 989e12, "H100": 989e12, "GH200": 989e12, "A100": 312e12,
             "L40S": 362e12, "L4": 121e12, "A10": 125e12},
}
"""Dense peak FLOP/s by dtype and GPU name fragment."""


def peak_flops(gpu_name: str, dtype: str) -> float | None:
    """The dense peak of the GPU called ``gpu_name`` in ``dtype``, where known (the longest matching name
    fragment wins: "A100" over "A10")."""
    table = PEAK_FLOPS.get(dtype, {})
    matches = [fragment for fragment in table if fragment in gpu_name]
    return table[max(matches, key=len)] if matches else None


def flops_per_token(*, parameters: int, n_layers: int, dim: int, seq_len: int) -> float:
    """Training FLOPs per token: 6 N + 12 L d T."""
    return 6 * parameters + 12 * n_layers * dim * seq_len


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


def mfu(run: RunDescription, *, gpu_names: Iterable[str], tokens_per_s: float | None,
        script_parameters: int | None = None) -> Mfu:
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
        per_token = flops_per_token(parameters=run.model.parameters, n_layers=run.model.n_layers,
                                    dim=run.model.dim, seq_len=run.seq_len)
    names = sorted(set(gpu_names))
    if not names:
        return Mfu(value=None, why_not="no GPU seen yet", flops_per_token=per_token)
    peaks = {name: peak_flops(name, run.dtype) for name in names}
    unknown = [name for name, peak in peaks.items() if peak is None]
    if unknown:
        return Mfu(value=None, why_not=f"no {run.dtype} peak known for {unknown[0]}", flops_per_token=per_token)
    peak = min(p for p in peaks.values() if p is not None)
    if tokens_per_s is None:
        return Mfu(value=None, why_not="no complete step yet", flops_per_token=per_token, peak_flops_per_s=peak)
    gpus = run.world_size
    return Mfu(value=tokens_per_s * per_token / (peak * gpus), why_not=None, tokens_per_s=tokens_per_s,
               flops_per_token=per_token, peak_flops_per_s=peak, gpus=gpus)


def achieved_flops_per_rank(run: RunDescription, tokens_per_s: float | None) -> float | None:
    """FLOP/s one rank achieved: tokens/s x FLOPs per token / ranks (built-in training runs; else ``None``).
    The planner takes it from a recording to put a step-time share on its predicted communication."""
    if run.inference or run.model is None or run.seq_len is None or tokens_per_s is None:
        return None
    per_token = flops_per_token(parameters=run.model.parameters, n_layers=run.model.n_layers, dim=run.model.dim,
                                seq_len=run.seq_len)
    return tokens_per_s * per_token / run.world_size
