"""Which ranks and nodes need attention: the outliers of one measure over the last closed steps.

Rules:

- **Measures** (:data:`MEASURES`): a rank's step time, its exposed communication, its data wait and its
  pipeline bubble, each in seconds per step (its step's parts,
  :mod:`~meshtop.recordings.metrics.breakdown`); and its memory headroom in bytes (its memory row).
- **A rank's value** of a step measure is its median over its last :data:`WINDOW` closed steps, so one slow
  step does not flag a rank and a rank slow for a while does.
- **An outlier** is scored by Iglewicz and Hoaglin's modified z-score (1993), robust to the outliers
  themselves: ``z = 0.6745 (x - median) / MAD`` over the ranks' values (MAD: the median absolute deviation);
  a rank needs attention where ``z`` passes :data:`Z_LIMIT` (3.5, their recommendation) on the measure's bad
  side (high for the times, low for headroom) and it is off the median by more than :data:`MIN_SPREAD` of
  the median and :data:`MIN_OFF` of the measure's unit (so ranks alike to microseconds are not told apart by
  a tiny MAD). Where the MAD is 0 (most ranks alike) ``z`` is infinite for a rank off the median that far.
  Fewer than :data:`MIN_RANKS` ranks are not scored: there is no crowd to stand out from.
- **A node's value** is the median of its ranks' values, and nodes are scored among themselves by the same
  rule (so a slow node stands out whole, though each of its ranks is like its neighbours).
- **The top k** are the ranks with the highest ``z`` on the bad side, flagged or not: the list beside a
  rank grid.
"""

from __future__ import annotations

import math
from collections import defaultdict, deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import numpy as np

MEASURES = {
    "step": "high",
    "communication": "high",
    "data": "high",
    "bubble": "high",
    "headroom": "low",
}
"""Each measure and its bad side."""
LABELS = {
    "step": "step time",
    "communication": "exposed communication",
    "data": "data wait",
    "bubble": "pipeline bubble",
    "headroom": "memory headroom",
}
"""Each measure in words (the rank grid's heading, ``compare``'s lines)."""
STEP_MEASURES = ("step", "communication", "data", "bubble")
WINDOW = 20
"""Closed steps a rank's value is the median of."""
Z_LIMIT = 3.5
MIN_SPREAD = 0.05
"""How far off the median (a share of it) a flagged rank is, at least."""
MIN_OFF = {"step": 1e-3, "communication": 1e-3, "data": 1e-3, "bubble": 1e-3, "headroom": float(64 << 20)}
"""How far off the median a flagged rank is, at least, in the measure's unit (1 ms; 64 MiB)."""
MIN_RANKS = 3
CONSISTENCY = 0.6745
"""The normal distribution's MAD in standard deviations: it makes ``z`` comparable to a standard score."""


class RankRecent:
    """Each rank's values of the step measures over its last :data:`WINDOW` closed steps."""

    def __init__(self) -> None:
        self._values: dict[str, dict[int, deque[float]]] = {
            measure: defaultdict(lambda: deque(maxlen=WINDOW)) for measure in STEP_MEASURES
        }

    def add(self, rank: int, measure: str, value: float) -> None:
        self._values[measure][rank].append(value)

    def add_many(self, measure: str, ranks: Iterable[int], values: Iterable[float]) -> None:
        """A closed step's ``measure`` of each of ``ranks``."""
        recent = self._values[measure]
        for rank, value in zip(ranks, values, strict=True):
            recent[rank].append(value)

    def medians(self, measure: str) -> dict[int, float]:
        """Each rank's median of ``measure`` over its last closed steps (those it has one for); the ranks with as
        many steps kept are taken together, one array (1024 ranks: one median call, not 1024)."""
        by_length: dict[int, list[int]] = defaultdict(list)
        for rank, values in self._values[measure].items():
            if values:
                by_length[len(values)].append(rank)
        medians: dict[int, float] = {}
        for ranks in by_length.values():
            rows = np.array([self._values[measure][rank] for rank in ranks], dtype=float)
            medians.update(zip(ranks, np.median(rows, axis=1).tolist(), strict=True))
        return medians


@dataclass(frozen=True, slots=True)
class Scored:
    """A rank or a node: its value of the measure and its modified z-score (bad side positive)."""

    key: int
    value: float
    z: float
    flagged: bool
    """It needs attention: ``z`` past :data:`Z_LIMIT`, and far enough off the median."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Attention:
    """The ranks and nodes that stand out on one measure."""

    measure: str
    median: float | None
    """The ranks' median value (``None`` with no rank)."""
    ranks: tuple[Scored, ...]
    """Every scored rank, the worst first."""
    nodes: tuple[Scored, ...]
    """Every scored node, the worst first (none with fewer than :data:`MIN_RANKS` nodes)."""

    @property
    def flagged_ranks(self) -> tuple[int, ...]:
        return tuple(scored.key for scored in self.ranks if scored.flagged)

    @property
    def flagged_nodes(self) -> tuple[int, ...]:
        return tuple(scored.key for scored in self.nodes if scored.flagged)

    def top(self, k: int) -> tuple[Scored, ...]:
        """The ``k`` ranks with the highest ``z``, flagged or not."""
        return self.ranks[:k]


def scored(measure: str, values: Mapping[int, float]) -> tuple[Scored, ...]:
    """Each of ``values`` (key -> value of ``measure``) with its modified z-score on the measure's bad side
    (positive where it is worse than the median), the worst first; none for fewer than :data:`MIN_RANKS`."""
    if len(values) < MIN_RANKS:
        return ()
    keys = list(values)
    x = np.array([values[key] for key in keys], dtype=float)
    sign = 1.0 if MEASURES[measure] == "high" else -1.0
    median = float(np.median(x))
    mad = float(np.median(np.abs(x - median)))
    far = max(MIN_SPREAD * abs(median), MIN_OFF[measure])
    rows = []
    for key, value in zip(keys, x.tolist(), strict=True):
        off = sign * (value - median)
        z = CONSISTENCY * off / mad if mad > 0 else (math.inf if off > far else 0.0)
        rows.append(Scored(key, value, z, z > Z_LIMIT and off > far))
    return tuple(sorted(rows, key=lambda row: (-row.z, row.key)))


def attention(measure: str, values: Mapping[int, float], node_of: Mapping[int, int]) -> Attention:
    """Score ``values`` (rank -> the rank's value of ``measure``) and their nodes (``node_of``: rank -> node;
    a rank missing from it is node 0)."""
    by_node: dict[int, list[float]] = {}
    for rank, value in values.items():
        by_node.setdefault(node_of.get(rank, 0), []).append(value)
    node_values = {node: float(np.median(ranks)) for node, ranks in by_node.items()}
    return Attention(
        measure=measure,
        median=float(np.median(list(values.values()))) if values else None,
        ranks=scored(measure, values),
        nodes=scored(measure, node_values),
    )
