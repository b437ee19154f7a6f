"""A plain torchrun script that paces its steps and can fail once, for the tests of torchrun's restarts.

``--sleep-s`` per step keeps the job running while a node joins; ``--fail-at STEP`` makes rank 1 raise at that
step in the first start only (torchrun's ``TORCHELASTIC_RESTART_COUNT`` is 0 there), so ``--max-restarts 1``
starts every rank again and the job then completes.
"""

import argparse
import os
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--sleep-s", type=float, default=0.0)
    parser.add_argument("--fail-at", type=int, default=None)
    args = parser.parse_args()
    restart = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    first_start = restart == "0"
    # torch 2.13's gloo group finds its peers' addresses under keys that a restart does not clear: a new start
    # may connect to a dead rank's port (1 in 4 plain torchruns here); a prefix per start keeps them apart
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    agent_store = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
    store = dist.TCPStore(
        os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world, is_master=rank == 0 and not agent_store
    )
    dist.init_process_group("gloo", store=dist.PrefixStore(f"start{restart}", store), rank=rank, world_size=world)
    torch.manual_seed(0)
    ddp = DistributedDataParallel(nn.Linear(16, 16))
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.01)
    for step in range(args.steps):
        if first_start and step == args.fail_at and dist.get_rank() == 1:
            raise RuntimeError(f"failing at step {step} on purpose (first start)")
        x = torch.randn(8, 16)
        loss = (ddp(x) - x).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        time.sleep(args.sleep_s)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
