"""Hang detection: no rank made progress for a while, so say where each rank is.

Progress is a step or a collective completing on any rank. Each rank's
heartbeat (:class:`RankProgress`, four a second from its shipper thread, which
keeps running while the training thread is blocked) says which step it is in
and the oldest collective it has issued and not seen complete. In a hang the
ranks that wait show the collective and group they wait in; the rank that
does not is the one to look at.
"""

from __future__ import annotations

import statistics
import time
from collections import deque
from collections.abc import Callable, Iterable

from meshtop.probes.arrivals import Arrivals
from meshtop.probes.events import (
    HangDetected,
    RankProgress,
    StepTiming,
)

STARTUP_TIMEOUT_S = 600.0
"""Before the first step: building the model, joining the group, first compilations."""
STARTUP_MIN_S = 60.0
"""A timeout the user gives applies from the first step; before it, at least this."""
MIN_TIMEOUT_S = 30.0
STEP_MULTIPLE = 20.0
"""After the first step the default timeout is this many median steps (at least MIN_TIMEOUT_S)."""
REPEAT_S = 60.0
"""A hang that goes on is reported again after max(timeout, this)."""
SILENT_HEARTBEAT_S = 3.0
"""A rank whose heartbeat is older than this is frozen, stopped, or gone."""


def default_timeout_s(step_times_s: Iterable[float]) -> float:
    """The hang timeout when the user gives none: generous at start, then a multiple of the median step."""
    times = list(step_times_s)
    if not times:
        return STARTUP_TIMEOUT_S
    return max(MIN_TIMEOUT_S, STEP_MULTIPLE * statistics.median(times))


class HangWatch:
    """Folds the job's events; :meth:`check` says when no rank has made progress for the timeout."""

    def __init__(
        self,
        world_size: int,
        *,
        timeout_s: float | None = None,
        quiet_s: float = 0.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.world_size = world_size
        self.fixed_timeout_s = timeout_s
        self.quiet_s = quiet_s
        """The longest quiet time the job's work allows (an inference load's longest gap between
        arrivals): the default timeout is never shorter than twice it."""
        self._clock = clock
        self._last_progress = clock()
        self._reported_at: float | None = None
        self._step_times: deque[float] = deque(maxlen=50)
        """Rank 0's last step times: the timeout's input, not a figure anyone is shown (the job step's figures
        are the metrics core's, the slowest rank's). It follows the job's recent pace, where the run's median
        would lag a job that slowed down, and the supervision has it with no fold at hand."""
        self._heartbeats: dict[int, tuple[RankProgress, float]] = {}

    def ranks_started(self, world_size: int, *, restart: int) -> None:
        """The job's ranks started, ``world_size`` of them, after ``restart`` restarts: a restart begins
        afresh, on the startup timeout (its ranks load and join again) and with no heartbeat yet."""
        self.world_size = world_size
        if restart:
            self._last_progress, self._reported_at = self._clock(), None
            self._step_times.clear()
            self._heartbeats.clear()

    @property
    def timeout_s(self) -> float:
        if self.fixed_timeout_s is None:
            return max(default_timeout_s(self._step_times), 2 * self.quiet_s)
        return self.fixed_timeout_s if self._step_times else max(self.fixed_timeout_s, STARTUP_MIN_S)

    def observe(self, arrivals: Arrivals) -> None:
        """Fold what arrived: heartbeats and steps decoded; collectives only count as progress, so they
        are not decoded."""
        now = self._clock()
        if arrivals.has("collective"):
            self._last_progress, self._reported_at = now, None
        for event in arrivals.events(("rank_progress", "step")):
            if isinstance(event, RankProgress):
                self._heartbeats[event.rank] = (event, now)
            elif isinstance(event, StepTiming):
                self._last_progress, self._reported_at = now, None
                if event.rank == 0:
                    self._step_times.append(event.duration_s)

    @property
    def reported(self) -> bool:
        """A hang was reported and no progress has been seen since."""
        return self._reported_at is not None

    def check(self) -> HangDetected | None:
        """A report once the job has been silent for the timeout (then again only after another timeout)."""
        now = self._clock()
        silent = now - self._last_progress
        since = now - self._reported_at if self._reported_at is not None else silent
        if silent < self.timeout_s or (self._reported_at is not None and since < max(self.timeout_s, REPEAT_S)):
            return None
        self._reported_at = now
        return HangDetected(
            wall_ns=time.time_ns(),
            timeout_s=self.timeout_s,
            silent_s=round(silent, 1),
            report="\n".join(self.report_lines()),
        )

    def report_lines(self) -> list[str]:
        """A verdict line, then one line per rank."""
        now, now_ns = self._clock(), time.time_ns()
        waiting, outside, silent, lines = [], [], [], []
        for rank in range(self.world_size):
            seen = self._heartbeats.get(rank)
            if seen is None:
                silent.append(rank)
                lines.append(f"rank {rank}: no heartbeat received (not started, or hooks unreachable)")
                continue
            beat, at = seen
            where = f"step {beat.step + 1}" if beat.step is not None else "between steps"
            if now - at > SILENT_HEARTBEAT_S:
                silent.append(rank)
                lines.append(f"rank {rank}: silent for {now - at:.0f} s (frozen, stopped or gone; last in {where})")
            elif beat.in_flight and beat.oldest_op is not None and beat.oldest_start_ns is not None:
                waiting.append(rank)
                peer = f" with rank {beat.oldest_peer}" if beat.oldest_peer is not None else ""
                lines.append(
                    f"rank {rank}: inside {beat.oldest_op}{peer} on {beat.oldest_group} for "
                    f"{(now_ns - beat.oldest_start_ns) / 1e9:.0f} s ({where})"
                )
            else:
                outside.append(rank)
                lines.append(f"rank {rank}: not in a collective ({where})")
        verdict = []
        if waiting:
            verdict.append(f"{_ranks(waiting)} {'waits' if len(waiting) == 1 else 'wait'} in a collective")
        if outside:
            verdict.append(f"{_ranks(outside)} {'is' if len(outside) == 1 else 'are'} not in one: look there first")
        if silent:
            verdict.append(f"{_ranks(silent)} sent no heartbeat")
        return ["; ".join(verdict), *lines]


def _ranks(ranks: list[int]) -> str:
    return f"rank {ranks[0]}" if len(ranks) == 1 else "ranks " + ", ".join(str(r) for r in ranks)
