"""The loss of a user's own script: what meshtop reads from ``backward()`` equals what the script wrote down.

``tests/kit/loss_script.py`` writes, per rank and step, the ``.item()`` of each micro-batch's loss before any
scaling (or, pipelined, of its schedule's losses). A step's loss is the loss whose gradient the optimizer
applies: for a loop that scales each micro-batch's loss by 1 / accumulation (as the frameworks do) the mean of
its micro-batches' losses, which is what such a loop logs; for one that does not, their sum; for a pipeline
schedule that scales its gradients by 1 / microbatches, the mean of its microbatches' losses, and for one that
does not, their sum. meshtop's step table must hold those values, to 1e-6 relative, with their count, on DDP,
FSDP2 and a 1F1B pipeline, with and without gradient accumulation.
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


def logged(line: dict[str, Any], *, scaled: bool) -> float:
    """What the loop's optimizer follows: a scaling loop's micro-batch losses each weigh 1 / their count (their
    mean, what the frameworks log), a loop that does not scale sums them."""
    micro = line["micro"]
    return sum(micro) / len(micro) if scaled else sum(micro)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("parallel", "accum", "scaled"),
    [("ddp", 1, True), ("ddp", 3, True), ("ddp", 3, False), ("fsdp", 1, True), ("fsdp", 2, True)],
    ids=["ddp", "ddp-accum3", "ddp-accum3-unscaled", "fsdp2", "fsdp2-accum2"],
)
def test_each_ranks_loss_is_the_one_its_optimizer_follows(
    tmp_path: Path, parallel: str, accum: int, scaled: bool
) -> None:
    script = ("--parallel", parallel, "--accum", str(accum), *(() if scaled else ("--no-scale",)))
    recording, written = record(tmp_path, 2, *script)
    steps = steps_of(recording)
    assert sorted(steps) == [(rank, step) for rank in range(2) for step in range(STEPS)]
    for rank in range(2):
        for step, line in written_losses(written, rank).items():
            row, expected = steps[(rank, step)], logged(line, scaled=scaled)
            assert math.isclose(row["loss"], expected, rel_tol=1e-6), (rank, step, row["loss"], line)
            assert row["losses"] == line["count"] == accum
    summary = summary_json(recording)["steps"]["loss"]
    ranks_first = [logged(written_losses(written, rank)[0], scaled=scaled) for rank in range(2)]
    assert math.isclose(summary["first"], sum(ranks_first) / 2, rel_tol=1e-6)  # the job's: the ranks' mean
    assert summary["per_step"] == accum


def test_the_rule_worked_by_hand() -> None:
    """The references above, by hand: micro-batch losses 2.0, 3.0 and 7.0 read 4.0 scaled, 12.0 not."""
    line = {"micro": [2.0, 3.0, 7.0]}
    assert (logged(line, scaled=True), logged(line, scaled=False)) == (4.0, 12.0)


@pytest.mark.slow
@pytest.mark.parametrize("scaled", [True, False], ids=["scale-grads", "no-scale-grads"])
def test_a_pipelines_loss_comes_from_its_last_stage_only(tmp_path: Path, scaled: bool) -> None:
    recording, written = record(tmp_path, 2, "--parallel", "pp", *(() if scaled else ("--no-scale",)))
    steps = steps_of(recording)
    last = {step: logged(line, scaled=scaled) for step, line in written_losses(written, 1).items()}
    assert len(last) == STEPS and not (written / "rank0.jsonl").read_text()
    for step in range(STEPS):
        assert steps[(0, step)]["loss"] is None and steps[(0, step)]["losses"] is None  # the first stage has none
        row = steps[(1, step)]
        assert math.isclose(row["loss"], last[step], rel_tol=1e-6), (step, row, last[step])
        assert row["losses"] == 4  # one a microbatch, each read once (its backward is not a second loss)
    assert math.isclose(summary_json(recording)["steps"]["loss"]["last"], last[STEPS - 1], rel_tol=1e-6)
    text = run_meshtop("summary", str(recording)).stdout
    assert f"{last[STEPS - 1]:.4g} last (from 1 of 2 ranks: the others compute none; each rank's " in text
    assert "from its 4 losses a step)" in text


@pytest.mark.slow
def test_no_loss_reads_none(tmp_path: Path) -> None:
    recording, written = record(tmp_path, 2, "--parallel", "ddp", meshtop_args=("--no-loss",))
    assert written_losses(written, 0)  # the script ran its steps
    assert {(row["loss"], row["losses"]) for row in steps_of(recording).values()} == {(None, None)}
    assert summary_json(recording)["steps"]["loss"]["first"] is None


TUTORIAL = "tests/kit/fsdp2_tutorial.py"


@pytest.mark.slow
@pytest.mark.parametrize("nan_from", [None, 4], ids=["trains", "diverges"])
def test_a_script_shaped_as_pytorchs_fsdp2_tutorial_records_every_step_and_its_loss(
    tmp_path: Path, nan_from: int | None
) -> None:
    """The tutorial's shape (meta-device model, ``fully_shard`` per layer then the root, ``to_empty`` and
    ``reset_parameters``, Adam, ``model(x).sum()``, ``clip_grad_norm_``, a DCP checkpoint at the end): its 10
    steps, each rank's loss as the script read it. A run whose loss turns NaN at step index 4 keeps all 10 steps
    (a step with a NaN loss was once dropped as a malformed event, so such a run recorded none), their losses NaN
    from there, and the summary says so."""
    out, written = tmp_path / "rec", tmp_path / "written"
    command = ["torchrun", "--standalone", "--nproc-per-node=2", TUTORIAL, "--out", str(written)]
    done = run_meshtop(
        "record", str(out), "--", *command, *(() if nan_from is None else ("--nan-from", str(nan_from))),
        env={"CUDA_VISIBLE_DEVICES": ""}, cwd=REPO,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    steps = steps_of(out)
    assert sorted(steps) == [(rank, step) for rank in range(2) for step in range(10)]
    for rank in range(2):
        for step, line in written_losses(written, rank).items():
            row = steps[(rank, step)]
            if nan_from is not None and step >= nan_from:
                assert math.isnan(row["loss"]) and math.isnan(line["loss"]), (rank, step, row)
            else:
                assert math.isclose(row["loss"], line["loss"], rel_tol=1e-6), (rank, step, row, line)
    summary = summary_json(out)["steps"]
    assert summary["count"] == 10 and summary["loss"]["not_finite_from"] == nan_from
    if nan_from is not None:
        assert "(NaN or infinite from step 5)" in run_meshtop("summary", str(out)).stdout
