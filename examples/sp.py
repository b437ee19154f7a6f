"""Sequence-parallel training with DTensor, as in torchtitan and PyTorch's tensor-parallel tutorial.

Each rank holds a slice of the sequence (``Shard(0)`` of the tokens) and normalises it; the MLP's first
linear is split by columns and all-gathers the sequence it reads, its second is split by rows and
reduce-scatters what it writes back into sequence slices. A step issues, per rank and per block, an
all-gather and a reduce-scatter going forward and the two again (swapped) going back: with one block,
2 reduce-scatters a step a rank (and the all-reduces of the norm's replicated weight gradients).

A plain torchrun script (it imports nothing of meshtop's)::

    torchrun --standalone --nproc-per-node 2 examples/sp.py --steps 8
    meshtop record OUT -- torchrun --standalone --nproc-per-node 2 examples/sp.py --steps 8

The mesh has one dim, named ``tp``. nccl with one GPU per rank where there are GPUs, gloo on CPU otherwise.
"""

import argparse
import os

import torch
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Shard
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, SequenceParallel, parallelize_module


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--tokens", type=int, default=32, help="the whole sequence, split over the ranks")
    args = parser.parse_args()
    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    world = int(os.environ["WORLD_SIZE"])
    mesh = init_device_mesh("cuda" if cuda else "cpu", (world,), mesh_dim_names=("tp",))
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.LayerNorm(args.dim), nn.Linear(args.dim, 4 * args.dim), nn.GELU(), nn.Linear(4 * args.dim, args.dim)
    )
    plan = {
        "0": SequenceParallel(sequence_dim=0),  # the norm runs on this rank's slice (its weights replicated)
        "1": ColwiseParallel(input_layouts=Shard(0)),  # all-gathers the sequence slices
        "3": RowwiseParallel(output_layouts=Shard(0)),  # reduce-scatters back into sequence slices
    }
    model = parallelize_module(model.to(mesh.device_type), mesh, plan)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=False)
    data = torch.Generator().manual_seed(1 + mesh.get_rank())  # each rank its own slice of the sequence
    for step in range(args.steps):
        x = torch.randn(args.tokens // world, args.dim, generator=data).to(mesh.device_type)
        loss = (model(x) - x).pow(2).mean()  # this rank's slice: the output is Shard(0), local here
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if mesh.get_rank() == 0:
            print(f"step {step} loss {loss.item():.4f}", flush=True)
    torch.distributed.barrier()  # every rank done before any tears its group down
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
