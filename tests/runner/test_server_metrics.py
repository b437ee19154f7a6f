"""The server's ``/metrics``: parsed as Prometheus writes it, the known engines' series named alike, scraped
from a live exposition, and folded into the engine's figures (by hand)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from meshtop.probes.events import ProbeOff, ServerMetric
from meshtop.recordings.compare import compare
from meshtop.recordings.export import SERVER_PID, export_perfetto
from meshtop.recordings.metrics.server import ServerFold
from meshtop.recordings.reader import open_recording
from meshtop.runner.serving.scrape import COMMON, Scraper, parse_exposition
from tests.kit.commands import run_meshtop
from tests.kit.screen import replayed
from tests.kit.sse_server import stub_server


def vllm_like() -> tuple[CollectorRegistry, Gauge, Gauge, Gauge, Counter]:
    """A registry with vLLM's names and labels, written by prometheus_client (as vLLM's server is)."""
    registry = CollectorRegistry()
    running = Gauge("vllm:num_requests_running", "running", ["model_name", "engine"], registry=registry)
    waiting = Gauge("vllm:num_requests_waiting", "waiting", ["model_name", "engine"], registry=registry)
    usage = Gauge("vllm:kv_cache_usage_perc", "KV-cache use", ["model_name", "engine"], registry=registry)
    preempted = Counter("vllm:num_preemptions", "preemptions", ["model_name", "engine"], registry=registry)
    Histogram("vllm:time_to_first_token_seconds", "ttft", ["model_name"], registry=registry).labels("m").observe(0.2)
    return registry, running, waiting, usage, preempted


def test_an_exposition_parses_as_written_and_known_engines_get_common_names() -> None:
    registry, running, waiting, usage, preempted = vllm_like()
    for engine, (run, wait, use) in enumerate([(3, 7, 0.25), (2, 1, 0.5)]):
        running.labels("m", str(engine)).set(run)
        waiting.labels("m", str(engine)).set(wait)
        usage.labels("m", str(engine)).set(use)
    preempted.labels("m", "0").inc(4)
    samples = parse_exposition(generate_latest(registry).decode())
    by_name = {(name, labels): value for name, labels, value in samples}
    assert by_name[("vllm:num_requests_waiting", 'engine="1",model_name="m"')] == 1.0
    assert by_name[("vllm:num_preemptions_total", 'engine="0",model_name="m"')] == 4.0
    assert by_name[("vllm:time_to_first_token_seconds_bucket", 'le="0.25",model_name="m"')] == 1.0
    assert {COMMON.get(name) for name, _, _ in samples} >= {
        "requests_running",
        "requests_waiting",
        "kv_cache_usage",
        "preemptions",
    }
    text = (
        '# HELP x y\n\nsglang:num_queue_reqs 5\ntgi_queue_size{a="}"} 2 1700000000\n'
        'bad{unclosed 3\nno_value\nnan_value NaN\nname_only{} \nsglang:token_usage{model_name="m"} 0.28\n'
    )
    assert parse_exposition(text) == [
        ("sglang:num_queue_reqs", "", 5.0),
        ("tgi_queue_size", 'a="}"', 2.0),
        ("sglang:token_usage", 'model_name="m"', 0.28),
    ]


def test_the_scraper_keeps_changed_series_only_and_says_once_when_there_are_none() -> None:
    registry, running, waiting, _usage, _preempted = vllm_like()
    waiting.labels("m", "0").set(2)
    running.labels("m", "0").set(1)
    with stub_server(metrics=lambda: generate_latest(registry)) as server:
        scraper = Scraper((f"{server.url}/metrics",), emit=lambda events: None)
        first = scraper.scrape_once()
        again = scraper.scrape_once()
        waiting.labels("m", "0").set(5)
        third = scraper.scrape_once()
    assert {(e.name, e.value) for e in first if isinstance(e, ServerMetric) and e.common} == {
        ("vllm:num_requests_waiting", 2.0),
        ("vllm:num_requests_running", 1.0),
    }
    assert len({e.wall_ns for e in first}) == 1  # one scrape, one moment
    assert again == []  # nothing changed
    assert [(e.name, e.value, e.common) for e in third] == [("vllm:num_requests_waiting", 5.0, "requests_waiting")]
    emitted: list[object] = []
    with stub_server() as server:  # no /metrics: transformers serve's case
        scraper = Scraper((f"{server.url}/metrics",), emit=emitted.extend)
        scraper.start()
        deadline = time.monotonic() + 10
        while not emitted and time.monotonic() < deadline:
            time.sleep(0.05)
        scraper.stop()
    [off] = emitted
    assert isinstance(off, ProbeOff) and off.probe == "server metrics"
    assert off.reason == f"GET {server.url}/metrics answered HTTP 404: the server publishes no Prometheus metrics there"


@pytest.mark.parametrize(
    ("exposition", "expected"),
    [
        (
            "sglang:num_running_reqs 3\nsglang:num_queue_reqs 7\nsglang:token_usage 0.25\n"
            "sglang:prompt_tokens_total 1200\nsglang:generation_tokens_total 640\nsglang:cache_hit_rate 0.5\n",
            {
                ("sglang:num_running_reqs", 3.0, "requests_running"),
                ("sglang:num_queue_reqs", 7.0, "requests_waiting"),
                ("sglang:token_usage", 0.25, "kv_cache_usage"),
                ("sglang:prompt_tokens_total", 1200.0, "prompt_tokens"),
                ("sglang:generation_tokens_total", 640.0, "generation_tokens"),
                ("sglang:cache_hit_rate", 0.5, None),
            },
        ),
        (
            "tgi_batch_current_size 4\ntgi_queue_size 9\ntgi_request_input_length_sum 800\n"
            "tgi_request_generated_tokens_sum 320\ntgi_request_count 12\n",
            {
                ("tgi_batch_current_size", 4.0, "requests_running"),
                ("tgi_queue_size", 9.0, "requests_waiting"),
                ("tgi_request_input_length_sum", 800.0, "prompt_tokens"),
                ("tgi_request_generated_tokens_sum", 320.0, "generation_tokens"),
                ("tgi_request_count", 12.0, None),
            },
        ),
        (
            "vllm:num_requests_running 1\nvllm:num_requests_waiting 2\nvllm:gpu_cache_usage_perc 0.75\n"
            "vllm:num_preemptions_total 5\nvllm:prompt_tokens_total 100\nvllm:generation_tokens_total 50\n",
            {
                ("vllm:num_requests_running", 1.0, "requests_running"),
                ("vllm:num_requests_waiting", 2.0, "requests_waiting"),
                ("vllm:gpu_cache_usage_perc", 0.75, "kv_cache_usage"),
                ("vllm:num_preemptions_total", 5.0, "preemptions"),
                ("vllm:prompt_tokens_total", 100.0, "prompt_tokens"),
                ("vllm:generation_tokens_total", 50.0, "generation_tokens"),
            },
        ),
    ],
    ids=["sglang", "tgi", "vllm-v0"],
)
def test_each_engines_series_get_the_common_names_of_their_documented_meaning(
    exposition: str, expected: set[tuple[str, float, str | None]]
) -> None:
    """Each engine's documented series, scraped from a live exposition: the common name of each is written out
    here from the engines' documentation (running batch, queue, KV-cache share, token counters), not read from
    meshtop's table; a series of no common meaning keeps none."""
    with stub_server(metrics=lambda: exposition.encode()) as server:
        events = Scraper((f"{server.url}/metrics",), emit=lambda events: None).scrape_once()
    assert {(e.name, e.value, e.common) for e in events if isinstance(e, ServerMetric)} == expected


def metric(at_s: float, name: str, value: float, labels: str = "") -> ServerMetric:
    return ServerMetric(wall_ns=int(at_s * 1e9), name=name, labels=labels, value=value, common=COMMON.get(name))


def test_the_engine_figures_by_hand() -> None:
    """Two engines' queues summed a scrape, the fuller KV cache taken, a series left out keeping its value,
    counters' increase across a restart."""
    fold = ServerFold()
    scrapes = [
        [  # t = 0: engine 0 waits 4, engine 1 waits 2; KV 0.2 and 0.6; 100 tokens generated so far
            metric(0, "vllm:num_requests_waiting", 4, 'engine="0"'),
            metric(0, "vllm:num_requests_waiting", 2, 'engine="1"'),
            metric(0, "vllm:kv_cache_usage_perc", 0.2, 'engine="0"'),
            metric(0, "vllm:kv_cache_usage_perc", 0.6, 'engine="1"'),
            metric(0, "vllm:generation_tokens_total", 100),
            metric(0, "vllm:iteration_tokens_total_bucket", 3, 'le="8"'),
        ],
        [  # t = 0.5: engine 1's queue unchanged (left out), engine 0's 10; KV 0.9 on engine 0; 250 tokens
            metric(0.5, "vllm:num_requests_waiting", 10, 'engine="0"'),
            metric(0.5, "vllm:kv_cache_usage_perc", 0.9, 'engine="0"'),
            metric(0.5, "vllm:generation_tokens_total", 250),
        ],
        [  # t = 1: the server restarted: its counter from 0, now 30
            metric(1.0, "vllm:num_requests_waiting", 0, 'engine="0"'),
            metric(1.0, "vllm:generation_tokens_total", 30),
        ],
    ]
    for scrape in scrapes:
        for event in scrape:
            fold.add(event)
    figures = fold.figures()
    assert figures is not None
    assert (figures.scrapes, figures.series) == (3, 6)
    waiting = figures.gauges["requests_waiting"]
    assert (waiting["last"], waiting["max"]) == (2, 12)  # 4+2, 10+2, 0+2
    assert waiting["mean"] == pytest.approx((6 + 12 + 2) / 3)
    kv = figures.gauges["kv_cache_usage"]
    assert (kv["last"], kv["max"]) == (0.9, 0.9) and kv["mean"] == pytest.approx((0.6 + 0.9 + 0.9) / 3)
    assert figures.counters == {"generation_tokens": pytest.approx(150 + 30)}
    assert "requests_running" not in figures.gauges
    assert list(fold.recent["requests_waiting"]) == [6, 12]  # the scrape in progress is not in the history yet
    assert [(at, value) for at, name, value in fold.timeline() if name == "requests_waiting"] == [
        (0, 6),
        (500_000_000, 12),
        (1_000_000_000, 2),
    ]
    assert ServerFold().figures() is None


@pytest.mark.slow
def test_a_recorded_load_holds_the_engines_view_beside_its_requests(tmp_path: Path) -> None:
    """``meshtop record --endpoint`` against a server whose /metrics are vLLM's: the summary and compare read
    the engine's queue and KV cache from the recording."""
    registry, running, waiting, usage, _preempted = vllm_like()
    running.labels("m", "0").set(4)
    waiting.labels("m", "0").set(9)
    usage.labels("m", "0").set(0.75)
    with stub_server(chunks=6, gap_s=0.01, metrics=lambda: generate_latest(registry)) as server:
        done = run_meshtop(
            "record", tmp_path / "a", "--endpoint", server.url, "--requests", "60", "--concurrency", "4",
            "--output-len", "6",
        )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "server (its /metrics" in done.stdout and "waiting mean 9.0 max 9" in done.stdout, done.stdout
    summary = json.loads(run_meshtop("summary", tmp_path / "a", "--json").stdout)
    assert summary["server"]["scrapes"] >= 1
    assert summary["server"]["requests_waiting"]["max"] == 9 and summary["server"]["kv_cache_usage"]["max"] == 0.75
    assert summary["requests"]["completed"] == 60 and summary["requests"]["tokens_from"] == {"usage": 60}
    rows = {
        row["name"]: row for row in compare(open_recording(tmp_path / "a"), open_recording(tmp_path / "a"))["metrics"]
    }
    assert rows["server queue max"]["a"] == 9 and rows["server KV-cache use mean"]["b"] == 0.75
    view = replayed(tmp_path / "a").requests_view()  # the dashboard of a replay reads what summary read
    assert view is not None and view.server is not None and view.server.gauges["requests_waiting"]["max"] == 9
    assert view.figures.client is not None and view.figures.completed == 60
    trace = tmp_path / "trace.json"
    assert export_perfetto(open_recording(tmp_path / "a"), trace) > 0
    counters = [
        e for e in json.loads(trace.read_text())["traceEvents"] if e.get("pid") == SERVER_PID and e["ph"] == "C"
    ]
    assert {e["name"] for e in counters} >= {"requests_waiting", "kv_cache_usage"}
    assert all(e["args"]["requests_waiting"] == 9 for e in counters if e["name"] == "requests_waiting")


@pytest.mark.slow
def test_an_overloaded_server_is_blocked_by_its_queue(tmp_path: Path) -> None:
    """A stub of one slot (each answer 6 chunks 50 ms apart: some 3.3 answers a second) asked 10 requests a
    second for 4 s, publishing its waiting requests as vLLM names them: its backlog grows by some 6.7 a second
    while the load is sent (about 4 waiting on average over the first third of that time, 22 over the last),
    far past the queue's floor and twice the first third, so the blocker is ``queue``."""

    def exposition() -> bytes:
        return f'vllm:num_requests_waiting{{model_name="m"}} {server.waiting}\n'.encode()

    with stub_server(chunks=6, gap_s=0.05, serial=True, metrics=exposition) as server:
        done = run_meshtop(
            "record", tmp_path / "a", "--endpoint", server.url, "--requests", "40", "--request-rate", "10",
            "--output-len", "6",
        )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    summary = json.loads(run_meshtop("summary", tmp_path / "a", "--json").stdout)
    blocker = summary["blocker"]
    assert blocker["kind"] == "queue", (blocker, summary["requests"]["client"], summary["server"])
    assert blocker["evidence"].startswith("requests waiting grew from "), blocker
