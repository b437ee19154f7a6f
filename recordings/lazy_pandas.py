"""pandas, imported on first use, and never left half-imported by an interrupt.

meshtop's own process imports pandas only where a figure or a frame first asks for it: the import costs a
process 0.45 s, which ``meshtop record`` and ``run`` would otherwise spend before launching the ranks. That
first use can fall inside a job, where Ctrl-C or SIGTERM raises ``KeyboardInterrupt`` in the main thread. An
import it cuts short removes the ``pandas`` package from ``sys.modules`` but keeps the C modules already
loaded, and those look their capsules up on the package: every later import then fails ("partially
initialized module 'pandas' has no attribute '_pandas_datetime_CAPI'"), the one that finishes the recording
included (a CI soak's SIGTERM found it).

Python raises a signal's exception only in the main thread, so the main thread has another thread import
pandas and waits for it: an interrupt ends the wait, not the import, and the next use finds pandas whole (or
waits on the import's own lock until it is).
"""

from __future__ import annotations

import contextlib
import importlib
import sys
import threading
from types import ModuleType


def pandas() -> ModuleType:
    """The ``pandas`` module, imported whole (see the module's docstring)."""
    loaded = sys.modules.get("pandas")
    if loaded is not None and not getattr(getattr(loaded, "__spec__", None), "_initializing", False):
        return loaded
    if threading.current_thread() is threading.main_thread():
        importer = threading.Thread(target=_import, name="meshtop-import-pandas", daemon=True)
        importer.start()
        importer.join()
    return importlib.import_module("pandas")  # the import's own error, where it failed, is raised here


def _import() -> None:
    with contextlib.suppress(Exception):  # raised again, with its traceback, by the caller's own import
        importlib.import_module("pandas")
