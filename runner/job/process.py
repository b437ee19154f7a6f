"""The launcher child and the processes of its job: start it, follow it, stop it, and read how it ended.

The child (:mod:`meshtop.runner.job.agent`) runs in its own session, so a Ctrl-C in the
terminal reaches meshtop alone, which then stops the whole job: SIGTERM to the
launcher (torchrun forwards it to every rank), and after a grace period
SIGKILL to every process of the job that meshtop has seen, so none is left
behind even if the launcher itself is gone.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterable
from dataclasses import replace
from pathlib import Path

import psutil

from meshtop.probes.collector import Collector
from meshtop.probes.events import HangDetected
from meshtop.recordings.typed_json import RecordingError, load
from meshtop.runner.job.environment import Launch, worker_environment
from meshtop.runner.job.files import LAUNCHER_LOG, STATUS_NAME, TORCHELASTIC_NAME, LauncherStatus
from meshtop.runner.job.flight import is_stopped
from meshtop.runner.job.last_words import last_words, read_tail
from meshtop.runner.results import JobResult, RankExit, root_cause

STOP_GRACE_S = 15.0
SAFE_PATH = ("-P",) if sys.version_info >= (3, 11) else ()
"""The launcher starts in the user's folder (its ranks run there) but does not search it for modules (Python
3.11's ``-P``): a user's own ``meshtop.py`` there would hide meshtop from it. Before 3.11 it does, and the
launcher's last words (:mod:`meshtop.runner.job.last_words`) say so."""


class Job:
    """One launched job: its launcher process, the ranks it spawned, their event files."""

    def __init__(self, launch: Launch, session_dir: Path, collector: Collector) -> None:
        self.launch = launch
        self.session_dir = session_dir
        self.log_path = session_dir / LAUNCHER_LOG
        self._status_path = session_dir / STATUS_NAME
        self.collector = collector
        self._seen: dict[int, psutil.Process] = {}
        self._process: subprocess.Popen[bytes] | None = None
        self._started = 0.0
        self._log_start = 0
        """Where this launch's output begins in the launcher log (a session folder's log is appended to)."""

    def start(self) -> None:
        self.session_dir.mkdir(parents=True, exist_ok=True)
        self.collector.start()
        agent = [sys.executable, *SAFE_PATH, "-m", "meshtop.runner.job.agent"]
        command = [*agent, str(self._status_path), self.launch.launcher, *self.launch.launcher_args]
        with self.log_path.open("ab") as log:
            self._log_start = log.seek(0, os.SEEK_END)
            self._process = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=worker_environment(self.launch, self.collector, self.session_dir),
                start_new_session=True,
            )
        self._started = time.monotonic()

    def poll(self) -> bool:
        """Whether the launcher still runs; also notes every process of the job seen so far."""
        assert self._process is not None, "start() first"
        try:
            for child in psutil.Process(self._process.pid).children(recursive=True):
                self._seen.setdefault(child.pid, child)
        except psutil.NoSuchProcess:
            pass
        return self._process.poll() is None

    def stop(self, grace_s: float = STOP_GRACE_S) -> None:
        """SIGTERM the launcher (which stops the ranks), then SIGKILL whatever is left."""
        assert self._process is not None, "start() first"
        self.poll()
        if self._process.poll() is None:
            self._process.send_signal(signal.SIGTERM)
            self.wake_stopped()
            try:
                self._process.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
        self.reap()

    def wake_stopped(self) -> None:
        """SIGCONT every process of the job that is stopped (SIGSTOP, a debugger's hold): a stopped process acts on
        the SIGTERM it was sent only once continued, so the stop would otherwise wait out its grace (a shell's
        ``kill`` of a stopped job sends SIGCONT after SIGTERM for the same reason)."""
        for process in self._seen.values():
            if is_stopped(process.pid):
                _signal(process, signal.SIGCONT)

    def reap(self) -> None:
        """Kill any process of the job that outlived the launcher; remove torchrun's log folder if the launcher
        could not (:data:`meshtop.runner.job.files.TORCHELASTIC_NAME`)."""
        alive = [p for p in self._seen.values() if _is_running(p)]
        for process in alive:
            _signal(process, signal.SIGTERM)
        self.wake_stopped()
        _, alive = psutil.wait_procs(alive, timeout=3.0)
        for process in alive:
            _signal(process, signal.SIGKILL)
        psutil.wait_procs(alive, timeout=3.0)
        shutil.rmtree(self._status_path.parent / TORCHELASTIC_NAME, ignore_errors=True)

    def result(
        self, *, interrupted: bool, hang: HangDetected | None = None, ranks: Iterable[int] | None = None
    ) -> JobResult:
        """How the job ended, for ``ranks`` (default: every rank; on many nodes, this node's)."""
        assert self._process is not None, "start() first"
        duration = time.monotonic() - self._started
        try:
            status = load(LauncherStatus, json.loads(self._status_path.read_text()), whole=STATUS_NAME)
        except (FileNotFoundError, json.JSONDecodeError, RecordingError):
            status = None
        failures = {int(rank): failure for rank, failure in status.ranks.items()} if status is not None else {}
        # on many nodes: the ranks that reported, and those that failed before they could (torchrun names them)
        world = sorted(set(ranks) | set(failures)) if ranks is not None else range(self.launch.world_size)
        if hang is not None:
            why = f"stopped: no rank made progress for {hang.silent_s:.0f} s (hang)"
            exits = tuple(RankExit(rank=r, exit_code=None, signal=None, error=why) for r in world)
            return JobResult(
                status="failed", ranks=exits, duration_s=duration, log_path=self.log_path, hang=hang.report
            )
        if interrupted or (status is not None and status.status == "interrupted"):
            exits = tuple(RankExit(rank=r, exit_code=None, signal=None, error="stopped on request") for r in world)
            return JobResult(status="interrupted", ranks=exits, duration_s=duration, log_path=self.log_path)
        if status is not None and status.status == "completed":
            exits = tuple(RankExit(rank=r, exit_code=0, signal=None, error=None) for r in world)
            return JobResult(status="completed", ranks=exits, duration_s=duration, log_path=self.log_path)
        first = root_cause(failures)
        # the launcher, or the rank that failed first, died without saying why: its last words in the log say it
        said = self.last_words() if first is None or not failures[first].error else None
        if first is None:
            code = self._process.returncode
            how = f"killed by {signal_name(-code)}" if code < 0 else f"exited with code {code}"
            why = f"launcher {how} before reporting"
            why += f": {said}" if said is not None else ""
        else:
            why = f"stopped after rank {first} failed"
            if said is not None:
                failures[first] = replace(failures[first], error=f"{said} (from the end of the launcher log)")
        exits = tuple(
            RankExit(rank=r, exit_code=failures[r].exit_code, signal=failures[r].signal, error=failures[r].error)
            if r in failures
            else RankExit(rank=r, exit_code=None, signal=None, error=why)
            for r in world
        )
        return JobResult(
            status="failed",
            ranks=exits,
            duration_s=duration,
            log_path=self.log_path,
            root_cause=first,
            failure_times={rank: float(failure.timestamp or 0) for rank, failure in failures.items()},
        )

    def last_words(self) -> str | None:
        """The last meaningful line this launch wrote to the launcher log (:mod:`meshtop.runner.job.last_words`):
        why the launcher or a rank died, where it did not say so itself."""
        return last_words(read_tail(self.log_path, self._log_start))


def _is_running(process: psutil.Process) -> bool:
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _signal(process: psutil.Process, signum: int) -> None:
    with contextlib.suppress(psutil.NoSuchProcess):
        process.send_signal(signum)


def signal_name(number: int) -> str:
    """``SIGKILL`` for 9; ``signal 64`` for a number without a name here."""
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"
