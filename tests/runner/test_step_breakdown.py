"""Where an unmodified script's steps go (recordings/metrics/breakdown.py over probes/phases.py), checked on
scripts made slow in one place on purpose (tests/kit/breakdown_script.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from tests.kit.commands import run_meshtop, summary_json
from tests.kit.straggler_watch import watch_recording

REPO = Path(__file__).resolve().parents[2]
SCRIPT = "tests/kit/breakdown_script.py"
STEPS = 6
SLEEP_MS = 15.0
"""Per sample: 4 samples a batch, so about 60 ms of every step is the DataLoader's."""
STRAGGLING_STEPS = "300"
"""Steps of a job with a straggler: about 50 ms each, 15 s, past the 10 s the rule holds before it names a rank."""


def record(tmp_path: Path, ranks: int, *script_args: str) -> tuple[Path, Path]:
    out, written = tmp_path / "rec", tmp_path / "written"
    command = ["torchrun", "--standalone", f"--nproc-per-node={ranks}", SCRIPT, "--out", str(written)]
    done = run_meshtop(
        "record", str(out), "--", *command, "--steps", str(STEPS), *script_args,
        env={"CUDA_VISIBLE_DEVICES": ""}, cwd=REPO,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    return out, written


def step_rows(recording: Path) -> list[dict[str, Any]]:
    return pq.read_table(recording / "events" / "step.parquet").to_pylist()


@pytest.mark.slow
def test_a_slow_dataloader_is_most_of_the_step_and_the_parts_add_up(tmp_path: Path) -> None:
    recording, written = record(tmp_path, 2, "--data-sleep-ms", str(SLEEP_MS))
    breakdown = summary_json(recording)["breakdown"]
    assert breakdown["biggest"] == "data", breakdown
    for rank in range(2):
        parts = breakdown["per_rank"][str(rank)]
        assert sum(row["share"] for row in parts.values()) == pytest.approx(1.0, abs=0.01)  # they add up
        # the data part against the script's own clock around next(): the same time, within 10 % of the step
        waits = json.loads((written / f"rank{rank}.json").read_text())["data_s"]
        steps_s = sum(row["duration_s"] for row in step_rows(recording) if row["rank"] == rank)
        own_share = sum(waits[1:]) / steps_s  # step 0 begins at its first forward: its batch came before it
        assert parts["data"]["share"] == pytest.approx(own_share, abs=0.10), (parts["data"], own_share)
        assert parts["data"]["share"] > 0.5
    text = run_meshtop("summary", str(recording)).stdout
    assert "where the step goes (all ranks): data " in text, text


@pytest.mark.slow
def test_extra_compute_on_one_rank_names_it_the_straggler_within_30_s_with_forward_as_its_cause(tmp_path: Path) -> None:
    """Rank 1 spins 50 ms in its forward each step (well past a loaded 2-core VM's noise, which the 0.8 of steps
    below must stand); rank 0 waits for it in the all-reduce. Played back a step at a time, as the dashboard
    would have seen it live, rank 1 is named (and no other rank) within 30 s of the job's first step."""
    recording, _ = record(tmp_path, 2, "--busy-rank", "1", "--busy-ms", "50", "--steps", STRAGGLING_STEPS)
    watch = watch_recording(recording)
    assert list(watch.named) == [1] and watch.named[1] <= 30.0, watch.report()
    summary = summary_json(recording)
    [straggler] = summary["stragglers"]
    assert (straggler["rank"], straggler["cause"]) == (1, "forward"), straggler
    assert straggler["slowest_in"] >= 0.8 and straggler["cause_share"] > 0.5 > straggler["peers_cause_share"]
    assert straggler["verdict"].startswith("rank 1 is the slowest in ")
    assert " of steps: forward " in straggler["verdict"]
    rank0 = summary["breakdown"]["per_rank"]["0"]
    assert rank0["communication"]["share"] > rank0["forward"]["share"]  # the others wait on it
    assert straggler["verdict"] in run_meshtop("summary", str(recording)).stdout


@pytest.mark.slow
def test_a_slow_optimizer_is_the_biggest_part(tmp_path: Path) -> None:
    recording, _ = record(tmp_path, 2, "--optimizer-sleep-ms", "30")
    breakdown = summary_json(recording)["breakdown"]
    assert breakdown["biggest"] == "optimizer", breakdown["parts"]
    assert breakdown["parts"]["optimizer"]["s_per_step"] >= 0.030


@pytest.mark.slow
def test_a_slow_dataloader_on_one_rank_names_it_the_straggler_with_data_as_its_cause(tmp_path: Path) -> None:
    """Rank 1's dataset sleeps 12 ms a sample (48 ms a batch), rank 0's not at all: rank 1 makes every step
    slow, rank 0 waits for it in the all-reduce; summary and the dashboard's alert name rank 1 and its data."""
    recording, _ = record(tmp_path, 2, "--data-sleep-ms", "12", "--data-rank", "1", "--steps", STRAGGLING_STEPS)
    summary = summary_json(recording)
    [straggler] = summary["stragglers"]
    assert (straggler["rank"], straggler["cause"]) == (1, "data"), straggler
    assert straggler["verdict"].startswith("rank 1 is the slowest in ") and " of steps: data " in straggler["verdict"]
    assert straggler["cause_share"] > 0.5 > straggler["peers_cause_share"]
    assert summary["breakdown"]["per_rank"]["1"]["data"]["share"] > 0.5
    assert summary["steps"]["loss"]["first"] is not None  # the script's own loss, read from its backward
    text = run_meshtop("summary", str(recording)).stdout
    assert straggler["verdict"] in text and "loss: " in text
