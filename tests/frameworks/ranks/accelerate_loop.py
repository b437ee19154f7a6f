"""A plain accelerate training loop on the tiny Llama, 2 CPU ranks (gloo, DDP), with gradient accumulation.

``accelerate launch --multi_gpu --num_processes 2 accelerate_loop.py --out DIR [--steps S] [--accum K]``, or the
same script under ``torchrun --nproc-per-node 2`` (``--multi_gpu`` makes accelerate launch through torchrun; on
a machine without GPUs the ranks run on the CPU with gloo).

The loop is accelerate's own recipe: ``with accelerator.accumulate(model)``, ``accelerator.backward(loss)``,
which differentiates ``loss / K`` (K the accumulation), and ``optimizer.step()`` and ``optimizer.zero_grad()`` on
every micro-batch: accelerate's optimizer does nothing until ``sync_gradients``. accelerate logs nothing by
itself; the loop logs, each optimizer step, ``accelerator.reduce(sum of loss / K, "mean")``: the mean over ranks
of the mean of each rank's micro-batch losses.

Writes (``witness``) rank 0's account: the optimizer steps accelerate took (micro-batches after which
``sync_gradients`` held) and each one's logged loss; each rank's scalars given to ``backward`` and its
optimizer's bytes; torch's flight records. It imports nothing of meshtop's.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
from accelerate import Accelerator
from tiny_llama import TokenDataset, tiny_llama
from witness import flight_records, write_account, write_rank

BATCH = 4


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--accum", type=int, default=1)
    args = parser.parse_args()
    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=args.accum)
    dataset = TokenDataset(BATCH * accelerator.num_processes * args.accum * args.steps)
    loader = torch.utils.data.DataLoader(dataset, batch_size=BATCH, shuffle=False)
    model = tiny_llama()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    model.train()
    steps, logged, backpropagated, micro = 0, [], [], []
    for batch in loader:
        with accelerator.accumulate(model):
            loss = model(**batch).loss
            accelerator.backward(loss)
            micro.append(loss.item() / accelerator.gradient_accumulation_steps)  # what backward differentiated
            optimizer.step()
            optimizer.zero_grad()
        if accelerator.sync_gradients:
            steps += 1
            logged.append(accelerator.reduce(torch.tensor(sum(micro)), "mean").item())
            backpropagated.append(micro)
            micro = []
    accelerator.wait_for_everyone()
    flight_records(args.out)
    write_rank(args.out, backpropagated=backpropagated, optimizer=optimizer.optimizer)
    if accelerator.is_main_process:
        write_account(args.out, {"optimizer_steps": steps, "logged_loss": logged})
    accelerator.end_training()


if __name__ == "__main__":
    main()
