"""The loss of a user's own script: what meshtop reads from ``backward()`` equals what the script wrote down.

``tests/kit/loss_script.py`` writes, per rank and step, the mean of the ``.item()`` of the losses it
differentiated (or, pipelined, of its schedule's losses); meshtop's step table must hold the same values, to
1e-6 relative, with their count, on DDP, FSDP2 and a 1F1B pipeline, with and without gradient accumulation.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from tests.kit.commands import run_meshtop, summary_json

REPO = Path(__file__).resolve().parents[2]
SCRIPT = "tests/kit/loss_script.py"
STEPS = 4


def record(tmp_path: Path, ranks: int, *script_args: str, meshtop_args: tuple[str, ...] = ()) -> tuple[Path, Path]:
    out, written = tmp_path / "rec", tmp_path / "written"
    command = ["torchrun", "--standalone", f"--nproc-per-node={ranks}", SCRIPT, "--out", str(written)]
    done = run_meshtop(
        "record", str(out), *meshtop_args, "--", *command, "--steps", str(STEPS), *script_args,
        env={"CUDA_VISIBLE_DEVICES": ""}, cwd=REPO,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    return out, written


def steps_of(recording: Path) -> dict[tuple[int, int], dict[str, Any]]:
    rows = pq.read_table(recording / "events" / "step.parquet").to_pylist()
    return {(row["rank"], row["step"]): row for row in rows}


def written_losses(written: Path, rank: int) -> dict[int, dict[str, Any]]:
    path = written / f"rank{rank}.jsonl"
    return {line["step"]: line for line in map(json.loads, path.read_text().splitlines())}


@pytest.mark.slow
@pytest.mark.parametrize(
    ("parallel", "accum"),
    [("ddp", 1), ("ddp", 3), ("fsdp", 1), ("fsdp", 2)],
    ids=["ddp", "ddp-accum3", "fsdp2", "fsdp2-accum2"],
)
def test_each_ranks_loss_is_the_mean_the_script_computed(tmp_path: Path, parallel: str, accum: int) -> None:
    recording, written = record(tmp_path, 2, "--parallel", parallel, "--accum", str(accum))
    steps = steps_of(recording)
    assert sorted(steps) == [(rank, step) for rank in range(2) for step in range(STEPS)]
    for rank in range(2):
        for step, line in written_losses(written, rank).items():
            row = steps[(rank, step)]
            assert math.isclose(row["loss"], line["loss"], rel_tol=1e-6), (rank, step, row["loss"], line)
            assert row["losses"] == line["count"] == accum
    summary = summary_json(recording)["steps"]["loss"]
    first = sum(written_losses(written, rank)[0]["loss"] for rank in range(2)) / 2  # the job's: the ranks' mean
    assert math.isclose(summary["first"], first, rel_tol=1e-6)
    assert summary["per_step"] == accum


@pytest.mark.slow
def test_a_pipelines_loss_comes_from_its_last_stage_only(tmp_path: Path) -> None:
    recording, written = record(tmp_path, 2, "--parallel", "pp")
    steps = steps_of(recording)
    last = written_losses(written, 1)
    assert len(last) == STEPS and not (written / "rank0.jsonl").read_text()
    for step in range(STEPS):
        assert steps[(0, step)]["loss"] is None and steps[(0, step)]["losses"] is None  # the first stage has none
        row = steps[(1, step)]
        assert math.isclose(row["loss"], last[step]["loss"], rel_tol=1e-6), (step, row, last[step])
        assert row["losses"] == 4  # one a microbatch, each read once (its backward is not a second loss)
    assert math.isclose(summary_json(recording)["steps"]["loss"]["last"], last[STEPS - 1]["loss"], rel_tol=1e-6)
    text = run_meshtop("summary", str(recording)).stdout
    assert f"{last[STEPS - 1]['loss']:.4g} last (from 1 of 2 ranks: the others compute none; each rank's the " in text
    assert "mean of its 4 losses a step)" in text


@pytest.mark.slow
def test_no_loss_reads_none(tmp_path: Path) -> None:
    recording, written = record(tmp_path, 2, "--parallel", "ddp", meshtop_args=("--no-loss",))
    assert written_losses(written, 0)  # the script ran its steps
    assert {(row["loss"], row["losses"]) for row in steps_of(recording).values()} == {(None, None)}
    assert summary_json(recording)["steps"]["loss"]["first"] is None
