"""``meshtop run`` that can be left: d in the dashboard gives the shell its prompt back and lets the job go on,
headless and recorded, as ``record`` would run it; ``meshtop watch`` comes back to it.

A shell waits for the process it started, and only that process's exit gives the prompt back; the job's
session (its threads, its launcher child) cannot move to another process. So a recorded ``run`` forks once,
at its start, before it has a thread: the child is meshtop as it always was, and the parent only waits
for it (:func:`detachable`). At its end the parent exits with the child's exit code; when the child
detaches, it tells the parent, which exits 0 at once, and the child leaves the terminal's session
(:meth:`Detacher.detach`). Signals meant for meshtop reach the child: SIGTERM and SIGUSR1 sent to the
parent (the pid the shell knows) are passed on; SIGINT and SIGHUP come from the terminal to both, and the
parent leaves them to the child.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from pathlib import Path
from types import FrameType
from typing import NoReturn

CONSOLE_LOG = "console.log"
"""In a detached run's recording: what ``record`` would have printed from the moment it was detached."""


class Detacher:
    """The child's end of the fork: how it lets its waiting parent go."""

    def __init__(self, fd: int) -> None:
        self._fd = fd

    def detach(self, log: Path) -> None:
        """Let the parent exit (the shell's prompt comes back), leave the terminal's session (its hangup is no
        longer this process's), and write from now on into ``log``, the terminal's input closed."""
        sys.stdout.flush()
        sys.stderr.flush()
        os.write(self._fd, b"d")
        os.close(self._fd)
        os.setsid()
        out = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        nowhere = os.open(os.devnull, os.O_RDONLY)
        os.dup2(nowhere, 0)
        os.dup2(out, 1)
        os.dup2(out, 2)
        os.close(out)
        os.close(nowhere)


def detachable() -> Detacher:
    """Fork: in the child, the :class:`Detacher` it detaches with; the parent never returns (it waits, then
    exits as the child did, or 0 once the child detached)."""
    sys.stdout.flush()  # nothing written before is written twice
    sys.stderr.flush()
    read_end, write_end = os.pipe()
    child = os.fork()
    if child == 0:
        os.close(read_end)
        return Detacher(write_end)
    os.close(write_end)
    _wait(child, read_end)


def _wait(child: int, fd: int) -> NoReturn:
    def pass_on(signum: int, frame: FrameType | None) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(child, signum)

    for passed in (signal.SIGTERM, signal.SIGUSR1):
        signal.signal(passed, pass_on)
    for left in (signal.SIGINT, signal.SIGHUP):
        signal.signal(left, signal.SIG_IGN)
    try:
        said = os.read(fd, 1)  # the child's word, or nothing once it has ended
    except OSError:
        said = b""
    if said == b"d":
        os._exit(0)
    _, status = os.waitpid(child, 0)
    code = os.waitstatus_to_exitcode(status)
    os._exit(code if code >= 0 else 128 - code)
