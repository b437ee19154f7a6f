"""A rank of a tensor-parallel generation check: ``torchrun --nproc-per-node=TP -m tests.generate_worker TP OUT``.

Builds the tiny model sharded over ``tp`` ranks the way the runner does
(meta device, Megatron TP, name-seeded weights), serves the requests of
``tests.test_generate`` with continuous batching, and rank 0 writes the tokens.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from runner.generate import Generator, generate_all
from runner.mesh import build_mesh
from runner.model import Transformer
from runner.presets import PRESETS
from runner.tensor_parallel import apply_tensor_parallel
from runner.weights import init_weights
from tests.test_generate import SEED, requests


def main(tp: int, out: Path) -> None:
    dist.init_process_group("gloo")
    try:
        mesh = build_mesh(device_type="cpu", pp=1, dp=1, tp=tp)
        shape = PRESETS["tiny"]
        with torch.device("meta"):
            model = Transformer(shape)
        apply_tensor_parallel(model, tp_mesh=mesh["tp"])
        model.to_empty(device="cpu")
        with torch.no_grad():
            init_weights(model, model=shape, seed=SEED, device=torch.device("cpu"))
        generator = Generator(model.eval(), max_batch=2, max_len=64, device=torch.device("cpu"), dtype=torch.float32)
        outputs = generate_all(generator, requests())
        if dist.get_rank() == 0:
            out.write_text(json.dumps({str(k): v for k, v in outputs.items()}))
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main(int(sys.argv[1]), Path(sys.argv[2]))
