"""Lightning's Trainer on the tiny Llama, 2 CPU ranks (gloo), DDP strategy, with gradient accumulation.

``torchrun --nproc-per-node 2 lightning_trainer.py --out DIR [--steps S] [--accum K]``

In float32 Lightning runs each optimizer step's last micro-batch (forward and backward) inside
``optimizer.step(closure)``, the micro-batches before it outside. ``training_step`` returns the micro-batch's
mean token loss, which Lightning divides by K (the accumulation) before ``backward``; it logs that loss with
``self.log(..., sync_dist=True)``: the mean over ranks of the one micro-batch's loss, undivided. A step's logged
loss here is the mean of its micro-batches' logged values (Lightning keeps no accumulated loss of its own).

Writes (``witness``) rank 0's account: ``global_step`` (Lightning's optimizer steps) and each step's logged
loss, read back from ``trainer.callback_metrics`` after each micro-batch; each rank's scalars given to
``backward`` (``outputs["loss"]``, divided by K) and its optimizer's bytes; torch's flight records. It imports
nothing of meshtop's.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from statistics import fmean

import lightning as L
import torch
import torch.distributed as dist
from tiny_llama import TokenDataset, tiny_llama
from witness import flight_records, write_account, write_rank

BATCH = 4
RANKS = 2


class TinyLlamaModule(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.model = tiny_llama()

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        loss = self.model(**batch).loss
        self.log("train_loss", loss, on_step=True, on_epoch=False, sync_dist=True)
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=1e-3)


class Account(L.Callback):
    """What Lightning said of each micro-batch, grouped by the optimizer step it went into."""

    def __init__(self) -> None:
        self.logged: list[list[float]] = []
        self.backpropagated: list[list[float]] = []
        self._logged: list[float] = []
        self._backpropagated: list[float] = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self._logged.append(trainer.callback_metrics["train_loss"].item())
        self._backpropagated.append(outputs["loss"].item())
        if trainer.global_step > len(self.logged):  # this micro-batch ended an optimizer step
            self.logged.append(self._logged)
            self.backpropagated.append(self._backpropagated)
            self._logged, self._backpropagated = [], []


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--accum", type=int, default=1)
    args = parser.parse_args()
    dataset = TokenDataset(BATCH * RANKS * args.accum * args.steps)
    loader = torch.utils.data.DataLoader(dataset, batch_size=BATCH, shuffle=False)
    account = Account()
    trainer = L.Trainer(
        accelerator="cpu",
        devices=RANKS,
        strategy="ddp",
        max_steps=args.steps,
        accumulate_grad_batches=args.accum,
        precision="32-true",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[account],
        default_root_dir=str(args.out / "lightning"),
    )
    trainer.fit(TinyLlamaModule(), loader)
    flight_records(args.out)
    write_rank(args.out, backpropagated=account.backpropagated, optimizer=trainer.optimizers[0])
    if dist.get_rank() == 0:
        logged = [fmean(values) for values in account.logged]
        write_account(args.out, {"optimizer_steps": trainer.global_step, "logged_loss": logged})
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
