"""Model FLOPs utilisation: the FLOP/s a training run achieves over its GPUs' peak.

- FLOPs per token = 6 N for the forward and backward pass of N parameters,
  plus attention's 12 L d T for L layers of width d over T tokens of context
  (PaLM, Chowdhery et al. 2022, appendix B);
- MFU = tokens/s (the p50 over the job's steps) x FLOPs per token /
  (the GPU's dense peak for the run's dtype x the ranks' GPUs).

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


def mfu(run: RunDescription, *, gpu_names: Iterable[str], tokens_per_s: float | None) -> Mfu:
    """The run's MFU, or why it has none."""
    if run.inference:
        return Mfu(value=None, why_not="MFU is a training figure (6N FLOPs per token is forward and backward)")
    if run.device != "cuda":
        return Mfu(value=None, why_not=f"no peak FLOP/s for a {run.device} device")
    if run.model is None or run.dtype is None or run.seq_len is None:
        return Mfu(value=None, why_not="the model's shape is not known (a script's own model)")
    per_token = flops_per_token(parameters=run.model.parameters, n_layers=run.model.n_layers, dim=run.model.dim,
                                seq_len=run.seq_len)
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
