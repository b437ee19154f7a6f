"""The CUDA path: nccl ranks, one GPU each. Skipped where there is no GPU."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import torch

from meshtop.probes.events import Event
from tests.kit.commands import run_meshtop, summary_json
from tests.kit.jobs import launch

pytestmark = pytest.mark.gpu
GPUS = torch.cuda.device_count() if torch.cuda.is_available() else 0


def run_on_gpus(tmp_path: Path, **spec: object) -> list[float]:
    launched = launch(tmp_path / spec_name(spec), device="cuda", dtype="fp32", steps=3, batch_size=8, **spec)
    assert launched.result.status == "completed", launched.result
    return launched.losses


def spec_name(spec: dict[str, object]) -> str:
    return "-".join(f"{k}{v}" for k, v in spec.items()) or "single"


@contextlib.contextmanager
def nccl_probe(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[list[Event], list[str]]]:
    """One nccl rank on GPU 0 with the collective probe installed (CUDA-event timing on): the events it emits
    and the errors it reports, until the block ends (the probe out, the process group destroyed)."""
    import torch.distributed as dist

    from meshtop.probes.collectives import CollectiveProbe, GroupDirectory
    from meshtop.probes.wire import NCCL_TIMING_ENV

    monkeypatch.setenv(NCCL_TIMING_ENV, "1")
    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("nccl", store=store, rank=0, world_size=1, device_id=torch.device("cuda", 0))
    events: list[Event] = []
    errors: list[str] = []
    probe = CollectiveProbe(
        rank=0, groups=GroupDirectory(), emit=events.append, step=lambda: 1, device_timing=True, on_error=errors.append
    )
    probe.install()
    try:
        yield events, errors
    finally:
        probe.uninstall()
        dist.destroy_process_group()


@pytest.mark.skipif(GPUS < 1, reason="needs a CUDA GPU")
def test_single_gpu_training_learns(tmp_path: Path) -> None:
    losses = run_on_gpus(tmp_path, dp=1)
    assert len(losses) == 3 and losses[-1] < losses[0]


@pytest.mark.skipif(GPUS < 2, reason="needs two CUDA GPUs (nccl puts one rank on each)")
@pytest.mark.parametrize(
    "plan", [dict(dp=2), dict(tp=2), dict(pp=2), dict(dp=2, fsdp=True)], ids=["dp2", "tp2", "pp2", "fsdp2"]
)
def test_two_gpu_plans_match_one_gpu(plan: dict[str, object], tmp_path: Path) -> None:
    # On the GPU, cuBLAS may pick other kernels for other shapes: looser than on CPU.
    assert run_on_gpus(tmp_path, **plan) == pytest.approx(run_on_gpus(tmp_path, dp=1), rel=1e-3)


@pytest.mark.skipif(GPUS < 1, reason="needs a CUDA GPU")
def test_nvml_samples_the_real_gpu() -> None:
    from meshtop.probes.nvml import Nvml

    nvml = Nvml()
    assert nvml.state == "ok"
    sample = nvml.sample(0)
    assert sample.name and sample.memory_total_bytes > 0 and sample.power_w is not None
    assert sample.sm_clock_mhz is not None and sample.temperature_c is not None
    nvml.close()


@pytest.mark.skipif(GPUS < 1, reason="needs a CUDA GPU")
def test_cuda_memory_accounting_fills_the_allocator_figures(tmp_path: Path) -> None:
    from meshtop.probes.events import MemorySnapshot

    launched = launch(tmp_path / "mem", device="cuda", dp=1, steps=2, model="small")
    assert launched.result.status == "completed"
    snapshot = [e for e in launched.events if isinstance(e, MemorySnapshot)][-1]
    assert snapshot.allocated_bytes >= snapshot.weights_bytes + snapshot.optimizer_bytes
    assert snapshot.peak_allocated_bytes >= snapshot.allocated_bytes
    assert snapshot.activations_bytes is not None and snapshot.activations_bytes > 0
    assert 0 < snapshot.device_used_bytes <= snapshot.device_total_bytes


@pytest.mark.skipif(GPUS < 1, reason="needs a CUDA GPU")
def test_a_real_cuda_out_of_memory_fails_the_rank_with_the_allocators_message(tmp_path: Path) -> None:
    """A batch far too large for any GPU: 4096 x 1024 tokens of the 125m model need terabytes of
    activations (the logits alone are 268 GB in bf16), so the caching allocator refuses within the first
    forward. Not the injected fault (``oom:R:S``, which raises the same error type on CPU)."""
    launched = launch(tmp_path / "oom", device="cuda", dp=1, steps=2, model="125m", batch_size=4096, seq_len=1024)
    result = launched.result
    assert result.status == "failed" and result.root_cause == 0, result
    error = result.ranks[0].error or ""
    assert "OutOfMemoryError" in error and "CUDA out of memory" in error, error
    assert "fault injected" not in error
    assert launched.steps == []


@pytest.mark.skipif(GPUS < 2, reason="needs two CUDA GPUs")
def test_nccl_collectives_are_timed_with_cuda_events(tmp_path: Path) -> None:
    from meshtop.probes.events import CollectiveTiming

    launched = launch(tmp_path / "nccl", device="cuda", dp=2, steps=2)
    assert launched.result.status == "completed"
    timed = [e for e in launched.events if isinstance(e, CollectiveTiming) and e.step is not None]
    assert timed and all(e.clock == "cuda_events" and e.end_ns > e.start_ns for e in timed)


@pytest.mark.skipif(GPUS < 1, reason="needs a CUDA GPU")
def test_nccl_timing_on_one_gpu_reads_cuda_events_without_blocking_the_host(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One nccl rank (all a one-GPU machine allows): the probe's device path, end to end.

    A 256 MiB all-reduce queued behind a long matmul on the stream: the call returns to the host long
    before the GPU runs it, and the event's duration is the all-reduce's own time on the GPU (CUDA
    events around it), not the time since the call.
    """
    import time

    import torch.distributed as dist

    from meshtop.probes.events import CollectiveTiming

    with nccl_probe(tmp_path, monkeypatch) as (events, errors):
        buffer = torch.ones(64 << 20, device="cuda")
        dist.all_reduce(buffer)  # warm nccl up
        torch.cuda.synchronize()
        time.sleep(0.1)
        events.clear()
        a = torch.randn(8192, 8192, device="cuda")
        for _ in range(20):  # about 0.2 s of queued work ahead of the collective
            a = a @ a / 8192
        called = time.perf_counter()
        dist.all_reduce(buffer)
        returned = time.perf_counter() - called
        torch.cuda.synchronize()
        deadline = time.monotonic() + 5
        while not events and time.monotonic() < deadline:
            time.sleep(0.01)
    timed = [e for e in events if isinstance(e, CollectiveTiming) and e.op == "all_reduce"]
    assert errors == []
    assert len(timed) == 1 and timed[0].clock == "cuda_events"
    assert returned < 0.05  # the host did not wait for the queued matmuls
    assert 0 <= timed[0].duration_s < 0.05  # the all-reduce alone, not the matmuls queued before it


@pytest.mark.skipif(GPUS < 1, reason="needs a CUDA GPU")
def test_every_nccl_op_kind_on_one_gpu_is_timed_with_cuda_events(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each collective one nccl rank can run (c10d's and the functional ones that sequence and tensor parallel
    use), timed by CUDA events; the barrier too, whatever work it returns."""
    import time

    import torch.distributed as dist
    import torch.distributed._functional_collectives as funcol

    from meshtop.probes.events import CollectiveTiming

    with nccl_probe(tmp_path, monkeypatch) as (events, errors):
        x = torch.ones(1 << 20, device="cuda")
        dist.all_reduce(x)
        dist.broadcast(x, src=0)
        dist.reduce(x, dst=0)
        dist.all_gather_into_tensor(torch.empty_like(x), x)
        dist.reduce_scatter_tensor(torch.empty_like(x), x)
        dist.all_to_all_single(torch.empty_like(x), x)
        dist.all_gather([torch.empty_like(x)], x)
        funcol.wait_tensor(funcol.all_reduce(x, "sum", dist.group.WORLD))
        funcol.wait_tensor(funcol.reduce_scatter_tensor(x, "sum", 0, dist.group.WORLD))
        funcol.wait_tensor(funcol.all_gather_tensor(x, 0, dist.group.WORLD))
        dist.barrier()
        torch.cuda.synchronize()
        deadline = time.monotonic() + 5
        while len(events) < 11 and time.monotonic() < deadline:
            time.sleep(0.01)
    timed = [e for e in events if isinstance(e, CollectiveTiming)]
    clocks = sorted({(e.op, e.clock) for e in timed})
    print(clocks)
    assert errors == []
    ops = [e.op for e in timed]
    for op in ("all_reduce", "broadcast", "reduce", "all_gather", "reduce_scatter", "all_to_all"):
        assert op in ops, clocks
    assert ops.count("all_reduce") == 2 and ops.count("reduce_scatter") == 2, clocks  # c10d's and the functional
    assert all(e.clock == "cuda_events" for e in timed if e.op != "barrier"), clocks
    assert "barrier" in ops, clocks


@pytest.mark.skipif(GPUS < 1, reason="needs a CUDA GPU")
def test_a_scripts_loss_on_the_gpu_is_read_from_pinned_memory_as_the_script_computed_it(tmp_path: Path) -> None:
    """A DDP script on one GPU with 2 micro steps a step: each step's loss, summed on the device and read once
        its copy to pinned memory completed, equals the mean of the script's own micro-batch ``.item()``s (each
    scaled by 1/2 before its backward: their sum); the breakdown adds up."""
    out, written = tmp_path / "rec", tmp_path / "written"
    script = ["tests/kit/loss_script.py", "--parallel", "ddp", "--accum", "2", "--device", "cuda", "--steps", "6"]
    done = run_meshtop(
        "record", str(out), "--", "torchrun", "--standalone", "--nproc-per-node=1", *script, "--out", str(written),
        cwd=Path(__file__).resolve().parents[2],
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    rows = {row["step"]: row for row in pq.read_table(out / "events" / "step.parquet").to_pylist()}
    lines = [json.loads(line) for line in (written / "rank0.jsonl").read_text().splitlines()]
    assert len(lines) == 6 and sorted(rows) == list(range(6))
    for line in lines:
        assert rows[line["step"]]["loss"] == pytest.approx(sum(line["micro"]) / 2, rel=1e-6)
        assert rows[line["step"]]["losses"] == 2
    breakdown = summary_json(out)["breakdown"]
    assert sum(row["share"] for row in breakdown["per_rank"]["0"].values()) == pytest.approx(1.0, abs=0.01)


@pytest.mark.skipif(GPUS < 1, reason="needs a CUDA GPU")
def test_meshtop_makes_the_host_wait_for_the_device_no_more_often_than_the_script_does(tmp_path: Path) -> None:
    """The check with torch's profiler: the same DDP script on one GPU (2 micro steps a step; under meshtop its
    loss read each step, the breakdown's device marks, its all-reduces timed by CUDA events) makes as many
    blocking CUDA calls (``loss_script.WAITS``) under ``meshtop record`` as under plain torchrun."""
    root = Path(__file__).resolve().parents[2]
    script = ["tests/kit/loss_script.py", "--parallel", "ddp", "--accum", "2", "--device", "cuda", "--steps", "6"]
    torchrun = ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node=1"]
    plain = subprocess.run(
        [sys.executable, *torchrun, *script, "--out", str(tmp_path / "plain"), "--syncs", str(tmp_path / "plain.json")],
        cwd=root, capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    assert plain.returncode == 0, plain.stdout + plain.stderr
    hooked = ["--out", str(tmp_path / "hooked"), "--syncs", str(tmp_path / "hooked.json")]
    done = run_meshtop("record", str(tmp_path / "rec"), "--", "torchrun", *torchrun[2:], *script, *hooked, cwd=root)
    assert done.returncode == 0, done.stdout + done.stderr
    without = json.loads((tmp_path / "plain.json").read_text())
    under = json.loads((tmp_path / "hooked.json").read_text())
    assert under == without
    assert without["cudaStreamSynchronize"] + without["cudaMemcpy"] >= 10  # the script's own .item()s: seen


@pytest.mark.skipif(GPUS < 1, reason="needs a CUDA GPU")
def test_forward_and_backward_windows_are_the_devices_time_not_the_hosts_queueing() -> None:
    """The host queues a forward of 40 large matmuls in well under a millisecond; the device takes tens of
    them: the window read from its marks (never a sync by the probe; the test's own sync only lets it read
    now) spans the device's time, as a separate pair of events measures it."""
    from meshtop.probes.device_clock import DeviceClock
    from meshtop.probes.phases import FORWARD, Phases

    phases = Phases(DeviceClock())
    x = torch.randn(4096, 4096, device="cuda")
    torch.cuda.synchronize()
    phases.take()  # idle: the anchor
    before, after = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    phases.begin(FORWARD)
    before.record()
    y = x
    for _ in range(40):
        y = torch.tanh(y @ x)
    after.record()
    phases.end(FORWARD)
    windows = phases.take()
    host_kinds, host_starts, host_ends = windows.kinds, windows.starts, windows.ends
    torch.cuda.synchronize()
    assert windows.ready()
    kinds, starts, ends = windows.final()
    device_ms = before.elapsed_time(after)
    assert kinds == host_kinds == "f" and device_ms > 5
    assert (ends[0] - starts[0]) / 1e6 == pytest.approx(device_ms, rel=0.05, abs=0.5)
    assert (host_ends[0] - host_starts[0]) / 1e6 < device_ms / 2  # the host only queued it
    assert ends[0] >= host_ends[0]  # the device finished after the host had queued it all
