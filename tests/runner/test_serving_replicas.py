"""Replicas of one model as one endpoint list (``--endpoint URL1,URL2``), against two real stub servers of
different speeds: the load goes round them by request id, each replica's requests and /metrics are its own and
add up to the server's figures, a replica that dies mid-load fails its share while the load goes on, and a bad
list is one line."""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from meshtop.probes.events import RequestDone, ServerMetric
from meshtop.recordings.manifest import read_manifest
from meshtop.recordings.metrics.server import ServerFold
from meshtop.recordings.reader import open_recording
from meshtop.runner.load import PlannedRequest
from meshtop.runner.serving.client import LoadGenerator
from meshtop.runner.serving.load import Prompt, request_from_json
from meshtop.tui.requests_lines import requests_lines
from tests.kit.commands import one_line_error, run_meshtop, summary_json
from tests.kit.ports import free_port
from tests.kit.screen import replayed
from tests.kit.sse_server import stub_server
from tests.runner.test_serving_load import Collected, spec_for
from tests.runner.test_serving_stops import failed_line, recording, stub_process, wait_for_requests

LOAD = ("--requests", "20", "--concurrency", "4", "--warmup", "2", "--output-len", "4", "--seed", "5")


def vllm_metrics(waiting: int, usage: float, generated: list[int]) -> bytes:
    """vLLM's names: a fixed queue and KV-cache use, and a counter of generated tokens that grows a scrape."""
    generated[0] += 10
    return (
        f'vllm:num_requests_waiting{{model_name="m"}} {waiting}\n'
        f'vllm:kv_cache_usage_perc{{model_name="m"}} {usage}\n'
        f'vllm:generation_tokens_total{{model_name="m"}} {generated[0]}\n'
    ).encode()


def test_two_replicas_take_the_load_round_robin_and_their_figures_add_up(tmp_path: Path) -> None:
    """22 requests (2 of warmup) over a fast and a slow replica: the even ids to the first, the odd to the
    second, each request's prompt where its id says (the same load, the same replica); the summary has a row a
    replica, the slow one's TTFT the longer; the servers' queues add up and the KV cache is the fuller one's."""
    counts = [[0], [0]]
    out = tmp_path / "two"
    with (
        stub_server(chunks=4, first_s=0.005, metrics=lambda: vllm_metrics(3, 0.5, counts[0])) as fast,
        stub_server(chunks=4, first_s=0.15, metrics=lambda: vllm_metrics(5, 0.8, counts[1])) as slow,
    ):
        done = run_meshtop("record", out, "--endpoint", f"{fast.url},{slow.url}", *LOAD)
        prompts = [[body["prompt"] for body in server.bodies] for server in (fast, slow)]
    assert done.returncode == 0, done.stdout + done.stderr
    planned = [request_from_json(json.loads(line)) for line in (out / "load.jsonl").read_text().splitlines()]
    for replica, sent in enumerate(prompts):
        assert sent[0] == "hello"  # the probe request, then the load's own
        expected = Counter(request.prompt.text for request in planned if request.id % 2 == replica)
        assert Counter(sent[1:]) == expected
    events = open_recording(out).arrow("request", ["request", "replica"]).to_pylist()
    assert len(events) == 22 and all(event["replica"] == event["request"] % 2 for event in events)
    scraped = open_recording(out).arrow("server_metric", ["replica"]).to_pylist()
    assert {row["replica"] for row in scraped} == {0, 1}
    requests = summary_json(out)["requests"]
    fast_row, slow_row = requests["per_replica"]
    assert (fast_row["replica"], fast_row["completed"], slow_row["replica"], slow_row["completed"]) == (0, 10, 1, 10)
    assert fast_row["ttft_s"]["p50"] < 0.1 < 0.15 <= slow_row["ttft_s"]["p50"]
    assert fast_row["output_tokens_per_s"] + slow_row["output_tokens_per_s"] == pytest.approx(
        requests["output_tokens_per_s"]
    )
    assert "replica 0: 10 completed" in done.stdout and "replica 1: 10 completed" in done.stdout, done.stdout
    panel = requests_lines(replayed(out), 160).plain  # the dashboard's requests panel, of the replay
    assert "  replicas  0: 10 done, TTFT p50 " in panel and " · 1: 10 done, TTFT p50 1" in panel, panel
    server = summary_json(out)["server"]
    assert server["requests_waiting"]["max"] == 8 and server["kv_cache_usage"]["max"] == 0.8  # 3 + 5; the fuller
    assert server["generation_tokens"] >= 20  # both counters grew, 10 a scrape each
    endpoint = read_manifest(out).run.endpoint
    assert endpoint is not None and endpoint.replicas == (fast.url, slow.url)
    assert endpoint.url == f"{fast.url},{slow.url}"
    assert endpoint.server_metrics == f"{fast.url}/metrics,{slow.url}/metrics"


def test_a_replica_killed_mid_load_fails_its_share_and_the_load_goes_on_to_the_other(tmp_path: Path) -> None:
    """The killed replica's requests are each refused and counted, by replica; the live one answers all of its
    own, and nothing is left unsent: a load balancer that round-robins over a dead replica fails the same."""
    out = tmp_path / "killed"
    with stub_server(chunks=4, gap_s=0.02) as live, stub_process("4", "20") as (dead, url):
        process = recording(out, "--endpoint", f"{live.url},{url}", "--requests", "60", "--concurrency", "2")
        wait_for_requests(out, 8, process)
        dead.kill()
        stdout, stderr = process.communicate(timeout=120)
    assert process.returncode == 1, stdout + stderr
    requests = summary_json(out)["requests"]
    live_row, dead_row = requests["per_replica"]
    assert live_row["completed"] == 30 and 4 <= dead_row["completed"] < 30, requests["per_replica"]
    assert requests["not_sent"] == 0 and requests["completed"] + requests["failed"] == 60
    assert dict((row["reason"], row["count"]) for row in requests["failures"]).get("connection refused", 0) >= 5
    line = failed_line(stdout)
    assert "requests failed" in line and f"; by replica: 1 ({url}) " in line, line
    assert line.endswith("(gone: it refused its requests)"), line
    assert "the server is gone" not in line


def test_the_load_stops_for_a_gone_server_only_once_every_replica_refused_5_in_a_row() -> None:
    """Two ports where nothing listens: requests 0 to 9 go round them, 5 refused by each; then the load stops."""
    requests = [PlannedRequest(id=i, prompt=Prompt(text="q"), output_len=2, offset_s=None) for i in range(20)]
    dead = tuple(f"http://127.0.0.1:{free_port()}" for _ in range(2))
    sink = Collected()
    generator = LoadGenerator(spec_for(dead[0], urls=dead, concurrency=1), sink)
    asyncio.run(generator.run(requests))
    generator.close()
    events = [event for event in sink.events if isinstance(event, RequestDone)]
    assert [(event.request, event.replica, event.error_kind) for event in events] == [
        (i, i % 2, "refused") for i in range(10)
    ]
    assert generator.gone == "5 requests in a row were refused by every replica"
    assert generator.gone_replicas == (0, 1) and generator.failed_by_replica == {0: 5, 1: 5}


def test_a_replica_not_running_is_one_line_before_anything_is_sent(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    port = free_port()
    with stub_server(chunks=1) as live:
        line = one_line_error(
            ["record", str(tmp_path / "none"), "--endpoint", f"{live.url},http://127.0.0.1:{port}", *LOAD], capsys
        )
        posts = live.posts
    assert line.startswith(f"meshtop: error: --endpoint http://127.0.0.1:{port}: cannot reach the server"), line
    assert posts == 0 and not (tmp_path / "none").exists()


def test_a_bad_list_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = str(tmp_path / "bad")
    with stub_server(models=("a",)) as first, stub_server(models=("b",)) as second:
        lines = {
            words: one_line_error(["record", out, "--endpoint", endpoints, *extra, *LOAD], capsys)
            for words, endpoints, extra in (
                ("empty", f"{first.url},", ()),
                ("bad", f"{first.url},ftp://h", ()),
                ("twice", f"{first.url},{first.url}", ()),
                ("models", f"{first.url},{second.url}", ()),
                ("metrics", f"{first.url},{second.url}", ("--server-metrics", "http://m:1,http://m:2,http://m:3")),
                ("server", f"{first.url},{second.url}", ("--", "vllm", "serve", "m")),
            )
        }
        posts = first.posts + second.posts
    assert lines == {
        "empty": f"meshtop: error: --endpoint '{first.url},': item 2 of 2 is empty: give URL or URL1,URL2,...",
        "bad": "meshtop: error: --endpoint: 'ftp://h' is not an http:// or https:// URL with a host",
        "twice": f"meshtop: error: --endpoint {first.url},{first.url}: {first.url} is listed twice: each replica once",
        "models": f"meshtop: error: --endpoint: the replicas serve different models: {first.url} 'a', {second.url} "
        "'b': give replicas of one model",
        "metrics": "meshtop: error: --server-metrics http://m:1,http://m:2,http://m:3: give one URL, or one per "
        "--endpoint replica (2)",
        "server": f"meshtop: error: --endpoint {first.url},{second.url}: meshtop starts one server (the command "
        "after --); give one URL, or start the replicas yourself and leave out the command",
    }
    assert posts == 0 and not Path(out).exists()


def test_the_replicas_queues_add_up_at_each_scrape_and_the_kv_cache_is_the_fullest() -> None:
    """Two replicas publishing the same series (the same name and labels) at one scrape time: waiting 3 and 5
    is 8; KV cache 0.5 and 0.8 is 0.8; each replica's generated tokens counter grows by its own, 10 + 20."""
    fold = ServerFold()
    for at_ns, values in ((1, ((3, 0.5, 100), (5, 0.8, 50))), (2, ((1, 0.25, 110), (2, 0.5, 70)))):
        for replica, (waiting, usage, generated) in enumerate(values):
            for name, value in (
                ("vllm:num_requests_waiting", waiting),
                ("vllm:kv_cache_usage_perc", usage),
                ("vllm:generation_tokens_total", generated),
            ):
                common = {"vllm:num_requests_waiting": "requests_waiting", "vllm:kv_cache_usage_perc": "kv_cache_usage"}
                fold.add(
                    ServerMetric(
                        wall_ns=at_ns,
                        name=name,
                        labels='model_name="m"',
                        value=value,
                        common=common.get(name, "generation_tokens"),
                        replica=replica,
                    )
                )
    figures = fold.figures()
    assert figures is not None and (figures.scrapes, figures.series) == (2, 6)
    assert figures.gauges["requests_waiting"] == {"last": 3, "mean": 5.5, "max": 8}
    assert figures.gauges["kv_cache_usage"] == pytest.approx({"last": 0.5, "mean": 0.65, "max": 0.8})
    assert figures.counters["generation_tokens"] == 30


def test_a_recording_from_before_replicas_reads_as_one_server(tmp_path: Path) -> None:
    """A manifest without ``replicas`` and scraped series without ``replica``: one server, as they were."""
    out = tmp_path / "old"
    with stub_server(chunks=2, metrics=lambda: vllm_metrics(3, 0.5, [0])) as server:
        done = run_meshtop("record", out, "--endpoint", server.url, "--requests", "4", "--output-len", "2")
    assert done.returncode == 0, done.stdout + done.stderr
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["endpoint"].pop("replicas") == []
    (out / "manifest.json").write_text(json.dumps(manifest))
    scraped = out / "events" / "server_metric.parquet"
    pq.write_table(pq.read_table(scraped).drop_columns(["replica"]), scraped)
    endpoint = read_manifest(out).run.endpoint
    assert endpoint is not None and endpoint.replicas == () and endpoint.server_metrics == f"{server.url}/metrics"
    summary = summary_json(out)
    assert summary["server"]["requests_waiting"]["max"] == 3 and summary["server"]["kv_cache_usage"]["max"] == 0.5
    assert [row["completed"] for row in summary["requests"]["per_replica"]] == [4]
