"""What a run measured of its hardware: the rates ``meshtop plan --from REC`` predicts step times with.

- **bus bandwidth**: the median over (group, op) of each one's busbw p50, of the operations that ran
  alone (:func:`meshtop.recordings.metrics.collectives.typical_busbw_gbps`), in GB/s;
- **FLOP/s per rank**: tokens/s x FLOPs per token / ranks
  (:func:`meshtop.recordings.metrics.mfu.achieved_flops_per_rank`; built-in training runs only).
"""

from __future__ import annotations

from dataclasses import dataclass

from meshtop.recordings.manifest import RunDescription
from meshtop.recordings.metrics.collectives import typical_busbw_gbps
from meshtop.recordings.metrics.figures import RunFigures
from meshtop.recordings.metrics.mfu import achieved_flops_per_rank


@dataclass(frozen=True, slots=True, kw_only=True)
class MeasuredRates:
    busbw_gbps: float | None
    flops_per_s: float | None
    """Achieved by one rank."""


def measured_rates(run: RunDescription, figures: RunFigures) -> MeasuredRates:
    """The rates of a run described by ``run`` whose figures are ``figures``."""
    return MeasuredRates(
        busbw_gbps=typical_busbw_gbps(figures.collectives),
        flops_per_s=achieved_flops_per_rank(run, figures.steps.tokens_per_s),
    )
