"""A data-parallel torchrun script whose steps take at least ``--step-s`` seconds: a job that runs long enough to
be watched, left and come back to, on any machine (a sleep, not a bigger model, sets its pace)."""

import argparse
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--step-s", type=float, default=0.2)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = DistributedDataParallel(nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.Linear(64, 32)))
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-2)
    data = torch.Generator().manual_seed(1 + dist.get_rank())
    for _ in range(args.steps):
        began = time.monotonic()
        x = torch.randn(16, 32, generator=data)
        loss = (model(x) - x).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        time.sleep(max(0.0, args.step_s - (time.monotonic() - began)))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
