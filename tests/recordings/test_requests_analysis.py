"""Inference analysis: request metrics in the summary, compare and the dashboard, over hand-built recordings
(tests/kit/inference.py: the requests, and the figures worked out by hand from them)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from meshtop.recordings.compare import compare
from meshtop.recordings.reader import open_recording
from meshtop.recordings.samples import SAMPLE
from meshtop.recordings.summary import summarize
from meshtop.tui.alerts import alerts_of
from meshtop.tui.app import MeshtopApp
from meshtop.tui.filters import every_rank
from meshtop.tui.sources import ReplaySource
from meshtop.tui.state import DashboardState
from meshtop.tui.summary_text import comparison_lines, summary_lines
from meshtop.tui.views import memory_lines, memory_parts
from tests.kit.inference import KV_BYTES, OOM, WINDOW_S, run_description, served, the_requests
from tests.kit.inference import write_inference_recording as write_recording
from tests.kit.screen import replayed, screen_text


@pytest.fixture
def recording(tmp_path: Path) -> Path:
    return write_recording(tmp_path / "infer", the_requests())


def ms(*values: float) -> list[Any]:
    return [pytest.approx(v / 1e3, abs=1e-12) for v in values]


@pytest.mark.parametrize("parquet", [False, True], ids=["json-lines", "parquet"])
def test_request_latencies_rates_goodput_and_failures_are_exact(tmp_path: Path, parquet: bool) -> None:
    requests = summarize(open_recording(write_recording(tmp_path / "r", the_requests(), parquet=parquet)))["requests"]
    assert (requests["count"], requests["completed"], requests["failed"]) == (6, 4, 2)
    assert requests["failures"] == [
        {"reason": OOM, "count": 1},
        {"reason": "not served: the job ended failed first", "count": 1},
    ]
    quantiles = ("mean", "p50", "p90", "p99")
    assert [requests["ttft_s"][q] for q in quantiles] == ms(37.5, 35, 54, 59.4)
    assert [requests["tpot_s"][q] for q in quantiles] == ms(15, 15, 19, 19.9)  # request 3 has one token: no TPOT
    assert [requests["itl_s"][q] for q in quantiles] == ms(80 / 6, 12.5, 17.5, 19.75)
    assert [requests["e2e_s"][q] for q in quantiles] == ms(57.5, 60, 77, 79.7)
    assert requests["request_throughput_per_s"] == pytest.approx(4 / WINDOW_S)
    assert requests["output_tokens_per_s"] == pytest.approx(10 / WINDOW_S)
    # SLO TTFT <= 50 ms and TPOT <= 12 ms: request 1 misses the TPOT, request 2 the TTFT; 0 and 3 are good.
    assert requests["goodput_per_s"] == pytest.approx(2 / WINDOW_S)
    assert requests["slo_met"] == pytest.approx(2 / 6)
    assert requests["per_replica"] == [
        {
            "replica": 0,
            "completed": 2,
            "output_tokens_per_s": pytest.approx(6 / WINDOW_S),
            "ttft_s": {"p50": ms(40)[0]},
        },
        {
            "replica": 1,
            "completed": 2,
            "output_tokens_per_s": pytest.approx(4 / WINDOW_S),
            "ttft_s": {"p50": ms(35)[0]},
        },
    ]


def test_without_slos_goodput_is_null_and_without_a_load_the_rows_are_the_count(tmp_path: Path) -> None:
    path = write_recording(tmp_path / "r", the_requests(), slo_ttft_ms=None, slo_tpot_ms=None)
    requests = summarize(open_recording(path))["requests"]
    assert requests["goodput_per_s"] is None and requests["slo_met"] is None and requests["slo"] is None
    assert (requests["count"], requests["failed"]) == (6, 2)
    requests = summarize(open_recording(write_recording(tmp_path / "n", the_requests(), requests=None)))["requests"]
    assert (requests["count"], requests["completed"], requests["failed"]) == (5, 4, 1)  # no load: the rows count
    assert summarize(open_recording(SAMPLE))["requests"] is None  # training


def test_inference_steps_are_rank_0_iterations_and_stages_come_from_pipeline_waits(recording: Path) -> None:
    summary = summarize(open_recording(recording))
    steps = summary["steps"]
    assert steps["count"] == 5  # rank 0's iterations, not steps numbered alike over the replicas
    assert steps["time_s"]["p50"] == pytest.approx(0.010) and steps["time_s"]["mean"] == pytest.approx(0.016)
    assert steps["tokens_per_s"]["p50"] == pytest.approx(10 / WINDOW_S)
    assert steps["loss"] == dict.fromkeys(("first", "last", "not_finite_from", "per_step", "ranks", "of_ranks"))
    stage0, stage1 = summary["stages"]
    assert stage0["busy_s"] == pytest.approx(79 / 8 / 1e3) and stage0["idle_s"] == pytest.approx(31 / 8 / 1e3)
    assert stage0["bubble_fraction"] == pytest.approx(31 / 110)
    assert (stage1["busy_s"], stage1["idle_s"], stage1["bubble_fraction"]) == (
        pytest.approx(0.009),
        pytest.approx(0.001),
        pytest.approx(0.1),
    )  # rank 3 measured no wait: left out
    assert [row["kv_cache_bytes"] for row in summary["memory"]] == [KV_BYTES] * 4


def test_summary_text_has_the_request_lines(recording: Path) -> None:
    lines = summary_lines(summarize(open_recording(recording)))
    assert lines[1].startswith("  dp2 x tp1 x pp2 · inference · model tiny")
    assert lines[2] == "iterations (rank 0): 5  p50 10.00 ms  p90 26.00 ms  mean 16.00 ms"
    expected = [
        "requests: 6  completed 4  failed 2",
        f"  failed 1: {OOM}",
        "  failed 1: not served: the job ended failed first",
        "  latency (ms)         p50       p90       p99",
        "  TTFT               35.00     54.00     59.40",
        "  TPOT               15.00     19.00     19.90",
        "  ITL                12.50     17.50     19.75",
        "  e2e                60.00     77.00     79.70",
        "  30.77 req/s  76.92 output tok/s  goodput 15.38 req/s (33.3% of requests met TTFT <= 50 ms, TPOT <= 12 ms)",
        "  replica 0: 2 completed  46.15 output tok/s  TTFT p50 40.00 ms",
        "  replica 1: 2 completed  30.77 output tok/s  TTFT p50 35.00 ms",
    ]
    assert lines[3:5] == ["blocker: fit", f"  1 request failed out of memory: {OOM}"]  # the serving rule's
    assert lines[6 : 6 + len(expected)] == expected
    assert "pipeline stages (mean per iteration):" in lines
    assert lines[-4].startswith("  rank 0: peak 300.0 MiB") and "  kv cache 64.0 MiB" in lines[-4]


def shifted_load(directory: Path, *, ttft_ms: float, concurrency: int = 2) -> Path:
    """40 requests, one every 10 ms, TTFT around ``ttft_ms`` (spread 0-4 ms), then 4 tokens 5 ms apart."""
    requests = []
    for index in range(40):
        arrival = index * 10.0
        first = arrival + ttft_ms + index % 5
        requests.append(served(index, index % 2, arrival, [first + 5 * k for k in range(4)]))
    return write_recording(directory, requests, status="completed", concurrency=concurrency, requests=40)


def test_compare_flags_a_doubled_ttft_and_calls_a_different_concurrency_unfair(tmp_path: Path) -> None:
    before = open_recording(shifted_load(tmp_path / "a", ttft_ms=20))
    after = open_recording(shifted_load(tmp_path / "b", ttft_ms=40))
    comparison = compare(before, after)
    rows = {row["name"]: row for row in comparison["metrics"]}
    assert comparison["warnings"] == []
    assert rows["TTFT p50 (ms)"]["ratio"] == pytest.approx(42 / 22) and rows["TTFT p50 (ms)"]["significant"]
    assert (rows["TTFT p50 (ms)"]["a"], rows["TTFT p50 (ms)"]["b"]) == (pytest.approx(22.0), pytest.approx(42.0))
    assert not rows["TPOT p50 (ms)"]["significant"] and rows["TPOT p50 (ms)"]["ratio"] == pytest.approx(1.0)
    assert not rows["ITL p50 (ms)"]["significant"]
    assert rows["e2e p50 (ms)"]["significant"]
    assert {
        "request throughput (requests/s)",
        "output throughput (tokens/s)",
        "goodput (requests/s)",
        "iteration time (s)",
        "stage 0 bubble",
    } <= set(rows)
    assert "step time (s)" not in rows
    # TTFT 20 to 24 ms, 8 requests each: p50 22 ms; B's 40 to 44: 42 ms. The heading says the unit of its values
    [line] = [line for line in comparison_lines(comparison) if line.startswith("  TTFT p50 (ms) ")]
    assert line.split()[3:] == ["22.000", "42.000", "1.909", "*"]

    other = open_recording(shifted_load(tmp_path / "c", ttft_ms=20, concurrency=4))
    assert compare(before, other)["warnings"] == ["the runs differ in load concurrency (2 vs 4)"]


def test_the_dashboard_folds_requests_as_the_summary_does(recording: Path) -> None:
    summary = summarize(open_recording(recording))["requests"]
    state = replayed(recording)
    view = state.requests_view()
    assert view is not None
    figures = view.figures
    assert (view.total, figures.completed, figures.failed) == (
        summary["count"],
        summary["completed"],
        summary["failed"],
    )
    assert [{"reason": r, "count": n} for r, n in figures.failures] == summary["failures"]
    for name in ("ttft_s", "tpot_s", "itl_s", "e2e_s"):
        assert figures.latencies[name] == summary[name]
    assert figures.request_throughput_per_s == summary["request_throughput_per_s"]
    assert figures.output_tokens_per_s == summary["output_tokens_per_s"]
    assert figures.goodput_per_s == summary["goodput_per_s"]
    assert figures.slo_met == summary["slo_met"] == pytest.approx(2 / 6)
    assert state.steps_done == 5 and [s.duration_s for s in state.steps] == [0.01, 0.01, 0.02, 0.01, 0.03]
    assert state.bubble_history() == {0: pytest.approx((0.2,) * 5), 1: pytest.approx((0.1,) * 5)}  # replica 0's
    assert state.mfu().value is None and "training" in (state.mfu().why_not or "")
    assert ("warning", f"failed requests: 2; most often (1): {OOM}") in [(a.severity, a.text) for a in alerts_of(state)]
    parts, _ = memory_parts(state.memory_rows()[0])  # the devices view's bar has a KV cache part, in its colour
    assert parts["kv cache"] == KV_BYTES
    assert any(span.style == "#d7af5f" for span in memory_lines(state, every_rank, 100, None).spans)


def test_before_the_job_ends_unserved_requests_are_not_counted_failed_and_latencies_cover_the_run() -> None:
    state = DashboardState(run_description())
    state.apply_events(the_requests())
    view = state.requests_view()
    assert view is not None and (view.figures.completed, view.figures.failed) == (4, 1)
    for index in range(2000):  # one every 10 ms: 20 s of requests
        state.apply_events([served(100 + index, 0, index * 10, [index * 10 + k for k in range(1, 5)])])
    view = state.requests_view()
    assert view is not None and view.figures.completed == 2004
    assert state.fold.requests is not None and state.fold.requests.latencies["ttft_s"].count == 2004
    assert [len(values) for values in view.history.values()] == [512, 512, 4096, 512]  # the sparklines' window


@pytest.mark.screen
async def test_the_dashboard_shows_requests_in_the_header_and_overview(recording: Path) -> None:
    source = ReplaySource(open_recording(recording), clock=lambda: 0.0)
    source.playback.seek_fraction(1.0)
    source.playback.paused = True
    app = MeshtopApp(source)
    async with app.run_test(size=(100, 30)) as pilot:
        await pilot.pause()
        text = screen_text(app)
        header = text.splitlines()[1]
        assert header.startswith(" requests 4/6 (2 failed)  30.77 req/s  TTFT p50 35.0 ms  77 tok/s")
        assert "MFU" not in header and "step" not in header
        rows = {line.split()[0]: line.split()[1:] for line in text.splitlines()[4:] if line.split()}
        assert "4/6 completed · 2 failed · 30.77 req/s · 77 tok/s out" in text
        assert rows["TTFT"][:4] == ["35.0", "ms", "59.4", "ms"]
        assert rows["TPOT"][:4] == ["15.0", "ms", "19.9", "ms"]
        assert f"failed 1: {OOM}" in text
        await pilot.press("4")
        await pilot.pause()
        await pilot.pause()
        assert "bubble per stage (share of iteration time spent waiting; recent: replica 0's)" in screen_text(app)
        await pilot.press("5")
        await pilot.pause()
        await pilot.pause()
        steps = screen_text(app)
        assert "iteration time (rank 0)" in steps and "throughput" in steps
        assert "loss" not in steps  # nothing is trained: no empty loss chart


def test_a_train_recording_keeps_its_comparison_rows(tmp_path: Path) -> None:
    sample = open_recording(SAMPLE)
    names = [row["name"] for row in compare(sample, sample)["metrics"]][:2]
    assert names == ["step time (s)", "throughput (tokens/s)"]
    assert json.dumps(summarize(sample)["requests"]) == "null"
