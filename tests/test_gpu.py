"""The CUDA path: nccl ranks, one GPU each. Skipped where there is no GPU."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from probes.events import Event
from recordings.steps import StepFolder
from runner.launch import run_job
from runner.plan import RunSpec, resolve

pytestmark = pytest.mark.gpu
GPUS = torch.cuda.device_count() if torch.cuda.is_available() else 0


def run_on_gpus(tmp_path: Path, **spec: object) -> list[float]:
    run = resolve(RunSpec(device="cuda", dtype="fp32", steps=3, batch_size=8, **spec), gpus_visible=GPUS)  # type: ignore[arg-type]
    events: list[Event] = []
    result = run_job(run, session_dir=tmp_path / spec_name(spec), on_events=events.extend)
    assert result.status == "completed", result
    folder = StepFolder(run.world_size)
    steps = sorted((s for e in events if e.kind == "step" and (s := folder.add(e))), key=lambda s: s.step)
    return [s.loss for s in steps]


def spec_name(spec: dict[str, object]) -> str:
    return "-".join(f"{k}{v}" for k, v in spec.items()) or "single"


@pytest.mark.skipif(GPUS < 1, reason="needs a CUDA GPU")
def test_single_gpu_training_learns(tmp_path: Path) -> None:
    losses = run_on_gpus(tmp_path, dp=1)
    assert len(losses) == 3 and losses[-1] < losses[0]


@pytest.mark.skipif(GPUS < 2, reason="needs two CUDA GPUs (nccl puts one rank on each)")
@pytest.mark.parametrize("plan", [dict(dp=2), dict(tp=2), dict(pp=2), dict(dp=2, fsdp=True)],
                         ids=["dp2", "tp2", "pp2", "fsdp2"])
def test_two_gpu_plans_match_one_gpu(plan: dict[str, object], tmp_path: Path) -> None:
    # On the GPU, cuBLAS may pick other kernels for other shapes: looser than on CPU.
    assert run_on_gpus(tmp_path, **plan) == pytest.approx(run_on_gpus(tmp_path, dp=1), rel=1e-3)
