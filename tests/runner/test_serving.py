"""A load sent to a real OpenAI-compatible server (``transformers serve`` on the CPU, a tiny Llama built in the
test): every request recorded as the server counted it, the same load sent again, compared, a server killed
mid-load, and bad endpoints refused in one line."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import psutil
import pytest

from meshtop.probes.events import RequestDone
from meshtop.recordings.compare import compare
from meshtop.recordings.reader import open_recording
from meshtop.runner.serving.load import LoadRequest, request_from_json
from tests.kit.commands import meshtop, run_meshtop
from tests.kit.hf_server import Server, needs_serving, serving
from tests.kit.ports import free_port

pytestmark = [pytest.mark.slow, needs_serving]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    with serving(tmp_path_factory.mktemp("server")) as running:
        yield running


def requests_of(directory: Path) -> list[RequestDone]:
    """The recording's request events, in request id order."""
    table = open_recording(directory).table("request")
    events = [RequestDone(**{k: v for k, v in row.items()}) for row in table.to_dict("records")]
    return sorted(events, key=lambda event: event.request)


def load_of(directory: Path) -> list[LoadRequest]:
    return [request_from_json(json.loads(line)) for line in (directory / "load.jsonl").read_text().splitlines()]


def summary(directory: Path) -> dict[str, object]:
    done = run_meshtop("summary", directory, "--json")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def answer_alone(server: Server, request: LoadRequest) -> dict[str, int]:
    """The server's usage for ``request`` sent on its own, not streamed: what the load should have counted."""
    body = {"model": server.model, "prompt": request.prompt.text, "max_tokens": request.output_len, "temperature": 0.0}
    call = urllib.request.Request(
        f"{server.url}/v1/completions", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(call, timeout=60) as response:
        return json.loads(response.read())["usage"]


def test_a_closed_loop_load_is_recorded_request_by_request_as_the_server_counted_it(
    server: Server, tmp_path: Path
) -> None:
    out = tmp_path / "closed"
    done = run_meshtop(
        "record", out, "--endpoint", server.url, "--requests", "16", "--concurrency", "4",
        "--input-len", "8:24", "--output-len", "4:12", "--warmup", "2", "--seed", "3",
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "completed" in done.stdout and "16/16" in done.stdout
    planned = load_of(out)
    assert [request.warmup for request in planned] == [True] * 2 + [False] * 16
    events = requests_of(out)
    assert [event.request for event in events] == [request.id for request in planned]  # warmup recorded, marked
    assert [event.warmup for event in events] == [request.warmup for request in planned]
    for event, request in zip(events, planned, strict=True):
        assert event.status == "completed" and event.tokens_from == "usage", event
        assert event.first_token_ns is not None and event.arrival_ns <= event.first_token_ns <= event.end_ns
        assert event.scheduled_ns is not None and event.scheduled_ns <= event.arrival_ns
        alone = answer_alone(server, request)  # greedy: the same answer when sent alone
        assert (event.prompt_tokens, event.output_tokens) == (alone["prompt_tokens"], alone["completion_tokens"])
        assert 1 <= len(event.token_ns) <= event.output_tokens  # a chunk holds one token or more
    figures = summary(out)["requests"]
    assert (figures["count"], figures["completed"], figures["failed"], figures["warmup"]) == (16, 16, 0, 2)
    assert figures["tokens_from"] == {"usage": 16}  # type: ignore[index]
    measured = [event for event in events if not event.warmup]
    assert figures["output_tokens_per_s"] == pytest.approx(  # type: ignore[index]
        sum(event.output_tokens for event in measured)
        / ((max(e.end_ns for e in measured) - min(e.arrival_ns for e in measured)) / 1e9)
    )


def test_the_same_seed_and_same_load_send_the_same_prompts_at_the_same_offsets(server: Server, tmp_path: Path) -> None:
    load = ["--requests", "16", "--request-rate", "8", "--output-len", "6", "--seed", "5", "--warmup", "2"]
    first, second, again = tmp_path / "a", tmp_path / "b", tmp_path / "c"
    for out, options in ((first, load), (second, load), (again, ["--same-load", str(first)])):
        done = run_meshtop("record", out, "--endpoint", server.url, *options)
        assert done.returncode == 0, done.stdout + done.stderr
    assert (first / "load.jsonl").read_text() == (second / "load.jsonl").read_text()
    assert (first / "load.jsonl").read_text() == (again / "load.jsonl").read_text()
    assert json.loads((again / "manifest.json").read_text())["endpoint"]["same_load"] == str(first)
    for out in (first, second, again):
        planned = {request.id: request.offset_s for request in load_of(out) if not request.warmup}
        events = [event for event in requests_of(out) if not event.warmup]
        assert len(events) == 16
        starts = {event.scheduled_ns - round(planned[event.request] * 1e9) for event in events}
        assert max(starts) - min(starts) <= 1_000  # every request meant for its own offset from one start
        start = min(starts)
        for event in events:
            sent_offset_s = (event.arrival_ns - start) / 1e9
            # sent at its offset give or take the machine's scheduling: 5.2 ms late once on the 2-core VM while
            # other tests loaded it (the send lag itself is measured and judged: the "client-limited" verdict)
            assert sent_offset_s == pytest.approx(planned[event.request], abs=0.02), event
    comparison = compare(open_recording(first), open_recording(again))
    assert comparison["warnings"] == []
    assert comparison["failures"] == []
    rows = {row["name"]: row for row in comparison["metrics"]}
    assert rows["failed requests"]["a"] == rows["failed requests"]["b"] == 0
    # both runs' TTFT compared; whether they differ is the machine's: a real server on 2 shared cores gave one
    # run 29 ms and its same-load rerun 17 ms (p50) in a CI rehearsal (compare's verdict on noise alone is
    # tests/recordings/test_compare_export.py's, on controlled values)
    assert rows["TTFT p50 (ms)"]["a"] > 0 and rows["TTFT p50 (ms)"]["b"] > 0, rows["TTFT p50 (ms)"]
    listing = run_meshtop("compare", first, second)
    assert listing.returncode == 0 and "TTFT p99 (ms)" in listing.stdout, listing.stderr


def test_a_chat_load_from_a_prompts_file(server: Server, tmp_path: Path) -> None:
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(
        json.dumps({"messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "the fox"}]})
        + "\n"
        + json.dumps({"messages": [{"role": "user", "content": "the lazy dog jumps"}]})
        + "\n"
    )
    out = tmp_path / "chat"
    done = run_meshtop(
        "record", out, "--endpoint", f"{server.url}/v1", "--api", "chat", "--prompts", prompts, "--requests", "6",
        "--concurrency", "2", "--output-len", "5",
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    events = requests_of(out)
    assert len(events) == 6 and all(e.status == "completed" and e.output_tokens == 5 for e in events), events
    assert {request.prompt.messages for request in load_of(out)} <= {
        (("system", "be brief"), ("user", "the fox")),
        (("user", "the lazy dog jumps"),),
    }


class NotOpenAI(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(404)
        self.end_headers()
        self.wfile.write(b"<html>no such page</html>")

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def not_openai() -> Iterator[str]:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), NotOpenAI)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


def test_bad_endpoints_are_one_line_and_exit_2_before_any_load(server: Server, not_openai: str, tmp_path: Path) -> None:
    cases = {
        "unreachable": ([f"http://127.0.0.1:{free_port()}"], "cannot reach the server"),
        "not openai": ([not_openai], "answered HTTP 404"),
        "unknown model": ([server.url, "--model", "nope"], f"serves {server.model}"),
        "refused body": ([server.url, "--ignore-eos"], "the server refused a completions request"),
        "not a url": (["ftp://x"], "is not an http:// or https:// URL"),
        "bad slo": ([server.url, "--slo", "ttft=fast"], "give ttft=TIME and/or tpot=TIME"),
        "built-in option": ([server.url, "--tp", "2"], "--tp sets up the built-in model"),
        "a training recipe": ([server.url, "--precision", "mixed"], "--precision sets up the built-in model"),
        "lone burstiness": ([server.url, "--burstiness", "0.5"], "give --request-rate too"),
    }
    for name, (options, words) in cases.items():
        out = tmp_path / name.replace(" ", "-")
        done = run_meshtop("record", out, "--endpoint", *options)
        assert done.returncode == 2, (name, done.stdout, done.stderr)
        assert len(done.stderr.strip().splitlines()) == 1 and words in done.stderr, (name, done.stderr)
        assert not out.exists(), name
    done = run_meshtop("record", tmp_path / "x", "--warmup", "3")  # an endpoint's option without --endpoint
    assert done.returncode == 2 and "give --endpoint URL" in done.stderr


def test_a_server_meshtop_starts_is_waited_for_loaded_and_gone_after(server: Server, tmp_path: Path) -> None:
    """``-- SERVER COMMAND``: started, its startup said, asked once up, loaded, stopped with its whole tree;
    one that dies at start is one line with its last words, exit 1, the recording kept."""
    port = free_port()
    command = [
        sys.executable, "-c", "from transformers.cli.transformers import main; main()", "serve", server.model,
        "--host", "127.0.0.1", "--port", str(port), "--device", "cpu",
    ]  # fmt: skip
    out = tmp_path / "started"
    env = {"OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "HF_HUB_DISABLE_UPDATE_CHECK": "1"}
    done = run_meshtop(
        "record", out, "--endpoint", f"http://127.0.0.1:{port}", "--requests", "6", "--concurrency", "2",
        "--output-len", "4", "--", *command, env=env,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "server ready after" in done.stdout and "server: started by meshtop" in done.stdout, done.stdout
    endpoint = json.loads((out / "manifest.json").read_text())["endpoint"]
    assert endpoint["model"] == server.model  # asked of the server once it was up
    started = endpoint["server"]
    assert started["command"] == command and started["exit_code"] is not None and started["startup_s"] > 0
    assert started["log_tail"] and (out / "server.log").stat().st_size > 0
    assert summary(out)["requests"]["completed"] == 6  # type: ignore[index]
    assert not [p.pid for p in psutil.process_iter(["cmdline"]) if str(port) in " ".join(p.info["cmdline"] or [])]

    out = tmp_path / "dead"
    dying = [sys.executable, "-c", "print('loading weights'); print('boom: no such model'); raise SystemExit(3)"]
    done = run_meshtop("record", out, "--endpoint", f"http://127.0.0.1:{free_port()}", "--", *dying)
    assert done.returncode == 1, done.stdout + done.stderr
    [line] = [line for line in done.stdout.splitlines() if line.startswith("failed after")]
    assert "the server exited with code 3 before it answered" in line and "boom: no such model" in line, line
    assert summary(out)["run"]["status"] == "failed"  # type: ignore[index]


def test_a_server_killed_mid_load_stops_the_load_and_keeps_the_recording(server: Server, tmp_path: Path) -> None:
    """The module's server, killed: so this is the module's last test (a server of its own would cost CI
    15 s or more to start). Once 5 requests in a row are refused the server is gone: the rest is not sent."""
    out = tmp_path / "killed"
    load = ["--requests", "400", "--concurrency", "4", "--output-len", "8"]
    process = subprocess.Popen(
        meshtop("record", out, "--endpoint", server.url, *load),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    requests_file = out / "events" / "request.jsonl"
    deadline = time.monotonic() + 120
    while not (requests_file.exists() and requests_file.read_text().count("\n") >= 8):
        assert time.monotonic() < deadline and process.poll() is None, process.communicate()
        time.sleep(0.1)
    server.kill()
    stdout, stderr = process.communicate(timeout=120)
    assert process.returncode == 1, stdout + stderr
    [line] = [line for line in stdout.splitlines() if line.startswith("failed after")]
    assert "the server is gone (5 requests in a row were refused): the load was stopped, " in line, line
    figures = summary(out)
    assert figures["run"]["status"] == "failed"  # type: ignore[index]
    requests = figures["requests"]
    assert 8 <= requests["completed"] < 400 and requests["not_sent"] > 0  # type: ignore[index,operator]
    assert requests["completed"] + requests["failed"] + requests["not_sent"] == 400  # type: ignore[index,operator]
    reasons = {row["reason"]: row["count"] for row in requests["failures"]}  # type: ignore[index]
    # the 5th refusal in a row stops the load; the other 3 clients may each have sent one more by then
    assert 5 <= reasons["connection refused"] <= 8, reasons
    assert set(reasons) <= {
        "connection refused",
        "connection reset by the server",
        "the server closed the connection mid-answer",
    }, reasons
