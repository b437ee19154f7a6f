"""Mixed precision: bf16 compute over fp32 master weights and fp32 optimizer state, two ways.

- Under FSDP2 (``--fsdp``), its own :class:`MixedPrecisionPolicy`: the shards
  stay fp32 (weights, gradients and AdamW's moments), each unit is gathered in
  bf16 for its forward and backward, and gradients are reduce-scattered in
  fp32 (``reduce_dtype``) onto the fp32 shards.
- Everywhere else (DDP, tensor and pipeline parallel, ``replicate``): the
  model's parameters are bf16, so its compute, activations, gradients and
  their all-reduce are bf16, and the optimizer keeps an fp32 master copy of
  each parameter with fp32 moments (:func:`master_weights_adamw`), as
  Megatron-LM's mixed-precision optimizer does. The ZeRO paper's "2 + 2 + 12"
  bytes a parameter (Rajbhandari et al. 2020, section 3.1).

Why not autocast over fp32 parameters: it saves the bf16 copy of every weight
for backward (an activation the size of the model, whatever the batch) and
runs the embedding and norms in fp32, so neither the memory nor the traffic
would be a recipe anyone trains large models with.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch

from meshtop.runner.plan import ResolvedRun

if TYPE_CHECKING:
    from torch.distributed.fsdp import MixedPrecisionPolicy

TORCH_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def fsdp_policy(run: ResolvedRun) -> MixedPrecisionPolicy:
    """FSDP2's policy: bf16 gathers and compute, fp32 gradient reduction, under mixed precision; else its
    default (compute in the shards' dtype)."""
    from torch.distributed.fsdp import MixedPrecisionPolicy  # DTensor's import, only where FSDP2 runs

    if run.mixed:
        return MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    return MixedPrecisionPolicy()


def master_weights_adamw(parameters: Sequence[torch.nn.Parameter], **options: Any) -> torch.optim.AdamW:
    """AdamW over an fp32 copy of each of ``parameters`` (bf16): before its step, each copy takes its
    parameter's gradient (in fp32); after it, each parameter takes its copy's new value (rounded to bf16).

    The copies are the optimizer's parameters, so they count as its state
    (:func:`meshtop.probes.memory.optimizer_bytes`). Both copies run as the
    optimizer's own step hooks, inside any global step hook (the step phases'
    optimizer window includes them). A copy's fp32 gradient lives for the step
    only. A DTensor parameter gets a DTensor copy with its placements.
    """
    pairs = [
        (parameter, parameter.detach().to(dtype=torch.float32, copy=True).requires_grad_(True))
        for parameter in parameters
    ]
    optimizer = torch.optim.AdamW([master for _, master in pairs], **options)

    def take_gradients(*_: Any) -> None:
        for parameter, master in pairs:
            master.grad = None if parameter.grad is None else parameter.grad.detach().to(torch.float32)

    def give_values(*_: Any) -> None:
        with torch.no_grad():
            for parameter, master in pairs:
                parameter.copy_(master)
                master.grad = None

    optimizer.register_step_pre_hook(take_gradients)
    optimizer.register_step_post_hook(give_values)
    return optimizer
