"""What blocks a real training run (recordings/metrics/blocker.py): short jobs on gloo CPU ranks, each made to
be held by one part of its step, read back through ``meshtop summary REC --json``; and a plan the planner says
does not fit, refused by ``run`` and ``record`` before anything launches (tui/options.py ``refuse_misfit``)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from meshtop.recordings.metrics.blocker import BEYOND_COMPUTE, MATERIAL_SHARE, SUGGESTIONS, percent
from meshtop.runner.errors import PlanError
from meshtop.runner.plan import RunSpec, resolve
from meshtop.tui.options import refuse_misfit
from tests.bench.accuracy import ANY_ABOVE, BELOW
from tests.kit.commands import one_line_error, run_meshtop
from tests.probes.test_node_samplers import fake_pynvml

REPO = Path(__file__).resolve().parents[2]
CPU = {"CUDA_VISIBLE_DEVICES": ""}


def recorded_blocker(recording: Path, *command: str | Path, kind: str) -> dict[str, Any]:
    """Record ``command`` (meshtop's arguments after ``record OUT``) into ``recording``; its blocker is
    ``kind``, the breakdown's largest part beyond compute and at least :data:`MATERIAL_SHARE` of the step, and
    its evidence names that share and its seconds a step. The breakdown's parts."""
    done = run_meshtop("record", recording, *command, env=CPU, cwd=REPO)
    assert done.returncode == 0, done.stdout + done.stderr
    found = json.loads(run_meshtop("summary", recording, "--json").stdout)
    blocker, parts = found["blocker"], found["breakdown"]["parts"]
    assert blocker["kind"] == kind, (blocker, parts)
    share = parts[kind]["share"]
    assert share >= max(MATERIAL_SHARE, *(parts[part]["share"] for part in BEYOND_COMPUTE)), parts
    said = f"{kind} {percent(share)} of the step ({parts[kind]['s_per_step'] * 1e3:.1f} ms a step), the largest"
    assert blocker["evidence"].startswith(said), blocker
    assert blocker["suggestion"] == SUGGESTIONS[kind]
    return parts


@pytest.mark.slow
def test_a_slow_dataloader_blocks_a_script_by_its_data(tmp_path: Path) -> None:
    """tests/kit/breakdown_script.py, a torchrun script of its own, on 2 ranks, its dataset sleeping 15 ms a
    sample, 4 a batch: about 60 ms of a step of about 70 waits on the DataLoader."""
    script = ["torchrun", "--standalone", "--nproc-per-node=2", "tests/kit/breakdown_script.py"]
    script += ["--out", str(tmp_path / "written"), "--steps", "6", "--data-sleep-ms", "15"]
    parts = recorded_blocker(tmp_path / "data", "--", *script, kind="data")
    assert parts["data"]["s_per_step"] > 0.040


@pytest.mark.slow
def test_a_dp2_run_of_the_tiny_model_on_gloo_is_blocked_by_communication(tmp_path: Path) -> None:
    """Two CPU ranks of the tiny model, one sequence of 8 tokens each: forward and backward take a few ms,
    too short to hide the gradients' all-reduce over gloo behind them (a third to a half of the step on 2
    cores; at the default 4 x 64 tokens a rank, a backward long enough to overlap most of it leaves some 13 %,
    too near the tenth to tell)."""
    recorded_blocker(tmp_path / "dp2", "--dp", "2", "--steps", "6", "--seq-len", "8", "--batch-size", "2",
                     kind="communication")  # fmt: skip


@pytest.mark.slow
def test_a_gpipe_run_of_two_microbatches_is_blocked_by_its_bubble(tmp_path: Path) -> None:
    """pp 2 with GPipe's 2 microbatches of the small model (as tests/bench/accuracy.py measures the bubble: 2
    sequences of 128 tokens a microbatch, compute enough to keep the stages balanced): each stage idles
    (p - 1) / (m + p - 1) = 1 / 3 of its schedule, within the accuracy bench's bounds; no collective runs
    outside the pipeline."""
    parts = recorded_blocker(
        tmp_path / "gpipe", "--model", "small", "--pp", "2", "--schedule", "gpipe", "--microbatches", "2",
        "--batch-size", "4", "--seq-len", "128", "--steps", "6", kind="bubble",
    )  # fmt: skip
    assert 1 / 3 - BELOW <= parts["bubble"]["share"] <= 1 / 3 + ANY_ABOVE, parts["bubble"]
    assert parts["communication"]["share"] < MATERIAL_SHARE


PARAMETERS_125M = 134_105_856
"""The 125m preset's parameters (``meshtop plan``'s model line: 134.1 M)."""


def test_a_plan_that_does_not_fit_is_refused_before_launch(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """dp 2 of the 125m model in fp32 against ``--device-memory 4GB``: each replica holds 16 bytes a parameter
    (weights 4, grads 4, Adam's two moments 8), 134.1 M x 16 = 2.0 GiB, and the activations of 4 sequences of
    1,024 tokens on top: the planner's 5.4 GiB on rank 0 (its first of equals), above 4 x 10^9 bytes =
    3.7 GiB. Nothing launches: no recording folder, no runs folder."""
    out = tmp_path / "rec"
    argv = ["record", str(out), "--model", "125m", "--dp", "2", "--device", "cpu", "--device-memory", "4GB"]
    line = one_line_error(argv, capsys)
    assert line.startswith("meshtop: error: blocker: fit: the predicted peak of rank 0, 5.4 GiB, above the "
                           "device's 3.7 GiB; try: "), line  # fmt: skip
    assert f"try: {SUGGESTIONS['fit']} (--no-fit-check launches it anyway)" in line
    assert not out.exists()
    plan = ["plan", "--ranks", "2", "--plans", "dp2", "--model", "125m", "--device-memory", "4GB", "--json"]
    [row] = json.loads(run_meshtop(*plan, env=CPU).stdout)["plans"]
    state = row["peak"]["weights_bytes"] + row["peak"]["grads_bytes"] + row["peak"]["optimizer_bytes"]
    assert state == pytest.approx(16 * PARAMETERS_125M, rel=1e-3)
    assert (row["peak_rank"], row["fits"], f"{row['peak']['fit_bytes'] / 2**30:.1f}") == (0, False, "5.4")
    runs = tmp_path / "runs"
    line = one_line_error(["run", "--runs-dir", str(runs), "--device", "cpu", "--device-memory", "1MiB"], capsys)
    assert "blocker: fit: the predicted peak of rank 0, 7.7 MiB, above the device's 1.0 MiB; try: " in line
    assert not runs.exists()
    line = one_line_error(["record", str(out), "--device-memory", "1GiB", "--", "train.py"], capsys)
    assert "--device-memory sets up the built-in model" in line  # a script is not planned


def test_on_gpus_the_visible_gpus_memory_is_the_device_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two fake GPUs of 141 GiB each (NVML, the boundary this machine cannot reach): the 8b model on one of them
    in bf16 is predicted 180.4 GiB on rank 0 (weights and grads 15.0 GiB each, Adam's state 29.9 GiB, the
    activations of 4 sequences of 4,096 tokens 120.5 GiB: ``meshtop plan --model 8b --gpus 1``), above it;
    the 1b model over both (30.3 GiB a rank) fits; ``--device-memory`` stands in place of the GPU's."""
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml(gpus=2))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    big = resolve(RunSpec(model="8b", dp=1, device="cuda"), gpus_visible=2)
    with pytest.raises(PlanError, match=r"^blocker: fit: the predicted peak of rank 0, 180\.4 GiB, above the "
                       r"device's 141\.0 GiB; try: "):  # fmt: skip
        refuse_misfit(big, None)
    refuse_misfit(big, "200GiB")
    refuse_misfit(resolve(RunSpec(model="1b", dp=2, device="cuda"), gpus_visible=2), None)


@pytest.mark.slow
def test_no_fit_check_launches_a_plan_predicted_not_to_fit(tmp_path: Path) -> None:
    done = run_meshtop("record", tmp_path / "rec", "--device-memory", "1MiB", "--no-fit-check", "--steps", "2",
                       env=CPU, cwd=REPO)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert (tmp_path / "rec" / "manifest.json").exists()
