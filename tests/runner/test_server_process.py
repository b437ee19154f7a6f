"""A server meshtop starts: waited for until it answers, said in one line when it never does, and stopped
whole (a child that ignores SIGINT, and one in a session of its own, included)."""

from __future__ import annotations

import signal
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

from meshtop.runner.serving.http import Origin
from meshtop.runner.serving.server import (
    ServerCommand,
    ServerFailed,
    ServerProcess,
    StartupStopped,
    environment_that_matters,
    log_tail,
)
from tests.kit.ports import free_port

QUICK_STOP = ((signal.SIGINT, 1.0), (signal.SIGTERM, 1.0), (signal.SIGKILL, 2.0))

ANSWERS = """
import http.server, os, signal, subprocess, sys
port = int(sys.argv[1])
print("vLLM API server version 0.99.1", flush=True)
signal.signal(signal.SIGINT, signal.SIG_IGN)  # a server that ignores SIGINT: the stop goes on to SIGTERM
# a worker in a session of its own (as some engines start theirs): out of the server's process group
WORKER = "import signal, time; signal.signal(signal.SIGINT, signal.SIG_IGN); time.sleep(600)"
subprocess.Popen([sys.executable, "-c", WORKER], start_new_session=True)
class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/health" else 404)
        self.end_headers()
    def log_message(self, *args):
        pass
http.server.HTTPServer(("127.0.0.1", port), Health).serve_forever()
"""


def test_a_server_is_waited_for_then_stopped_with_its_whole_tree(tmp_path: Path) -> None:
    port = free_port()
    server = ServerProcess(ServerCommand(command=(sys.executable, "-c", ANSWERS, str(port))), tmp_path / "server.log")
    said: list[tuple[float, str]] = []
    server.wait_ready(Origin.parse(f"http://127.0.0.1:{port}"), progress=lambda s, line: said.append((s, line)))
    assert server.report.startup_s is not None and server.report.version == "0.99.1"
    deadline = time.monotonic() + 10
    while len(server._seen) < 2 and time.monotonic() < deadline:  # the worker, once forked
        server.watch()
        time.sleep(0.05)
    tree = list(server._seen.values())
    assert len(tree) == 2
    report = server.stop(QUICK_STOP)
    assert report.exit_code == -signal.SIGTERM  # SIGINT ignored; SIGTERM ended it
    assert not [p for p in tree if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    assert report.log_tail == ("vLLM API server version 0.99.1",)


def test_a_server_that_never_answers_or_exits_first_is_one_line(tmp_path: Path) -> None:
    loading = "print('loading...', flush=True); import time; time.sleep(60)"
    silent = ServerCommand(command=(sys.executable, "-c", loading), startup_timeout_s=4)  # a loaded CI's start
    server = ServerProcess(silent, tmp_path / "a.log")
    with pytest.raises(
        ServerFailed, match=r"did not answer .* within 4 s \(--startup-timeout\); its last lines: loading"
    ):
        server.wait_ready(Origin.parse(f"http://127.0.0.1:{free_port()}"), progress=lambda s, line: None)
    assert server.stop(QUICK_STOP).exit_code is not None
    server = ServerProcess(silent, tmp_path / "stopped.log")
    stop = threading.Event()
    threading.Timer(0.3, stop.set).start()  # the user quits while it loads
    begun = time.monotonic()
    with pytest.raises(StartupStopped):
        server.wait_ready(Origin.parse(f"http://127.0.0.1:{free_port()}"), progress=lambda s, line: None, stop=stop)
    assert time.monotonic() - begun < 3  # at once, not at the startup timeout
    server.stop(QUICK_STOP)
    dying = ServerCommand(command=(sys.executable, "-c", "raise SystemExit(5)"))
    server = ServerProcess(dying, tmp_path / "b.log")
    with pytest.raises(ServerFailed, match="exited with code 5 before it answered; it printed nothing"):
        server.wait_ready(Origin.parse(f"http://127.0.0.1:{free_port()}"), progress=lambda s, line: None)
    with pytest.raises(ServerFailed, match="cannot start the server 'no-such-engine-here'"):
        ServerProcess(ServerCommand(command=("no-such-engine-here",)), tmp_path / "c.log")


def test_the_environment_kept_and_the_log_tail(tmp_path: Path) -> None:
    kept = environment_that_matters(
        {"CUDA_VISIBLE_DEVICES": "0,1", "NCCL_DEBUG": "INFO", "HOME": "/root", "VLLM_X": "1"}
    )
    assert kept == {"CUDA_VISIBLE_DEVICES": "0,1", "NCCL_DEBUG": "INFO", "VLLM_X": "1"}
    log = tmp_path / "log"
    log.write_text("".join(f"line {n}\n\n" for n in range(30)))
    assert log_tail(log, 3) == ["line 27", "line 28", "line 29"] and log_tail(tmp_path / "none") == []
