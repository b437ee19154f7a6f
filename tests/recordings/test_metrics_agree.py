"""One metrics core: the dashboard (a replay, folded frame by frame) and ``meshtop summary --json`` (whole
tables) report the same figures for the same recording, to the last bit."""

from __future__ import annotations

import json
from itertools import pairwise
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from meshtop.probes.events import MemorySnapshot, StepTiming
from meshtop.probes.kinds import FOLD_ORDER
from meshtop.recordings.metrics.figures import straggler_json
from meshtop.recordings.metrics.mfu import GpuModel, peak_flops
from meshtop.recordings.metrics.run import RunFold
from meshtop.recordings.reader import open_recording
from meshtop.recordings.samples import INFER_SAMPLE, SAMPLE
from meshtop.recordings.summary import fold_recording
from meshtop.tui.cli import main
from meshtop.tui.sources import ReplaySource
from meshtop.tui.state import DashboardState
from tests.kit.commands import run_meshtop, summary_json
from tests.kit.events import gpu_sample
from tests.kit.inference import the_requests, write_inference_recording
from tests.kit.recordings import description, with_model, write_recording

SAMPLES = [SAMPLE, INFER_SAMPLE]
"""Every recording meshtop ships."""


def replayed(path: Path, rows_per_frame: int = 997) -> DashboardState:
    """The dashboard's state at the end of a replay that folds a few hundred rows a frame."""
    recording = open_recording(path)
    source = ReplaySource(recording, clock=lambda: 0.0, rows_per_frame=rows_per_frame)
    source.playback.seek_fraction(1.0)
    state = DashboardState(recording.manifest.run)
    frames = 0
    while not source.caught_up:
        state = source.poll(state)
        frames += 1
    assert frames > 1 or source.timeline.rows <= rows_per_frame
    return state


def assert_same_figures(state: DashboardState, summary: dict[str, Any]) -> None:
    figures = state.figures()
    rows = {(row.group, row.op): row for row in figures.collectives}
    assert set(rows) == {(row["group"], row["op"]) for row in summary["collectives"]}
    for row in summary["collectives"]:
        mine = rows[(row["group"], row["op"])]
        assert (
            mine.count,
            mine.bytes,
            mine.in_flight_p50_s,
            mine.in_flight_p99_s,
            mine.busbw_p50_gbps,
            mine.exposed_share,
        ) == (
            row["count"],
            row["bytes"],
            row["in_flight_s"]["p50"],
            row["in_flight_s"]["p99"],
            row["busbw_gbps"]["p50"],
            row["exposed_s"]["share"],
        )
    assert figures.steps.count == summary["steps"]["count"]
    assert figures.steps.time_s["p50"] == summary["steps"]["time_s"]["p50"]
    assert [(row.stage, row.bubble_fraction) for row in figures.stages] == [
        (row["stage"], row["bubble_fraction"]) for row in summary["stages"]
    ]
    assert {row.rank: row.peak_bytes for row in figures.memory} == {
        row["rank"]: row["peak_bytes"] for row in summary["memory"]
    }
    assert state.most_loaded_rank() == summary["most_loaded_rank"]
    assert [straggler_json(straggler) for straggler in figures.stragglers] == summary["stragglers"]
    if summary["requests"] is not None:
        assert figures.requests is not None
        for name in ("ttft_s", "tpot_s", "e2e_s"):
            assert (figures.requests.latencies[name]["p50"], figures.requests.latencies[name]["p99"]) == (
                summary["requests"][name]["p50"],
                summary["requests"][name]["p99"],
            )
    assert figures.mfu.value == summary["mfu"]["value"]


@pytest.mark.parametrize("sample", SAMPLES, ids=[path.name for path in SAMPLES])
def test_a_shipped_sample_replayed_agrees_with_its_summary(sample: Path, capsys: pytest.CaptureFixture[str]) -> None:
    summary = summary_json(sample)
    assert summary["collectives"] and summary["memory"]
    assert summary["stages"] if sample == SAMPLE else summary["requests"]["completed"]  # tp2-infer: no pipeline
    assert_same_figures(replayed(sample), summary)


@pytest.mark.slow
def test_a_fresh_multi_rank_recording_replayed_agrees_with_its_summary(
    recorded: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    summary = summary_json(recorded)
    assert len(summary["collectives"]) == 3 and len(summary["stages"]) == 2
    assert_same_figures(replayed(recorded, rows_per_frame=50), summary)


def test_an_inference_recording_replayed_agrees_with_its_summary(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write_inference_recording(tmp_path / "infer", the_requests(), parquet=True)
    summary = summary_json(path)
    assert summary["requests"]["completed"] == 4 and summary["stages"]
    assert_same_figures(replayed(path, rows_per_frame=3), summary)


def cuda_run_recording(
    directory: Path, gpu_name: str = "NVIDIA H100 80GB HBM3", power_limit_w: float | None = 700.0
) -> Path:
    """A one-GPU training run described on ``gpu_name``: 12 steps of 4,096 tokens, about 0.5 s each."""
    run = with_model(
        description(dp=1, steps=12, batch_size=4, seq_len=1024, device="cuda", dtype="bf16"), parameters=1_000_000_000
    )
    rng = np.random.default_rng(3)
    events: list[Any] = []
    for step in range(12):
        duration = 0.5 + 0.01 * rng.standard_normal()
        events.append(StepTiming(rank=0, step=step, start_ns=step * 10**9, duration_s=duration, tokens=4096, loss=3.0))
        events.append(
            MemorySnapshot(
                rank=0,
                step=step,
                wall_ns=step * 10**9,
                weights_bytes=2 << 30,
                grads_bytes=2 << 30,
                optimizer_bytes=12 << 30,
                activations_bytes=10 << 30,
                kv_cache_bytes=None,
                allocated_bytes=16 << 30,
                reserved_bytes=40 << 30,
                peak_allocated_bytes=(30 << 30) + step,
                device_used_bytes=42 << 30,
                device_total_bytes=80 << 30,
                rss_bytes=4 << 30,
            )
        )
        events.append(
            gpu_sample(
                gpu=0,
                wall_ns=step * 10**9,
                name=gpu_name,
                memory_used_bytes=42 << 30,
                memory_total_bytes=80 << 30,
                utilization_pct=99.0,
                memory_utilization_pct=50.0,
                power_w=600.0,
                sm_clock_mhz=1980.0,
                temperature_c=60.0,
                power_limit_w=power_limit_w,
            )
        )
    return write_recording(directory, events, run=run, parquet=True)


def test_mfu_is_in_summary_and_compare_where_the_gpu_peak_is_known(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = cuda_run_recording(tmp_path / "h100")
    summary = summary_json(path)
    mfu = summary["mfu"]
    tokens_per_s = summary["steps"]["tokens_per_s"]["p50"]
    flops = 6 * (1_000_000_000 - 256 * 64) + 12 * 4 * 64 * 1024  # 6N + 12 L d T of the tiny shape with a 1B
    # count, less its untied token embedding (looked up, not multiplied)
    assert mfu["flops_per_token"] == flops and mfu["peak_flops_per_s"] == 989e12 and mfu["gpus"] == 1
    assert mfu["value"] == pytest.approx(tokens_per_s * flops / 989e12) and mfu["why_not"] is None
    assert_same_figures(replayed(path, rows_per_frame=5), summary)
    assert main(["compare", str(path), str(path), "--json"]) == 0
    rows = {row["name"]: row for row in json.loads(capsys.readouterr().out)["metrics"]}
    assert rows["MFU"]["a"] == mfu["value"] and rows["MFU"]["ratio"] == 1.0
    assert rows["most loaded GPU headroom (bytes)"]["a"] == (80 << 30) - (30 << 30) - 11


def test_a_gpu_missing_from_the_peak_table_says_so_instead_of_guessing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    summary = summary_json(cuda_run_recording(tmp_path / "unknown", gpu_name="Mystery GPU 9000"))
    assert summary["mfu"]["value"] is None
    assert summary["mfu"]["why_not"] == "no bf16 peak known for Mystery GPU 9000"
    assert main(["summary", str(tmp_path / "unknown")]) == 0
    assert "MFU" not in capsys.readouterr().out


@pytest.mark.parametrize(
    ("name", "power_limit_w", "peak"),
    [
        ("NVIDIA H200", 700.0, 989e12),  # SXM
        ("NVIDIA H200", 600.0, 835e12),  # the NVL card, where its name does not say so
        ("NVIDIA H200 NVL", None, 835e12),
        ("NVIDIA H200", None, 989e12),  # NVIDIA names the cards: without a limit, the name's own part
        ("NVIDIA H100 80GB HBM3", 700.0, 989e12),
        ("NVIDIA H100 PCIe", None, 756e12),
        ("NVIDIA H100 NVL", 400.0, 835e12),
        ("NVIDIA A100-SXM4-80GB", 400.0, 312e12),
        ("NVIDIA A10", 150.0, 125e12),
        ("NVIDIA L40S", 350.0, 362e12),
        ("NVIDIA GeForce RTX 4090", 450.0, 165.2e12),
        ("NVIDIA GH200 480GB", 900.0, 989e12),
        ("Mystery GPU 9000", 300.0, None),
    ],
)
def test_the_peak_of_each_gpu_is_told_by_its_name_and_where_needed_its_power_limit(
    name: str, power_limit_w: float | None, peak: float | None
) -> None:
    assert peak_flops(GpuModel(name, power_limit_w), "bf16") == peak
    assert peak_flops(GpuModel(name, power_limit_w), "fp16") == peak
    assert peak_flops(GpuModel(name, power_limit_w), "fp32") is None  # no tensor-core rate in the table


def test_an_h200_nvl_card_has_the_cards_peak_in_mfu(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    summary = summary_json(cuda_run_recording(tmp_path / "nvl", gpu_name="NVIDIA H200", power_limit_w=600.0))
    assert summary["mfu"]["peak_flops_per_s"] == 835e12 and summary["mfu"]["value"] is not None


def test_the_fold_gives_the_same_figures_however_the_tables_are_cut(capsys: pytest.CaptureFixture[str]) -> None:
    recording = open_recording(SAMPLE)
    whole = fold_recording(recording).figures()
    rng = np.random.default_rng(7)
    pieces = []
    for kind in FOLD_ORDER:
        if kind not in recording.kinds():
            continue
        table = recording.arrow(kind)
        cuts = np.sort(rng.integers(0, len(table) + 1, size=5))
        edges = [0, *cuts.tolist(), len(table)]
        pieces += [(kind, table.slice(a, b - a)) for a, b in pairwise(edges) if b > a]
    fold = RunFold(recording.manifest.run)
    for kind, piece in sorted(pieces, key=lambda item: FOLD_ORDER[item[0]]):
        fold.apply(kind, piece)
    fold.finish("completed")
    assert fold.figures() == whole


@pytest.mark.slow
def test_a_gpipe_pipelines_exposed_communication_never_exceeds_its_step(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:

    out = tmp_path / "gpipe"
    done = run_meshtop(
        "record",
        str(out),
        "--pp",
        "2",
        "--dp",
        "1",
        "--schedule",
        "gpipe",
        "--microbatches",
        "8",
        "--batch-size",
        "16",
        "--steps",
        "5",
        "--device",
        "cpu",
        timeout_s=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    fold = fold_recording(open_recording(out))
    assert len(fold.closed) == 5
    for step in fold.closed:
        assert set(step.exposed_by_op) >= {("pp", "send"), ("pp", "recv")}
        for op, seconds in step.exposed_by_op.items():
            assert 0 <= seconds <= step.duration_s, (step.step, op, seconds, step.duration_s)
    rows = {(row.group, row.op): row for row in fold.figures().collectives}
    assert rows[("pp", "recv")].exposed_measured  # pipelining waits on its receives from Python: seen
    summary = summary_json(out)
    assert all(0 < row["exposed_s"]["share"] <= 1 for row in summary["collectives"])


def test_rows_that_cannot_be_the_jobs_are_left_out_and_said_not_raised(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from meshtop.probes.events import CollectiveTiming

    def op(rank: int, group_size: int, end_ns: int = 2_000) -> CollectiveTiming:
        return CollectiveTiming(
            rank=rank,
            step=0,
            op="all_reduce",
            group="dp",
            group_size=group_size,
            peer=None,
            bytes=8,
            dtype="float32",
            start_ns=1_000,
            end_ns=end_ns,
            clock="completion",
        )

    events = [
        op(0, 2),
        op(-1, 2),
        op(10**12, 2),
        op(1, 0),
        op(1, 2, end_ns=5),
        StepTiming(rank=0, step=0, start_ns=0, duration_s=0.01, tokens=8, loss=1.0),
        StepTiming(rank=7, step=0, start_ns=0, duration_s=0.01, tokens=8, loss=1.0),
    ]
    path = write_recording(tmp_path / "odd", events, run=description(dp=2))
    summary = summary_json(path)
    assert [row["count"] for row in summary["collectives"]] == [1]
    assert summary["problems"] == [
        "events/collective: 4 row(s) that cannot be this job's (a rank outside it, a group of no rank, an end "
        "before the start) were left out",
        "events/step: 1 row(s) that cannot be this job's (a rank outside it, a group of no rank, an end before "
        "the start) were left out",
    ]
    assert_same_figures(replayed(path, rows_per_frame=2), summary)
