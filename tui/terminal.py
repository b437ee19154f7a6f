"""The terminal the dashboard draws on, and what meshtop does when it goes away.

An SSH connection that drops, a closed window, a killed tmux session: the
kernel hangs the terminal up and sends SIGHUP, and from then on every read of
it returns end-of-file and every write fails. Textual does not survive that on
its own: its input thread reads end-of-file in a loop (a core at 100 %), its
output thread dies on the first failed write and the next writes then wait
forever for room in its queue, so the app can neither draw nor exit, and
SIGTERM no longer ends it.

:class:`TerminalGuard` is the one door to the terminal while the dashboard
runs. When the terminal is lost (SIGHUP, or a write that fails), it puts
``/dev/null`` in its place before anything else happens, for standard input,
output and error: no write fails or waits, and a read ends at once (a quiet
pipe would do for input, but Textual's input thread may have been told the
terminal is readable just before the swap, and would then wait on the pipe for
ever, keeping the process from exiting). The dashboard exits at once, which
stops its input thread, and the session goes on headless
(:func:`go_on_headless` below).
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TextIO

if TYPE_CHECKING:
    from meshtop.tui.sources import LiveSource


class TerminalGuard:
    """Watches the terminal for the dashboard; :meth:`lose` swaps it for a silent one, once."""

    def __init__(self) -> None:
        self.lost_at: float | None = None
        """``time.time()`` when the terminal was lost, if it was."""
        self.why: str | None = None
        self.on_lost: Callable[[], object] = lambda: None
        """Called, from whichever thread noticed, once the terminal is lost and replaced (the app sets it)."""
        self._lock = threading.Lock()
        self._real_stderr: Any = None

    @property
    def lost(self) -> bool:
        return self.lost_at is not None

    def note(self) -> str | None:
        """``2026-12-01T15:02:11+0000: SIGHUP``, for the manifest; ``None`` while the terminal is there."""
        if self.lost_at is None:
            return None
        return f"{time.strftime('%Y-%m-%dT%H:%M:%S%z', time.localtime(self.lost_at))}: {self.why}"

    def install(self) -> None:
        """Guard the output Textual writes to (``sys.__stderr__``, read when the app starts) and take SIGHUP
        (the app's event loop takes it over while it runs)."""
        self._real_stderr = sys.__stderr__
        sys.__stderr__ = GuardedOutput(sys.__stderr__, self)  # type: ignore[misc,assignment,arg-type]
        self.take_sighup()

    def uninstall(self) -> None:
        """The app has ended: its output is the real one again; SIGHUP stays taken (a terminal lost while the
        session closes, or goes on headless, is swapped the same way: nothing is printed to a dead one)."""
        if self._real_stderr is not None:
            sys.__stderr__ = self._real_stderr  # type: ignore[misc]
        self.take_sighup()

    def take_sighup(self) -> None:
        signal.signal(signal.SIGHUP, lambda signum, frame: self.lose("SIGHUP"))

    def lose(self, why: str) -> None:
        """The terminal is gone (``why``): put the silent one in its place and say so, once."""
        with self._lock:
            if self.lost_at is not None:
                return
            self.lost_at, self.why = time.time(), why
            nowhere = os.open(os.devnull, os.O_RDWR)
            for fd in (0, 1, 2):
                os.dup2(nowhere, fd)
            os.close(nowhere)
        self.on_lost()


class GuardedOutput:
    """A terminal's text output whose failed write means the terminal is lost, not an error for the writer."""

    def __init__(self, real: TextIO, guard: TerminalGuard) -> None:
        self._real = real
        self._guard = guard

    def write(self, text: str) -> int:
        try:
            return self._real.write(text)
        except (OSError, ValueError) as error:  # EIO once hung up; ValueError: the file was closed
            self._guard.lose(f"a write to the terminal failed ({error})")
            return len(text)

    def flush(self) -> None:
        try:
            self._real.flush()
        except (OSError, ValueError) as error:
            self._guard.lose(f"a write to the terminal failed ({error})")

    def __getattr__(self, name: str) -> Any:  # fileno, isatty, encoding: the real file's
        return getattr(self._real, name)


def go_on_headless(source: LiveSource, *, recording: bool, console: TextIO | None = None) -> None:
    """The dashboard is gone (its terminal went away, or d detached it): a recorded job goes on, headless, until
    it ends or SIGTERM / Ctrl-C stops it, as ``record`` would run it (a hang stops it; ``console``, where given,
    takes ``record``'s progress lines); one not recorded is stopped (by the caller)."""
    source.headless(console)
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # the app's event loop had it: a KeyboardInterrupt
    if not recording:
        return
    try:
        while not source.wait(0.5):
            pass
    except KeyboardInterrupt:
        pass
