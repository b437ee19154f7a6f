"""compare: the change and whether it is real; export: a Perfetto trace and CSV tables."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from meshtop.probes.events import StepTiming
from meshtop.recordings.compare import mann_whitney_p
from meshtop.tui.cli import main
from tests.kit.recordings import description, write_recording


def synthetic_recording(directory: Path, *, step_s: float, model: str = "tiny", spread: float = 0.002) -> Path:
    """A finished one-rank recording with 40 steps around ``step_s``."""
    generator = np.random.default_rng(0)
    steps = [
        StepTiming(
            rank=0,
            step=n,
            start_ns=n * 10**9,
            duration_s=step_s + spread * generator.standard_normal(),
            tokens=512,
            loss=2.0,
        )
        for n in range(40)
    ]
    return write_recording(directory, steps, run=description(dp=1, model=model, seq_len=64, batch_size=8))


def run_compare(a: Path, b: Path, capsys: pytest.CaptureFixture[str]) -> dict:
    assert main(["compare", str(a), str(b), "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_a_slower_run_is_a_significant_change(tmp_path: Path, capsys) -> None:
    before = synthetic_recording(tmp_path / "a", step_s=0.100)
    after = synthetic_recording(tmp_path / "b", step_s=0.120)
    comparison = run_compare(before, after, capsys)
    step = next(m for m in comparison["metrics"] if m["name"] == "step time (s)")
    assert set(step) == {"name", "a", "b", "ratio", "significant"}
    assert step["ratio"] == pytest.approx(1.2, rel=0.02) and step["significant"]
    assert comparison["warnings"] == []


def test_noise_alone_is_not_a_significant_change(tmp_path: Path, capsys) -> None:
    before = synthetic_recording(tmp_path / "a", step_s=0.100, spread=0.01)
    after = synthetic_recording(tmp_path / "b", step_s=0.1005, spread=0.01)
    comparison = run_compare(before, after, capsys)
    assert not any(m["significant"] for m in comparison["metrics"])


def test_different_work_is_warned_about(tmp_path: Path, capsys) -> None:
    comparison = run_compare(
        synthetic_recording(tmp_path / "a", step_s=0.1),
        synthetic_recording(tmp_path / "b", step_s=0.1, model="small"),
        capsys,
    )
    assert comparison["warnings"] == ["the runs trained different models (tiny vs small)"]


def test_mann_whitney_separates_shifted_samples_only() -> None:
    generator = np.random.default_rng(1)
    base = generator.normal(0, 1, 50)
    assert mann_whitney_p(base, generator.normal(0, 1, 50)) > 0.01
    assert mann_whitney_p(base, generator.normal(2, 1, 50)) < 1e-6


@pytest.mark.slow
def test_a_recording_compared_with_itself_changes_nothing(recorded: Path, capsys) -> None:
    comparison = run_compare(recorded, recorded, capsys)
    names = [m["name"] for m in comparison["metrics"]]
    assert {
        "step time (s)",
        "throughput (tokens/s)",
        "dp/all_reduce exposed time per step (s)",
        "stage 0 bubble",
        "rank 3 peak memory (bytes)",
        "most loaded rank peak memory (bytes)",
    } <= set(names)
    assert all(m["ratio"] == pytest.approx(1.0) and not m["significant"] for m in comparison["metrics"])


@pytest.mark.slow
def test_perfetto_trace_has_a_track_per_rank_with_slices_and_counters(recorded: Path, tmp_path: Path) -> None:
    out = tmp_path / "trace.json"
    assert main(["export", str(recorded), "--format", "perfetto", "-o", str(out)]) == 0
    trace = json.loads(out.read_text())["traceEvents"]
    processes = {e["args"]["name"] for e in trace if e["ph"] == "M" and e["name"] == "process_name"}
    assert processes == {"rank 0", "rank 1", "rank 2", "rank 3"}
    slices = [e for e in trace if e["ph"] == "X"]
    assert {e["cat"] for e in slices} == {"step", "stage", "collective"}
    assert all(e["dur"] >= 0 and e["ts"] > 0 for e in slices)
    assert sum(e["cat"] == "step" for e in slices) == 16  # 4 steps x 4 ranks
    assert any(e["ph"] == "C" and e["name"] == "memory (bytes)" for e in trace)


@pytest.mark.slow
def test_csv_export_writes_every_table_and_refuses_to_overwrite(recorded: Path, tmp_path: Path, capsys) -> None:
    out = tmp_path / "csv"
    assert main(["export", str(recorded), "--format", "csv", "-o", str(out)]) == 0
    assert {"step.csv", "collective.csv", "stage_action.csv", "memory.csv", "manifest.json"} <= {
        p.name for p in out.iterdir()
    }
    assert (out / "step.csv").read_text().splitlines()[0].startswith("rank,step,start_ns,duration_s")
    capsys.readouterr()
    assert main(["export", str(recorded), "--format", "csv", "-o", str(out)]) == 2
    assert "exists" in capsys.readouterr().err
    shutil.rmtree(out)


def test_a_part_of_a_trace_holds_its_ranks_and_steps_and_the_counters_over_them(tmp_path: Path) -> None:
    from meshtop.recordings.samples import SAMPLE

    out = tmp_path / "part.json"
    assert (
        main(["export", str(SAMPLE), "--format", "perfetto", "-o", str(out), "--ranks", "0,2", "--steps", "10-12"]) == 0
    )
    trace = json.loads(out.read_text())["traceEvents"]
    processes = {e["args"]["name"] for e in trace if e["ph"] == "M" and e["name"] == "process_name"}
    assert processes == {"rank 0", "rank 2"}
    slices = [e for e in trace if e["ph"] == "X"]
    assert {e["pid"] for e in slices} == {0, 2}
    assert (
        sorted(e["name"] for e in slices if e["cat"] == "step") == ["step 10"] * 2 + ["step 11"] * 2 + ["step 12"] * 2
    )
    assert {e["args"]["step"] for e in slices if e["cat"] in ("stage", "collective")} == {10, 11, 12}
    steps = [e for e in slices if e["cat"] == "step"]
    first, last = min(e["ts"] for e in steps), max(e["ts"] + e["dur"] for e in steps)
    memory = [e for e in trace if e["ph"] == "C" and e["name"] == "memory (bytes)"]
    assert len(memory) == 6 and {e["pid"] for e in memory} == {0, 2}  # each rank's snapshot at each step's end
    load = [e for e in trace if e["ph"] == "C" and e["name"] == "cpu %"]
    assert load and all(e["pid"] in (0, 2) and first - 1 <= e["ts"] <= last + 1 for e in load)


def test_a_traces_size_is_estimated_before_and_a_whole_one_too_large_for_perfetto_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from meshtop.recordings import export
    from meshtop.recordings.reader import open_recording
    from meshtop.recordings.samples import SAMPLE
    from tests.kit.commands import one_line_error

    out = tmp_path / "whole.json"
    assert main(["export", str(SAMPLE), "--format", "perfetto", "-o", str(out)]) == 0
    capsys.readouterr()
    estimate = export.estimated_bytes(open_recording(SAMPLE))
    assert estimate == pytest.approx(out.stat().st_size, rel=0.1)
    monkeypatch.setattr(export, "PERFETTO_UI_BYTES", estimate // 2)
    line = one_line_error(["export", str(SAMPLE), "--format", "perfetto", "-o", str(tmp_path / "again.json")], capsys)
    assert "more than Perfetto's UI opens" in line and "--ranks" in line and "--steps" in line
    assert not (tmp_path / "again.json").exists()
    for argv, message in (
        (["--ranks", "3-1"], "--ranks '3-1': the range 3-1 runs backwards"),
        (["--steps", "1-2,5-6"], "give one range of steps"),
        (["--steps", "900-901"], "no step 900-901"),
        (["--ranks", "x"], "give numbers and ranges"),
    ):
        target = tmp_path / "bad.json"
        assert message in one_line_error(
            ["export", str(SAMPLE), "--format", "perfetto", "-o", str(target), *argv], capsys
        )
    csv = one_line_error(["export", str(SAMPLE), "--format", "csv", "-o", str(tmp_path / "c"), "--ranks", "0"], capsys)
    assert "give them with --format perfetto" in csv


def test_a_compare_at_scale_names_what_stood_out_before_and_after_and_keeps_per_rank_rows_short(
    tmp_path: Path, capsys
) -> None:
    """1024 ranks on 16 nodes, node 5 twice as slow before and not after: the text names node 5 and its 64
    ranks in A, nothing in B, and says fixed (the other way round: new); the JSON lists the flagged ranks, the
    worst first, and counts them all."""
    from tests.kit.recordings import fleet_recording

    slow = fleet_recording(tmp_path / "slow", ranks=1024, nodes=16, slow_node=5)
    even = fleet_recording(tmp_path / "even", ranks=1024, nodes=16)
    assert main(["compare", str(slow), str(even)]) == 0
    text = capsys.readouterr().out
    [line] = [line for line in text.splitlines() if line.strip().startswith("step time: A:")]
    assert "A: node 5, 64 rank(s): " in line and "and 56 more; B: nothing  [fixed]" in line, line
    assert main(["compare", str(even), str(slow), "--json"]) == 0
    [step] = [row for row in json.loads(capsys.readouterr().out)["standing_out"] if row["measure"] == "step"]
    assert step["verdict"] == "new" and step["a"]["flagged_ranks"] == 0
    assert [node["node"] for node in step["b"]["nodes"]] == [5] and step["b"]["flagged_ranks"] == 64
    assert len(step["b"]["ranks"]) == 8 and all(320 <= rank["rank"] < 384 for rank in step["b"]["ranks"])
    values = [rank["value"] for rank in step["b"]["ranks"]]
    assert values == sorted(values, reverse=True) and values[0] > 1.9 * step["b"]["median"]


def test_a_compare_of_many_ranks_prints_the_per_rank_peaks_that_moved_most(tmp_path: Path, capsys) -> None:
    """Past 16 ranks, the text keeps the 8 per-rank peak rows that moved most and counts the others."""
    from tests.kit.events import memory_snapshot

    def run(directory: Path, grown: int) -> Path:
        events = [memory_snapshot(rank, (100 + (50 if rank == grown else 0)) << 20) for rank in range(32)]
        return write_recording(directory, events, run=description(dp=32))

    assert main(["compare", str(run(tmp_path / "a", -1)), str(run(tmp_path / "b", 7))]) == 0
    lines = capsys.readouterr().out.splitlines()
    per_rank = [line for line in lines if line.strip().startswith("rank ") and "peak memory" in line]
    assert len(per_rank) == 8 and next(line for line in per_rank if "1.500" in line).split()[1] == "7", per_rank
    assert any("the other 24 ranks' peak memory: B / A 1.000 to 1.000, 0 moved" in line for line in lines), lines
