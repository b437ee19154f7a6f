"""Where the step goes: each rank's step split into data, forward, backward, optimizer, exposed
communication, pipeline bubble and the rest, adding up to the step.

Rules, per rank and closed step:

- The rank's step is [start, start + duration] (its ``step`` event). Each moment of it goes to exactly one
  part, the first of these that covers it, so the parts add up to the step:

  1. **communication**: a moment the rank waited in a collective (not a pipeline's send or receive):
     [end - waited, end] of each operation whose wait the probe saw, else the operation's whole in-flight
     time [start, end], an upper bound, as the exposed time of
     :mod:`~meshtop.recordings.metrics.collectives` (DDP's reducer waits where no probe sees it);
  2. **bubble**, a pipelined rank's: a moment it waited on a pipeline send or receive, by the same rule;
  3. **optimizer**, 4. **backward**, 5. **forward**, 6. **data**: the rank's phase windows
     (:mod:`meshtop.probes.phases`; a forward inside backward, activation checkpointing's recomputation, is
     backward; data last: on a GPU the host waits for its next batch while the device still runs the work
     it queued, and that moment is the device's work, not a wait for data);
  7. **bubble**, again a pipelined rank's: a moment of its pipeline schedule (from the step's start to its
     optimizer step, ``forward_backward_s``) in none of the above: it idled between stage actions;
  8. **other**: the rest (the loop's own code, logging, a host sync the script made).

  A rank is pipelined when it measured its pipeline waits (``pipeline_wait_s``) and waited in one or ran a
  send or receive in the step.
- Over the run, per rank: each part's mean seconds per step and its **share**, the part's sum over the
  rank's step times' sum. The job's: the same over every rank's steps; and per closed step, each part's
  mean over the step's ranks (the values ``compare`` tests a change on).
- Intervals are wall-clock nanoseconds (the ranks' own clocks, moved onto the head's on many nodes).
"""

from __future__ import annotations

from collections import defaultdict, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from meshtop.recordings.metrics.stats import Distribution

PARTS = ("data", "forward", "backward", "optimizer", "communication", "bubble", "other")
"""Every part, in the order they are shown."""
WORK_PARTS = ("data", "forward", "backward", "optimizer", "other")
"""The parts of a rank's own work (not waiting on others): where a straggler's cause is looked for."""
PHASE_PARTS = {"d": "data", "f": "forward", "b": "backward", "o": "optimizer"}
_LABELS = ("communication", "bubble", "optimizer", "backward", "forward", "data", "bubble", "other")
"""The part of each precedence level (the index), first wins: see the module's rules."""
_COMM, _P2P, _SCHEDULE, _OTHER = 0, 1, 6, 7
ABOVE_MEAN = 0.01
"""A rank's part counts as above the job's when its share is at least this much higher (1 point)."""
HISTORY = 240
"""Closed steps whose parts the dashboard charts."""
_PHASE_LEVEL = {"o": 2, "b": 3, "f": 4, "d": 5}

Interval = tuple[int, int]


@dataclass(frozen=True, slots=True)
class RankStep:
    """One rank's step and what covered it."""

    start_ns: int
    end_ns: int
    schedule_end_ns: int | None
    """A pipelined rank's: where its schedule ended (the optimizer's start); ``None`` otherwise."""
    phases: str
    phase_start_ns: Sequence[int]
    phase_end_ns: Sequence[int]
    communication: Sequence[Interval]
    pipeline_waits: Sequence[Interval]


def step_parts(step: RankStep) -> dict[str, float]:
    """Seconds of each of :data:`PARTS` in ``step``, by the module's rules (they add up to its length)."""
    intervals: list[tuple[int, int, int]] = [(s, e, _COMM) for s, e in step.communication]
    intervals += [(s, e, _P2P) for s, e in step.pipeline_waits]
    for kind, s, e in zip(step.phases, step.phase_start_ns, step.phase_end_ns, strict=True):
        if (level := _PHASE_LEVEL.get(kind)) is not None:
            intervals.append((s, e, level))
    if step.schedule_end_ns is not None:
        intervals.append((step.start_ns, step.schedule_end_ns, _SCHEDULE))
    parts = dict.fromkeys(PARTS, 0.0)
    if step.end_ns <= step.start_ns:
        return parts
    clipped = [
        (max(s, step.start_ns), min(e, step.end_ns), level)
        for s, e, level in intervals
        if min(e, step.end_ns) > max(s, step.start_ns)
    ]
    cuts = sorted({step.start_ns, step.end_ns, *(s for s, _, _ in clipped), *(e for _, e, _ in clipped)})
    edges = np.array(cuts, dtype=np.int64)
    best = np.full(len(edges) - 1, _OTHER, dtype=np.int64)
    for s, e, level in clipped:  # each segment takes the first (lowest) level covering it
        lo, hi = np.searchsorted(edges, s), np.searchsorted(edges, e)
        np.minimum(best[lo:hi], level, out=best[lo:hi])
    lengths = np.diff(edges) / 1e9
    totals = np.bincount(best, weights=lengths, minlength=len(_LABELS))
    for level, seconds in enumerate(totals.tolist()):
        parts[_LABELS[level]] += seconds
    return parts


@dataclass(frozen=True, slots=True, kw_only=True)
class Breakdown:
    """Each part's mean seconds per step and share of the step, over the job's ranks and per rank."""

    parts: dict[str, dict[str, float]]
    """Part -> ``{"s_per_step": ..., "share": ...}`` over every rank's closed steps."""
    per_rank: dict[int, dict[str, dict[str, float]]]
    steps: int
    """Closed rank-steps it is over."""
    slowest_in: dict[int, float]
    """Per rank: the share of its stage's closed steps in which it had the most compute time."""
    history: dict[str, tuple[float, ...]] = field(default_factory=dict)
    """Per part: its mean over the ranks in each of the last :data:`HISTORY` closed steps (the dashboard's)."""

    def above_mean(self, rank: int) -> tuple[str, float, float] | None:
        """The part of ``rank``'s own work whose share of its step exceeds the job's share the most, by at
        least :data:`ABOVE_MEAN` (the dashboard's rank row): (part, its share, the job's); ``None`` otherwise."""
        own = self.per_rank.get(rank)
        if own is None or not self.parts:
            return None
        part = max(WORK_PARTS, key=lambda name: own[name]["share"] - self.parts[name]["share"])
        share, mean = own[part]["share"], self.parts[part]["share"]
        return (part, share, mean) if share - mean >= ABOVE_MEAN else None

    def cause(self, rank: int, peers: Sequence[int]) -> tuple[str, float, float] | None:
        """The part of ``rank``'s own work whose share of its step exceeds ``peers``' mean share the most:
        (part, its share, the peers' mean share); ``None`` without the phases of both."""
        own = self.per_rank.get(rank)
        others = [self.per_rank[peer] for peer in peers if peer in self.per_rank and peer != rank]
        if own is None or not others:
            return None

        def peers_share(part: str) -> float:
            return sum(parts[part]["share"] for parts in others) / len(others)

        part = max(WORK_PARTS, key=lambda name: own[name]["share"] - peers_share(name))
        return part, own[part]["share"], peers_share(part)

    def biggest(self) -> str | None:
        """The part that took the most of the step (``None`` before any step)."""
        if not self.steps:
            return None
        return max(PARTS, key=lambda part: self.parts[part]["share"])

    def to_json(self) -> dict[str, object]:
        return {
            "parts": self.parts,
            "per_rank": {str(rank): parts for rank, parts in sorted(self.per_rank.items())},
            "biggest": self.biggest(),
            "slowest_in": {str(rank): share for rank, share in sorted(self.slowest_in.items())},
        }


class BreakdownFold:
    """Each rank's step parts, summed as steps close."""

    def __init__(self) -> None:
        self._sums: dict[int, np.ndarray] = defaultdict(lambda: np.zeros(len(PARTS)))
        self._step_s: dict[int, float] = defaultdict(float)
        self._steps: dict[int, int] = defaultdict(int)
        self.per_step: dict[str, Distribution] = {part: Distribution() for part in PARTS}
        """Per closed step: each part's mean over the step's ranks (seconds)."""
        self._recent: dict[str, deque[float]] = {part: deque(maxlen=HISTORY) for part in PARTS}
        self._slowest: dict[int, int] = defaultdict(int)
        self._stage_steps: dict[int, int] = defaultdict(int)
        """Per rank: the closed steps of its stage that had two or more ranks' parts."""

    def add_step(self, parts_by_rank: dict[int, dict[str, float]], stage_of: Callable[[int], int]) -> None:
        """One closed step's parts of each rank (from :meth:`add`): per stage of two or more ranks, the rank with
        the most compute time (its step less communication and bubble) was the slowest."""
        if parts_by_rank:
            for part in PARTS:
                mean = sum(parts[part] for parts in parts_by_rank.values()) / len(parts_by_rank)
                self.per_step[part].add(mean)
                self._recent[part].append(mean)
        stages: dict[int, list[tuple[float, int]]] = defaultdict(list)
        for rank, parts in parts_by_rank.items():
            compute = sum(seconds for part, seconds in parts.items() if part not in ("communication", "bubble"))
            stages[stage_of(rank)].append((compute, rank))
        for ranks in stages.values():
            if len(ranks) < 2:
                continue
            self._slowest[max(ranks)[1]] += 1
            for _, rank in ranks:
                self._stage_steps[rank] += 1

    def add(self, rank: int, step: RankStep) -> dict[str, float]:
        parts = step_parts(step)
        self._sums[rank] += np.array([parts[part] for part in PARTS])
        self._step_s[rank] += (step.end_ns - step.start_ns) / 1e9
        self._steps[rank] += 1
        return parts

    def figures(self) -> Breakdown:
        def rows(sums: np.ndarray, step_s: float, steps: int) -> dict[str, dict[str, float]]:
            return {
                part: {"s_per_step": float(total) / steps, "share": float(total) / step_s if step_s > 0 else 0.0}
                for part, total in zip(PARTS, sums.tolist(), strict=True)
            }

        per_rank = {rank: rows(self._sums[rank], self._step_s[rank], self._steps[rank]) for rank in self._sums}
        steps = sum(self._steps.values())
        total = sum(self._sums.values(), np.zeros(len(PARTS)))
        parts = rows(total, sum(self._step_s.values()), steps) if steps else {}
        slowest = {rank: self._slowest[rank] / steps for rank, steps in self._stage_steps.items() if steps}
        history = {part: tuple(values) for part, values in self._recent.items()}
        return Breakdown(parts=parts, per_rank=per_rank, steps=steps, slowest_in=slowest, history=history)
