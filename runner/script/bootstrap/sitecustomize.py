"""meshtop's bootstrap: attach meshtop's probes to a rank of a user's script before the script runs.

meshtop puts this folder first on the ``PYTHONPATH`` of a script it launches
(:func:`meshtop.runner.session.session.script_launch`), so every Python process of the job
imports this module at start-up. It does nothing but hand over to the user's
own ``sitecustomize`` (there may be one further down the path, and it must
still run) unless :data:`meshtop.runner.script.command.ATTACH_ENV` is set and the process is a
rank torchrun started (``RANK`` set) that no parent attached: torchrun's
launcher, and processes the ranks start themselves (data loader workers,
compile workers), which inherit the environment, are left alone. Nothing is
written into the user's project or environment.
"""

from __future__ import annotations

import os
import sys
import traceback
from importlib.machinery import PathFinder
from importlib.util import module_from_spec

ATTACHED_ENV = "MESHTOP_ATTACHED_PID"
"""The pid of the process meshtop attached to: its children inherit it and so know not to attach again."""


def run_users_sitecustomize() -> None:
    """Import the ``sitecustomize`` that this one hides, if there is one, as Python would have."""
    here = os.path.dirname(os.path.realpath(__file__))
    path = [entry for entry in sys.path if os.path.realpath(entry or os.curdir) != here]  # this folder by any name
    spec = PathFinder.find_spec("sitecustomize", path)
    if spec is None or spec.loader is None:
        return
    module = module_from_spec(spec)
    ours = sys.modules["sitecustomize"]
    sys.modules["sitecustomize"] = module
    try:
        spec.loader.exec_module(module)
    except Exception:  # as site.py does: say so, and start anyway
        sys.modules["sitecustomize"] = ours
        print(f"Error in sitecustomize ({spec.origin}):", file=sys.stderr)
        traceback.print_exc()


def should_attach() -> bool:
    """Whether this process is a rank to attach to. ``MESHTOP_ATTACH`` is
    :data:`meshtop.runner.script.command.ATTACH_ENV`,
    spelled out: this module runs in every Python process of the job and imports nothing of meshtop's
    until it attaches."""
    return (
        os.environ.get("MESHTOP_ATTACH") == "1"
        and "RANK" in os.environ
        and os.environ.get(ATTACHED_ENV) in (None, str(os.getpid()))
    )


def attach_or_say_why() -> None:
    os.environ[ATTACHED_ENV] = str(os.getpid())
    try:
        from meshtop.runner.script.attach import attach

        attach()
    except Exception as error:  # the script runs on unwatched: a probe never stops the job it measures
        print(
            f"meshtop: could not attach to rank {os.environ['RANK']}: {type(error).__name__}: {error}", file=sys.stderr
        )


run_users_sitecustomize()
if should_attach():
    attach_or_say_why()
