"""Pipeline stage analysis: busy, idle and bubble per stage and step.

For each step, the pipeline's span is the slowest pipeline rank's forward +
backward time (the schedule's step; the optimizer is not part of the
pipeline). A rank's busy time is the sum of its stage actions in that step;
its idle time is the span minus that, and its bubble fraction idle / span.
For balanced stages, GPipe and 1F1B give (p - 1) / (m + p - 1).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass

from probes.events import Event, RankStarted, StageAction, StepTiming


@dataclass(frozen=True, slots=True, kw_only=True)
class StageStep:
    """One pipeline rank in one step."""

    step: int
    pp_rank: int
    stages: tuple[int, ...]
    busy_s: float
    idle_s: float
    span_s: float

    @property
    def bubble_fraction(self) -> float:
        return self.idle_s / self.span_s if self.span_s > 0 else 0.0


def stage_steps(events: Iterable[Event]) -> list[StageStep]:
    """Busy / idle of every pipeline rank in every step (the mean over its dp and tp copies)."""
    started: dict[int, RankStarted] = {}
    busy: dict[tuple[int, int], float] = defaultdict(float)  # (rank, step) -> s
    fwd_bwd: dict[tuple[int, int], float] = {}
    for event in events:
        if isinstance(event, RankStarted):
            started[event.rank] = event
        elif isinstance(event, StageAction) and event.step is not None:
            busy[(event.rank, event.step)] += (event.end_ns - event.start_ns) / 1e9
        elif isinstance(event, StepTiming) and event.forward_backward_s is not None:
            fwd_bwd[(event.rank, event.step)] = event.forward_backward_s
    span: dict[int, float] = defaultdict(float)
    for (rank, step), seconds in fwd_bwd.items():
        span[step] = max(span[step], seconds)
    per_stage: dict[tuple[int, int], list[float]] = defaultdict(list)  # (step, pp_rank) -> busy of each copy
    for (rank, step), seconds in busy.items():
        if rank in started:
            per_stage[(step, started[rank].pp_rank)].append(seconds)
    stages_of = {s.pp_rank: s.stages for s in started.values()}
    rows = []
    for (step, pp_rank), copies in sorted(per_stage.items()):
        mean_busy = sum(copies) / len(copies)
        total = max(span[step], mean_busy)
        rows.append(StageStep(step=step, pp_rank=pp_rank, stages=stages_of[pp_rank], busy_s=mean_busy,
                              idle_s=total - mean_busy, span_s=total))
    return rows


def theoretical_bubble(p: int, m: int, virtual_stages: int = 1) -> float:
    """(p - 1) / (v m + p - 1): the idle share of a balanced GPipe / 1F1B (v = 1) or interleaved step."""
    return (p - 1) / (virtual_stages * m + p - 1)
