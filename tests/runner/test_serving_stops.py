"""A load sent as a user sends it (issue 47), against a minimal streaming server: a server that dies mid-load
stops the load, a load stopped by the user counts what it never sent apart from what failed, the recorded
load is what --same-load sends again, and the options' and alerts' words are true for an endpoint."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psutil
import pytest

from meshtop.tui.alerts import alerts_of
from tests.kit.commands import meshtop, one_line_error, run_meshtop, summary_json
from tests.kit.ports import free_port
from tests.kit.screen import replayed
from tests.kit.sse_server import stub_server

REPOSITORY = Path(__file__).resolve().parents[2]
"""Where ``python -m tests.kit.sse_server`` is found."""


@contextmanager
def stub_process(*args: str) -> Iterator[tuple[subprocess.Popen[str], str]]:
    """The stub server in a process of its own (one to kill), on a free port: it and its URL."""
    process = subprocess.Popen(
        [sys.executable, "-m", "tests.kit.sse_server", *args], stdout=subprocess.PIPE, text=True, cwd=REPOSITORY
    )
    try:
        assert process.stdout is not None
        yield process, f"http://127.0.0.1:{int(process.stdout.readline())}"
    finally:
        process.kill()
        process.wait(10)


def recording(out: Path, *args: str | Path) -> subprocess.Popen[str]:
    """``meshtop record OUT ARGS`` started, its output captured."""
    return subprocess.Popen(
        meshtop("record", out, *args), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPOSITORY
    )


def wait_for_requests(out: Path, count: int, process: subprocess.Popen[str]) -> None:
    """Until the recording holds ``count`` request events (its tables are flushed five times a second)."""
    requests_file = out / "events" / "request.jsonl"
    deadline = time.monotonic() + 120
    while not (requests_file.exists() and requests_file.read_text().count("\n") >= count):
        assert time.monotonic() < deadline and process.poll() is None, process.communicate()
        time.sleep(0.05)


def failed_line(stdout: str) -> str:
    [line] = [line for line in stdout.splitlines() if line.startswith("failed after")]
    return line


def test_a_server_killed_mid_load_is_gone_after_5_refusals_and_the_rest_is_not_sent(tmp_path: Path) -> None:
    """Issue 47: 233 requests were sent to a refused port after the server's SIGKILL. 5 refused in a row stop
    the load; the 3 other clients may each have sent one more by then."""
    out = tmp_path / "killed"
    with stub_process("4", "20") as (server, url):  # 4 chunks 20 ms apart: about 60 ms a request
        process = recording(out, "--endpoint", url, "--requests", "400", "--concurrency", "4")
        wait_for_requests(out, 8, process)
        server.kill()
        stdout, stderr = process.communicate(timeout=120)
    assert process.returncode == 1, stdout + stderr
    requests = summary_json(out)["requests"]
    assert requests["completed"] >= 8 and requests["not_sent"] > 0, requests
    assert requests["completed"] + requests["failed"] + requests["not_sent"] == 400
    line = failed_line(stdout)
    assert (
        "the server is gone (5 requests in a row were refused): the load was stopped, "
        f"{requests['not_sent']:,} of 400 requests not sent; " in line
    ), line
    reasons = {row["reason"]: row["count"] for row in requests["failures"]}
    assert 5 <= reasons.pop("connection refused") <= 8, requests["failures"]
    assert set(reasons) <= {"connection reset by the server", "the server closed the connection mid-answer"}


def test_a_server_meshtop_started_that_dies_mid_load_stops_the_load_at_once(tmp_path: Path) -> None:
    """Its process gone is enough: 2 requests a second would take 2.5 s to be refused 5 times in a row."""
    port = free_port()
    out = tmp_path / "exited"
    command = [sys.executable, "-m", "tests.kit.sse_server", "2", "--port", str(port)]
    load = ["--requests", "400", "--request-rate", "2", "--burstiness", "1e4"]
    process = recording(out, "--endpoint", f"http://127.0.0.1:{port}", *load, "--", *command)
    wait_for_requests(out, 2, process)
    [started] = [p for p in psutil.process_iter(["cmdline"]) if p.info["cmdline"] == command]
    started.kill()
    stdout, stderr = process.communicate(timeout=60)
    assert process.returncode == 1, stdout + stderr
    requests = summary_json(out)["requests"]
    assert requests["completed"] + requests["failed"] + requests["not_sent"] == 400 and requests["not_sent"] > 390
    line = failed_line(stdout)
    assert (
        "the server exited with signal SIGKILL during the load: the load was stopped, "
        f"{requests['not_sent']:,} of 400 requests not sent" in line
    ), line


def test_a_load_stopped_by_the_user_counts_what_it_never_sent_apart_from_the_failed(tmp_path: Path) -> None:
    """A load stopped by the user: those in flight at the stop (at most the 2 clients') are interrupted; the
    rest were not sent, and are not failed (the summary, its text and the closing line say how many)."""
    out = tmp_path / "stopped"
    with stub_server(chunks=4, gap_s=0.02) as server:
        process = recording(out, "--endpoint", server.url, "--requests", "2000", "--concurrency", "2")
        wait_for_requests(out, 6, process)
        process.send_signal(signal.SIGINT)
        stdout, stderr = process.communicate(timeout=60)
    assert process.returncode == 130, stdout + stderr
    requests = summary_json(out)["requests"]
    assert requests["failed"] <= 2 and requests["count"] == requests["completed"] + requests["failed"], requests
    assert {row["reason"] for row in requests["failures"]} <= {"interrupted: the load was stopped"}
    assert requests["not_sent"] == 2000 - requests["count"] and requests["not_sent"] > 1000
    assert f"not sent {requests['not_sent']}" in run_meshtop("summary", out).stdout.splitlines()[2]
    assert f"{requests['not_sent']} not sent)" in stdout.split("interrupted after")[1]


def test_same_load_sends_the_recorded_load_jsonl_not_what_its_seed_plans(tmp_path: Path) -> None:
    """The first run's load.jsonl edited: the second run sends the edited prompts and lengths."""
    first, again = tmp_path / "first", tmp_path / "again"
    with stub_server(chunks=2) as server:
        done = run_meshtop("record", first, "--endpoint", server.url, "--requests", "3", "--concurrency", "1")
        assert done.returncode == 0, done.stdout + done.stderr
        planned = [json.loads(line) for line in (first / "load.jsonl").read_text().splitlines()]
        edited = [{**line, "prompt": f"edited {line['id']}", "max_tokens": 3 + line["id"]} for line in planned]
        (first / "load.jsonl").write_text("".join(json.dumps(line) + "\n" for line in edited))
        server.bodies.clear()
        done = run_meshtop("record", again, "--endpoint", server.url, "--same-load", first)
        bodies = list(server.bodies)
    assert done.returncode == 0, done.stdout + done.stderr
    assert (again / "load.jsonl").read_text() == (first / "load.jsonl").read_text()
    sent = [(body["prompt"], body["max_tokens"]) for body in bodies if body["prompt"] != "hello"]  # not the probe
    assert sent == [("edited 0", 3), ("edited 1", 4), ("edited 2", 5)]


def test_probe_off_on_an_endpoint_run_names_no_ranks(tmp_path: Path) -> None:
    """An endpoint's probes are this machine's and the server's: "on every rank" was not true of them."""
    out = tmp_path / "no-metrics"
    with stub_server(chunks=4, gap_s=0.05) as server:
        done = run_meshtop("record", out, "--endpoint", server.url, "--requests", "4", "--concurrency", "1")
    assert done.returncode == 0, done.stdout + done.stderr
    texts = [alert.text for alert in alerts_of(replayed(out)) if alert.text.startswith("probe off")]
    assert texts == [
        f"probe off: server metrics: GET {server.url}/metrics answered HTTP 404: "
        "the server publishes no Prometheus metrics there"
    ]


def test_a_bare_slo_number_is_refused_asking_for_its_unit(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 47: ttft=0.5 was read as 0.5 ms and no request met it."""
    line = one_line_error(
        ["record", str(tmp_path / "x"), "--endpoint", "http://127.0.0.1:9", "--slo", "ttft=0.5,tpot=0.05"], capsys
    )
    assert line == "meshtop: error: --slo 'ttft=0.5,tpot=0.05': ttft=0.5 has no unit: give one, such as 500ms or 0.5s"
    assert not (tmp_path / "x").exists()


def test_same_load_names_the_load_options_given_burstiness_too(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base = ["record", str(tmp_path / "x"), "--endpoint", "http://127.0.0.1:9", "--same-load", str(tmp_path / "a")]
    assert one_line_error([*base, "--burstiness", "0.5"], capsys) == (
        "meshtop: error: --same-load repeats a recorded load, its shape and seed included: leave out --burstiness"
    )
    assert one_line_error([*base, "--request-rate", "3", "--burstiness", "0.5", "--seed", "4"], capsys) == (
        "meshtop: error: --same-load repeats a recorded load, its shape and seed included: leave out "
        "--request-rate, --burstiness and --seed"
    )


def test_an_endpoint_error_names_the_url_with_its_path(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url = f"http://127.0.0.1:{free_port()}/v2"
    line = one_line_error(["record", str(tmp_path / "x"), "--endpoint", url, "--requests", "1"], capsys)
    assert line.startswith(f"meshtop: error: --endpoint {url}: cannot reach the server ("), line
