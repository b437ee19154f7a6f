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
  3. **backward**, 4. **forward**, 5. **optimizer**, 6. **data**: the rank's phase windows
     (:mod:`meshtop.probes.phases`; a forward inside backward, activation checkpointing's recomputation, is
     backward; a forward and a backward inside an optimizer step, a closure's (``optimizer.step(closure)``:
     Lightning's automatic optimization, LBFGS), are forward and backward, the optimizer its own work
     around them; data last: on a GPU the host waits for its next batch while the device still runs the
     work it queued, and that moment is the device's work, not a wait for data);
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

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from meshtop.recordings.metrics.collectives import Waits
from meshtop.recordings.metrics.stats import Distribution
from meshtop.recordings.metrics.steps import StepSpans

PARTS = ("data", "forward", "backward", "optimizer", "communication", "bubble", "other")
"""Every part, in the order they are shown."""
WORK_PARTS = ("data", "forward", "backward", "optimizer", "other")
"""The parts of a rank's own work (not waiting on others): where a straggler's cause is looked for."""
PHASE_PARTS = {"d": "data", "f": "forward", "b": "backward", "o": "optimizer"}
_LABELS = ("communication", "bubble", "backward", "forward", "optimizer", "data", "bubble", "other")
"""The part of each precedence level (the index), first wins: see the module's rules."""
COMM, P2P, SCHEDULE, OTHER = 0, 1, 6, 7
"""Levels: a collective's wait, a pipelined rank's send or receive wait, its schedule, and none of the rules."""
ABOVE_MEAN = 0.01
"""A rank's part counts as above the job's when its share is at least this much higher (1 point)."""
HISTORY = 240
"""Closed steps whose parts the dashboard charts."""
_PHASE_LEVEL = {"b": 2, "f": 3, "o": 4, "d": 5}
"""The level of each phase's letter."""
_COMPUTE = np.array([part not in ("communication", "bubble") for part in PARTS])
"""The parts of a rank's compute time (its step less communication and bubble)."""
_PART_OF_LEVEL = np.array([[float(label == part) for part in PARTS] for label in _LABELS])
"""Level -> part, as a matrix: a row's seconds by level, times it, are its seconds by part."""
_LEVEL_OF_LETTER = np.full(256, -1, dtype=np.int64)
_LEVEL_OF_LETTER[[ord(letter) for letter in _PHASE_LEVEL]] = list(_PHASE_LEVEL.values())
"""A phase letter's level by its byte (-1: not a phase of the rules)."""

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


@dataclass(frozen=True, slots=True)
class StepCells:
    """Many rank-steps and what covered them, as columns (a closed step's ranks at once): rank-step ``i`` is
    [``start_ns[i]``, ``end_ns[i]``]; interval ``j`` covers [``from_ns[j]``, ``to_ns[j]``) of rank-step
    ``cell[j]`` at precedence ``level[j]`` (an index of the rules' list, lowest first)."""

    start_ns: npt.NDArray[np.int64]
    end_ns: npt.NDArray[np.int64]
    cell: npt.NDArray[np.int64]
    from_ns: npt.NDArray[np.int64]
    to_ns: npt.NDArray[np.int64]
    level: npt.NDArray[np.int64]

    @classmethod
    def of(cls, steps: Sequence[RankStep]) -> StepCells:
        """The columns of ``steps`` (one rank-step each), by the module's rules."""
        rows = [(index, *interval) for index, step in enumerate(steps) for interval in rank_intervals(step)]
        cell, from_ns, to_ns, level = np.array(rows, dtype=np.int64).reshape(-1, 4).T
        start = np.array([step.start_ns for step in steps], dtype=np.int64)
        end = np.array([step.end_ns for step in steps], dtype=np.int64)
        return cls(start, end, cell, from_ns, to_ns, level)


def step_cells(spans: StepSpans, ranks: Sequence[int], waits: Waits) -> StepCells:
    """A closed step's cells, cell ``i`` being ``ranks[i]``'s (each measured its phases: ``spans.windows``),
    with ``waits``, the exposed intervals of the step's operations, by the module's rules."""
    count = len(ranks)
    cell_of = np.full(max(max(ranks), int(waits.rank.max(initial=0))) + 1, -1, dtype=np.int64)
    cell_of[np.asarray(ranks)] = np.arange(count)
    wait_cell = cell_of[waits.rank]
    known = wait_cell >= 0
    wait_cell, pipeline = wait_cell[known], waits.pipeline[known]
    ran_p2p = np.zeros(count, dtype=bool)
    ran_p2p[wait_cell[pipeline]] = True
    rows = spans.rows(ranks)
    start = np.asarray(spans.start_ns, dtype=np.int64)[rows]
    end = np.asarray(spans.end_ns, dtype=np.int64)[rows]
    forward_backward = np.array([spans.forward_backward_s[row] for row in rows], dtype=np.float64)  # None: NaN
    windows = [spans.windows[rank] for rank in ranks]
    wait = np.array([found.pipeline_wait_s for found in windows], dtype=np.float64)
    pipelined = ~np.isnan(wait) & ((wait > 0) | ran_p2p)
    scheduled = np.flatnonzero(pipelined & ~np.isnan(forward_backward))
    planned = np.stack(
        [scheduled, start[scheduled], start[scheduled] + (forward_backward[scheduled] * 1e9).astype(np.int64)], axis=1
    )
    whole = [  # else torn: no phases
        index for index, found in enumerate(windows) if len(found.phases) == len(found.start_ns) == len(found.end_ns)
    ]
    letters = [windows[index].phases for index in whole]
    phased, counts = np.array(whole, dtype=np.int64), [len(letter) for letter in letters]
    phase_start = [np.asarray(windows[index].start_ns, dtype=np.int64) for index in whole]  # a fold's: views
    phase_end = [np.asarray(windows[index].end_ns, dtype=np.int64) for index in whole]
    phase_level = _LEVEL_OF_LETTER[np.frombuffer("".join(letters).encode("ascii", "replace"), dtype=np.uint8)]
    phase_cell = np.repeat(phased, counts)
    is_phase = phase_level >= 0
    wait_level = np.where(pipeline & pipelined[wait_cell], P2P, COMM)
    phase_from, phase_to = (np.concatenate([np.empty(0, dtype=np.int64), *parts]) for parts in (phase_start, phase_end))
    columns = [
        (wait_cell, waits.start_ns[known], waits.end_ns[known], wait_level),
        tuple(column[is_phase] for column in (phase_cell, phase_from, phase_to, phase_level)),
        (planned[:, 0], planned[:, 1], planned[:, 2], np.full(len(planned), SCHEDULE)),
    ]
    cell, from_ns, to_ns, level = (np.concatenate(parts) for parts in zip(*columns, strict=True))
    return StepCells(start, end, cell, from_ns, to_ns, level)


def rank_intervals(step: RankStep) -> list[tuple[int, int, int]]:
    """Every interval of one rank-step with its precedence level."""
    intervals: list[tuple[int, int, int]] = [(s, e, COMM) for s, e in step.communication]
    intervals += [(s, e, P2P) for s, e in step.pipeline_waits]
    for kind, s, e in zip(step.phases, step.phase_start_ns, step.phase_end_ns, strict=True):
        if (level := _PHASE_LEVEL.get(kind)) is not None:
            intervals.append((s, e, level))
    if step.schedule_end_ns is not None:
        intervals.append((step.start_ns, step.schedule_end_ns, SCHEDULE))
    return intervals


def cells_parts(cells: StepCells) -> npt.NDArray[np.float64]:
    """Seconds of each of :data:`PARTS` (columns) in each rank-step of ``cells`` (rows), by the module's rules:
    they add up to each step's length (none for a step that ends before it starts).

    The rank-steps are laid end to end on one line (each 1 ns past the last one's end) so that one sort of
    every interval's ends cuts them all into segments; per level, a segment is covered when more intervals of
    that level opened before it than closed, and takes the lowest level covering it."""
    steps = len(cells.start_ns)
    length = np.maximum(cells.end_ns - cells.start_ns, 0)
    base = np.cumsum(length + 1) - (length + 1)
    shift = base - cells.start_ns
    begin = np.maximum(cells.from_ns, cells.start_ns[cells.cell])
    finish = np.minimum(cells.to_ns, cells.end_ns[cells.cell])
    kept = finish > begin
    cell, level = cells.cell[kept], cells.level[kept]
    begin, finish = begin[kept] + shift[cell], finish[kept] + shift[cell]
    cuts = np.sort(np.concatenate([base, base + length, begin, finish]))
    cuts = cuts[np.r_[True, cuts[1:] != cuts[:-1]]]  # np.unique, without its hashing (3 times the time here)
    owner = np.searchsorted(base, cuts[:-1], side="right") - 1
    inside = cuts[1:] <= (base + length)[owner]  # not the 1 ns between one rank-step and the next
    opened, closed = np.searchsorted(cuts, begin), np.searchsorted(cuts, finish)
    best = np.full(len(cuts) - 1, OTHER, dtype=np.int64)
    for lvl in np.flatnonzero(np.bincount(level)).tolist():  # lowest first: a segment keeps the first level
        at = level == lvl
        depth = np.cumsum(np.bincount(opened[at], minlength=len(cuts)) - np.bincount(closed[at], minlength=len(cuts)))
        best[(depth[:-1] > 0) & (best == OTHER)] = lvl
    totals = np.bincount(
        owner[inside] * len(_LABELS) + best[inside], weights=np.diff(cuts)[inside], minlength=steps * len(_LABELS)
    ).reshape(steps, len(_LABELS))
    return totals @ _PART_OF_LEVEL / 1e9


def step_parts(step: RankStep) -> dict[str, float]:
    """Seconds of each of :data:`PARTS` in ``step``, by the module's rules (they add up to its length)."""
    return dict(zip(PARTS, cells_parts(StepCells.of([step]))[0].tolist(), strict=True))


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
    """Each rank's step parts, summed as steps close (a column a part, a row a rank: a closed step's ranks are
    added at once)."""

    def __init__(self) -> None:
        self._sums = np.zeros((0, len(PARTS)))
        self._step_s = np.zeros(0)
        self._steps = np.zeros(0, dtype=np.int64)
        self.per_step: dict[str, Distribution] = {part: Distribution() for part in PARTS}
        """Per closed step: each part's mean over the step's ranks (seconds)."""
        self._recent: dict[str, deque[float]] = {part: deque(maxlen=HISTORY) for part in PARTS}
        self._slowest = np.zeros(0, dtype=np.int64)
        self._stage_steps = np.zeros(0, dtype=np.int64)
        """Per rank: the closed steps of its stage that had two or more ranks' parts."""

    def add_step(self, ranks: Sequence[int], parts: npt.NDArray[np.float64], stages: Sequence[int]) -> None:
        """One closed step's parts (a row each of ``ranks``, as :meth:`add_cells` gave them; ``stages``: each
        one's pipeline stage): per stage of two or more ranks, the rank with the most compute time (its step
        less communication and bubble; of two alike, the higher rank) was the slowest."""
        if not len(ranks):
            return
        for part, mean in zip(PARTS, parts.mean(axis=0).tolist(), strict=True):
            self.per_step[part].add(mean)
            self._recent[part].append(mean)
        rank, stage = np.asarray(ranks, dtype=np.int64), np.asarray(stages, dtype=np.int64)
        self._grow(int(rank.max()) + 1)
        compute = parts[:, _COMPUTE].sum(axis=1)
        order = np.lexsort((rank, compute, stage))  # by stage, the slowest (then the highest rank) last
        stage, rank = stage[order], rank[order]
        change = stage[1:] != stage[:-1]
        last, first = np.r_[change, True], np.r_[True, change]
        size = np.diff(np.r_[np.flatnonzero(first), len(stage)])
        shared = np.repeat(size >= 2, size)  # each rank: its stage has two ranks or more
        np.add.at(self._slowest, rank[last & shared], 1)
        self._stage_steps[rank[shared]] += 1

    def add(self, rank: int, step: RankStep) -> dict[str, float]:
        """One rank-step's parts, summed in."""
        return dict(zip(PARTS, self.add_cells([rank], StepCells.of([step]))[0].tolist(), strict=True))

    def add_cells(self, ranks: Sequence[int], cells: StepCells) -> npt.NDArray[np.float64]:
        """Rank-steps' parts (``ranks[i]``'s is the cell ``i``: a closed step's ranks, each once), summed in;
        a row of parts each, in the order of :data:`PARTS`."""
        parts = cells_parts(cells)
        rank = np.asarray(ranks, dtype=np.int64)
        self._grow(int(rank.max(initial=-1)) + 1)
        self._sums[rank] += parts
        self._step_s[rank] += (cells.end_ns - cells.start_ns) / 1e9
        self._steps[rank] += 1
        return parts

    def _grow(self, ranks: int) -> None:
        """Room for ranks below ``ranks``."""
        more = ranks - len(self._steps)
        if more > 0:
            self._sums = np.vstack([self._sums, np.zeros((more, len(PARTS)))])
            self._step_s, self._steps = np.r_[self._step_s, np.zeros(more)], np.r_[self._steps, np.zeros(more, int)]
            self._slowest = np.r_[self._slowest, np.zeros(more, dtype=np.int64)]
            self._stage_steps = np.r_[self._stage_steps, np.zeros(more, dtype=np.int64)]

    def figures(self) -> Breakdown:
        def rows(sums: np.ndarray, step_s: float, steps: int) -> dict[str, dict[str, float]]:
            return {
                part: {"s_per_step": float(total) / steps, "share": float(total) / step_s if step_s > 0 else 0.0}
                for part, total in zip(PARTS, sums.tolist(), strict=True)
            }

        seen = np.flatnonzero(self._steps).tolist()
        per_rank = {rank: rows(self._sums[rank], float(self._step_s[rank]), int(self._steps[rank])) for rank in seen}
        steps = int(self._steps.sum())
        parts = rows(self._sums.sum(axis=0), float(self._step_s.sum()), steps) if steps else {}
        shared = np.flatnonzero(self._stage_steps)
        slowest = dict(zip(shared.tolist(), (self._slowest[shared] / self._stage_steps[shared]).tolist(), strict=True))
        history = {part: tuple(values) for part, values in self._recent.items()}
        return Breakdown(parts=parts, per_rank=per_rank, steps=steps, slowest_in=slowest, history=history)
