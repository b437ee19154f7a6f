"""Deterministic weight initialisation that does not depend on the plan.

Every parameter is drawn whole from a generator seeded by the run's seed and
the parameter's name in the full model, then the rank keeps its own shard. So
a tp=2 or fsdp=2 rank holds exactly the slice that a single process would hold
of the same tensor, which is what lets parallel losses match one process.

A tied output projection is the embedding's Parameter, listed once under
``tok_embeddings.weight``; a pipeline's last stage holds its own copy of it
as ``output.weight``, drawn under the embedding's name so both copies start equal.
"""

from __future__ import annotations

import math
import sys
import zlib

import torch
from torch import nn

from meshtop.recordings.manifest import ModelShape

INIT_STD = 0.02
TIED_OUTPUT, EMBEDDING = "output.weight", "tok_embeddings.weight"


def initial_value(
    name: str, shape_of_param: torch.Size, *, model: ModelShape, seed: int, device: torch.device
) -> torch.Tensor:
    """The full float32 starting value of the parameter called ``name``."""
    if name.endswith("norm.weight"):
        return torch.ones(shape_of_param, device=device)
    std = INIT_STD
    if name.endswith(("attention.wo.weight", "feed_forward.w2.weight")):
        std = INIT_STD / math.sqrt(2 * model.n_layers)  # residual projections, GPT-2 style
    generator = torch.Generator(device=device)
    generator.manual_seed((seed * 1_000_003 + zlib.crc32(name.encode())) % (2**63))
    return torch.randn(shape_of_param, generator=generator, device=device) * std


@torch.no_grad()
def init_weights(module: nn.Module, *, model: ModelShape, seed: int, device: torch.device) -> None:
    """Fill every parameter of ``module`` (plain or DTensor) with its share of the full value.

    No parameter is a DTensor unless ``torch.distributed.tensor`` was imported (by tensor parallelism, FSDP2
    or replicate): a DDP job's ranks start without its import."""
    dtensors = sys.modules.get("torch.distributed.tensor")
    for name, param in module.named_parameters():
        if model.tie_embeddings and name == TIED_OUTPUT:
            name = EMBEDDING
        full = initial_value(name, param.shape, model=model, seed=seed, device=device)
        if dtensors is not None and isinstance(param, dtensors.DTensor):
            shard = dtensors.distribute_tensor(full, param.device_mesh, param.placements, src_data_rank=None)
            param.to_local().copy_(shard.to_local())
        else:
            param.copy_(full)
