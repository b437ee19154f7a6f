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
