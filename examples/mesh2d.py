"""Data x tensor parallel training on a 2-D DeviceMesh: tensor parallel inside each pair, FSDP2 across pairs.

A plain torchrun script (it imports nothing of meshtop's); 4 ranks::

    torchrun --standalone --nproc-per-node 4 examples/mesh2d.py --steps 8
    meshtop record OUT -- torchrun --standalone --nproc-per-node 4 examples/mesh2d.py --steps 8

The mesh's dims are named ``dp`` and ``tp``. nccl with one GPU per rank where
there are GPUs, gloo on CPU otherwise.
"""

import argparse
import os

import torch
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--tp", type=int, default=2)
    args = parser.parse_args()
    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    world = int(os.environ["WORLD_SIZE"])
    mesh = init_device_mesh("cuda" if cuda else "cpu", (world // args.tp, args.tp), mesh_dim_names=("dp", "tp"))
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(args.dim, 4 * args.dim), nn.GELU(), nn.Linear(4 * args.dim, args.dim))
    model = parallelize_module(model.to(mesh.device_type), mesh["tp"], {"0": ColwiseParallel(), "2": RowwiseParallel()})
    fully_shard(model, mesh=mesh["dp"])
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=False)
    data = torch.Generator().manual_seed(1 + mesh.get_coordinate()[0])  # one batch per dp replica
    for step in range(args.steps):
        x = torch.randn(32, args.dim, generator=data).to(mesh.device_type)
        loss = (model(x) - x).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if mesh.get_rank() == 0:
            print(f"step {step} loss {loss.item():.4f}", flush=True)
    torch.distributed.barrier()  # every rank done before any tears its group down
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
