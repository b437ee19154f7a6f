"""``/metrics``: a live run scraped while it trains, a replay's series, and what a bad request gets."""

from __future__ import annotations

import json
import re
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from meshtop.probes.arrivals import Arrivals
from meshtop.probes.events import RankExited, RankStarted, RequestDone
from meshtop.recordings.prometheus import MetricsServer, RunMetrics
from meshtop.recordings.reader import open_recording
from meshtop.recordings.samples import SAMPLE
from meshtop.recordings.schema import events_of
from meshtop.recordings.session_fold import SessionFold
from meshtop.recordings.summary import summarize
from meshtop.tui.sources import ReplaySource
from meshtop.tui.state import DashboardState
from tests.kit.commands import line_matching, meshtop
from tests.kit.events import gpu_sample, rank_started
from tests.kit.recordings import description

ROOT = Path(__file__).resolve().parents[2]


def scrape(url: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    """Every sample of the exposition at ``url``, by sample name, as prometheus_client's parser reads it."""
    with urllib.request.urlopen(url, timeout=10) as response:
        assert response.headers["Content-Type"].startswith("text/plain; version=")
        text = response.read().decode()
    samples: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples.setdefault(sample.name, []).append((sample.labels, sample.value))
    return samples


def test_a_replay_moved_back_counts_its_collectives_again_on_their_nodes() -> None:
    """Counters only grow, so a jump back starts the series again up to the nearest snapshot: the collectives
    counted again carry the node their rank runs on ("0" in the one-node sample), as the first pass's did."""
    recording = open_recording(SAMPLE)
    source = ReplaySource(recording, clock=lambda: 0.0, metrics=True, snapshot_rows=1)  # snapshots to go back to
    state = DashboardState(recording.manifest.run)
    for fraction in (0.3, 1.0, 0.6):  # a snapshot at 0.3, the end, then back past it
        source.playback.seek_fraction(fraction)
        state = source.poll(state)
        while not source.caught_up:
            state = source.poll(state)
    assert source.metrics is not None
    families = text_string_to_metric_families(source.metrics.exposition().decode())
    counted = [s.labels for f in families for s in f.samples if s.name == "meshtop_collective_bytes_total"]
    assert counted and {labels["node"] for labels in counted} == {"0"}


def test_a_replay_serves_the_recordings_figures() -> None:
    recording = open_recording(SAMPLE)
    source = ReplaySource(recording, clock=lambda: 0.0, metrics=True)
    source.playback.seek_fraction(1.0)
    state = DashboardState(recording.manifest.run)
    while not source.caught_up:
        state = source.poll(state)
    assert source.metrics is not None
    server = MetricsServer(lambda: source.metrics, port=0).start()  # type: ignore[arg-type,return-value]
    try:
        host, port = server.address
        samples = scrape(f"http://{host}:{port}/metrics")
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(f"http://{host}:{port}/other", timeout=10)
        assert refused.value.code == 404
        assert scrape(f"http://{host}:{port}/metrics?x=1")  # the server is still there after a 404
    finally:
        server.stop()
    summary = summarize(recording)
    assert samples["meshtop_steps_total"][0][1] == summary["steps"]["count"]
    assert samples["meshtop_step_seconds_count"][0][1] == summary["steps"]["count"]
    collectives = {(labels["op"], labels["group"]): 0.0 for labels, _ in samples["meshtop_collective_bytes_total"]}
    for labels, value in samples["meshtop_collective_bytes_total"]:
        collectives[labels["op"], labels["group"]] += value
    assert collectives == {(row["op"], row["group"]): row["bytes"] for row in summary["collectives"]}
    busbw = {
        (labels["op"], labels["group"]): value for labels, value in samples["meshtop_collective_busbw_bytes_per_second"]
    }
    assert busbw == {
        (row["op"], row["group"]): pytest.approx(row["busbw_gbps"]["p50"] * 1e9)
        for row in summary["collectives"]
        if row["busbw_gbps"]["p50"] is not None
    }
    bubbles = {labels["stage"]: value for labels, value in samples["meshtop_stage_bubble_ratio"]}
    assert bubbles == {str(row["stage"]): pytest.approx(row["bubble_fraction"]) for row in summary["stages"]}
    assert {labels["rank"] for labels, _ in samples["meshtop_memory_bytes"]} == {"0", "1", "2", "3"}
    hosts = {(e.host, str(e.node)) for e in events_of("rank_started", recording.arrow("rank_started"))}
    assert {(labels["Hostname"], labels["node"]) for labels, _ in samples["meshtop_memory_bytes"]} == hosts
    assert {labels["rank"] for labels, _ in samples["meshtop_rank_up"]} == {"0", "1", "2", "3"}


def test_requests_and_gpus_in_base_units_with_the_dcgm_labels() -> None:
    """Requests read from the session's fold (one reported twice counts once, as in every figure), GPUs and
    ranks counted as they arrive."""
    metrics = RunMetrics(description(mode="infer"))
    session = SessionFold(metrics.run)
    metrics.follow(session)

    started = RankStarted(
        rank=0,
        pid=1,
        host="gpu-a",
        device="cuda:0",
        pp_rank=0,
        dp_rank=0,
        tp_rank=0,
        stages=(),
        local_parameters=1,
        wall_ns=0,
    )
    request = RequestDone(
        rank=0,
        replica=0,
        request=0,
        arrival_ns=0,
        first_token_ns=None,
        end_ns=400_000_000,
        prompt_tokens=4,
        output_tokens=4,
        token_ns=(100_000_000, 200_000_000, 300_000_000, 400_000_000),
        output_ids=(1, 2, 3, 4),
        status="completed",
        error=None,
    )
    gpu = gpu_sample(
        gpu=0,
        wall_ns=1,
        name="H200",
        memory_used_bytes=2**30,
        memory_total_bytes=2**37,
        utilization_pct=75.0,
        power_w=500.0,
        sm_clock_mhz=1980.0,
        uuid="GPU-1234",
        pcie_tx_bytes_per_s=3e9,
        pcie_rx_bytes_per_s=5e9,
    )  # no NVLink: its rates unknown
    arrivals = Arrivals([started, request, request, gpu])
    metrics.take(arrivals, session.take(arrivals))
    samples = {}
    for family in text_string_to_metric_families(metrics.exposition().decode()):
        for sample in family.samples:
            samples.setdefault(sample.name, []).append((sample.labels, sample.value))
    assert samples["meshtop_requests_total"] == [({"status": "completed"}, 1.0)]
    assert samples["meshtop_request_ttft_seconds_sum"][0][1] == pytest.approx(0.1)
    assert samples["meshtop_request_ttft_seconds_count"] == [({}, 1.0)]
    assert samples["meshtop_request_tpot_seconds_sum"][0][1] == pytest.approx(0.1)  # (0.4 - 0.1) / 3
    assert samples["meshtop_request_e2e_seconds_sum"][0][1] == pytest.approx(0.4)
    assert samples["meshtop_gpu_utilization_ratio"] == [({"gpu": "0", "UUID": "GPU-1234", "Hostname": "gpu-a"}, 0.75)]
    assert samples["meshtop_gpu_sm_clock_hertz"][0][1] == 1.98e9
    assert samples["meshtop_gpu_pcie_tx_bytes_per_second"] == [
        ({"gpu": "0", "UUID": "GPU-1234", "Hostname": "gpu-a"}, 3e9)
    ]
    assert samples["meshtop_gpu_pcie_rx_bytes_per_second"][0][1] == 5e9
    assert "meshtop_gpu_nvlink_tx_bytes_per_second" not in samples  # unknown is no series, never 0


def test_each_ranks_state_and_each_gpus_samples_are_the_folds() -> None:
    """dp 2 on host ``h``: ranks 0 and 1 start, rank 1 exits by SIGKILL (-9); GPU 0 sampled twice, at 300 W then
    400 W, its second reading of utilisation failed. rank_up 1 and 0; rank 1's exit code -9; GPU 0: 2 samples,
    its last power 400 W, no utilisation (its last sample read none)."""
    metrics = RunMetrics(description(dp=2))
    session = SessionFold(metrics.run)
    metrics.follow(session)
    exited = RankExited(rank=1, wall_ns=5, exit_code=-9, signal="SIGKILL", error=None)
    events = [rank_started(0), rank_started(1), exited, gpu_sample(wall_ns=1, power_w=300.0, utilization_pct=50.0)]
    arrivals = Arrivals([*events, gpu_sample(wall_ns=2, power_w=400.0, utilization_pct=None)])
    metrics.take(arrivals, session.take(arrivals))
    samples = {
        sample.name: sample
        for family in text_string_to_metric_families(metrics.exposition().decode())
        for sample in family.samples
        if sample.name != "meshtop_rank_up"
    }
    up = {
        sample.labels["rank"]: sample.value
        for family in text_string_to_metric_families(metrics.exposition().decode())
        for sample in family.samples
        if sample.name == "meshtop_rank_up"
    }
    assert up == {"0": 1.0, "1": 0.0}
    assert samples["meshtop_rank_exit_code"].labels == {"rank": "1", "Hostname": "h", "node": "0"}
    assert samples["meshtop_rank_exit_code"].value == -9
    assert samples["meshtop_gpu_samples_total"].value == 2
    assert samples["meshtop_gpu_power_watts"].value == 400.0
    assert "meshtop_gpu_utilization_ratio" not in samples


@pytest.mark.slow
def test_a_live_run_is_scraped_while_it_trains(tmp_path: Path) -> None:
    process = subprocess.Popen(
        meshtop(
            "record",
            str(tmp_path / "rec"),
            "--device",
            "cpu",
            "--steps",
            "100000",
            "--metrics-port",
            "0",
            "--metrics-per-rank",
        ),
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        url = line_matching(process, r"metrics: (http://\S+)").group(1)

        def collectives(samples: dict[str, list[tuple[dict[str, str], float]]]) -> set[tuple[str, str, str]]:
            counts = samples.get("meshtop_collective_seconds_count", [])
            return {(labels["op"], labels["group"], labels["rank"]) for labels, _ in counts}

        all_reduces = {("all_reduce", "dp", "0"), ("all_reduce", "dp", "1")}
        # a step that ends between the shipper's drain of the collective kernel and its send ships before its
        # all-reduces (they go with the next heartbeat), so on a busy machine a scrape can see the step first
        deadline = time.monotonic() + 180
        samples = scrape(url)
        while time.monotonic() < deadline and (
            samples.get("meshtop_steps_total", [({}, 0)])[0][1] < 3 or not all_reduces <= collectives(samples)
        ):
            time.sleep(0.5)
            samples = scrape(url)
        assert samples["meshtop_steps_total"][0][1] >= 3
        assert all_reduces <= collectives(samples)
        assert samples["meshtop_tokens_per_second"][0][1] > 0
        assert {labels["rank"] for labels, value in samples["meshtop_rank_up"] if value == 1} == {"0", "1"}
        assert {labels["category"] for labels, _ in samples["meshtop_memory_bytes"]} >= {"weights", "optimizer"}
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(url.replace("/metrics", "/"), timeout=10)
        assert refused.value.code == 404
        assert process.poll() is None  # a bad request did not take the session down
    finally:
        process.terminate()
        process.wait(timeout=60)


def test_the_grafana_dashboard_asks_only_for_series_meshtop_serves() -> None:
    dashboard = json.loads((ROOT / "docs" / "grafana" / "meshtop.json").read_text())
    asked = {
        re.sub(r"_(bucket|count|sum|total)$", "", name)
        for panel in dashboard["panels"]
        for target in panel["targets"]
        for name in re.findall(r"meshtop_[a-z0-9_]+", target["expr"])
    }
    served = {family.name for family in text_string_to_metric_families(RunMetrics(description()).exposition().decode())}
    assert asked and asked <= served, asked - served
    assert len(dashboard["panels"]) == len({panel["id"] for panel in dashboard["panels"]})


@pytest.mark.parametrize("per_rank", [False, True], ids=["per-node", "per-rank"])
def test_collectives_go_per_node_unless_asked_per_rank_and_each_rank_has_its_step_time(
    per_rank: bool, tmp_path: Path
) -> None:
    """A 64-rank job on 8 nodes: its collectives' series per node (8 label sets an op, their counts the sum of
    the node's ranks'), or per rank with ``--metrics-per-rank``; every rank's step time, the grid's median."""
    from tests.kit.events import collective, rank_started, step
    from tests.kit.recordings import write_recording

    events: list[object] = [rank_started(rank, node=rank // 8, host=f"node{rank // 8}") for rank in range(64)]
    for number in range(6):
        for rank in range(64):
            events.append(collective(rank, number, group="dp", group_size=64))
            events.append(step(rank, number, 0.2 if rank == 9 else 0.1))
    recording = open_recording(write_recording(tmp_path / "rec", events, run=description(dp=64)))
    source = ReplaySource(recording, clock=lambda: 0.0, metrics=True, metrics_per_rank=per_rank)
    source.playback.seek_fraction(1.0)
    state = DashboardState(recording.manifest.run)
    while not source.caught_up:
        state = source.poll(state)
    assert source.metrics is not None
    samples: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(source.metrics.exposition().decode()):
        for sample in family.samples:
            samples.setdefault(sample.name, []).append((sample.labels, sample.value))
    counts = samples["meshtop_collective_seconds_count"]
    if per_rank:
        assert len(counts) == 64 and counts[9][0] == {"op": "all_reduce", "group": "dp", "node": "1", "rank": "9"}
    else:
        assert sorted(labels["node"] for labels, _ in counts) == [str(node) for node in range(8)]
        assert sum(value for _, value in counts) == 64 * 6 and all(value == 8 * 6 for _, value in counts)
    step_time = {labels["rank"]: value for labels, value in samples["meshtop_rank_step_seconds"]}
    assert len(step_time) == 64 and step_time["9"] == pytest.approx(0.2) and step_time["0"] == pytest.approx(0.1)
