"""Stragglers: a rank that computes more slowly than the other ranks of its pipeline stage, for longer than
chance and a busy machine explain.

- A rank's **compute time** in a closed step is its own step time less its
  exposed communication in that step (the time its thread waited in
  collectives, :mod:`meshtop.recordings.metrics.collectives`): what it spent
  on its own work. Sources: the rank's :class:`~meshtop.probes.events.StepTiming`
  (end - start) and the step's exposed time per rank, decided when the step
  closes.
- Its **peers** are the other ranks of the same pipeline stage (pp rank) in
  the step: ranks of different stages do different work. N is the number of
  ranks of the stage.
- The **slowest** of a stage in a closed step is its rank with the most
  compute time (of two alike, the higher rank), in a stage of two ranks or
  more.
- The **window** is the job's last :data:`WINDOW` closed steps. Over it, per
  rank: k, the steps in which it was the slowest of its stage, of n, the steps
  it computed in; its **recent compute time** c, the median of its compute
  times; and m, the median of its peers' recent compute times.
- A rank is **judged** at every closed step once n reaches :data:`MIN_STEPS`.
  It is a **suspect** when both hold:

  1. *beyond chance*: of N alike ranks, each is the slowest in a step with
     chance 1/N, so the one-sided binomial test of k slowest steps of n must
     reject that: P(X >= k) <= :data:`ALPHA` / N for X ~ Binomial(n, 1/N)
     (``scipy.stats.binomtest(k, n, 1/N, alternative="greater")``). Each of
     the stage's N ranks is tested at ALPHA / N, so that all of them together
     name one by chance in at most ALPHA of the judgements (Bonferroni). With
     2 ranks and a full window: 18 of 20 steps (p = 211 / 2^20 = 0.0002), not
     17 (p = 1351 / 2^20 = 0.0013);
  2. *by enough*: c > :data:`RATIO` x m and c - m > :data:`MIN_GAP_S`.

- A **straggler** is a rank judged a suspect at every closed step, one
  after another, for :data:`HOLD_S` seconds at least: from the start of the
  first of those steps to the end of the last (the steps' own clocks, so a
  recording's ``summary`` names the straggler the dashboard named live). It
  is named no more from the first step it is not a suspect at. The figure is
  c / m; **slowest in** is k / n.

A slow rank makes its peers wait for it in their collectives, so their
compute time stays low while its own is high: the rule names the rank they
waited for, not the ranks that waited.

Where the ranks measured their step's phases (:mod:`meshtop.recordings.metrics.breakdown`),
a straggler's **cause** is looked for over the same window. Per part of its
own work (data, forward, backward, optimizer, other): s, the part's share of
its steps, and p, its peers' mean share of theirs; S and P, the sums over the
parts (its compute share and theirs), so S - P is its **extra**. A rank slowed
whole (a busy machine, a slower device) has every part grown alike, and no
part is the cause; a cause is a part grown beyond the rest of its work: its
**own extra** is s - p x g, where g = (S - s) / (P - p) is how much the rest
of its work grew (g = 1 where its peers have no other work). The cause is the
part of the largest own extra, where that is at least :data:`CAUSE_SHARE` of
the extra: "rank 3 is the slowest in 80 % of steps: data 41 % of its step vs
6 % on the others". Elsewhere (no such part, or no phases measured) the cause
is unknown: "rank 3 is the slowest in 100 % of steps: 1.40x its peers'
compute time, cause unknown".

What the rule does not see: ranks equally slow in one stage share its
slowest steps, so two slow ranks of four (each the slowest in about half the
steps: p = 0.014 for 10 of 20 against 1/4, above ALPHA / 4) are not named; and
a straggler for less than :data:`HOLD_S` seconds.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from functools import cache

import numpy as np
import numpy.typing as npt

from meshtop.recordings.metrics.breakdown import PARTS, WORK_PARTS

WINDOW = 20
"""Closed steps a rank is judged over: enough for the binomial test to tell a rank that is the slowest in
most of them from one that is by chance (of 2 ranks: 18 of 20 is beyond chance, 12 of 20 is chance), few
enough that a slow spell on a busy machine, which moves from rank to rank within seconds, soon leaves it."""
MIN_STEPS = 10
"""Closed steps a rank needs in the window before it is judged: its median is then of ten steps, which a few
slow ones do not move."""
ALPHA = 0.001
"""The chance that one judgement of a stage of alike ranks finds one of them beyond chance (each of its N
ranks tested at ALPHA / N). Small, since a run is judged at each of thousands of closed steps; the hold
then asks for it at every step for :data:`HOLD_S`, which chance alone does not give."""
RATIO = 1.25
"""A suspect's recent compute time exceeds its peers' median by this factor..."""
MIN_GAP_S = 0.002
"""...and by this many seconds (a 1.3 ms step against a 1 ms one is noise)."""
HOLD_S = 10.0
"""Seconds a rank is a suspect at every closed step before it is named: on a machine shared with other work,
the scheduler slows one rank for a few seconds at a time, beyond chance and by far (measured in
docs/benchmarks.md), then another; what makes a real straggler (a slow device, a slow loader, extra work)
lasts."""
CAUSE_SHARE = 0.5
"""A cause's own extra is at least this part of the straggler's extra compute: the part explains most of why
the rank is slower. Where its extra is spread over its parts as their sizes are (its process slowed whole, as
on a busy machine) or over several, none is its cause."""

Column = npt.NDArray[np.int64]
"""Integers, one a rank."""

_WORK = np.array([PARTS.index(part) for part in WORK_PARTS])
"""Where the parts of a rank's own work are in a row of :data:`~meshtop.recordings.metrics.breakdown.PARTS`."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Straggler:
    """A rank whose compute time has exceeded its stage peers' beyond chance, for long enough."""

    rank: int
    stage: int
    """Its pipeline rank."""
    compute_s: float
    """Its recent compute time (median over the window)."""
    peers_compute_s: float
    """The median of its peers' recent compute times."""
    ratio: float
    """compute_s / peers_compute_s."""
    slowest_in: float
    """The share of its steps in the window in which it had its stage's most compute time."""
    cause: str | None = None
    """The part of its work that explains most of its extra compute time (``None``: unknown)."""
    cause_share: float | None = None
    """That part's share of its steps..."""
    peers_cause_share: float | None = None
    """...and its peers' mean share of theirs."""

    @property
    def verdict(self) -> str:
        """The straggler in one line, with its cause where the phases say it (the dashboard, summary, compare)."""
        if self.cause is None:
            because = f"{self.ratio:.2f}x its peers' compute time, cause unknown"
        else:
            because = (
                f"{self.cause} {self.cause_share or 0:.0%} of its step vs {self.peers_cause_share or 0:.0%} on the "
                "others"
            )
        return f"rank {self.rank} is the slowest in {self.slowest_in:.0%} of steps: {because}".replace("%", " %")


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


@cache
def fewest_beyond_chance(steps: int, ranks: int) -> int:
    """The fewest of ``steps`` closed steps a rank of a stage of ``ranks`` must be the slowest in to be beyond
    chance: the least k with P(X >= k) <= :data:`ALPHA` / ``ranks``, X ~ Binomial(``steps``, 1 / ``ranks``);
    ``steps + 1`` where even all of them are not."""
    from scipy.stats import binom  # 1 s a process: paid by a run that has a rank to judge, not at import

    at_least = binom.sf(np.arange(steps + 1) - 1, steps, 1 / ranks)  # P(X >= k), k = 0 .. steps
    beyond = np.flatnonzero(at_least <= ALPHA / ranks)
    return int(beyond[0]) if len(beyond) else steps + 1


class ComputeTimes:
    """The rule's input and state: each rank's compute time, work parts and whether it was its stage's slowest
    in the job's last :data:`WINDOW` closed steps (a ring of rows, a column a rank), and how long each rank has
    been a suspect."""

    def __init__(self) -> None:
        self._compute = np.full((WINDOW, 0), np.nan)
        self._work = np.zeros((WINDOW, 0, len(WORK_PARTS)))
        """Seconds of each part of :data:`WORK_PARTS` where the rank measured its phases..."""
        self._phased_s = np.zeros((WINDOW, 0))
        """...and that step's seconds (0 where it did not)."""
        self._slowest = np.zeros((WINDOW, 0), dtype=bool)
        self._stage = np.zeros(0, dtype=np.int64)
        """Each rank's stage in its last closed step."""
        self._since_ns = np.zeros(0, dtype=np.int64)
        """Each suspect's start of the first step of those it has been a suspect at, one after another."""
        self._last_end_ns = 0
        """The end of the last closed step."""
        self._suspects: dict[int, Straggler] = {}
        """The suspects at the last judgement, their figures (no cause yet)."""
        self.steps = 0
        """Closed steps added."""

    @property
    def recent(self) -> dict[int, list[float]]:
        """Each rank's compute times in the window, oldest first (ranks with one)."""
        rows = np.roll(self._compute, -(self.steps % WINDOW), axis=0)
        return {
            rank: column[~np.isnan(column)].tolist() for rank, column in enumerate(rows.T) if not np.isnan(column).all()
        }

    def add_step(
        self,
        rank_durations_s: dict[int, float],
        exposed_by_rank: dict[int, float],
        *,
        span_ns: tuple[int, int],
        stage_of: Callable[[int], int] | None = None,
        parts: tuple[Sequence[int], npt.NDArray[np.float64]] | None = None,
    ) -> None:
        """A step closed: each of its ranks' compute time, and each rank judged. ``span_ns``: the step's first
        start and last end (wall clock); ``stage_of``: a rank's pipeline rank (``None``: one stage); ``parts``:
        the ranks that measured their phases and a row of :data:`~meshtop.recordings.metrics.breakdown.PARTS`
        seconds each (``BreakdownFold.add_cells``)."""
        count = len(rank_durations_s)
        if not count:
            return
        ranks = np.fromiter(rank_durations_s, dtype=np.int64, count=count)
        compute = np.fromiter(compute_seconds(rank_durations_s, exposed_by_rank).values(), np.float64, count)
        stage = np.zeros(count, np.int64) if stage_of is None else np.fromiter(map(stage_of, ranks.tolist()), np.int64)
        self._grow(int(ranks.max()) + 1)
        slot = self.steps % WINDOW
        self.steps += 1
        self._compute[slot], self._work[slot], self._phased_s[slot], self._slowest[slot] = np.nan, 0.0, 0.0, False
        self._compute[slot, ranks], self._stage[ranks] = compute, stage
        if parts is not None and len(parts[0]):
            phased = np.asarray(parts[0], dtype=np.int64)
            self._work[slot, phased] = parts[1][:, _WORK]
            self._phased_s[slot, phased] = parts[1].sum(axis=1)  # the parts add up to the step
        order = np.lexsort((ranks, compute, stage))  # by stage, the slowest (then the highest rank) last
        stage, ranks = stage[order], ranks[order]
        change = stage[1:] != stage[:-1]
        first, last = np.r_[True, change], np.r_[change, True]
        size = np.diff(np.r_[np.flatnonzero(first), count])
        stage_size = np.repeat(size, size)
        self._slowest[slot, ranks[last & (stage_size >= 2)]] = True
        self._judge(ranks, stage, stage_size, span_ns)

    def _judge(self, ranks: Column, stage: Column, stage_size: Column, span_ns: tuple[int, int]) -> None:
        """Judge the ranks of the step just added (``ranks`` by stage, with each one's stage and its size), and
        note since when each suspect has been one."""
        was = self._suspects
        slowest = self._slowest[:, ranks].sum(axis=0)
        compute = self._compute[:, ranks]
        computed = ~np.isnan(compute)
        steps = computed.sum(axis=0)
        above = np.flatnonzero((steps >= MIN_STEPS) & (stage_size >= 2) & (slowest * stage_size > steps))
        beyond = [
            index
            for index in above.tolist()
            if slowest[index] >= fewest_beyond_chance(int(steps[index]), int(stage_size[index]))
        ]
        self._suspects = {}
        if beyond:
            recent = np.median(compute, axis=0) if computed.all() else np.nanmedian(compute, axis=0)  # 1/3 the time
            for index in beyond:
                peers = np.flatnonzero(stage == stage[index])
                ordered = np.sort(recent[peers])
                own = float(recent[index])
                others = median_without(ordered.tolist(), int(np.searchsorted(ordered, own)))
                if others > 0 and own > RATIO * others and own - others > MIN_GAP_S:
                    rank = int(ranks[index])
                    self._suspects[rank] = Straggler(
                        rank=rank,
                        stage=int(stage[index]),
                        compute_s=own,
                        peers_compute_s=others,
                        ratio=own / others,
                        slowest_in=float(slowest[index] / steps[index]),
                    )
        for rank in self._suspects.keys() - was.keys():
            self._since_ns[rank] = span_ns[0]
        self._last_end_ns = span_ns[1]

    def _grow(self, ranks: int) -> None:
        """Room for ranks below ``ranks``."""
        more = ranks - len(self._stage)
        if more > 0:
            self._compute = np.hstack([self._compute, np.full((WINDOW, more), np.nan)])
            self._work = np.hstack([self._work, np.zeros((WINDOW, more, len(WORK_PARTS)))])
            self._phased_s = np.hstack([self._phased_s, np.zeros((WINDOW, more))])
            self._slowest = np.hstack([self._slowest, np.zeros((WINDOW, more), dtype=bool)])
            self._stage = np.r_[self._stage, np.zeros(more, dtype=np.int64)]
            self._since_ns = np.r_[self._since_ns, np.zeros(more, dtype=np.int64)]

    def suspects(self) -> dict[int, float]:
        """Each suspect at the last judgement, and the seconds it has been one (a straggler from :data:`HOLD_S`
        on)."""
        return {rank: (self._last_end_ns - int(self._since_ns[rank])) / 1e9 for rank in sorted(self._suspects)}

    def stragglers(self) -> list[Straggler]:
        """The stragglers now, by rank, each with its cause where the phases show one."""
        return [self._explained(self._suspects[rank]) for rank, held_s in self.suspects().items() if held_s >= HOLD_S]

    def _explained(self, straggler: Straggler) -> Straggler:
        """``straggler`` with its cause, where its and its peers' phases show one (the module's rule)."""
        own = self._work_shares(np.array([straggler.rank]))
        if np.isnan(own).any():
            return straggler
        peers = np.flatnonzero(self._stage == straggler.stage)
        others = self._work_shares(peers[peers != straggler.rank])
        others = others[~np.isnan(others).any(axis=1)]
        if not len(others):
            return straggler
        share, peers_share = own[0], others.mean(axis=0)
        extra = share.sum() - peers_share.sum()
        rest, peers_rest = share.sum() - share, peers_share.sum() - peers_share
        growth = np.divide(rest, peers_rest, out=np.ones_like(rest), where=peers_rest > 0)
        own_extra = share - peers_share * growth
        part = int(np.argmax(own_extra))
        if extra <= 0 or own_extra[part] < CAUSE_SHARE * extra:
            return straggler
        return replace(
            straggler,
            cause=WORK_PARTS[part],
            cause_share=float(share[part]),
            peers_cause_share=float(peers_share[part]),
        )

    def _work_shares(self, ranks: Column) -> npt.NDArray[np.float64]:
        """Each of ``ranks``' work parts as shares of its steps in the window that measured them (a row a rank;
        NaN for a rank with none)."""
        step_s = self._phased_s[:, ranks].sum(axis=0)[:, None]
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.where(step_s > 0, self._work[:, ranks].sum(axis=0) / step_s, np.nan)
