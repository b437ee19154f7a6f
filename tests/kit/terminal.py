"""A real terminal for the dashboard's tests: meshtop runs under tmux, the screen is read with
``capture-pane`` and keys are pressed with ``send-keys``, so what is checked is what a user sees and what the
process does.

Each terminal is its own tmux server on its own socket (``tmux -L``), never the user's, killed at the end
with anything the job left. Modules that use it skip where tmux is not installed (:data:`TMUX`).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TypeVar

import psutil
import pytest

from tests.kit.commands import meshtop

TMUX = shutil.which("tmux")
REPO = Path(__file__).resolve().parents[2]
EXIT_KEEPER = Path(__file__).resolve().parents[1] / "tui" / "exit_keeper.py"
TAB_ROW = "1 Overview  2 Devices  3 Comms  4 Pipeline  5 Steps  6 Procs  7 Alerts  8 Grid"
POLL_S = 0.2
STARTUP_S = 60.0
"""Time for the dashboard's first frame (imports torch, textual, pandas)."""
JOB_S = 120.0
"""Time for a live job to reach a state (start its ranks, finish its steps)."""
EXIT_S = 60.0
"""Time for meshtop to exit after ``q`` (a live job stops every rank and closes its recording first)."""

T = TypeVar("T")


class Terminal:
    """One tmux server with one session of ``width`` x ``height`` running ``meshtop ARGS`` in bash."""

    def __init__(
        self, directory: Path, args: Sequence[str], *, width: int, height: int, env: dict[str, str] | None = None
    ) -> None:
        tag = uuid.uuid4().hex[:10]
        self.socket = f"meshtop-test-{os.getpid()}-{tag}"
        self.session = f"meshtop-{tag}"
        self.directory = directory
        self.exit_file = directory / f"exit-{tag}"
        self.width, self.height = width, height
        self.args = list(args)
        self.pane_pid: int | None = None
        self.socket_path: Path | None = None
        self._environment = {
            name: value
            for name, value in os.environ.items()
            if name not in ("TMUX", "TMUX_PANE", "COLUMNS", "LINES") and not name.startswith("TEXTUAL")
        }
        self._pane_env = {"TERM": "xterm-256color", **(env or {})}

    # -- tmux ----------------------------------------------------------------------

    def tmux(self, *args: str, check: bool = True) -> str:
        done = subprocess.run(
            [str(TMUX), "-L", self.socket, *args], capture_output=True, text=True, timeout=30, env=self._environment
        )
        if check and done.returncode != 0:
            raise AssertionError(f"tmux {' '.join(args)} failed ({done.returncode}): {done.stderr.strip()}")
        return done.stdout

    def start(self) -> None:
        config = self.directory / f"tmux-{self.session}.conf"
        # The pane stays after its command ends (its last screen can be read), no status line (the pane is
        # exactly width x height) and no user configuration.
        config.write_text(
            "set -g remain-on-exit on\nset -g status off\nset -g history-limit 10000\nset -g default-shell /bin/sh\n"
        )
        exports = " ".join(f"{name}={shlex.quote(value)}" for name, value in self._pane_env.items())
        # meshtop under the exit keeper, which the shell becomes: its exit code is kept when the terminal goes
        command = shlex.join([sys.executable, str(EXIT_KEEPER), str(self.exit_file), *meshtop(*self.args)])
        script = f"export {exports}; cd {shlex.quote(str(REPO))} && exec {command}"
        self.tmux(
            "-f",
            str(config),
            "new-session",
            "-d",
            "-s",
            self.session,
            "-x",
            str(self.width),
            "-y",
            str(self.height),
            f"bash -c {shlex.quote(script)}",
        )
        pane_pid, socket_path = (
            self.tmux("display-message", "-p", "-t", self.session, "#{pane_pid} #{socket_path}").strip().split(" ", 1)
        )
        self.pane_pid, self.socket_path = int(pane_pid), Path(socket_path)

    def close(self) -> None:
        """Kill the tmux server, then whatever of the job outlived it (the launcher runs in its own session)."""
        left = self.job_processes()
        self.tmux("kill-server", check=False)
        for process in left:
            with contextlib.suppress(psutil.Error):
                process.kill()
        psutil.wait_procs(left, timeout=10)
        if self.socket_path is not None:
            self.socket_path.unlink(missing_ok=True)

    # -- the screen and the keys -----------------------------------------------------

    def screen(self) -> str:
        """The visible screen, one line a row, trailing spaces cut."""
        text = self.tmux("capture-pane", "-p", "-t", self.session)
        return "\n".join(line.rstrip() for line in text.splitlines())

    def everything(self) -> str:
        """The screen and its history, wrapped lines joined: what meshtop printed after the dashboard closed."""
        text = self.tmux("capture-pane", "-p", "-J", "-S", "-", "-t", self.session)
        return "\n".join(line.rstrip() for line in text.splitlines())

    def press(self, *keys: str) -> None:
        self.tmux("send-keys", "-t", self.session, *keys)

    def exit_code(self) -> int | None:
        try:
            found = re.fullmatch(r"EXIT=(\d+)\s*", self.exit_file.read_text())
        except FileNotFoundError:
            return None
        return int(found.group(1)) if found else None

    def wait_for(self, check: Callable[[str], T | None], what: str, timeout_s: float) -> T:
        """Poll the screen until ``check`` gives something true; fail with the screen if time runs out
        or meshtop exits first."""
        deadline = time.monotonic() + timeout_s
        while True:
            screen = self.screen()
            found = check(screen)
            if found:
                return found
            code = self.exit_code()
            if code is not None:
                pytest.fail(f"meshtop exited ({code}) before {what}; the terminal:\n{self.everything()}")
            if time.monotonic() > deadline:
                pytest.fail(f"no {what} after {timeout_s:.0f} s; the screen:\n{screen}")
            time.sleep(POLL_S)

    def wait_text(self, text: str, timeout_s: float = STARTUP_S) -> str:
        return self.wait_for(lambda screen: screen if text in screen else None, repr(text), timeout_s)

    def wait_exit(self, timeout_s: float = EXIT_S) -> int:
        deadline = time.monotonic() + timeout_s
        while (code := self.exit_code()) is None:
            if time.monotonic() > deadline:
                pytest.fail(f"meshtop still running {timeout_s:.0f} s after q; the screen:\n{self.screen()}")
            time.sleep(POLL_S)
        self.wait_keeper_gone(deadline)
        return code

    def wait_keeper_gone(self, deadline: float) -> None:
        """The exit keeper writes the code as its last act and ends a moment later: wait for that moment, so
        a check for leftovers that follows sees only what meshtop left."""
        keepers = [process for process in self.job_processes() if str(EXIT_KEEPER) in " ".join(command_of(process))]
        deadline = max(deadline, time.monotonic() + 1.0)
        while alive := still_running(keepers):
            if time.monotonic() > deadline:
                pytest.fail(f"the exit keeper still running after writing meshtop's exit code: {alive}")
            time.sleep(0.02)

    # -- processes -----------------------------------------------------------------------

    def job_processes(self) -> list[psutil.Process]:
        """Every process below the pane's shell: meshtop, its launcher and the ranks."""
        if self.pane_pid is None:
            return []
        try:
            return psutil.Process(self.pane_pid).children(recursive=True)
        except psutil.NoSuchProcess:
            return []


@pytest.fixture
def terminal(tmp_path: Path) -> Iterator[Callable[..., Terminal]]:
    """Start meshtop in a fresh tmux terminal: ``terminal(args, width=, height=, env=)``."""
    opened: list[Terminal] = []

    def start(args: Sequence[str], *, width: int = 80, height: int = 24, env: dict[str, str] | None = None) -> Terminal:
        term = Terminal(tmp_path, args, width=width, height=height, env=env)
        opened.append(term)
        term.start()
        return term

    try:
        yield start
    finally:
        for term in opened:
            term.close()


def header_rows(screen: str) -> tuple[str, str]:
    """The header's two rows (empty where the screen has none yet)."""
    rows = [*screen.splitlines()[:2], "", ""]
    return rows[0], rows[1]


def still_running(processes: list[psutil.Process]) -> list[str]:
    """The processes that are still there, given a moment to finish exiting (a zombie counts as gone: it runs
    nothing; one caught mid-exit has released its memory, and its command line reads empty)."""
    deadline = time.monotonic() + 5.0
    while True:
        alive = []
        for process in processes:
            try:
                if process.is_running() and process.status() != psutil.STATUS_ZOMBIE:
                    alive.append(f"{process.pid}: {' '.join(process.cmdline())}")
            except psutil.Error:
                pass
        exiting = [line for line in alive if line.endswith(": ")]
        if not exiting or time.monotonic() > deadline:
            return alive
        time.sleep(0.05)


def command_of(process: psutil.Process) -> list[str]:
    """The process's command line; empty once it is gone."""
    try:
        return process.cmdline()
    except psutil.Error:
        return []


def python_module(process: psutil.Process) -> str | None:
    """What ``python [OPTIONS] -m MODULE`` runs; ``None`` for a script (the launcher's own command line names
    the worker's module too, the exit keeper's meshtop's: after their own)."""
    command = command_of(process)
    for index, part in enumerate(command[1:-1], 1):
        if part == "-m":
            return command[index + 1]
        if not part.startswith("-"):
            return None
    return None


def only_session(runs: Path) -> Path:
    sessions = [path for path in runs.iterdir() if path.is_dir()]
    assert len(sessions) == 1, f"expected one recorded session in {runs}, found {sessions}"
    assert sessions[0].name.endswith("-dp2-tp1-pp1"), sessions[0].name
    return sessions[0]


def manifest_status(session: Path) -> str:
    return str(json.loads((session / "manifest.json").read_text())["status"])


def live_env() -> dict[str, str]:
    """A CPU job whatever GPUs the host has."""
    return {"CUDA_VISIBLE_DEVICES": ""}
