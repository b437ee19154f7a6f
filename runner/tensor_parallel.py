"""Tensor parallelism: Megatron-style column / row sharding with DTensor."""

from __future__ import annotations

from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import Replicate
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    RowwiseParallel,
    parallelize_module,
)

from runner.model import Transformer


def apply_tensor_parallel(model: Transformer, *, tp_mesh: DeviceMesh) -> None:
    """Shard attention heads and the MLP hidden units of every block over ``tp_mesh``.

    q / k / v and w1 / w3 are split by output column, wo and w2 by input row, so
    each block costs one all-reduce in forward and one in backward per half.
    The embedding is split by vocabulary row and the output projection by
    vocabulary column, gathered back so the loss sees whole logits.
    """
    top_plan = {}
    if model.tok_embeddings is not None:
        top_plan["tok_embeddings"] = RowwiseParallel(input_layouts=Replicate(), output_layouts=Replicate())
    if model.output is not None:
        top_plan["output"] = ColwiseParallel(output_layouts=Replicate())
    if top_plan:
        parallelize_module(model, tp_mesh, top_plan)
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
