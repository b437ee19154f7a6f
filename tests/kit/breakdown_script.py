"""A DDP torchrun script made slow in one place on purpose, to check where meshtop says its steps go
(tests/runner/test_step_breakdown.py). It imports nothing of meshtop's.

``torchrun --nproc-per-node N tests/kit/breakdown_script.py --out DIR [--data-sleep-ms MS [--data-rank R]]
[--busy-rank R --busy-ms MS] [--optimizer-sleep-ms MS] [--steps S]``

Each batch comes from a DataLoader (no workers) whose dataset sleeps ``--data-sleep-ms`` per sample, 4
samples a batch (``--data-rank R``: on rank R only). ``--busy-rank R``: rank R's model spins ``--busy-ms``
in its forward (extra compute on one rank). ``--optimizer-sleep-ms``: every rank's optimizer step sleeps that
long first. Each rank writes ``DIR/rank{R}.json``: the seconds it spent in ``next()`` on the loader, per step,
by its own clock.
"""

import argparse
import json
import os
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, Dataset

DIM = 64
BATCH = 4


class Busy(nn.Module):
    """Spins ``busy_s`` before its forward: compute that one rank does and the others do not."""

    def __init__(self, inner: nn.Module, busy_s: float) -> None:
        super().__init__()
        self.inner = inner
        self.busy_s = busy_s

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        until = time.perf_counter() + self.busy_s
        while time.perf_counter() < until:
            pass
        return self.inner(x)


class SlowSGD(torch.optim.SGD):
    """SGD whose step sleeps ``sleep_s`` first."""

    def __init__(self, params, lr: float, sleep_s: float) -> None:  # type: ignore[no-untyped-def]
        super().__init__(params, lr=lr)
        self.sleep_s = sleep_s

    def step(self, closure=None):  # type: ignore[no-untyped-def]
        time.sleep(self.sleep_s)
        return super().step(closure)


class Samples(Dataset):
    def __init__(self, sleep_s: float) -> None:
        self.sleep_s = sleep_s

    def __len__(self) -> int:
        return 10_000

    def __getitem__(self, index: int) -> torch.Tensor:
        if self.sleep_s:
            time.sleep(self.sleep_s)
        return torch.full((DIM,), float(index % 7) / 7)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--data-sleep-ms", type=float, default=0.0)
    parser.add_argument("--data-rank", type=int, default=None)
    parser.add_argument("--busy-rank", type=int, default=None)
    parser.add_argument("--busy-ms", type=float, default=0.0)
    parser.add_argument("--optimizer-sleep-ms", type=float, default=0.0)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    layers: nn.Module = nn.Sequential(nn.Linear(DIM, 4 * DIM), nn.GELU(), nn.Linear(4 * DIM, DIM))
    if rank == args.busy_rank:
        layers = Busy(layers, args.busy_ms / 1e3)
    model = nn.parallel.DistributedDataParallel(layers)
    optimizer = SlowSGD(model.parameters(), lr=0.01, sleep_s=args.optimizer_sleep_ms / 1e3)
    slow_data = args.data_rank is None or rank == args.data_rank
    batches = iter(DataLoader(Samples(args.data_sleep_ms / 1e3 if slow_data else 0.0), batch_size=BATCH))
    waits = []
    for _ in range(args.steps):
        begun = time.perf_counter()
        x = next(batches)
        waits.append(time.perf_counter() - begun)
        loss = (model(x) - x).pow(2).mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"rank{rank}.json").write_text(json.dumps({"data_s": waits}))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
