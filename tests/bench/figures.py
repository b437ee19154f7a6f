"""What every benchmark of the suite hands back: one row per figure, with its repetitions, spread and target.

The machine is noisy, so a figure alone means little: each row says how many
repetitions it rests on and how far they spread, and whether its target is
met, so that one table can be read without the code behind it.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
from scipy import stats

from meshtop.recordings.metrics.stats import quantile as core_quantile


@dataclass(frozen=True, slots=True)
class Target:
    """A bound on a figure: at least ``low``, at most ``high``, or both; neither means "reported only"."""

    low: float | None = None
    high: float | None = None

    def met(self, value: float) -> bool | None:
        if self.low is None and self.high is None:
            return None
        if math.isnan(value):
            return False
        return (self.low is None or value >= self.low) and (self.high is None or value <= self.high)

    def __str__(self) -> str:
        if self.low is not None and self.high is not None:
            return f"{self.low:g}..{self.high:g}"
        if self.low is not None:
            return f">= {self.low:,g}"
        if self.high is not None:
            return f"<= {self.high:,g}"
        return "-"


NO_TARGET = Target()


@dataclass(frozen=True, slots=True)
class Spread:
    """How far the repetitions behind a figure spread: ``low``..``high`` of the named ``kind`` over ``reps``."""

    reps: int
    low: float
    high: float
    kind: str = "min-max"

    @classmethod
    def of(cls, values: Sequence[float], kind: str = "min-max") -> Spread:
        """min-max, or the interquartile range (``kind="p25-p75"``), of ``values``."""
        if not values:
            return cls(0, math.nan, math.nan, kind)
        if kind == "p25-p75":
            return cls(len(values), quantile(values, 0.25), quantile(values, 0.75), kind)
        return cls(len(values), min(values), max(values), kind)


@dataclass(frozen=True, slots=True)
class Row:
    """One figure of the suite."""

    figure: str
    """The benchmark: overhead, efficiency, ingest, samplers, tui, recordings, accuracy."""
    case: str
    """What was measured, e.g. ``DDP dp2`` or ``load 1M events``."""
    value: float
    unit: str
    spread: Spread
    target: Target = NO_TARGET
    note: str = ""
    met: bool | None = field(default=None)
    details: dict[str, Any] = field(default_factory=dict)
    """Everything else the benchmark measured (JSON only)."""

    def __post_init__(self) -> None:
        if self.met is None:
            object.__setattr__(self, "met", self.target.met(self.value))

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["target"] = {"text": str(self.target), "low": self.target.low, "high": self.target.high}
        return data


def quantile(values: Sequence[float], q: float) -> float:
    """The ``q`` quantile by linear interpolation (as numpy's default); NaN for no values."""
    found = core_quantile(np.asarray(values, dtype=float), q)
    return math.nan if found is None else found


def median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else math.nan


def median_interval(values: Sequence[float], confidence: float = 0.95) -> tuple[float, float]:
    """The bootstrap ``confidence`` interval of the median of ``values`` (percentile method, a fixed seed, so a
    run's figures can be reproduced from its values); NaN for fewer than 2 values."""
    if len(values) < 2:
        return math.nan, math.nan
    found = stats.bootstrap(
        (np.asarray(values, dtype=float),),
        np.median,
        confidence_level=confidence,
        method="percentile",
        n_resamples=9999,
        random_state=np.random.default_rng(0),
    )
    return float(found.confidence_interval.low), float(found.confidence_interval.high)
