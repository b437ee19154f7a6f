"""Pipeline parallelism with ``torch.distributed.pipelining``.

The model is cut into ``pp x v`` stages of consecutive layers. A pp rank owns
one stage (GPipe, 1F1B) or ``v`` stages looped round the ranks
(interleaved 1F1B: rank r holds stages r, r + pp, ...).

Tied embeddings: the first stage (on pp rank 0) holds the token embedding
and the last (on pp rank pp - 1) the output projection, the same matrix in a
single process. As Megatron-LM does, each end keeps its own copy, both
initialised alike (:mod:`meshtop.runner.rank.weights`), and after each step's backward the
two copies' gradients are summed by an all-reduce over the pair of ranks that
holds them (one group per (dp, tp) position), so both take the same optimizer
step as the single tied parameter would.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh

from meshtop.runner.plan import ResolvedRun
from meshtop.runner.rank.model import Transformer

if TYPE_CHECKING:
    from torch.distributed.pipelining.schedules import _PipelineSchedule

# torch.distributed.pipelining (and DTensor, which it imports) are imported where a pipeline is built: they
# bring in torch._dynamo, some 2 s of CPU at each rank's start, which a plan without pp never uses.

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def cut_stage(model: Transformer, *, run: ResolvedRun, stage_index: int) -> Transformer:
    """A copy of ``model`` that keeps only the layers (and ends) of ``stage_index``."""
    stage = copy.deepcopy(model)
    keep = {str(layer) for layer in run.plan.stage_layers[stage_index]}
    for name in list(stage.layers.keys()):
        if name not in keep:
            del stage.layers[name]
    if stage_index != 0:
        stage.tok_embeddings = None
    if stage_index != run.plan.num_stages - 1:
        stage.norm = None
        stage.output = None
    return stage


def build_schedule(
    modules: list[torch.nn.Module],
    *,
    run: ResolvedRun,
    stage_indices: list[int],
    pp_mesh: DeviceMesh,
    device: torch.device,
    loss_fn: LossFn,
) -> _PipelineSchedule:
    """The schedule that runs this rank's stages (``modules`` in ``stage_indices`` order)."""
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe, ScheduleInterleaved1F1B

    group = pp_mesh.get_group()
    stages: list[Any] = [  # the schedules take their stages' private base class
        PipelineStage(module, index, run.plan.num_stages, device, group=group)
        for module, index in zip(modules, stage_indices, strict=True)
    ]
    if run.plan.schedule == "interleaved-1f1b":
        return ScheduleInterleaved1F1B(stages, n_microbatches=run.microbatches, loss_fn=loss_fn)
    single = Schedule1F1B if run.plan.schedule == "1f1b" else ScheduleGPipe
    return single(stages[0], n_microbatches=run.microbatches, loss_fn=loss_fn)


def embedding_group(run: ResolvedRun, *, mesh: DeviceMesh) -> dist.ProcessGroup | None:
    """This rank's group of {first-stage rank, last-stage rank} at its (dp, tp) position, where the model
    ties its embeddings and this rank holds an end; ``None`` otherwise.

    Every rank must call this, as every rank creates every group (in the same order, as c10d requires).
    """
    if not run.shape.tie_embeddings or run.plan.pp == 1:
        return None
    ranks = mesh.mesh  # [pp, dp, tp] -> global rank
    mine = None
    for dp in range(run.plan.dp):
        for tp in range(run.plan.tp):
            ends = [int(ranks[0, dp, tp]), int(ranks[run.plan.pp - 1, dp, tp])]
            group = dist.new_group(ends)
            if dist.get_rank() in ends:
                mine = group
    return mine


def tied_ends(modules: Sequence[torch.nn.Module]) -> list[torch.Tensor]:
    """The tied embedding copies this rank's stages hold: the embedding of the first, the output of the last."""
    ends = []
    for module in modules:
        assert isinstance(module, Transformer), "pipeline stages are Transformer chunks"
        if module.tok_embeddings is not None:
            ends.append(module.tok_embeddings.weight)
        if module.output is not None:
            ends.append(module.output.weight)
    return ends


@torch.no_grad()
def sum_tied_gradients(ends: list[torch.Tensor], *, group: dist.ProcessGroup) -> None:
    """Add the other end's gradient to each of this rank's tied copies.

    A DTensor gradient is summed by its local shard: both ends' parameters have the same placements, and
    their gradients are laid out as their parameters (FSDP2 / replicate reduce them so, and without dp
    :func:`meshtop.runner.rank.tensor_parallel.keep_gradients_sharded` does)."""
    from torch.distributed.tensor import DTensor

    for param in ends:
        grad = param.grad
        assert grad is not None, "a tied end has a gradient after backward"
        if isinstance(grad, DTensor):
            assert isinstance(param, DTensor) and grad.placements == param.placements, (
                "a gradient is laid out as its parameter"
            )
            dist.all_reduce(grad.to_local(), group=group)
        else:
            dist.all_reduce(grad, group=group)
