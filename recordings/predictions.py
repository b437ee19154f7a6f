"""The planner's report as ``meshtop plan --json`` prints it and a sweep keeps it (``sweep.json``'s ``report``):
each plan's predicted memory per rank and traffic per step, or why it cannot run.

Plain dataclasses, read typed as the manifest is (:mod:`meshtop.recordings.typed_json`): the planner
(:mod:`meshtop.runner.planner`) writes them, and the sweep (:mod:`meshtop.recordings.sweep`) holds each
against what its recording measured.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from meshtop.recordings.manifest import ModelShape
from meshtop.recordings.typed_json import RecordingError


@dataclass(frozen=True, kw_only=True, slots=True)
class RankPrediction:
    """The planner's bytes for one rank at its peak, by category."""

    rank: int
    weights_bytes: int
    grads_bytes: int
    optimizer_bytes: int
    activations_bytes: int
    """Training: the peak bytes saved for backward. Serving: ``0`` (nothing is kept between ops but the cache)."""
    kv_cache_bytes: int
    total_bytes: int
    """The categories above summed: what a recording measures."""
    recompute_bytes: int = 0
    """Activation checkpointing: what one block's recomputation holds during its backward, on top of what is
    saved (not measured, so not in the total)."""
    fit_bytes: int | None = None
    """What must fit in the device's memory: the total and a block's recomputation, an upper bound (by the last
    block's backward the loss's log-softmax is already freed); ``None`` in a sweep from before recipes."""


@dataclass(frozen=True, kw_only=True, slots=True)
class PredictedTraffic:
    """The planner's collective traffic of one rank in one training step, per (group, op)."""

    rank: int
    op: str
    """The probes' op names: all_reduce, all_gather, reduce_scatter, send, recv."""
    group: str
    """dp, tp, pp, or embedding (the first and last stage's tied embedding copies)."""
    group_size: int
    bytes: int
    """S summed over the step's operations (for gathers and scatters, the whole buffer)."""
    count: int
    """Operations in the step."""


@dataclass(frozen=True, kw_only=True, slots=True)
class PlanPrediction:
    """One plan of the planner's report: why it cannot run, or what it predicts (``runs``)."""

    key: str
    runs: bool
    reason: str | None
    label: str | None = None
    dp: int | None = None
    tp: int | None = None
    pp: int | None = None
    fsdp: bool | None = None
    schedule: str | None = None
    microbatches: int | None = None
    virtual_stages: int = 1
    in_flight: tuple[int, ...] | None = None
    """Microbatches each pipeline rank holds at once (training)."""
    peak_rank: int | None = None
    peak: RankPrediction | None = None
    """The most loaded rank's bytes."""
    ranks: tuple[RankPrediction, ...] = ()
    fits: bool | None = None
    headroom_bytes: int | None = None
    traffic: tuple[PredictedTraffic, ...] = ()
    step_bytes: dict[str, int] = field(default_factory=dict)
    groups: dict[str, tuple[tuple[int, ...], ...]] = field(default_factory=dict)
    warnings: tuple[str, ...] = ()
    group_nodes: dict[str, tuple[tuple[int, ...], ...]] = field(default_factory=dict)
    comm_s: float | None = None
    compute_s: float | None = None
    comm_share: float | None = None

    def __post_init__(self) -> None:
        if self.runs and (self.peak is None or self.pp is None):
            raise RecordingError(f"plan {self.key} runs, but its prediction is missing (peak, pp)")


@dataclass(frozen=True, kw_only=True, slots=True)
class PlanReport:
    """The planner's report: what ``meshtop plan --json`` prints, and what a sweep ran from."""

    model: ModelShape | None
    ranks: int
    device: str
    mode: str
    """``train`` or ``infer``: what the plans are ranked by."""
    dtype: str | None
    precision: str | None = None
    checkpoint: str | None = None
    batch_size: int | None
    seq_len: int | None
    device_memory_bytes: int | None
    busbw_bytes_per_s: float | None
    flops_per_s: float | None
    plans: tuple[PlanPrediction, ...]
