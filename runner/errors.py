"""The runner's errors: a run that cannot be launched as asked.

Both are :class:`meshtop.probes.errors.MeshtopError` subclasses (one line on stderr, exit code 2). They
live apart from the modules that raise them so the plan (:mod:`meshtop.runner.plan`) and the reader of a
model's config (:mod:`meshtop.runner.model_config`) can each import them without importing the other.
"""

from __future__ import annotations

from meshtop.probes.errors import MeshtopError


class PlanError(MeshtopError):
    """The asked-for run cannot be launched; the message names the fix."""


class ModelConfigError(PlanError):
    """A ``--model-config`` file meshtop cannot read or build; the message names the file and the fix."""
