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
    """Collects :class:`StepTiming` from every rank; yields each step when it is complete.

    In training every rank takes part in every step. In inference each of the
    ``replicas`` (dp) steps on its own (a step is one op of that replica), so a
    step is complete when the replica's tp x pp ranks have reported it.
    """

    def __init__(self, world_size: int, *, replicas: int = 1, tp: int = 1) -> None:
        self.world_size = world_size
        self.replicas, self.tp = replicas, tp
        self._needed = world_size // replicas
        self._pending: dict[tuple[int, int], list[StepTiming]] = defaultdict(list)

    def add(self, timing: StepTiming) -> JobStep | None:
        """Take one rank's timing; the job's (or replica's) step if this was the last rank missing."""
        key = ((timing.rank // self.tp) % self.replicas, timing.step)
        reports = self._pending[key]
        reports.append(timing)
        if len(reports) < self._needed:
            return None
        del self._pending[key]
        losses = [r.loss for r in reports if r.loss is not None]
        duration = max(r.duration_s for r in reports)
        return JobStep(
            step=timing.step,
            loss=sum(losses) / len(losses) if losses else None,
            duration_s=duration,
            tokens_per_s=timing.tokens / duration if duration > 0 else 0.0,
        )
