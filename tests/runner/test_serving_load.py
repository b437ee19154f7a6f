"""The endpoint load (planned from options and a seed), the HTTP client, and the load generator, against a
minimal streaming server: no model, no ranks."""

from __future__ import annotations

import asyncio
import json
import statistics
import time
from dataclasses import replace
from pathlib import Path

import pytest

from meshtop.probes.events import Event, RequestDone
from meshtop.probes.sink import EventSink
from meshtop.recordings.manifest import Load
from meshtop.recordings.metrics.requests import RequestFold
from meshtop.runner.errors import PlanError
from meshtop.runner.load import PlannedRequest, arrival_offsets_s
from meshtop.runner.serving import endpoint
from meshtop.runner.serving.client import ClientSpec, LoadGenerator, chunk_text, request_body
from meshtop.runner.serving.endpoint import served_models
from meshtop.runner.serving.http import Origin, Pool, RequestFailed, error_message
from meshtop.runner.serving.load import (
    DURATION_REQUESTS,
    WORDS,
    LoadRequest,
    Prompt,
    check_load,
    plan_load,
    read_prompts,
    request_from_json,
    request_to_json,
    requests_for,
)
from meshtop.tui.endpoint_options import parse_slo
from tests.kit.commands import run_meshtop, summary_json
from tests.kit.sse_server import MODEL, stub_server


def test_the_same_options_and_seed_plan_the_same_load_and_another_seed_another() -> None:
    load = Load(requests=50, concurrency=None, request_rate_per_s=5.0, warmup=3, prompt_len=(4, 9), seed=7)
    planned = plan_load(load)
    assert plan_load(load) == planned
    assert plan_load(replace(load, seed=8)) != planned
    assert [request.id for request in planned] == list(range(53))
    assert [request.warmup for request in planned] == [True] * 3 + [False] * 50
    assert all(request.offset_s is None for request in planned[:3])
    offsets = [request.offset_s for request in planned[3:]]
    assert offsets == sorted(offsets) and offsets == arrival_offsets_s(load)
    for request in planned:
        words = (request.prompt.text or "").split()
        assert 4 <= len(words) <= 9 and set(words) <= set(WORDS)
        assert 32 <= request.output_len <= 32
    assert [request_from_json(json.loads(json.dumps(request_to_json(r)))) for r in planned] == planned


@pytest.mark.parametrize("burstiness", [0.25, 1.0, 4.0])
def test_open_loop_gaps_have_the_asked_mean_and_the_burstiness_spread(burstiness: float) -> None:
    """Gamma gaps of shape k: mean 1 / rate, coefficient of variation 1 / sqrt(k) (k = 1: Poisson)."""
    load = Load(requests=20_000, concurrency=None, request_rate_per_s=10.0, burstiness=burstiness, seed=1)
    offsets = arrival_offsets_s(load)
    assert offsets is not None
    gaps = [b - a for a, b in zip([0.0, *offsets], offsets, strict=False)]
    mean = statistics.fmean(gaps)
    assert mean == pytest.approx(0.1, rel=0.05)
    assert statistics.pstdev(gaps) / mean == pytest.approx(burstiness**-0.5, rel=0.06)
    assert arrival_offsets_s(Load(requests=5, concurrency=4, request_rate_per_s=None)) is None


def test_prompts_files_of_each_shape_and_each_fault(tmp_path: Path) -> None:
    lines = tmp_path / "lines.jsonl"
    lines.write_text('{"prompt": "a b"}\n\n{"messages": [{"role": "user", "content": "hi"}]}\n')
    assert read_prompts(lines) == [Prompt(text="a b"), Prompt(messages=(("user", "hi"),))]
    sharegpt = tmp_path / "sharegpt.json"
    sharegpt.write_text(
        json.dumps([{"conversations": [{"from": "system", "value": "s"}, {"from": "human", "value": "q"}]}])
    )
    assert read_prompts(sharegpt) == [Prompt(text="q")]
    load = Load(requests=20, concurrency=2, request_rate_per_s=None, seed=3)
    planned = plan_load(load, read_prompts(lines))
    assert {request.prompt for request in planned} == set(read_prompts(lines))
    faults = {
        "bad.jsonl": ('{"prompt": "a"}\n{nope\n', "line 2 is not JSON"),
        "empty.jsonl": ("\n\n", "no prompts in it"),
        "keys.jsonl": ('{"text": "a"}\n', "line 1: no 'prompt', 'messages' or 'conversations'"),
        "turns.json": ('[{"conversations": [{"from": "gpt", "value": "a"}]}]', "record 1: a conversation without"),
        "missing.jsonl": (None, "No such file or directory"),
    }
    for name, (text, words) in faults.items():
        path = tmp_path / name
        if text is not None:
            path.write_text(text)
        with pytest.raises(PlanError, match=words):
            read_prompts(path)
    binary = tmp_path / "binary.jsonl"
    binary.write_bytes(b"\xff\xfe\x00")
    with pytest.raises(PlanError, match="not UTF-8"):
        read_prompts(binary)


def test_load_values_out_of_range_name_their_option() -> None:
    base = {"requests": 4, "concurrency": 2, "request_rate_per_s": None}
    for changes, words in (
        ({"requests": 0}, "--requests must be 1"),
        ({"concurrency": 0}, "--concurrency must be 1"),
        ({"request_rate_per_s": 3.0}, "exclude each other"),
        ({"concurrency": None, "request_rate_per_s": -1.0}, "--request-rate must be above 0"),
        ({"timeout_s": 0.0}, "--timeout must be above 0"),
        ({"burstiness": float("inf")}, "--burstiness must be above 0"),
        ({"warmup": -1}, "--warmup must be 0"),
    ):
        with pytest.raises(PlanError, match=words):
            check_load(Load(**{**base, **changes}))  # type: ignore[arg-type]


def test_slo_and_urls_and_server_messages() -> None:
    assert parse_slo("ttft=200ms,tpot=0.05s") == (200.0, 50.0)
    assert parse_slo("tpot=20 ms") == (None, 20.0)
    for bad in ("ttft", "ttft=-1ms", "latency=3ms", "ttft=fast", "latency=3"):
        with pytest.raises(PlanError, match="give ttft=TIME and/or tpot=TIME"):
            parse_slo(bad)
    origin = Origin.parse("localhost:8000")
    assert (origin.base, origin.prefix) == ("http://localhost:8000", "/v1")
    assert Origin.parse("https://h/v1/").url("/models") == "https://h:443/v1/models"
    assert Origin.parse("http://h:9/api").prefix == "/api/v1"
    for bad in ("ftp://h", "http://", "http://h:port"):
        with pytest.raises(ValueError):
            Origin.parse(bad)
    assert error_message(b'{"error": {"message": "model not found"}}') == "model not found"
    assert error_message(b'{"detail": [{"msg": "bad"}]}') == '[{"msg": "bad"}]'
    assert error_message(b"Internal Server Error\nmore") == "Internal Server Error"
    assert error_message(b"x" * 500).endswith("...")


def test_a_server_that_lists_no_models_is_loaded_with_the_one_named_and_a_failing_one_is_said(tmp_path: Path) -> None:
    """``transformers serve`` 5.17 lists only its hub cache's models, not the local one it serves, and answers
    ``/v1/models`` with HTTP 500 where that cache's folder is missing (both seen on the GPU machine)."""
    load = ["--requests", "2", "--concurrency", "1", "--output-len", "2"]
    with stub_server(models=(), chunks=2) as server:
        unnamed = run_meshtop("record", tmp_path / "unnamed", "--endpoint", server.url, *load)
        named = run_meshtop("record", tmp_path / "named", "--endpoint", server.url, "--model", "/models/llama", *load)
        models = {body["model"] for body in server.bodies}
    assert unnamed.returncode == 2 and not (tmp_path / "unnamed").exists()
    assert unnamed.stderr.strip().splitlines() == [
        f"meshtop: error: --endpoint {server.url}: the server lists no models: name the one to load with --model"
    ]
    assert named.returncode == 0, named.stdout + named.stderr
    assert models == {"/models/llama"} and summary_json(tmp_path / "named")["requests"]["completed"] == 2
    with stub_server(models_status=500) as server, pytest.raises(PlanError, match="the server failed to answer"):
        served_models(Origin.parse(server.url))


def test_the_probe_request_waits_as_long_as_it_is_given(monkeypatch: pytest.MonkeyPatch) -> None:
    """A server meshtop started gets what --startup-timeout leaves for its first answer (transformers serve
    starts its batching loop at its first request), others the probe's own timeout."""
    monkeypatch.setattr(endpoint, "PROBE_TIMEOUT_S", 0.3)
    load = Load(requests=2, concurrency=1, request_rate_per_s=None, output_len=(1, 1))
    with stub_server(chunks=1, first_s=0.6) as server:
        run = endpoint.plan_endpoint(server.url, api="completions", model=None, load=load)
        with pytest.raises(PlanError, match="timed out"):
            endpoint.check_server(run, probe_timeout_s=endpoint.PROBE_TIMEOUT_S)
        assert endpoint.check_server(run, probe_timeout_s=3.0).model == MODEL


def test_chunks_with_text_count_and_role_or_usage_chunks_do_not() -> None:
    assert chunk_text({"choices": [{"text": "ab"}]}) == "ab"
    assert chunk_text({"choices": [{"delta": {"role": "assistant"}}]}) == ""
    assert chunk_text({"choices": [{"delta": {"reasoning_content": "r", "content": "c"}}]}) == "cr"
    assert chunk_text({"choices": [], "usage": {"completion_tokens": 3}}) == ""
    spec = ClientSpec(
        urls=("http://h/v1",), api="chat", model="m", concurrency=1, timeout_s=1, ignore_eos=True, requests_path="",
        status_path="",
    )  # fmt: skip
    path, body = request_body(spec, PlannedRequest(id=0, prompt=Prompt(text="q"), output_len=4, offset_s=None))
    assert path == "/chat/completions" and body["messages"] == [{"role": "user", "content": "q"}]
    assert body["stream_options"] == {"include_usage": True} and body["ignore_eos"] is True


class Collected(EventSink):
    def __init__(self) -> None:
        self.events: list[Event] = []

    def emit(self, event: Event) -> None:
        self.events.append(event)


def spec_for(url: str, **changes: object) -> ClientSpec:
    fields: dict[str, object] = {
        "urls": (url,), "api": "completions", "model": MODEL, "concurrency": 2, "timeout_s": 5.0,
        "ignore_eos": False, "requests_path": "", "status_path": "",
    }  # fmt: skip
    return ClientSpec(**{**fields, **changes})  # type: ignore[arg-type]


def run_load(spec: ClientSpec, requests: list[LoadRequest]) -> list[RequestDone]:
    sink = Collected()
    generator = LoadGenerator(spec, sink)

    async def whole_load() -> None:
        await generator.run(requests)
        generator.close()

    asyncio.run(whole_load())
    return sorted((e for e in sink.events if isinstance(e, RequestDone)), key=lambda e: e.request)


def test_the_client_streams_every_chunk_over_kept_alive_connections() -> None:
    planned = plan_load(Load(requests=12, concurrency=3, request_rate_per_s=None, output_len=(5, 5), warmup=2))
    with stub_server(chunks=5, gap_s=0.002) as server:
        events = run_load(spec_for(server.url, concurrency=3), planned)
        connections = server.connections
    assert [e.request for e in events] == list(range(14)) and all(e.status == "completed" for e in events)
    for event in events:
        assert (event.output_tokens, event.prompt_tokens, event.tokens_from) == (5, 3, "usage")
        assert len(event.token_ns) == 5 and list(event.token_ns) == sorted(event.token_ns)
        assert event.arrival_ns <= event.token_ns[0] == event.first_token_ns and event.token_ns[-1] <= event.end_ns
    assert connections == 3  # the warmup's 2 kept and a third: each client reuses its connection
    assert [e.warmup for e in events] == [True, True] + [False] * 12


def test_the_client_names_each_failure() -> None:
    request = PlannedRequest(id=0, prompt=Prompt(text="q"), output_len=4, offset_s=None)
    with stub_server(status=429) as server:
        [refused] = run_load(spec_for(server.url), [request])
    assert (refused.status, refused.error_kind, refused.error) == ("failed", "http", "HTTP 429: stub refuses")
    with stub_server(chunks=6, close_after=2) as server:
        [cut] = run_load(spec_for(server.url), [request])
    assert cut.error_kind == "reset" and len(cut.token_ns) == 2 and cut.first_token_ns is not None
    with stub_server(chunks=50, gap_s=0.05) as server:
        [slow] = run_load(spec_for(server.url, timeout_s=0.3), [request])
    assert slow.error_kind == "timeout" and slow.error == "timeout: no full answer in 0.3 s"
    with stub_server() as server:
        port = server.port
    [nobody] = run_load(spec_for(f"http://127.0.0.1:{port}"), [request])
    assert (nobody.error_kind, nobody.error) == ("refused", "connection refused") and nobody.first_token_ns is None


def test_without_a_usage_chunk_the_output_tokens_are_the_chunks_with_text() -> None:
    request = PlannedRequest(id=0, prompt=Prompt(text="q"), output_len=5, offset_s=None)
    with stub_server(chunks=5, usage=False) as server:
        [event] = run_load(spec_for(server.url), [request])
    assert (event.status, event.output_tokens, event.tokens_from, event.prompt_tokens) == ("completed", 5, "chunks", 0)
    assert len(event.token_ns) == 5


def test_a_connection_idle_3_s_is_reused_and_one_idle_4_5_s_is_not() -> None:
    """uvicorn (transformers serve, vLLM) closes a connection idle for 5 s: a request written to it as it
    closes is lost (issue 47: request 46 reused one idle 6.25 s). Requests 3 s, then 4.5 s apart."""

    async def spaced() -> list[int]:
        pool = Pool(Origin.parse(server.url))
        connections = []
        for pause_s in (0.0, 3.0, 4.5):
            await asyncio.sleep(pause_s)
            assert len([data async for _, data in pool.stream("/completions", {"prompt": "x"})]) == 2
            connections.append(server.connections)
        pool.close()
        return connections

    with stub_server(chunks=1) as server:
        assert asyncio.run(spaced()) == [1, 1, 2]


def test_a_load_against_a_server_that_closes_connections_idle_1_s_loses_no_request() -> None:
    """Issue 47's open loop whose gaps outlast the server's keep-alive, here 1 s: requests 1.5 s apart, each
    answered on a connection of its own."""
    requests = [PlannedRequest(id=i, prompt=Prompt(text="q"), output_len=2, offset_s=1.5 * i) for i in range(3)]
    with stub_server(chunks=2, keep_alive_s=1.0) as server:
        events = run_load(spec_for(server.url, concurrency=None), requests)
        connections, closed_idle = server.connections, server.closed_idle
    assert [(event.status, event.error) for event in events] == [("completed", None)] * 3
    assert (connections, closed_idle) == (3, 2)


def test_a_request_its_server_closed_unanswered_is_sent_once_more_on_a_fresh_connection() -> None:
    """A server that closes a kept-alive connection as a request comes (its keep-alive ran out) never read
    it: the request goes once more on a new connection. Once: a second such close fails it."""
    requests = [PlannedRequest(id=i, prompt=Prompt(text=f"q{i}"), output_len=2, offset_s=None) for i in range(3)]
    with stub_server(chunks=2, unanswered=frozenset({2})) as server:
        events = run_load(spec_for(server.url, concurrency=1), requests)
        posts, connections = server.posts, server.connections
    assert [(event.status, event.error) for event in events] == [("completed", None)] * 3
    assert (posts, connections) == (4, 2)  # the second request written twice: on the first connection, then anew
    with stub_server(chunks=2, unanswered=frozenset({2, 3})) as server:
        events = run_load(spec_for(server.url, concurrency=1), requests)
        posts, connections = server.posts, server.connections
    assert [(event.status, event.error) for event in events] == [
        ("completed", None),
        ("failed", "the server closed the connection mid-answer"),
        ("completed", None),
    ]
    assert (posts, connections) == (4, 3)


def test_a_pool_reads_a_stream_to_its_end_before_reusing_the_connection() -> None:
    async def two() -> list[list[bytes]]:
        pool = Pool(Origin.parse(server.url))
        answers = []
        for _ in range(2):
            answers.append([data async for _, data in pool.stream("/completions", {"prompt": "x"})])
        pool.close()
        return answers

    with stub_server(chunks=3) as server:
        first, second = asyncio.run(two())
        assert server.connections == 1
    assert first == second and len(first) == 4  # 3 chunks and the usage chunk; [DONE] ends it
    assert json.loads(first[-1])["usage"]["completion_tokens"] == 3


def test_an_http_error_of_the_stream_is_one_line() -> None:
    async def one() -> None:
        pool = Pool(Origin.parse(server.url))
        try:
            async for _ in pool.stream("/completions", {}):
                pass
        finally:
            pool.close()

    with stub_server(status=503) as server, pytest.raises(RequestFailed, match="HTTP 503: stub refuses"):
        asyncio.run(one())


def test_a_load_sent_for_a_duration_stops_sending_at_it_and_is_what_it_sent() -> None:
    """Closed loop: no client takes a request past the duration; open loop: none due past it is sent. The
    fold counts the requests sent, none of the rest as failed."""
    closed = plan_load(Load(requests=400, concurrency=2, request_rate_per_s=None, duration_s=0.4))
    with stub_server(chunks=4, gap_s=0.01) as server:  # about 40 ms a request: 2 clients send about 20
        begun = time.monotonic()
        events = run_load(spec_for(server.url, duration_s=0.4), closed)
        took = time.monotonic() - begun
    assert 4 <= len(events) < 60 and took < 0.4 + 3, (len(events), took)  # the spread below is the tight bound
    assert max(e.arrival_ns for e in events) - min(e.arrival_ns for e in events) < 0.45e9
    load = Load(requests=200, concurrency=None, request_rate_per_s=50.0, duration_s=1.0, seed=2)
    planned = plan_load(load)
    due = [r for r in planned if (r.offset_s or 0) <= 1.0]
    with stub_server(chunks=2) as server:
        events = run_load(spec_for(server.url, concurrency=None, duration_s=1.0), planned)
    assert [e.request for e in events] == [r.id for r in due] and 30 <= len(due) <= 75
    fold = RequestFold(
        Load(requests=200, concurrency=None, request_rate_per_s=50.0, prompt_len=(32, 32), output_len=(32, 32),
             max_batch=0, seed=2, duration_s=1.0),
        replicas=1,
    )  # fmt: skip
    for event in events:
        fold.add(event)
    fold.ended_status = "completed"
    figures = fold.figures()
    assert (figures.count, figures.completed, figures.failed) == (len(due), len(due), 0)
    assert requests_for(1.0, 50.0, None) == 73 and requests_for(None, None, None) == 64
    assert requests_for(5.0, None, None) == DURATION_REQUESTS and requests_for(5.0, 3.0, 7) == 7


def test_a_recorded_load_says_the_clients_cpu_over_its_window(tmp_path: Path) -> None:
    """30 requests at 20 / s (about 1.5 s): the load generator's process samples (2 a second) inside the load's
    window give its CPU, a share of one core far from bound; summary prints it beside the send lag."""
    out = tmp_path / "rec"
    with stub_server(chunks=4) as server:
        done = run_meshtop(
            "record", out, "--endpoint", server.url, "--requests", "30", "--request-rate", "20", "--burstiness", "1e4"
        )
    assert done.returncode == 0, done.stdout + done.stderr
    client = summary_json(out)["requests"]["client"]
    assert 0 < client["cpu_pct"]["max"] < 90 and client["cpu_pct"]["mean"] <= client["cpu_pct"]["max"], client
    # never CPU-bound here; its sends may still lag past 10 ms on a loaded machine (a verdict of its own)
    assert client["limited"] is None or "CPU" not in client["limited"], client["limited"]
    [line] = [line for line in run_meshtop("summary", out).stdout.splitlines() if "client: send lag" in line]
    assert line.endswith(f"CPU {client['cpu_pct']['mean']:.0f} % of a core"), line
