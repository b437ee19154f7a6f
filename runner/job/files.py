"""The files a launched job's session folder holds, by name: written by the launcher process
(:mod:`meshtop.runner.job.agent`), read by meshtop's side (:mod:`meshtop.runner.job.process`, the live
dashboard). A leaf module: the launcher's child imports it without the supervision machinery."""

from __future__ import annotations

PHASE_NAME = "phase.txt"
"""Beside ``status.json``: what the launcher does before the ranks report, in words (the dashboard shows it
while it waits)."""
STATUS_NAME = "status.json"
"""The launcher's report of how the ranks ended."""
LAUNCHER_LOG = "launcher.log"
"""The launcher's (and torchrun's) stdout and stderr."""
TORCHELASTIC_NAME = ".torchelastic"
"""torchrun's log folder (the ranks' error files), in the session folder: left to itself, torchrun makes one in
the system's temporary folder for every run and never removes it. Removed as the job ends, by the launcher
or, if it was killed, by meshtop."""
