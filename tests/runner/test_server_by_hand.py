"""The server meshtop starts and the ``/metrics`` it scrapes, against figures and words worked out by hand: the
log's tail (its 64 KiB window, its lines as printed), the one-line failures, when startup is said and with
which line, what the report keeps (the command, the environment, the tree's CPU time and memory as the kernel
counts them), a stop that reaches every process and returns as soon as they are gone, and the scraper's
exposition rules, its byte cap and its count of failures before it stops asking.

The servers are small: ``sleep`` or a few lines of Python, and for HTTP a raw socket in the test that answers
each request as it is told (or closes it unanswered, or holds it), so each case is one exact exchange."""

from __future__ import annotations

import contextlib
import ctypes
import math
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import psutil
import pytest

from meshtop.probes.events import Event, ProbeOff, ServerMetric
from meshtop.runner.serving import scrape, server
from meshtop.runner.serving.http import Origin
from meshtop.runner.serving.scrape import Scraper, parse_exposition
from meshtop.runner.serving.server import ServerCommand, ServerFailed, ServerProcess, StartupStopped, log_tail
from tests.kit.ports import free_port

QUICK_STOP = ((signal.SIGINT, 2.0), (signal.SIGTERM, 2.0), (signal.SIGKILL, 2.0))
SLEEPER = ("sleep", "30")
"""A server that prints nothing and never answers (its log written by the test, before it starts)."""


def http(status: int, body: bytes = b"", *, length: int | None = None) -> bytes:
    """An HTTP/1.1 answer as written on the wire (``length``: a Content-Length other than the body's)."""
    size = len(body) if length is None else length
    return f"HTTP/1.1 {status} X\r\nContent-Length: {size}\r\nConnection: close\r\n\r\n".encode() + body


@contextmanager
def raw_server(answer: Callable[[int, str], bytes | None], *, hold: bool = False) -> Iterator[tuple[str, list[str]]]:
    """A server on a raw socket: the ``n``-th request (from 1) for ``path`` gets ``answer(n, path)`` written as
    is, then its connection is closed (``None``: closed unanswered), or held open until the block ends
    (``hold``). Yields its URL and the paths asked, in order."""
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.02)
    asked: list[str] = []
    held: list[socket.socket] = []
    done = threading.Event()

    def serve() -> None:
        while not done.is_set():
            try:
                connection, _ = listener.accept()
            except TimeoutError:
                continue
            connection.settimeout(2)
            request = b""
            while b"\r\n\r\n" not in request and (chunk := connection.recv(4096)):
                request += chunk
            asked.append(request.split(b" ")[1].decode())
            reply = answer(len(asked), asked[-1])
            if reply is not None:
                connection.sendall(reply)
            if hold and reply is not None:
                held.append(connection)
            else:
                connection.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}", asked
    finally:
        done.set()
        thread.join()
        listener.close()
        for connection in held:
            connection.close()


def nowhere() -> Origin:
    """An endpoint where nothing listens (every poll refused at once)."""
    return Origin.parse(f"http://127.0.0.1:{free_port()}")


def running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def wait_for(condition: Callable[[], object], within_s: float = 5.0) -> None:
    deadline = time.monotonic() + within_s
    while not condition():
        assert time.monotonic() < deadline, "timed out waiting"
        time.sleep(0.01)


@pytest.fixture(autouse=True)
def sigint_not_ignored() -> Iterator[None]:
    """The servers here end at SIGINT, as under meshtop started from a terminal; a test run started in the
    background of a script ignores SIGINT, and the servers would inherit that (they get the default)."""
    before = signal.getsignal(signal.SIGINT)
    if before == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, before)


@pytest.fixture
def fast_polls(monkeypatch: pytest.MonkeyPatch) -> None:
    """Polls 10 ms apart and the startup said every 50 ms (0.5 s and 5 s in production), so a test of the loop's
    rules takes a tenth of a second."""
    monkeypatch.setattr(server, "POLL_S", 0.01)
    monkeypatch.setattr(server, "PROGRESS_EVERY_S", 0.05)


# -- the log's tail ----------------------------------------------------------------------------------------


def test_the_log_tail_is_the_last_64_kib_as_printed_lines(tmp_path: Path) -> None:
    """A head line, then 64 lines of exactly 1,024 bytes (``line NN `` is 8, 1,015 dots, the newline): the
    last 64 x 1,024 = 65,536 bytes are those 64 lines whole, so the head is outside the window and the first
    line inside is ``line 00`` from its first byte."""
    log = tmp_path / "server.log"
    log.write_text("head\n" + "".join(f"line {n:02d} " + "." * 1015 + "\n" for n in range(64)))
    lines = log_tail(log, 100)
    assert len(lines) == 64
    assert lines[0] == "line 00 " + "." * 1015 and lines[-1] == "line 63 " + "." * 1015
    # a byte not UTF-8 is replaced, not fatal; a line keeps its indent and loses its trailing blanks; blank
    # lines are not lines
    log.write_bytes(b"  indented \xff word  \n\n   \nlast\t\n")
    assert log_tail(log) == ["  indented \ufffd word", "last"]


# -- starting: what the report keeps, what the server is given, the one-line failures ----------------------


def test_the_report_keeps_the_command_and_the_environment_that_decides_devices(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in list(os.environ):
        if name.startswith(server.ENV_PREFIXES):
            monkeypatch.delenv(name)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1,3")
    monkeypatch.setenv("NCCL_SOCKET_IFNAME", "lo")
    monkeypatch.setenv("MESHTOP_UNRELATED", "x")
    started = ServerProcess(ServerCommand(command=SLEEPER), tmp_path / "server.log")
    report = started.stop(QUICK_STOP)
    assert report.command == ("sleep", "30")
    assert report.environment == {"CUDA_VISIBLE_DEVICES": "1,3", "NCCL_SOCKET_IFNAME": "lo"}
    assert report.exit_code == -signal.SIGINT  # sleep ends at the first signal


def test_the_server_reads_nothing_of_meshtops_terminal(tmp_path: Path) -> None:
    """Its stdin is /dev/null, whatever meshtop's is (here a pipe put on fd 0 for the start: under pytest fd 0
    is /dev/null already, which would hide an inherited stdin)."""
    read_end, write_end = os.pipe()
    saved = os.dup(0)
    os.dup2(read_end, 0)
    try:
        started = ServerProcess(ServerCommand(command=SLEEPER), tmp_path / "server.log")
    finally:
        os.dup2(saved, 0)
        for fd in (saved, read_end, write_end):
            os.close(fd)
    try:
        assert os.readlink(f"/proc/{started.process.pid}/fd/0") == "/dev/null"
    finally:
        started.stop(QUICK_STOP)


def test_a_server_that_fails_is_one_line_with_its_last_three_lines(tmp_path: Path, fast_polls: None) -> None:
    """Five lines on stdout, then the reason on stderr (as Python and most engines print a fatal error): the
    last three lines, stderr's included, joined by `` | ``."""
    script = 'for n in 1 2 3 4 5; do echo "line $n"; done; echo "fatal: no GPU found" >&2; exit 3'
    started = ServerProcess(ServerCommand(command=("sh", "-c", script)), tmp_path / "server.log")
    with pytest.raises(ServerFailed) as failed:
        started.wait_ready(nowhere(), progress=lambda s, line: None)
    assert str(failed.value) == (
        "the server exited with code 3 before it answered; its last lines: line 4 | line 5 | fatal: no GPU found"
    )
    with pytest.raises(ServerFailed) as failed:
        ServerProcess(ServerCommand(command=("no-such-engine-here", "serve")), tmp_path / "none.log")
    assert str(failed.value) == "cannot start the server 'no-such-engine-here': No such file or directory"


# -- waiting until it answers ------------------------------------------------------------------------------


def ready_on_models_only(_n: int, path: str) -> bytes:
    return http(200, b'{"data": []}') if path == "/v1/models" else http(404)


def test_a_server_that_answers_models_only_is_ready_and_its_version_read(tmp_path: Path) -> None:
    """``/health`` 404, ``/v1/models`` 200 (as ``transformers serve``): ready at the first poll, so a startup
    timeout of 0 s is enough (and a wait that misses the answer fails at once). The version is the first one
    printed among the last 200 lines: a version line and 199 after it are 200 lines."""
    log = tmp_path / "server.log"
    log.write_text("INFO engine version: 0.7.3\n" + "".join(f"INFO loaded shard {n}\n" for n in range(199)))
    with raw_server(ready_on_models_only) as (url, asked):
        begun = time.monotonic()
        started = ServerProcess(ServerCommand(command=SLEEPER, startup_timeout_s=0), log)
        started.wait_ready(Origin.parse(url), progress=lambda s, line: None)
        took_s = time.monotonic() - begun
    started.stop(QUICK_STOP)
    assert asked == ["/health", "/v1/models"]
    assert started.report.version == "0.7.3"
    assert started.report.startup_s is not None and 0 < started.report.startup_s <= took_s
    # one more line after it, and the version line is the 201st from the end: not read
    log = tmp_path / "late.log"
    log.write_text("INFO engine version: 0.7.3\n" + "".join(f"INFO loaded shard {n}\n" for n in range(200)))
    with raw_server(ready_on_models_only) as (url, _asked):
        started = ServerProcess(ServerCommand(command=SLEEPER, startup_timeout_s=0), log)
        started.wait_ready(Origin.parse(url), progress=lambda s, line: None)
    started.stop(QUICK_STOP)
    assert started.report.version is None


def never_ready(tmp_path: Path, answer: Callable[[int, str], bytes | None]) -> tuple[str, list[str], ServerFailed]:
    """A server that printed "loading weights", waited on at :func:`raw_server` (``answer``) with a startup
    timeout of 0 s (one round of polls): the URL, the paths asked, and the failure the wait ended in."""
    log = tmp_path / "server.log"
    log.write_text("loading weights\n")
    with raw_server(answer) as (url, asked):
        started = ServerProcess(ServerCommand(command=SLEEPER, startup_timeout_s=0), log)
        with pytest.raises(ServerFailed) as failed:
            started.wait_ready(Origin.parse(url), progress=lambda s, line: None)
    started.stop(QUICK_STOP)
    return url, asked, failed.value


def test_a_port_that_drops_the_connection_or_a_host_that_cannot_be_asked_is_waited_on(tmp_path: Path) -> None:
    """A listener that closes each connection unanswered (an engine's port before its app is up), and a host
    name the resolver refuses (``a..b``: an empty label): each poll fails and the wait goes on, until the
    startup timeout (0 s: one round) says so in one line."""
    url, asked, failed = never_ready(tmp_path, lambda n, path: None)
    assert asked == ["/health", "/v1/models"]
    assert str(failed) == (
        f"the server did not answer {url}/health or /v1/models within 0 s (--startup-timeout); "
        "its last lines: loading weights"
    )
    started = ServerProcess(ServerCommand(command=SLEEPER, startup_timeout_s=0), tmp_path / "empty.log")
    with pytest.raises(ServerFailed) as failed:
        started.wait_ready(Origin.parse("http://a..b:8000"), progress=lambda s, line: None)
    started.stop(QUICK_STOP)
    assert str(failed.value) == (
        "the server did not answer http://a..b:8000/health or /v1/models within 0 s (--startup-timeout); "
        "it printed nothing"
    )


@pytest.mark.parametrize(
    ("printed", "said"),
    [("loading weights\nshard 2 of 4 loaded  \n", "shard 2 of 4 loaded"), ("", "(no output yet)")],
    ids=["its-last-line", "nothing-yet"],
)
def test_the_startup_is_said_every_progress_interval_with_the_last_line(
    tmp_path: Path, fast_polls: None, printed: str, said: str
) -> None:
    """Said first once 50 ms have passed since the start, then 50 ms after the last saying, with the log's last
    line (or that there is none); the user's stop (here at the second saying) ends the wait at once. A timer
    stops a wait that never says anything (2 s)."""
    log = tmp_path / "server.log"
    log.write_text(printed)
    stop = threading.Event()
    heard: list[tuple[float, str]] = []

    def progress(elapsed_s: float, line: str) -> None:
        heard.append((elapsed_s, line))
        if len(heard) == 2:
            stop.set()

    safety = threading.Timer(2.0, stop.set)
    safety.start()
    begun = time.monotonic()
    started = ServerProcess(ServerCommand(command=SLEEPER), log)
    try:
        with pytest.raises(StartupStopped):
            started.wait_ready(nowhere(), progress=progress, stop=stop)
        took_s = time.monotonic() - begun
    finally:
        safety.cancel()
        started.stop(QUICK_STOP)
    assert [line for _, line in heard] == [said, said]
    (first_s, _), (second_s, _) = heard
    assert first_s >= 0.05 and second_s - first_s >= 0.05 - 1e-9 and second_s <= took_s


# -- the tree: what it costs, and stopping it --------------------------------------------------------------

TREE = """
import os, time
if os.fork() == 0:  # a worker
    if os.fork() == 0:  # and the worker's own child, which spends some time in the kernel first
        with open("/dev/zero", "rb", buffering=0) as zero:
            while os.times().system < 0.03:
                zero.read(1 << 20)
        print("ready", flush=True)
    time.sleep(30)
    os._exit(0)
time.sleep(30)
"""


def kernel_counts(pid: int) -> tuple[float, int]:
    """The CPU seconds (user + system) and resident bytes the kernel counts for ``pid``: fields 14 and 15 of
    /proc/PID/stat in clock ticks, and the second field of /proc/PID/statm in pages."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    ticks = int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15; the list starts at field 3)
    pages = int(Path(f"/proc/{pid}/statm").read_text().split()[1])
    return ticks / os.sysconf("SC_CLK_TCK"), pages * os.sysconf("SC_PAGE_SIZE")


def test_the_trees_cpu_time_and_memory_are_the_sums_the_kernel_counts(tmp_path: Path) -> None:
    """Three processes (the server, its worker, the worker's child), all asleep once the child said ready:
    the report's CPU time is the sum of each one's user and system time, its peak memory the sum of their
    resident sizes, as /proc counts them at that moment. The child spent at least 0.03 s in the kernel, so a
    difference for a sum would show."""
    log = tmp_path / "server.log"
    started = ServerProcess(ServerCommand(command=(sys.executable, "-c", TREE)), log)
    try:
        wait_for(lambda: log_tail(log) == ["ready"])
        tree = [started.process.pid, *(child.pid for child in psutil.Process(started.process.pid).children(True))]
        assert len(tree) == 3
        time.sleep(0.02)  # the child's last write done: all three asleep
        started.watch()
        counts = [kernel_counts(pid) for pid in tree]
    finally:
        started.stop(QUICK_STOP)
    assert started.report.cpu_s == pytest.approx(sum(cpu for cpu, _ in counts))
    assert started.report.peak_rss_bytes == sum(rss for _, rss in counts)
    assert not [pid for pid in tree if running(pid)]


def test_a_server_seen_only_once_it_had_exited_held_no_memory(tmp_path: Path) -> None:
    """Seen as a zombie (ended, not yet reaped): 0 resident bytes, its tree seen (not ``None``)."""
    started = ServerProcess(ServerCommand(command=("true",)), tmp_path / "server.log")
    wait_for(lambda: psutil.Process(started.process.pid).status() == psutil.STATUS_ZOMBIE)
    started.watch()
    assert started.report.peak_rss_bytes == 0
    assert started.stop(QUICK_STOP).exit_code == 0


ORPHAN = """
import os, signal, time
if os.fork() == 0:
    if os.fork() == 0:  # a worker whose parent exits: it leaves the tree, not the session
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        print(os.getpid(), flush=True)
        time.sleep(30)
    os._exit(0)
os.wait()
time.sleep(30)
"""


def test_a_worker_that_left_the_tree_but_not_the_session_is_stopped(tmp_path: Path) -> None:
    """The server runs in a session of its own, so its process group's signal reaches a worker whose parent
    exited (reparented, out of the tree meshtop watches)."""
    log = tmp_path / "server.log"
    started = ServerProcess(ServerCommand(command=(sys.executable, "-c", ORPHAN)), log)
    wait_for(lambda: log_tail(log))
    orphan = int(log_tail(log)[0])
    try:
        started.watch()
        assert orphan not in [child.pid for child in psutil.Process(started.process.pid).children(True)]
        assert started.stop(QUICK_STOP).exit_code == -signal.SIGINT
        wait_for(lambda: not running(orphan), within_s=2)
    finally:
        if running(orphan):
            os.kill(orphan, signal.SIGKILL)


WORKER_IN_ITS_OWN_SESSION = """
import subprocess, time
worker = subprocess.Popen(["sleep", "30"], start_new_session=True)
print(worker.pid, flush=True)
time.sleep(30)
"""


def test_a_worker_left_by_a_server_that_died_is_stopped(tmp_path: Path) -> None:
    """The server, killed, leaves a worker in a session of its own that meshtop had seen: the stop still
    signals it (the server's process group is gone by then, which is no error), and reports the kill."""
    log = tmp_path / "server.log"
    started = ServerProcess(ServerCommand(command=(sys.executable, "-c", WORKER_IN_ITS_OWN_SESSION)), log)
    wait_for(lambda: log_tail(log))
    worker = int(log_tail(log)[0])
    try:
        started.watch()  # the server and its worker seen
        os.kill(started.process.pid, signal.SIGKILL)
        wait_for(lambda: started.exited() is not None)
        assert started.stop(QUICK_STOP).exit_code == -signal.SIGKILL
        assert not running(worker)
    finally:
        if running(worker):
            os.kill(worker, signal.SIGKILL)


def test_the_stop_returns_as_soon_as_the_tree_is_gone(tmp_path: Path) -> None:
    """``sleep`` ends at SIGINT: with 5 s of grace for each signal, the stop returns within one 50 ms check of
    its end (0.9 s allowed for a loaded machine), not after the grace, and sends no second signal."""
    started = ServerProcess(ServerCommand(command=SLEEPER), tmp_path / "server.log")
    begun = time.monotonic()
    report = started.stop(((signal.SIGINT, 5.0), (signal.SIGTERM, 5.0), (signal.SIGKILL, 5.0)))
    assert time.monotonic() - begun < 0.9
    assert report.exit_code == -signal.SIGINT and report.log_tail == ()


WORKER_OF_THE_SAME_GROUP = """
import os, signal, time
signal.signal(signal.SIGINT, signal.SIG_DFL)  # both end at SIGINT at once, in the kernel
worker = os.fork()
if worker == 0:
    time.sleep(30)
    os._exit(0)
print(worker, flush=True)
time.sleep(30)
"""


@contextmanager
def unreaped_orphans() -> Iterator[None]:
    """This process made the reaper of orphans that start below it (``PR_SET_CHILD_SUBREAPER``), reaping none
    of them until the block ends: as in a container whose first process does not reap (``docker run`` with no
    ``--init``), a process whose parent ended stays a zombie."""
    libc = ctypes.CDLL(None, use_errno=True)
    assert libc.prctl(36, 1, 0, 0, 0) == 0  # PR_SET_CHILD_SUBREAPER
    try:
        yield
    finally:
        libc.prctl(36, 0, 0, 0, 0)


def test_a_worker_left_a_zombie_is_not_waited_for(tmp_path: Path) -> None:
    """The server and its worker both end at SIGINT; the worker, its parent gone, stays a zombie: ended, so
    the stop returns at once (1.5 s allowed for a loaded machine) instead of waiting out SIGINT's grace (3 s)
    and the next signals' for it."""
    log = tmp_path / "server.log"
    with unreaped_orphans():
        started = ServerProcess(ServerCommand(command=(sys.executable, "-c", WORKER_OF_THE_SAME_GROUP)), log)
        wait_for(lambda: log_tail(log))
        worker = int(log_tail(log)[0])
        try:
            started.watch()
            begun = time.monotonic()
            report = started.stop(((signal.SIGINT, 3.0), (signal.SIGTERM, 3.0), (signal.SIGKILL, 3.0)))
            assert time.monotonic() - begun < 1.5 and report.exit_code == -signal.SIGINT
            assert psutil.Process(worker).status() == psutil.STATUS_ZOMBIE
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.kill(worker, signal.SIGKILL)
            with contextlib.suppress(ChildProcessError):
                os.waitpid(worker, 0)


# -- /metrics: the exposition ------------------------------------------------------------------------------


def test_the_exposition_rules_by_hand() -> None:
    """A comment is skipped even when a number follows its ``#``; a label value may hold ``{``; a sample's
    timestamp is not its value; a value that is not a number skips its line only."""
    text = (
        "# 1 comment that starts with a number\n"
        'tgi_queue_size{shard="{0}"} 2\n'
        "sglang:num_queue_reqs 5 1700000000\n"
        "vllm:num_requests_running unknown\n"
        "vllm:num_requests_waiting 4\n"
    )
    assert parse_exposition(text) == [
        ("tgi_queue_size", 'shard="{0}"', 2.0),
        ("sglang:num_queue_reqs", "", 5.0),
        ("vllm:num_requests_waiting", "", 4.0),
    ]


def test_a_scrape_keeps_its_moment_and_labels_and_replaces_bytes_that_are_not_utf8() -> None:
    body = b'vllm:num_requests_waiting{model_name="caf\xe9"} 3\n'
    with raw_server(lambda n, path: http(200, body)) as (url, _asked):
        before = time.time_ns()
        [event] = Scraper((f"{url}/metrics",), emit=lambda events: None).scrape_once()
        after = time.time_ns()
    assert isinstance(event, ServerMetric)
    assert (event.name, event.labels, event.value) == ("vllm:num_requests_waiting", 'model_name="caf\ufffd"', 3.0)
    assert event.common == "requests_waiting" and before <= event.wall_ns <= after


@pytest.mark.parametrize(
    ("body", "kept"),
    [
        # 25 bytes are read (the cap, 24, and one): 4 + 6 + 8 = 18 bytes of whole lines, then "d 4 17" of
        # "d 4 1700000000": cut at the cap, the partial line is dropped
        (b"a 1\nbb 22\nccc 333\nd 4 1700000000\n", [("a", 1.0), ("bb", 22.0), ("ccc", 333.0)]),
        # exactly the cap (24 bytes, no final newline): whole, its last line kept
        (b"a 1\nbb 22\nccc 333\nd 4 17", [("a", 1.0), ("bb", 22.0), ("ccc", 333.0), ("d", 4.0)]),
    ],
    ids=["past-the-cap", "at-the-cap"],
)
def test_an_answer_past_the_byte_cap_is_cut_at_its_last_whole_line(
    monkeypatch: pytest.MonkeyPatch, body: bytes, kept: list[tuple[str, float]]
) -> None:
    monkeypatch.setattr(scrape, "MAX_BYTES", 24)
    with raw_server(lambda n, path: http(200, body)) as (url, _asked):
        events = Scraper((f"{url}/metrics",), emit=lambda events: None).scrape_once()
    assert [(e.name, e.value) for e in events if isinstance(e, ServerMetric)] == kept


def test_a_scrape_reads_no_more_than_one_byte_past_the_cap(monkeypatch: pytest.MonkeyPatch) -> None:
    """A server that says 1,000 bytes and sends 25 (the cap, 24, and one), then holds the connection: the
    scrape has what it needs and does not wait for the rest."""
    monkeypatch.setattr(scrape, "MAX_BYTES", 24)
    monkeypatch.setattr(scrape, "TIMEOUT_S", 0.3)  # a read that waits for more than it was sent fails then
    body = b"a 1\nbb 22\nccc 333\nd 4 170"
    with raw_server(lambda n, path: http(200, body, length=1000), hold=True) as (url, _asked):
        events = Scraper((f"{url}/metrics",), emit=lambda events: None).scrape_once()
    assert [e.name for e in events if isinstance(e, ServerMetric)] == ["a", "bb", "ccc"]


def test_a_scrape_gives_up_after_its_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    """A listener that never accepts (the connection waits in its backlog, unanswered): the scrape times out
    after TIMEOUT_S (0.1 s here), not when the listener goes (closed by a timer after 1 s)."""
    monkeypatch.setattr(scrape, "TIMEOUT_S", 0.1)
    listener = socket.create_server(("127.0.0.1", 0))
    closer = threading.Timer(1.0, listener.close)
    closer.start()
    try:
        with pytest.raises(TimeoutError):
            Scraper((f"http://127.0.0.1:{listener.getsockname()[1]}/metrics",), emit=lambda events: None).scrape_once()
    finally:
        closer.cancel()
        listener.close()


# -- the scraper's thread ----------------------------------------------------------------------------------


def scraped(
    monkeypatch: pytest.MonkeyPatch, answer: Callable[[int, str], bytes | None]
) -> tuple[list[list[Event]], list[str], str, tuple[int, int]]:
    """What a scraper emitted (each list as emitted) until it went off, the paths it asked, the URL it asked,
    and the wall clock around its run; scrapes 10 ms apart (0.5 s in production)."""
    monkeypatch.setattr(scrape, "SCRAPE_INTERVAL_S", 0.01)
    emitted: list[list[Event]] = []
    with raw_server(answer) as (url, asked):
        scraper = Scraper((f"{url}/metrics",), emit=emitted.append)
        before = time.time_ns()
        scraper.start()
        wait_for(lambda: emitted and isinstance(emitted[-1][-1], ProbeOff), within_s=3)
        after = time.time_ns()
        scraper.stop()
    return emitted, asked, f"{url}/metrics", (before, after)


def test_a_scraper_that_never_had_an_answer_goes_off_after_three_dropped_scrapes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    emitted, asked, _url, (before, after) = scraped(monkeypatch, lambda n, path: None)
    assert len(asked) == 3  # FAILURES_BEFORE_OFF
    [[off]] = emitted
    assert isinstance(off, ProbeOff) and (off.rank, off.probe) == (0, "server metrics")  # the client's rank
    assert (
        off.reason == "Remote end closed connection without response: the server publishes no Prometheus metrics there"
    )
    assert before <= off.wall_ns <= after


def test_a_scraper_that_had_answers_counts_failures_in_a_row_from_its_last_answer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Answered, dropped, answered (the same series, so nothing emitted), then dropped three times: off at the
    sixth scrape (the count starts again at the answer), saying how many failed in a row."""
    answers = {1: http(200, b"x 1\n"), 3: http(200, b"x 1\n")}
    emitted, asked, _url, _ = scraped(monkeypatch, lambda n, path: answers.get(n))
    assert len(asked) == 6
    [first], [off] = emitted
    assert isinstance(first, ServerMetric) and (first.name, first.value) == ("x", 1.0)
    assert isinstance(off, ProbeOff)
    assert off.reason == "3 scrapes in a row failed (Remote end closed connection without response); not asked again"


def test_a_first_answer_without_metrics_sends_it_off_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    emitted, asked, url, _ = scraped(monkeypatch, lambda n, path: http(404))
    assert len(asked) == 1
    [[off]] = emitted
    assert isinstance(off, ProbeOff)
    assert off.reason == f"GET {url} answered HTTP 404: the server publishes no Prometheus metrics there"


def test_the_scrapers_thread_is_named_and_does_not_hold_meshtop_at_exit(monkeypatch: pytest.MonkeyPatch) -> None:
    """Named for a stack dump (py-spy, faulthandler); a daemon, so a scraper left running never keeps the
    interpreter from exiting. Its stop waits at most TIMEOUT_S + 1 for a scrape in flight: here a scrape whose
    emit blocks, with TIMEOUT_S set to -0.75 for the stop (its wait, 0.25 s) after the scrape began."""
    entered, release = threading.Event(), threading.Event()

    def emit(events: list[Event]) -> None:
        entered.set()
        release.wait(3)

    with raw_server(lambda n, path: http(200, b"x 1\n")) as (url, _asked):
        scraper = Scraper((f"{url}/metrics",), emit=emit)
        scraper.start()
        try:
            assert entered.wait(3)
            [thread] = [t for t in threading.enumerate() if t.name == "meshtop-server-metrics"]
            assert thread.daemon
            monkeypatch.setattr(scrape, "TIMEOUT_S", -0.75)
            begun = time.monotonic()
            scraper.stop()
            waited_s = time.monotonic() - begun
            assert 0.25 <= waited_s < 0.9 and thread.is_alive()
        finally:
            release.set()
            thread.join(3)


# -- what use found ----------------------------------------------------------------------------------------

NOT_HTTP = b"SSH-2.0-OpenSSH_9.6\r\n"
"""What another service on the port answers: ``http.client``'s BadStatusLine, neither an OSError nor a
ValueError."""


def test_a_port_that_answers_something_other_than_http_is_waited_on_and_scraped_as_a_failure(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url, asked, failed = never_ready(tmp_path, lambda n, path: NOT_HTTP)
    assert asked == ["/health", "/v1/models"]
    assert str(failed).startswith(f"the server did not answer {url}/health or /v1/models within 0 s")
    emitted, asked, _url, _clock = scraped(monkeypatch, lambda n, path: NOT_HTTP)
    assert len(asked) == 3  # FAILURES_BEFORE_OFF: not a ValueError, so not off at the first
    [[off]] = emitted
    assert isinstance(off, ProbeOff)
    assert off.reason == "SSH-2.0-OpenSSH_9.6: the server publishes no Prometheus metrics there"


COUNTS_SIGINT = """
import signal, time
got = []
signal.signal(signal.SIGINT, lambda signum, frame: got.append(signum))
print("ready", flush=True)
while not got:
    time.sleep(0.01)
time.sleep(0.5)  # a second SIGINT meanwhile is counted
print(len(got), flush=True)
"""


def test_the_server_gets_its_sigint_once(tmp_path: Path) -> None:
    """An engine on uvicorn takes a second SIGINT as "exit now", cutting its clean shutdown short: the stop
    signals the server's process group, and no process of that group a second time."""
    log = tmp_path / "server.log"
    started = ServerProcess(ServerCommand(command=(sys.executable, "-c", COUNTS_SIGINT)), log)
    wait_for(lambda: log_tail(log))
    assert started.stop(QUICK_STOP).exit_code == 0
    assert log_tail(log) == ["ready", "1"]


ORPHAN_DEAF_TO_SIGINT = ORPHAN.replace("signal.SIG_DFL", "signal.SIG_IGN")


def test_a_worker_that_left_the_tree_and_ignores_sigint_is_stopped_by_the_next_signal(tmp_path: Path) -> None:
    """The server ends at SIGINT; its worker, out of the tree (its parent exited) but in the server's session,
    ignores SIGINT: the stop goes on to SIGTERM for it rather than ending with the tree it knew."""
    log = tmp_path / "server.log"
    started = ServerProcess(ServerCommand(command=(sys.executable, "-c", ORPHAN_DEAF_TO_SIGINT)), log)
    wait_for(lambda: log_tail(log))
    orphan = int(log_tail(log)[0])
    try:
        started.watch()
        assert started.stop(QUICK_STOP).exit_code == -signal.SIGINT
        wait_for(lambda: not running(orphan), within_s=1)
    finally:
        if running(orphan):
            os.kill(orphan, signal.SIGKILL)


def test_a_server_that_accepts_and_never_answers_is_asked_again_after_the_ask_timeout(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each poll waits ASK_TIMEOUT_S for its answer (50 ms here, 2 s in production), then the wait goes on:
    both URLs asked, the startup timeout (0 s) said, well within a second."""
    monkeypatch.setattr(server, "ASK_TIMEOUT_S", 0.05)
    with raw_server(lambda n, path: b"", hold=True) as (url, asked):
        started = ServerProcess(ServerCommand(command=SLEEPER, startup_timeout_s=0), tmp_path / "server.log")
        begun = time.monotonic()
        with pytest.raises(ServerFailed):
            started.wait_ready(Origin.parse(url), progress=lambda s, line: None)
        took_s = time.monotonic() - begun
    started.stop(QUICK_STOP)
    assert asked == ["/health", "/v1/models"] and 0.1 <= took_s < 1.0


# -- the clock's boundaries, a signal refused, a pid taken again -------------------------------------------


def clock(*readings: float) -> Callable[[], float]:
    """A ``time.monotonic`` that reads ``readings`` in turn, then the last one for good (a clock that stands
    still), so a boundary is met exactly rather than some microseconds past it."""
    left = list(readings)
    return lambda: left.pop(0) if len(left) > 1 else left[0]


def test_the_startup_timeout_is_said_once_the_clock_is_past_it_not_at_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A startup timeout of 0 s, the clock read as 1,000 s at the start: the deadline is 1,000 s. Read at 1,000 s
    again after the polls, the time is not past it: the wait goes on, here to the user's stop (set before);
    read at the next float after 1,000 s, it is: the one-line failure."""
    stop = threading.Event()
    stop.set()
    origin = nowhere()
    for after_the_polls, ended in ((1000.0, StartupStopped), (math.nextafter(1000.0, math.inf), ServerFailed)):
        with monkeypatch.context() as patch:
            patch.setattr(time, "monotonic", clock(1000.0, after_the_polls))
            started = ServerProcess(ServerCommand(command=SLEEPER, startup_timeout_s=0), tmp_path / "server.log")
            with pytest.raises(ended):
                started.wait_ready(origin, progress=lambda s, line: None, stop=stop)
        started.stop(QUICK_STOP)


def said_on_a_clock(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, after_the_polls: float) -> list[tuple[float, str]]:
    """What a wait says about the startup of a server that printed "loading weights", the clock read as 1,000 s
    at the start and ``after_the_polls`` from then on, until the user's stop (set before) ends it at once."""
    log = tmp_path / "server.log"
    log.write_text("loading weights\n")
    stop = threading.Event()
    stop.set()
    origin = nowhere()
    heard: list[tuple[float, str]] = []
    with monkeypatch.context() as patch:
        patch.setattr(time, "monotonic", clock(1000.0, after_the_polls))
        started = ServerProcess(ServerCommand(command=SLEEPER), log)
        with pytest.raises(StartupStopped):
            started.wait_ready(origin, progress=lambda s, line: heard.append((s, line)), stop=stop)
    started.stop(QUICK_STOP)
    return heard


def test_the_startup_is_said_once_the_progress_interval_has_passed_to_the_last_float(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """PROGRESS_EVERY_S is 5 s: read at 1,005 s after the first polls (5 s since the start, exactly), the
    startup is said, with the 5 s and the log's last line; read at the float just below 1,005 s, not yet."""
    assert said_on_a_clock(tmp_path, monkeypatch, 1005.0) == [(5.0, "loading weights")]
    assert said_on_a_clock(tmp_path, monkeypatch, math.nextafter(1005.0, 0.0)) == []


SLOW_TO_END_AT_SIGINT = """
import signal, sys, time
def shut_down(signum, frame):
    time.sleep(1.5)  # a clean shutdown that takes a while
    sys.exit(7)
signal.signal(signal.SIGINT, shut_down)
print("ready", flush=True)
time.sleep(30)
"""


def test_a_grace_of_zero_goes_on_to_the_next_signal_at_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """On a clock that stands still at 1,000 s, SIGINT's grace of 0 s ends at 1,000 s: the clock at the grace's
    end is not within it, so SIGTERM follows at once, during the server's clean shutdown (1.5 s): it ends by
    SIGTERM, not with its own code 7. A timer kills it after 5 s should the stop wait on a clock that never
    moves."""
    log = tmp_path / "server.log"
    started = ServerProcess(ServerCommand(command=(sys.executable, "-c", SLOW_TO_END_AT_SIGINT)), log)
    wait_for(lambda: log_tail(log))

    def kill_it() -> None:
        if running(started.process.pid):
            os.kill(started.process.pid, signal.SIGKILL)

    safety = threading.Timer(5.0, kill_it)
    safety.start()
    try:
        with monkeypatch.context() as patch:
            patch.setattr(time, "monotonic", clock(1000.0))
            report = started.stop(((signal.SIGINT, 0.0), (signal.SIGTERM, 2.0)))
    finally:
        safety.cancel()
        started.stop(QUICK_STOP)
    assert report.exit_code == -signal.SIGTERM


@contextmanager
def as_nobody() -> Iterator[None]:
    """This process as the user nobody (65534), real and effective, its saved user id kept root so that it
    can come back: without CAP_KILL meanwhile, so a signal to a process of root's is refused (EPERM)."""
    os.setresuid(65534, 65534, 0)
    try:
        yield
    finally:
        os.setresuid(0, 0, 0)


def test_a_stop_refused_the_right_to_signal_reports_the_server_still_running(tmp_path: Path) -> None:
    """Stopped by a user who may not signal the server (this process as nobody, the server root's): the
    signal to its process group and the one to its worker in a session of its own are both refused (EPERM),
    which is no error: the stop gives up after the grace (50 ms) with no exit code, and both still run."""
    if os.geteuid() != 0:
        pytest.skip("needs root, to start a server as root and then lose the right to signal it")
    log = tmp_path / "server.log"
    started = ServerProcess(ServerCommand(command=(sys.executable, "-c", WORKER_IN_ITS_OWN_SESSION)), log)
    wait_for(lambda: log_tail(log))
    worker = int(log_tail(log)[0])
    try:
        with as_nobody():
            report = started.stop(((signal.SIGINT, 0.05),))
        assert report.exit_code is None
        assert running(started.process.pid) and running(worker)
    finally:
        started.stop(QUICK_STOP)
        if running(worker):
            os.kill(worker, signal.SIGKILL)


CLONE_AT = """
import ctypes, os, signal, struct, sys
wanted = (ctypes.c_int * 1)(int(sys.argv[1]))
# struct clone_args, 11 x u64: flags, pidfd, child_tid, parent_tid, exit_signal, stack, stack_size, tls,
# set_tid, set_tid_size, cgroup
args = struct.pack("11Q", 0, 0, 0, 0, signal.SIGCHLD, 0, 0, 0, ctypes.addressof(wanted), 1, 0)
syscall = ctypes.PyDLL(None, use_errno=True).syscall  # PyDLL: the GIL is held across the fork
syscall.restype = ctypes.c_long
pid = syscall(ctypes.c_long(435), ctypes.c_char_p(args), ctypes.c_size_t(len(args)))  # clone3
if pid == 0:
    os.execvp("sleep", ["sleep", "30"])
print(pid if pid > 0 else -ctypes.get_errno(), flush=True)
if pid > 0:
    os.waitpid(pid, 0)
"""
"""Starts ``sleep 30`` at the pid given (clone3's set_tid, Linux 5.5; root), prints the pid (or minus the errno),
and waits for it."""


def test_a_process_that_took_the_pid_of_a_server_that_ended_is_neither_signalled_nor_measured(tmp_path: Path) -> None:
    """The server (``true``) ended and was reaped; a process unrelated to it (``sleep``, in this test's session,
    placed at that pid by clone3) now holds its pid. The stop finds nothing of the server running and signals
    nothing: the exit code is the server's, 0, and the unrelated process still runs. Nor is it measured as the
    server: the server was never watched while it ran, so its report has no CPU time and no peak memory."""
    if os.geteuid() != 0:
        pytest.skip("placing a process at a given pid needs root")
    started = ServerProcess(ServerCommand(command=("true",)), tmp_path / "server.log")
    wait_for(lambda: started.exited() is not None)  # reaped: its pid is free again
    pid = started.process.pid
    helper = subprocess.Popen([sys.executable, "-c", CLONE_AT, str(pid)], stdout=subprocess.PIPE, text=True)
    assert helper.stdout is not None
    placed = int(helper.stdout.readline())
    try:
        if placed < 0:  # ENOSYS (clone3 filtered, as under Docker's default seccomp), EPERM, E2BIG (a kernel
            # before 5.5, without set_tid), EEXIST (the pid taken meanwhile)
            pytest.skip(f"this machine cannot place a process at a given pid ({os.strerror(-placed)})")
        assert placed == pid
        wait_for(lambda: psutil.Process(pid).cmdline() == ["sleep", "30"])
        report = started.stop(QUICK_STOP)
        assert (report.exit_code, report.cpu_s, report.peak_rss_bytes) == (0, None, None)
        assert running(pid)
    finally:
        if placed > 0:
            with contextlib.suppress(ProcessLookupError):
                os.kill(placed, signal.SIGKILL)
        helper.wait(5)
