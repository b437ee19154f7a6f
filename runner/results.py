"""How a job ended: each rank's exit (the manifest's :class:`RankExit`, recorded as it is), the job's result,
and which rank's failure brought it down.

The launcher of this node (:mod:`meshtop.runner.job.process`) and the head's view of the other nodes
(:mod:`meshtop.runner.multinode.fleet`) both build these, so they live below both.
"""

from __future__ import annotations

import math
import re
import time
from dataclasses import dataclass, field
from pathlib import Path

from meshtop.probes.events import Event, JobEnded, RankExited
from meshtop.recordings.manifest import RankExit


@dataclass(frozen=True, slots=True, kw_only=True)
class JobResult:
    """How the whole job ended."""

    status: str
    """``completed``, ``failed`` or ``interrupted``."""
    ranks: tuple[RankExit, ...]
    duration_s: float
    log_path: Path

    root_cause: int | None = None
    """The rank whose failure brought the job down, when one did."""
    hang: str | None = None
    """The hang report, when meshtop stopped the job because no rank made progress."""
    node_lost: str | None = None
    """Which node of a multi-node job was lost, its ranks and why, when that ended the job."""
    node_failed: str | None = None
    """Which node of a multi-node job failed with no rank of its own to blame (its launcher died), and why."""
    failure: str | None = None
    """Why a job with no rank to blame failed (a served load: its failed requests by kind)."""
    failure_times: dict[int, float] = field(default_factory=dict)
    """When each failed rank failed (torchrun's timestamp, seconds), to find the first across nodes."""

    @property
    def failed(self) -> tuple[RankExit, ...]:
        """Ranks that did not exit 0 by themselves (the root cause first)."""
        failed = [r for r in self.ranks if r.exit_code not in (0, None)]
        return tuple(sorted(failed, key=lambda r: (r.rank != self.root_cause, r.rank)))


@dataclass(frozen=True, slots=True, kw_only=True)
class RankFailure:
    """How one rank failed, as its launcher's ``status.json`` says (:mod:`meshtop.runner.job.agent`, from
    torchrun's failure), or the head knows of another node's rank (:mod:`meshtop.runner.multinode.fleet`)."""

    exit_code: int | None
    """The process's exit code (negative for a signal)."""
    signal: str | None
    error: str | None
    """The rank's one-line error, where it left one."""
    timestamp: float | None
    """When it failed (torchrun's timestamp, seconds; on many nodes, on the head's clock)."""


OWN_DEATHS = frozenset({"SIGKILL", "SIGSEGV", "SIGBUS", "SIGILL", "SIGFPE"})
"""Signals that end a rank from outside or for its own fault, never because a peer failed (SIGABRT can: an
uncaught error of a communication thread aborts the process)."""
PEER_GONE = re.compile(
    r"(closed|reset) by peer|broken pipe|remote process exited|communicator was aborted|"
    r"caused by a remote worker",
    re.IGNORECASE,
)
"""What gloo and nccl raise in a rank whose peer went away: the effect of another rank's failure (gloo's
transport errors end in "This is typically caused by a remote worker crashing", or "hanging")."""
SIGNALLED = re.compile(r"^Signal \d+ \(\w+\) received by PID \d+")
"""torchrun's message for a rank a signal ended that left no error of its own (no error file)."""


def root_cause(failures: dict[int, RankFailure]) -> int | None:
    """The first rank to fail by itself; ranks the launcher then stopped with SIGTERM come last.

    torchrun's timestamps are whole seconds (compared as such: another node's carry a fraction, its clock
    offset), and each launcher notices a death in its own time, so within one job's failure the effects are
    told from the cause first: a rank killed from outside or by its own fault (:data:`OWN_DEATHS`) comes
    first, and a rank whose error says a peer went away (:data:`PEER_GONE`) comes after every other.

    A rank the launcher stopped had left no error file, unless it was already failing by itself: one whose own
    error (an out-of-memory, say) was written while it shut down, and whose peer's "connection closed" ended
    first, is the cause all the same."""

    def order(rank: int) -> tuple[bool, bool, bool, float, int]:
        failure = failures[rank]
        error = failure.error or ""
        died = failure.signal in OWN_DEATHS
        peer_gone = PEER_GONE.search(error) is not None
        own_error = bool(error) and not peer_gone and SIGNALLED.match(error) is None
        only_stopped = failure.signal == "SIGTERM" and not own_error
        return only_stopped, not died, peer_gone, math.floor(failure.timestamp or 0), rank

    return min(failures, key=order) if failures else None


def lifecycle_events(result: JobResult) -> list[Event]:
    """How each rank and the job ended, as events for the recording."""
    now = time.time_ns()
    events: list[Event] = [
        RankExited(rank=r.rank, wall_ns=now, exit_code=r.exit_code, signal=r.signal, error=r.error)
        for r in result.ranks
    ]
    events.append(
        JobEnded(wall_ns=now, status=result.status, duration_s=result.duration_s, root_cause_rank=result.root_cause)
    )
    return events
