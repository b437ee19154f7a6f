"""A torchrun script that writes down its own losses, to check those meshtop reads (test_script_loss.py).

``torchrun --nproc-per-node N tests/kit/loss_script.py --parallel ddp|fsdp|pp --out DIR [--accum K] [--steps S]``

Each rank writes ``DIR/rank{R}.jsonl``: one line a step, ``{"step": s, "micro": [...], "count": n}``, the
``.item()`` of each micro-batch's loss before any scaling: ``--accum K`` runs K micro steps a step, each loss
divided by K before its backward, as gradient accumulation does in the frameworks (``--no-scale``: backpropagated
as it is, the gradients summed); pipelined (``--parallel pp``, the 1F1B schedule over 4 microbatches), the
schedule's losses on the last stage (``--no-scale``: the schedule told not to scale its gradients, its loss
function summing); the other stages write none. What a loop of each kind logs is worked out in the test from
``micro``.
``--device cuda``: nccl and a GPU a rank (DDP and FSDP2). ``--syncs FILE``: the steps after the first run under
torch's profiler, and FILE gets rank 0's count of each call that makes the host wait for the device
(:data:`WAITS`), so a run under meshtop and one without it can be compared (test_gpu.py). It imports nothing of
meshtop's.
"""

import argparse
import json
import os
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

DIM = 32
WAITS = ("cudaDeviceSynchronize", "cudaStreamSynchronize", "cudaEventSynchronize", "cudaStreamWaitEvent", "cudaMemcpy")
"""CUDA runtime calls that block the host until the device has done work (``cudaMemcpy`` is the blocking copy;
``cudaMemcpyAsync`` is not counted), and the wait of one stream on another's event."""


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--parallel", choices=("ddp", "fsdp", "pp"), required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--accum", type=int, default=1)
    parser.add_argument("--no-scale", dest="scale", action="store_false", help="micro-batch losses not scaled")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="cuda: nccl, a GPU a rank (ddp)")
    parser.add_argument("--syncs", type=Path, help="profile the steps after the first; write rank 0's waits here")
    args = parser.parse_args()
    cuda = args.device == "cuda"
    dist.init_process_group("nccl" if cuda else "gloo")
    device = torch.device("cuda", int(os.environ["LOCAL_RANK"])) if cuda else torch.device("cpu")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    data = torch.Generator().manual_seed(1 + rank)
    lines = []
    if args.parallel == "pp":
        lines = pipelined(args, rank, world)
    else:
        model: nn.Module = nn.Sequential(nn.Linear(DIM, 2 * DIM), nn.GELU(), nn.Linear(2 * DIM, DIM)).to(device)
        if args.parallel == "ddp":
            model = nn.parallel.DistributedDataParallel(model, device_ids=[device.index] if cuda else None)
        else:
            from torch.distributed.fsdp import fully_shard

            fully_shard(model)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
        profiler = None
        for step in range(args.steps):
            if step == 1 and args.syncs is not None:
                profiler = profile_waits()
            values = []
            for _ in range(args.accum):
                x = torch.randn(8, DIM, generator=data).to(device)
                loss = (model(x) - x).pow(2).mean()
                values.append(loss.item())
                (loss / args.accum if args.scale else loss).backward()
            optimizer.step()
            optimizer.zero_grad()
            lines.append({"step": step, "micro": values, "count": len(values)})
        if profiler is not None:
            profiler.stop()
            if rank == 0:
                write_waits(profiler, args.syncs)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"rank{rank}.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    dist.barrier()
    dist.destroy_process_group()


def profile_waits() -> torch.profiler.profile:
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU, *([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])]
    profiler = profile(activities=activities)
    profiler.start()
    return profiler


def write_waits(profiler: torch.profiler.profile, path: Path) -> None:
    counts = dict.fromkeys(WAITS, 0)
    for event in profiler.events():
        if event.name in counts:
            counts[event.name] += 1
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(counts))


def pipelined(args: argparse.Namespace, rank: int, world: int) -> list[dict[str, float]]:
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B

    microbatches = 4
    stage_module = nn.Sequential(nn.Linear(DIM, DIM), nn.GELU())
    stage = PipelineStage(stage_module, rank, world, torch.device("cpu"))
    schedule = Schedule1F1B(
        stage, n_microbatches=microbatches, loss_fn=lambda out, y: (out - y).pow(2).mean(), scale_grads=args.scale
    )
    optimizer = torch.optim.SGD(stage_module.parameters(), lr=0.05)
    lines = []
    shared = torch.Generator().manual_seed(7)  # every stage draws the same batch; the first and last use it
    for step in range(args.steps):
        x = torch.randn(4 * microbatches, DIM, generator=shared)
        if rank == 0:
            schedule.step(x)
        elif rank == world - 1:
            losses: list[torch.Tensor] = []
            schedule.step(target=x, losses=losses)
            values = [loss.item() for loss in losses]
            lines.append({"step": step, "micro": values, "count": len(values)})
        else:
            schedule.step()
        optimizer.step()
        optimizer.zero_grad()
    return lines


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
