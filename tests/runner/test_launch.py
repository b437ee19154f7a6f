"""meshtop supervises the job: each rank's exit, a failing rank named, Ctrl-C stops everything."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from meshtop.probes.events import StepTiming
from meshtop.runner.job.files import PHASE_NAME
from tests.kit.commands import meshtop
from tests.kit.jobs import alive

pytestmark = pytest.mark.slow


def test_failing_rank_is_named_with_its_error(launch_cpu, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MESHTOP_FAULT", "raise:1:2")
    launched = launch_cpu(dp=2, steps=5)
    result = launched.result
    assert result.status == "failed"
    assert result.root_cause == 1
    failing = result.ranks[1]
    assert failing.exit_code == 1
    assert "InjectedFault: fault injected by MESHTOP_FAULT on rank 1 at step 2" in failing.error
    assert len(launched.steps) == 2  # steps 0 and 1 completed on both ranks
    assert alive([s.pid for s in launched.started]) == []


def test_killed_rank_reports_its_signal(launch_cpu, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MESHTOP_FAULT", "kill:2:1")
    launched = launch_cpu(tp=2, pp=2, steps=4)
    result = launched.result
    assert result.status == "failed"
    assert result.root_cause == 2
    assert (result.ranks[2].exit_code, result.ranks[2].signal) == (-9, "SIGKILL")
    assert result.failed[0].rank == 2
    assert alive([s.pid for s in launched.started]) == []


def test_completed_job_reports_every_rank_exit_zero(launch_cpu, tmp_path: Path) -> None:
    launched = launch_cpu(dp=2, steps=2)
    assert launched.result.status == "completed"
    # the launcher said what it did before the ranks reported (the probe was built before the tests began)
    assert (tmp_path / "session" / PHASE_NAME).read_text().startswith("starting the ranks")
    assert [(r.rank, r.exit_code) for r in launched.result.ranks] == [(0, 0), (1, 0)]
    assert alive([s.pid for s in launched.started]) == []
    steps = [e for e in launched.events if isinstance(e, StepTiming)]
    assert len(steps) == 4
    # Each step says the CPU its rank used: some, and no more than its threads could in its wall time.
    assert all(s.cpu_s is not None and 0 < s.cpu_s < s.duration_s * 8 for s in steps)


def test_record_with_no_plan_options_runs_the_default_multi_rank_job(tmp_path: Path) -> None:
    done = subprocess.run(
        meshtop("record", str(tmp_path / "rec")),
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "CUDA_VISIBLE_DEVICES": ""},
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.startswith("meshtop: dp2 x tp1 x pp1")
    assert "step   20/20" in done.stdout
    assert "completed in" in done.stdout


def test_run_without_a_terminal_points_to_record(tmp_path: Path) -> None:
    done = subprocess.run(
        meshtop("run", "--runs-dir", str(tmp_path)),
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "CUDA_VISIBLE_DEVICES": ""},
    )
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "meshtop: error: meshtop run draws a dashboard, but standard output is not a terminal: "
        "use `meshtop record OUT` to record a job headless"
    ]
    assert list(tmp_path.iterdir()) == []  # nothing launched, nothing recorded


def test_record_writes_the_full_run_description(tmp_path: Path) -> None:
    out = tmp_path / "rec"
    done = subprocess.run(
        meshtop(
            "record", str(out), "--pp", "2", "--schedule", "gpipe", "--steps", "3", "--seed", "5", "--device", "cpu"
        ),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"recording: {out}" in done.stdout
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["schema_version"] == 3
    assert manifest["status"] == "completed"
    assert manifest["plan"] == {
        "dp": 1,
        "tp": 1,
        "pp": 2,
        "fsdp": False,
        "world_size": 2,
        "schedule": "gpipe",
        "microbatches": 4,
        "virtual_stages": 1,
        "stage_layers": [[0, 1], [2, 3]],
        "label": "dp1 x tp1 x pp2 (gpipe, 4 mb)",
    }
    assert manifest["model"]["name"] == "tiny" and manifest["model"]["parameters"] > 0
    assert (manifest["dtype"], manifest["device"], manifest["seed"], manifest["steps"]) == ("fp32", "cpu", 5, 3)
    assert manifest["command_line"][:3] == ["meshtop", "record", str(out)]
    assert manifest["software"]["torch"].startswith("2.")
    assert [r["exit_code"] for r in manifest["ranks"]] == [0, 0]
    assert manifest["steps_completed"] == 3
    kinds = {p.name for p in (out / "events").iterdir()}
    assert {
        "rank_started.parquet",
        "step.parquet",
        "collective.parquet",
        "stage_action.parquet",
        "memory.parquet",
    } <= kinds
