"""Faults injected on purpose, so tests can prove how meshtop handles a dying rank.

``MESHTOP_FAULT=KIND:RANK:STEP`` makes rank RANK, just before step STEP,
``raise`` a RuntimeError, ``oom`` (raise the out-of-memory error the CUDA
allocator raises), ``kill`` itself with SIGKILL, or ``hang`` (sleep forever,
so its peers block in their next collective). Unset, it costs one dictionary
lookup at start-up.
"""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass

from meshtop.probes.errors import MeshtopError

FAULT_ENV = "MESHTOP_FAULT"
KINDS = ("raise", "oom", "kill", "hang")


class FaultSpecError(MeshtopError):
    """``MESHTOP_FAULT`` is not of the form KIND:RANK:STEP."""


class InjectedFault(RuntimeError):
    """The error a ``raise`` fault raises inside a worker."""


@dataclass(frozen=True, slots=True)
class Fault:
    kind: str
    rank: int
    step: int

    def maybe_fire(self, *, rank: int, step: int) -> None:
        """Fire if this is the rank and step the fault names."""
        if (rank, step) != (self.rank, self.step):
            return
        if self.kind == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        if self.kind == "hang":
            while True:
                time.sleep(3600)
        if self.kind == "oom":
            import torch

            raise torch.OutOfMemoryError(
                f"CUDA out of memory. Tried to allocate 2.00 GiB (fault injected by {FAULT_ENV} on rank {rank} "
                f"at step {step})"
            )
        raise InjectedFault(f"fault injected by {FAULT_ENV} on rank {rank} at step {step}")


def fault_from_env(environ: dict[str, str] | None = None) -> Fault | None:
    """The fault the environment asks for, if any."""
    text = (environ if environ is not None else os.environ).get(FAULT_ENV)
    if not text:
        return None
    parts = text.split(":")
    if len(parts) != 3 or parts[0] not in KINDS or not parts[1].isdigit() or not parts[2].isdigit():
        raise FaultSpecError(f"{FAULT_ENV}={text!r}: expected KIND:RANK:STEP with KIND one of {', '.join(KINDS)}")
    return Fault(parts[0], int(parts[1]), int(parts[2]))
