"""torchtune's ``full_finetune_distributed`` recipe, as torchtune ships it, on the tiny Llama: 2 CPU ranks (gloo),
FSDP2 (the recipe shards every layer and the model with ``fully_shard``), with gradient accumulation.

``torchrun --nproc-per-node 2 torchtune_recipe.py --out DIR [--steps S] [--accum K]``

torchtune 0.6's recipe needs three stand-ins to run on the CPU, each for a CUDA-only call that does not touch
training: ``get_memory_stats`` (rank 0 calls it after building the model, unasked, and it raises "Logging memory
stats is not supported on CPU devices"), ``log_memory_stats``, and ``cleanup_before_training`` (it calls
``torch.cpu.empty_cache``, which does not exist). The training loop is the recipe's own.

The recipe normalises the loss by tokens, not by micro-batches: each micro-batch differentiates its mean token
loss times its labelled tokens (the sum of its token losses), and before the optimizer step it all-reduces the
tokens and that sum and multiplies the gradients by ``ranks / tokens`` (``training.scale_grads``). It logs
``sum / tokens``: the mean token loss of the step's whole batch, over every rank and micro-batch.

Writes (``witness``) rank 0's account: the optimizer steps and each one's loss, read from the recipe's own
``DiskLogger`` file; each rank's optimizer's bytes (the scalars it differentiated are not seen from here);
torch's flight records. It imports nothing of meshtop's.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import re
import sys
from pathlib import Path
from types import ModuleType

import torchtune
import torchtune.training as training
from torchtune_parts import write_checkpoint
from witness import flight_records, write_account, write_rank

BATCH = 4
RANKS = 2
CONFIG = Path(__file__).with_name("torchtune_tiny.yaml")
LOGGED = re.compile(r"^Step (\d+) \| loss:(\S+) ")


def run_on_cpu() -> None:
    """Stand-ins for the recipe's three CUDA-only calls that do not train (see above)."""
    training.get_memory_stats = lambda device, reset_stats=True: {}
    training.log_memory_stats = lambda *args, **kwargs: None
    training.cleanup_before_training = lambda: None


def load_recipe(name: str) -> ModuleType:
    """A recipe torchtune ships, loaded from its file as ``tune run`` finds it (its folder is no package)."""
    path = Path(torchtune.__file__).parents[1] / "recipes" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--accum", type=int, default=1)
    args = parser.parse_args()
    run_on_cpu()
    write_checkpoint(args.out / "checkpoint")
    recipe = load_recipe("full_finetune_distributed")
    cleanup = recipe.FullFinetuneRecipeDistributed.cleanup

    def witnessed_cleanup(self) -> None:
        flight_records(args.out)
        write_rank(args.out, backpropagated=[], optimizer=self._optimizer)
        cleanup(self)

    recipe.FullFinetuneRecipeDistributed.cleanup = witnessed_cleanup
    sys.argv = [
        recipe.__file__,
        "--config",
        str(CONFIG),
        f"output_dir={args.out / 'tune'}",
        f"checkpointer.checkpoint_dir={args.out / 'checkpoint'}",
        f"dataset.samples={BATCH * RANKS * args.accum * args.steps}",
        f"gradient_accumulation_steps={args.accum}",
        f"max_steps_per_epoch={args.steps}",
    ]
    rank = int(os.environ["RANK"])
    try:
        recipe.recipe_main()
    except SystemExit as exit_:  # torchtune's config.parse ends the process with the recipe's return value
        if exit_.code not in (None, 0):
            raise
    if rank == 0:
        lines = (args.out / "tune" / "logs" / "log.txt").read_text().splitlines()
        logged = [float(match[2]) for line in lines if (match := LOGGED.match(line))]
        write_account(args.out, {"optimizer_steps": len(logged), "logged_loss": logged})


if __name__ == "__main__":
    main()
