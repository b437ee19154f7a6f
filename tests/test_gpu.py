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
    result = run_job(run, session_dir=tmp_path / spec_name(spec), on_events=lambda arrivals: events.extend(arrivals.events()))
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


@pytest.mark.skipif(GPUS < 1, reason="needs a CUDA GPU")
def test_nvml_samples_the_real_gpu() -> None:
    from probes.nvml import Nvml

    nvml = Nvml()
    assert nvml.state == "ok"
    sample = nvml.sample(0)
    assert sample.name and sample.memory_total_bytes > 0 and sample.power_w is not None
    assert sample.sm_clock_mhz is not None and sample.temperature_c is not None
    nvml.close()


@pytest.mark.skipif(GPUS < 1, reason="needs a CUDA GPU")
def test_cuda_memory_accounting_fills_the_allocator_figures(tmp_path: Path) -> None:
    from probes.events import MemorySnapshot

    run = resolve(RunSpec(device="cuda", dp=1, steps=2, model="small"), gpus_visible=GPUS)
    events: list[Event] = []
    assert run_job(run, session_dir=tmp_path / "mem", on_events=lambda arrivals: events.extend(arrivals.events())).status == "completed"
    snapshot = [e for e in events if isinstance(e, MemorySnapshot)][-1]
    assert snapshot.allocated_bytes >= snapshot.weights_bytes + snapshot.optimizer_bytes
    assert snapshot.peak_allocated_bytes >= snapshot.allocated_bytes
    assert snapshot.activations_bytes is not None and snapshot.activations_bytes > 0
    assert 0 < snapshot.device_used_bytes <= snapshot.device_total_bytes


@pytest.mark.skipif(GPUS < 2, reason="needs two CUDA GPUs")
def test_nccl_collectives_are_timed_with_cuda_events(tmp_path: Path) -> None:
    from probes.events import CollectiveTiming

    run = resolve(RunSpec(device="cuda", dp=2, steps=2), gpus_visible=GPUS)
    events: list[Event] = []
    assert run_job(run, session_dir=tmp_path / "nccl", on_events=lambda arrivals: events.extend(arrivals.events())).status == "completed"
    timed = [e for e in events if isinstance(e, CollectiveTiming) and e.step is not None]
    assert timed and all(e.clock == "cuda_events" and e.end_ns > e.start_ns for e in timed)
