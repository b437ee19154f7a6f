"""Pipeline-parallel training with torch.distributed.pipelining: one stage per rank, the 1F1B schedule.

A plain torchrun script (it imports nothing of meshtop's)::

    torchrun --standalone --nproc-per-node 2 examples/pp.py --steps 8
    meshtop record OUT -- torchrun --standalone --nproc-per-node 2 examples/pp.py --steps 8

Each rank builds only its own layers (a manual split) and steps its own
optimizer. nccl with one GPU per rank where there are GPUs, gloo on CPU otherwise.
"""

import argparse
import os

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.pipelining import PipelineStage, Schedule1F1B


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--microbatches", type=int, default=4)
    args = parser.parse_args()
    cuda = torch.cuda.is_available()
    device = torch.device("cuda", int(os.environ["LOCAL_RANK"])) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if cuda else "gloo")
    rank, stages = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(rank)
    layers = nn.Sequential(nn.Linear(args.dim, 4 * args.dim), nn.GELU(), nn.Linear(4 * args.dim, args.dim)).to(device)
    stage = PipelineStage(layers, stage_index=rank, num_stages=stages, device=device)
    schedule = Schedule1F1B(stage, n_microbatches=args.microbatches, loss_fn=lambda out, y: (out - y).pow(2).mean())
    optimizer = torch.optim.AdamW(layers.parameters(), lr=1e-3)
    data = torch.Generator().manual_seed(1)
    for step in range(args.steps):
        x = torch.randn(8 * args.microbatches, args.dim, generator=data).to(device)
        optimizer.zero_grad()
        if rank == 0:
            schedule.step(x)
        elif rank == stages - 1:
            losses: list[torch.Tensor] = []
            schedule.step(target=x, losses=losses)
            print(f"step {step} loss {torch.stack(losses).mean().item():.4f}", flush=True)
        else:
            schedule.step()
        optimizer.step()
    dist.barrier()  # every rank done before any tears its group down
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
