"""Tensor parallelism: Megatron-style column / row sharding with DTensor."""

from __future__ import annotations

import torch
from torch.distributed._functional_collectives import AsyncCollectiveTensor
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Replicate
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    ParallelStyle,
    RowwiseParallel,
    parallelize_module,
)

from meshtop.runner.rank.model import Transformer


def apply_tensor_parallel(model: Transformer, *, tp_mesh: DeviceMesh) -> None:
    """Shard attention heads and the MLP hidden units of every block over ``tp_mesh``.

    q / k / v and w1 / w3 are split by output column, wo and w2 by input row, so
    each block costs one all-reduce in forward and one in backward per half.
    The embedding is split by vocabulary row and the output projection by
    vocabulary column, gathered back so the loss sees whole logits.

    Both shard their ``[vocab, dim]`` weight by vocabulary row (``Shard(0)``),
    so a tied output projection uses the embedding's DTensor; it is tied back
    after ``parallelize_module``, which gave each module a DTensor of its own.
    """
    top_plan: dict[str, ParallelStyle] = {}
    if model.tok_embeddings is not None:
        top_plan["tok_embeddings"] = RowwiseParallel(input_layouts=Replicate(), output_layouts=Replicate())
    if model.output is not None:
        top_plan["output"] = ColwiseParallel(output_layouts=Replicate())
    if top_plan:
        parallelize_module(model, tp_mesh, top_plan)
        model.tie_weights()
    block_plan = {
        "attention.wq": ColwiseParallel(),
        "attention.wk": ColwiseParallel(),
        "attention.wv": ColwiseParallel(),
        "attention.wo": RowwiseParallel(),
        "feed_forward.w1": ColwiseParallel(),
        "feed_forward.w3": ColwiseParallel(),
        "feed_forward.w2": RowwiseParallel(),
    }
    for block in model.layers.values():
        parallelize_module(block, tp_mesh, block_plan)


def completed(output: torch.Tensor) -> torch.Tensor:
    """``output`` once the collective that made it has completed.

    A tensor-parallel module's output comes from a functional collective (the output projection's
    all-gather) that is waited on only when the output is first used. A serving rank that is not the
    leader never uses its logits: unwaited, their works would end the op's time before its last collective
    does, and stay registered until exit, where gloo can abort the process (docs/runner.md).
    """
    return output.wait() if isinstance(output, AsyncCollectiveTensor) else output


def keep_gradients_sharded(model: Transformer) -> None:
    """Bring the vocabulary-split embedding's gradient back to its weight's placement after it accumulates.

    DTensor's embedding backward gives it a *replicated* gradient: the whole ``[vocab, dim]`` matrix on every
    tp rank (measured on torch 2.13: 2x the shard's bytes at tp 2; every other tp gradient comes back laid
    out as its weight, so only this one is hooked: the hook runs on each backward). Only this rank's rows
    are used by its optimizer, so the rest is memory for nothing; taking the local rows is a slice, no
    communication. FSDP2 and replicate already reduce gradients to the parameter's placement.
    """
    if model.tok_embeddings is not None and isinstance(model.tok_embeddings.weight, DTensor):
        model.tok_embeddings.weight.register_post_accumulate_grad_hook(_to_own_placement)


def _to_own_placement(parameter: torch.Tensor) -> None:
    grad = parameter.grad
    if isinstance(grad, DTensor) and isinstance(parameter, DTensor) and grad.placements != parameter.placements:
        rows = grad.redistribute(parameter.device_mesh, parameter.placements).to_local()
        # a copy: the redistributed shard is a view that would keep the whole matrix alive
        parameter.grad = DTensor.from_local(
            rows.clone(),
            parameter.device_mesh,
            parameter.placements,
            run_check=False,
            shape=parameter.shape,
            stride=parameter.stride(),
        )
