"""Fold per-rank step timings into whole-job steps as they arrive."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from probes.events import StepTiming


@dataclass(frozen=True, slots=True, kw_only=True)
class JobStep:
    """One step of the whole job, once every rank has reported it."""

    step: int
    loss: float | None
    """Mean over the ranks that compute a loss (each data-parallel replica weighs the same)."""
    duration_s: float
    """The slowest rank's step time: the job's step time."""
    tokens_per_s: float


class StepFolder:
    """Collects :class:`StepTiming` from every rank; yields each step when it is complete."""

    def __init__(self, world_size: int) -> None:
        self.world_size = world_size
        self._pending: dict[int, list[StepTiming]] = defaultdict(list)

    def add(self, timing: StepTiming) -> JobStep | None:
        """Take one rank's timing; the job's step if this was the last rank missing."""
        reports = self._pending[timing.step]
        reports.append(timing)
        if len(reports) < self.world_size:
            return None
        del self._pending[timing.step]
        losses = [r.loss for r in reports if r.loss is not None]
        duration = max(r.duration_s for r in reports)
        return JobStep(
            step=timing.step,
            loss=sum(losses) / len(losses) if losses else None,
            duration_s=duration,
            tokens_per_s=timing.tokens / duration if duration > 0 else 0.0,
        )
