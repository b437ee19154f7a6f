"""Data parallelism: replicate (DDP) or shard (FSDP2) over the dp mesh dim.

Replication takes one of two PyTorch implementations:
- alone (no tp, no pp): ``DistributedDataParallel``, the classic reducer that
  all-reduces gradient buckets during backward;
- composed with tp or pp: ``replicate`` from ``replicate_with_fsdp`` (FSDP2's
  machinery with a replicated placement). ``DistributedDataParallel`` does not
  compose with either: it cannot bucket DTensor parameters, and under
  ``torch.distributed.pipelining`` microbatches it trips the reducer's bucket
  rebuild or, with ``static_graph``, reduces wrong gradients (both seen on
  torch 2.13 with gloo). torchtitan likewise refuses DDP beyond 1-D.

``replicate_with_fsdp`` is private and recent, so it is imported only where
it is used: a torch without it fails that plan alone, in one line.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.nn.parallel import DistributedDataParallel

from meshtop.runner.errors import PlanError
from meshtop.runner.rank.model import Transformer

if TYPE_CHECKING:
    from torch.distributed.fsdp import MixedPrecisionPolicy

# FSDP2 and replicate import DTensor, and with it torch's compiler stack: some 1.3 s of CPU at each rank's
# start. They are imported where they are applied, so that a DDP job's ranks start without them.


def apply_fsdp(model: Transformer, *, dp_mesh: DeviceMesh, policy: MixedPrecisionPolicy | None = None) -> None:
    """Shard every block, then the rest of the model, over ``dp_mesh`` (FSDP2), with ``policy``'s dtypes.

    One ``fully_shard`` per block gives one all-gather per block in forward
    and in backward and one reduce-scatter per block, overlapped with compute.
    """
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    policy = policy or MixedPrecisionPolicy()
    for block in model.layers.values():
        fully_shard(block, mesh=dp_mesh, mp_policy=policy)
    fully_shard(model, mesh=dp_mesh, mp_policy=policy)


def apply_replicate(model: Transformer, *, dp_mesh: DeviceMesh) -> None:
    """Replicate ``model`` over ``dp_mesh`` with FSDP2's ``replicate``: one gradient all-reduce per block."""
    try:
        from torch.distributed._composable.replicate_with_fsdp import replicate
    except ImportError as error:
        raise PlanError(
            f"torch {torch.__version__} has no torch.distributed._composable.replicate_with_fsdp, which dp "
            "composed with tp or pp needs; shard instead (--fsdp) or use a torch release that has it"
        ) from error
    for block in model.layers.values():
        replicate(block, mesh=dp_mesh)
    replicate(model, mesh=dp_mesh)


def apply_ddp(model: nn.Module, *, dp_mesh: DeviceMesh, device: torch.device) -> nn.Module:
    """Wrap ``model`` in DDP over ``dp_mesh``: gradients all-reduced in buckets during backward."""
    return DistributedDataParallel(
        model,
        process_group=dp_mesh.get_group(),
        device_ids=[device.index] if device.type == "cuda" else None,
    )
