"""Where an unmodified script's steps go (recordings/metrics/breakdown.py over probes/phases.py), checked on
scripts made slow in one place on purpose (tests/kit/breakdown_script.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from tests.kit.commands import run_meshtop, summary_json

REPO = Path(__file__).resolve().parents[2]
SCRIPT = "tests/kit/breakdown_script.py"
STEPS = 6
SLEEP_MS = 15.0
"""Per sample: 4 samples a batch, so about 60 ms of every step is the DataLoader's."""


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
