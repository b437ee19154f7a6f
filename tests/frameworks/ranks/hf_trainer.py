"""The Hugging Face Trainer on the tiny Llama, 2 CPU ranks (gloo, DDP), with gradient accumulation.

``torchrun --nproc-per-node 2 hf_trainer.py --out DIR [--steps S] [--accum K]``

The Trainer logs, each step (``logging_steps=1``), the unweighted mean over ranks of each rank's sum of what
``training_step`` returned for its micro-batches. That is the scalar it gave ``backward``: the micro-batch's
summed token losses over the tokens of the whole accumulated batch of every rank, times the ranks
(``average_tokens_across_devices``, as the model accepts ``num_items_in_batch``); so the logged loss is the
mean token loss of the step's whole batch, and no division by the accumulation is left to do.

Writes (``witness``) the Trainer's own account, rank 0's: ``global_step`` and, from ``state.log_history``, each
step's loss; each rank's scalars given to ``backward`` (what ``training_step`` returned) and its optimizer's
bytes; torch's flight records. It imports nothing of meshtop's.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import torch
import torch.distributed as dist
from tiny_llama import TokenDataset, tiny_llama
from transformers import Trainer, TrainerCallback, TrainingArguments
from witness import flight_records, write_account, write_rank

BATCH = 4


class RecordingTrainer(Trainer):
    """The Trainer, keeping what ``training_step`` returned, grouped by optimizer step."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.micro_losses: list[float] = []
        self.step_losses: list[list[float]] = []

    def training_step(self, model, inputs, num_items_in_batch=None) -> torch.Tensor:
        loss = super().training_step(model, inputs, num_items_in_batch)
        self.micro_losses.append(loss.item())
        return loss


class StepEnd(TrainerCallback):
    """At each optimizer step's end, the micro-batch losses so far are that step's."""

    def __init__(self, trainer: RecordingTrainer) -> None:
        self.trainer = trainer

    def on_step_end(self, args, state, control, **kwargs):
        self.trainer.step_losses.append(self.trainer.micro_losses)
        self.trainer.micro_losses = []


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--accum", type=int, default=1)
    args = parser.parse_args()
    world = int(os.environ["WORLD_SIZE"])
    training = TrainingArguments(
        output_dir=str(args.out / "trainer"),
        max_steps=args.steps,
        per_device_train_batch_size=BATCH,
        gradient_accumulation_steps=args.accum,
        learning_rate=1e-3,
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        use_cpu=True,
        ddp_backend="gloo",
        dataloader_num_workers=0,
        disable_tqdm=True,
        seed=0,
    )
    dataset = TokenDataset(BATCH * world * args.accum * args.steps)
    trainer = RecordingTrainer(model=tiny_llama(), args=training, train_dataset=dataset)
    trainer.add_callback(StepEnd(trainer))
    trainer.train()
    flight_records(args.out)
    write_rank(args.out, backpropagated=trainer.step_losses, optimizer=trainer.optimizer.optimizer)
    if dist.get_rank() == 0:
        logged = [line["loss"] for line in trainer.state.log_history if "loss" in line]
        write_account(args.out, {"optimizer_steps": trainer.state.global_step, "logged_loss": logged})
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
