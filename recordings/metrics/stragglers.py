"""Stragglers: a rank that computes more slowly than the other ranks of its pipeline stage.

- A rank's **compute time** in a closed step is its own step time less its
  exposed communication in that step (the time its thread waited in
  collectives, :mod:`meshtop.recordings.metrics.collectives`): what it spent
  on its own work. Sources: the rank's :class:`~meshtop.probes.events.StepTiming`
  (end - start) and the step's exposed time per rank, decided when the step
  closes.
- Its **recent compute time** is the median of its last :data:`WINDOW`
  closed steps; a rank is judged once it has :data:`MIN_STEPS` of them.
- Its **peers** are the other judged ranks of the same pipeline stage (pp
  rank): ranks of different stages do different work.
- A rank is a **straggler** when its recent compute time c exceeds the median
  m of its peers' by both rules: c > :data:`RATIO` x m and c - m >
  :data:`MIN_GAP_S`. The figure is c / m.

A slow rank makes its peers wait for it in their collectives, so their
compute time stays low while its own is high: the rule names the cause, not
the ranks that waited.

Where the ranks measured their step's phases (:mod:`meshtop.recordings.metrics.breakdown`),
a straggler also gets:

- **slowest in**: the share of the closed steps in which it had the most
  compute time of its stage (step less communication and bubble);
- **cause**: the part of its own work (data, forward, backward, optimizer,
  other) whose share of its step exceeds its peers' mean share of theirs by
  the most, with both shares: "rank 3 is the slowest in 80 % of steps: data
  41 % of its step vs 6 % on the others".
"""

from __future__ import annotations

import statistics
from collections import defaultdict, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

WINDOW = 5
"""Closed steps of each rank whose compute time is kept."""
MIN_STEPS = 3
"""Closed steps a rank needs before it is judged."""
RATIO = 1.25
"""A straggler's compute time exceeds its peers' median by this factor..."""
MIN_GAP_S = 0.002
"""...and by this many seconds (a 1.3 ms step against a 1 ms one is noise)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Straggler:
    """A rank whose recent compute time exceeds its stage peers'."""

    rank: int
    stage: int
    """Its pipeline rank."""
    compute_s: float
    """Its recent compute time (median of its last steps)."""
    peers_compute_s: float
    """The median of its peers' recent compute times."""
    ratio: float
    """compute_s / peers_compute_s."""
    slowest_in: float | None = None
    """The share of closed steps in which it had its stage's most compute time (``None``: phases not measured)."""
    cause: str | None = None
    """The part of its work that exceeds its peers' the most (``None``: phases not measured)."""
    cause_share: float | None = None
    """That part's share of its step..."""
    peers_cause_share: float | None = None
    """...and its peers' mean share of theirs."""

    @property
    def verdict(self) -> str:
        """The straggler in one line, with its cause where the phases say it (the dashboard, summary, compare)."""
        if self.cause is None or self.slowest_in is None:
            return f"rank {self.rank} is a straggler: {self.ratio:.2f}x its peers' compute time"
        return (
            f"rank {self.rank} is the slowest in {self.slowest_in:.0%} of steps: {self.cause} "
            f"{self.cause_share or 0:.0%} of its step vs {self.peers_cause_share or 0:.0%} on the others"
        ).replace("%", " %")


def compute_seconds(rank_durations_s: dict[int, float], exposed_by_rank: dict[int, float]) -> dict[int, float]:
    """Each rank's compute time in one closed step: its step time less its exposed communication."""
    return {rank: duration - exposed_by_rank.get(rank, 0.0) for rank, duration in rank_durations_s.items()}


def median_without(ordered: Sequence[float], index: int) -> float:
    """The median of sorted ``ordered`` less its element at ``index`` (in O(1): the check runs per rank)."""

    def at(k: int) -> float:  # k-th of the list without ``index``
        return ordered[k if k < index else k + 1]

    n = len(ordered) - 1
    middle = n // 2
    return at(middle) if n % 2 else (at(middle - 1) + at(middle)) / 2


class ComputeTimes:
    """Each rank's compute time in its last :data:`WINDOW` closed steps."""

    def __init__(self) -> None:
        self.recent: dict[int, deque[float]] = {}

    def add_step(self, rank_durations_s: dict[int, float], exposed_by_rank: dict[int, float]) -> None:
        """A step closed: each of its ranks' compute time."""
        for rank, seconds in compute_seconds(rank_durations_s, exposed_by_rank).items():
            self.recent.setdefault(rank, deque(maxlen=WINDOW)).append(seconds)

    def stragglers(self, stage_of: Callable[[int], int]) -> list[Straggler]:
        """The stragglers now, by rank (``stage_of``: a rank's pipeline rank)."""
        peers: dict[int, list[tuple[float, int]]] = defaultdict(list)
        for rank, times in self.recent.items():
            if len(times) >= MIN_STEPS:
                peers[stage_of(rank)].append((statistics.median(times), rank))
        found = []
        for stage, group in peers.items():
            if len(group) < 2:
                continue
            medians = sorted(group)
            ordered = [median for median, _ in medians]
            for index, (own, rank) in enumerate(medians):
                others = median_without(ordered, index)
                if others > 0 and own > RATIO * others and own - others > MIN_GAP_S:
                    found.append(
                        Straggler(rank=rank, stage=stage, compute_s=own, peers_compute_s=others, ratio=own / others)
                    )
        return sorted(found, key=lambda straggler: straggler.rank)
