"""A serving engine meshtop starts itself: ``meshtop run|record ... --endpoint URL -- SERVER COMMAND...``.

The command runs in a session of its own, its output in the recording's ``server.log``. meshtop waits until
``/health`` or ``/v1/models`` answers 200 (``--startup-timeout``, 10 minutes by default: a large model loads
for minutes), saying how the startup goes (its last log line, the time so far); a server that exits first,
or never answers, is one line with its last log lines. After the load it is stopped as a user would: SIGINT
(engines shut down cleanly on it), then SIGTERM, then SIGKILL, to its whole process tree (an engine's
workers may sit in sessions of their own), so nothing of it is left. What ran is kept: the command, the
version it printed, the environment that decides its devices and network (``CUDA_VISIBLE_DEVICES``,
``NCCL_*``), the tail of its log, and its process tree's CPU time and peak memory.
"""

from __future__ import annotations

import contextlib
import http.client
import os
import re
import signal
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import psutil

from meshtop.recordings.manifest import ServerInfo
from meshtop.runner.serving.http import Origin

SERVER_LOG = "server.log"
DEFAULT_STARTUP_TIMEOUT_S = 600.0
POLL_S = 0.5
ASK_TIMEOUT_S = 2.0
"""How long one readiness poll waits for its answer (a server that accepts and never answers)."""
PROGRESS_EVERY_S = 5.0
"""How often the startup is said while waiting."""
STOP_STEPS = ((signal.SIGINT, 20.0), (signal.SIGTERM, 10.0), (signal.SIGKILL, 5.0))
"""Each signal of the stop, and how long the tree has to end after it."""
TAIL_LINES = 20
ENV_PREFIXES = ("CUDA_VISIBLE_DEVICES", "NCCL_", "HIP_VISIBLE_DEVICES", "VLLM_", "SGLANG_")
VERSION = re.compile(r"\bversion[:=\s]+v?(\d+\.\d+[\w.+-]*)", re.IGNORECASE)


class ServerFailed(Exception):
    """The server exited or did not answer; the message is one line with its last log lines."""


class StartupStopped(Exception):
    """The user stopped the session while the server was starting."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ServerCommand:
    """The server meshtop starts, and how long it may take to answer."""

    command: tuple[str, ...]
    startup_timeout_s: float = DEFAULT_STARTUP_TIMEOUT_S


def log_tail(path: Path, lines: int = TAIL_LINES) -> list[str]:
    """The last non-empty lines of ``path`` (empty when there is none)."""
    try:
        with path.open("rb") as log:
            log.seek(max(0, log.seek(0, os.SEEK_END) - 64 * 1024))
            text = log.read().decode("utf-8", "replace")
    except OSError:
        return []
    return [line.rstrip() for line in text.splitlines() if line.strip()][-lines:]


def environment_that_matters(environ: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in sorted(environ.items()) if any(k.startswith(prefix) for prefix in ENV_PREFIXES)}


class ServerProcess:
    """The started server: its process tree, watched while it runs, and stopped whole."""

    def __init__(self, spec: ServerCommand, log_path: Path, env: dict[str, str] | None = None) -> None:
        """Start ``spec``'s command, its output into ``log_path``, in ``env`` (``None``: meshtop's own
        environment; a capacity sweep's replicas each get their share of the GPUs)."""
        self.spec = spec
        self.log_path = log_path
        environ = dict(os.environ) if env is None else env
        self.report = ServerInfo(command=spec.command, environment=environment_that_matters(environ))
        """What ran, for the manifest: filled in as it runs and when it stops."""
        self._seen: dict[int, psutil.Process] = {}
        self._cpu: dict[int, float] = {}
        self._started = time.monotonic()
        try:
            with log_path.open("ab") as log:
                self.process = subprocess.Popen(
                    list(spec.command), stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                    start_new_session=True, env=environ,
                )  # fmt: skip
        except OSError as error:
            raise ServerFailed(f"cannot start the server {spec.command[0]!r}: {error.strerror or error}") from None

    def watch(self) -> None:
        """Note every process of its tree and their CPU and memory (called while it runs)."""
        if self.process.returncode is not None:  # reaped: its pid may be another process's by now
            return
        try:
            root = psutil.Process(self.process.pid)
            tree = [root, *root.children(recursive=True)]
        except psutil.Error:
            return
        rss = 0
        for process in tree:
            self._seen.setdefault(process.pid, process)
            with contextlib.suppress(psutil.Error):
                times = process.cpu_times()
                self._cpu[process.pid] = times.user + times.system
                rss += process.memory_info().rss
        peak = max(self.report.peak_rss_bytes or 0, rss)
        self.report = replace(self.report, cpu_s=sum(self._cpu.values()), peak_rss_bytes=peak)

    def wait_ready(
        self, origin: Origin, *, progress: Callable[[float, str], None], stop: threading.Event | None = None
    ) -> None:
        """Until ``/health`` or ``/v1/models`` answers 200; :class:`ServerFailed` if it exits or time runs out,
        :class:`StartupStopped` as soon as ``stop`` is set (q or SIGTERM while a large model loads)."""
        stop = stop if stop is not None else threading.Event()
        deadline = self._started + self.spec.startup_timeout_s
        said = self._started
        while True:
            self.watch()
            if self.process.poll() is not None:
                raise ServerFailed(
                    f"the server exited with code {self.process.returncode} before it answered{self._tail()}"
                )
            for url in (f"{origin.base}/health", origin.url("/models")):
                with (
                    contextlib.suppress(OSError, http.client.HTTPException, ValueError),  # not HTTP yet too
                    urllib.request.urlopen(url, timeout=ASK_TIMEOUT_S) as response,
                ):
                    if response.status == 200:
                        self.report = replace(
                            self.report, startup_s=time.monotonic() - self._started, version=self._version()
                        )
                        return
            now = time.monotonic()
            if now > deadline:
                raise ServerFailed(
                    f"the server did not answer {origin.base}/health or /v1/models within "
                    f"{self.spec.startup_timeout_s:g} s (--startup-timeout){self._tail()}"
                )
            if now - said >= PROGRESS_EVERY_S:
                said = now
                progress(now - self._started, (log_tail(self.log_path, 1) or ["(no output yet)"])[0])
            if stop.wait(POLL_S):
                raise StartupStopped()

    def _tail(self) -> str:
        lines = log_tail(self.log_path, 3)
        return ("; its last lines: " + " | ".join(lines)) if lines else "; it printed nothing"

    def _version(self) -> str | None:
        """The version the log says, where it says one."""
        for line in log_tail(self.log_path, 200):
            if found := VERSION.search(line):
                return found.group(1)
        return None

    def exited(self) -> int | None:
        """Its exit code once it ended by itself (``None`` while it runs)."""
        return self.process.poll()

    def stop(self, steps: tuple[tuple[signal.Signals, float], ...] = STOP_STEPS) -> ServerInfo:
        """SIGINT, then SIGTERM, then SIGKILL to its whole tree, each with time to end; what ran."""
        self.watch()
        for signum, grace_s in steps:
            alive = self._alive()
            if not alive:
                break
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.process.pid, signum)  # its process group: the engine and the workers it forked
            for process in alive:  # and, once, each that left the group (killpg has signalled the others)
                with contextlib.suppress(psutil.Error, OSError):
                    if os.getpgid(process.pid) != self.process.pid:
                        process.send_signal(signum)
            deadline = time.monotonic() + grace_s
            while self._alive() and time.monotonic() < deadline:
                time.sleep(0.05)
        self.report = replace(self.report, exit_code=self.process.poll(), log_tail=tuple(log_tail(self.log_path)))
        return self.report

    def _alive(self) -> list[psutil.Process]:
        """The processes of its tree or its session still running (a worker whose parent exited has left the
        tree, not the session); its own reaped here by Popen, which keeps its exit code: psutil's wait would
        reap it and leave Popen none."""
        self.process.poll()
        for pid in psutil.pids():
            if pid not in self._seen:
                with contextlib.suppress(OSError, psutil.Error):
                    if os.getsid(pid) == self.process.pid:
                        self._seen[pid] = psutil.Process(pid)
        alive = []
        for pid, process in self._seen.items():
            if pid == self.process.pid and self.process.returncode is not None:
                continue
            with contextlib.suppress(psutil.Error):
                if process.is_running() and process.status() != psutil.STATUS_ZOMBIE:
                    alive.append(process)
        if self.process.poll() is None and not alive:
            with contextlib.suppress(psutil.Error):
                alive.append(psutil.Process(self.process.pid))
        return alive
