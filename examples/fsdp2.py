"""Fully sharded data parallel training with FSDP2 (``fully_shard``): each rank holds a shard of every weight.

A plain torchrun script (it imports nothing of meshtop's)::

    torchrun --standalone --nproc-per-node 2 examples/fsdp2.py --steps 8
    meshtop record OUT -- torchrun --standalone --nproc-per-node 2 examples/fsdp2.py --steps 8

nccl with one GPU per rank where there are GPUs, gloo on CPU otherwise.
"""

import argparse
import os

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import fully_shard


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--layers", type=int, default=2)
    args = parser.parse_args()
    cuda = torch.cuda.is_available()
    device = torch.device("cuda", int(os.environ["LOCAL_RANK"])) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if cuda else "gloo")
    torch.manual_seed(0)
    model = nn.Sequential(
        *(
            nn.Sequential(nn.Linear(args.dim, 4 * args.dim), nn.GELU(), nn.Linear(4 * args.dim, args.dim))
            for _ in range(args.layers)
        )
    ).to(device)
    for block in model:
        fully_shard(block)
    fully_shard(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    data = torch.Generator().manual_seed(1 + dist.get_rank())
    for step in range(args.steps):
        x = torch.randn(32, args.dim, generator=data).to(device)
        loss = (model(x) - x).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if dist.get_rank() == 0:
            print(f"step {step} loss {loss.item():.4f}", flush=True)
    dist.barrier()  # every rank done before any tears its group down
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
