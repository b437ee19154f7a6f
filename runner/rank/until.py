"""A training run with no fixed number of steps: every rank ends it after the same step.

``meshtop run`` without ``--steps`` trains until the user presses q, :data:`meshtop.runner.plan.WATCH_LIMIT_S` at
most. The ranks must agree on the last step: one that left early would leave the others waiting in a
collective for it. So one rank decides and the store carries the decision:

- rank 0 alone looks for the request (the file :data:`STOP_ENV` names, which the launcher's session
  writes on q) and at the clock; at the end of its step S, before it begins S + 1, it puts
  ``S + MARGIN_STEPS`` in torchrun's store;
- every rank, at the end of every step, reads that key (one round trip to the store) and ends the run
  after the step it names.

Why every rank sees the key in time: a rank finishes step j only once each rank it exchanges with in
step j began step j (an all-reduce needs the whole group, and each pipeline link carries data both
ways every step), that is, finished step j - 1. Every rank reaches rank 0 in at most one hop per mesh
dim (pp, dp, tp), so finishing step S + 3 needs rank 0 to have begun S + 1: by then the key was
written, and every rank reads it at the end of S + 3 at the latest.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the launcher imports this module without torch
    import torch.distributed as dist

    from meshtop.probes.arrivals import Arrivals

STOP_ENV = "MESHTOP_STOP_FILE"
"""The file whose existence asks a run until stopped to end (set by
:func:`meshtop.runner.job.environment.builtin_launch`)."""
STOP_NAME = "stop"
"""Its name in the session folder."""
FINISH_GRACE_S = 20.0
"""How long the ranks may take to end a run asked to end, beyond its last steps (at the longest step time
seen), before the job is stopped instead."""
MARGIN_STEPS = 3
"""One step per mesh dim: see above."""
KEY = "meshtop/last-step"


class RunUntilStopped:
    """Whether a rank's run until stopped ends after a step: the same step on every rank."""

    def __init__(self, *, rank: int, time_limit_s: float, store: dist.Store, stop_file: Path | None) -> None:
        self.rank = rank
        self.deadline = time.monotonic() + time_limit_s
        self.store = store
        self.stop_file = stop_file
        self._asked = False
        self.last_step: int | None = None

    @classmethod
    def for_this_rank(cls, rank: int, time_limit_s: float) -> RunUntilStopped:
        """Under torchrun: its store (a client of the agent's, at ``MASTER_ADDR:MASTER_PORT``), one key per
        start of the ranks."""
        import torch.distributed as dist

        store = dist.TCPStore(
            os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False, wait_for_workers=False
        )
        start = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
        stop_file = os.environ.get(STOP_ENV)
        return cls(
            rank=rank,
            time_limit_s=time_limit_s,
            store=dist.PrefixStore(f"meshtop-{start}", store),
            stop_file=Path(stop_file) if stop_file else None,
        )

    def ends_after(self, step: int) -> bool:
        """Called at the end of each step: whether the run ends with it."""
        if (
            self.rank == 0
            and not self._asked
            and (time.monotonic() >= self.deadline or (self.stop_file is not None and self.stop_file.exists()))
        ):
            self.store.set(KEY, str(step + MARGIN_STEPS))
            self._asked = True
        if self.last_step is None and self.store.check([KEY]):
            self.last_step = int(self.store.get(KEY))
        return self.last_step is not None and step >= self.last_step


class FinishRequest:
    """The head's side: it asks the ranks to end a run until stopped, and stops them if they do not.

    Asked before any step, or for a run with a fixed length (no stop file), the job is stopped at once: the
    user wants out, and nothing would end it sooner.
    """

    def __init__(self, stop_file: Path | None) -> None:
        self.stop_file = stop_file
        self.stepped = False
        self.longest_step_s = 0.0
        self.deadline: float | None = None

    def observe(self, arrivals: Arrivals) -> None:
        if self.stop_file is None:  # nothing to time: a request stops the job at once
            return
        for step in arrivals.events(("step",)):
            self.stepped = True
            self.longest_step_s = max(self.longest_step_s, step.duration_s)  # type: ignore[attr-defined]

    def stop_now(self) -> bool:
        """Once asked (called at each delivery from then on): whether to stop the job as a stop request does."""
        if self.deadline is None:
            if self.stop_file is None or not self.stepped:
                return True
            self.stop_file.touch()
            self.deadline = time.monotonic() + FINISH_GRACE_S + (MARGIN_STEPS + 1) * self.longest_step_s
        return time.monotonic() > self.deadline
