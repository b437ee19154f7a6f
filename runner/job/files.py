"""The files a launched job's session folder holds, by name, and the launcher's status file as a type: written by
the launcher process (:mod:`meshtop.runner.job.agent`), read by meshtop's side (:mod:`meshtop.runner.job.process`,
the live dashboard). It imports only how a job ended (:mod:`meshtop.runner.results`): the launcher's child imports
it without the supervision machinery."""

from __future__ import annotations

from dataclasses import dataclass, field

from meshtop.runner.results import RankFailure

PHASE_NAME = "phase.txt"
"""Beside ``status.json``: what the launcher does before the ranks report, in words (the dashboard shows it
while it waits)."""
STATUS_NAME = "status.json"
"""The launcher's report of how the ranks ended (:class:`LauncherStatus`)."""
LAUNCHER_LOG = "launcher.log"
"""The launcher's (and torchrun's) stdout and stderr."""
TORCHELASTIC_NAME = ".torchelastic"
"""torchrun's log folder (the ranks' error files), in the session folder: left to itself, torchrun makes one in
the system's temporary folder for every run and never removes it. Removed as the job ends, by the launcher
or, if it was killed, by meshtop."""


@dataclass(frozen=True, slots=True, kw_only=True)
class LauncherStatus:
    """:data:`STATUS_NAME`: how the launcher's ranks ended, written however the job ends."""

    status: str
    """``completed``, ``failed`` or ``interrupted``."""
    ranks: dict[str, RankFailure] = field(default_factory=dict)
    """Each failed rank's failure, by its rank (a JSON object's keys are strings)."""
    signal: str | None = None
    """The signal that interrupted the launcher; left out of the file where none did."""
