"""Pipeline parallelism with ``torch.distributed.pipelining``.

The model is cut into ``pp x v`` stages of consecutive layers. A pp rank owns
one stage (GPipe, 1F1B) or ``v`` stages looped round the ranks
(interleaved 1F1B: rank r holds stages r, r + pp, ...).
"""

from __future__ import annotations

import copy
from collections.abc import Callable

import torch
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.pipelining import (
    PipelineStage,
    Schedule1F1B,
    ScheduleGPipe,
    ScheduleInterleaved1F1B,
)
from torch.distributed.pipelining.schedules import _PipelineSchedule

from runner.model import Transformer
from runner.plan import ResolvedRun

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def stages_of_rank(run: ResolvedRun, pp_rank: int) -> list[int]:
    """Stage indices held by pipeline rank ``pp_rank``, in execution order."""
    return [pp_rank + loop * run.pp for loop in range(run.virtual_stages)]


def cut_stage(model: Transformer, *, run: ResolvedRun, stage_index: int) -> Transformer:
    """A copy of ``model`` that keeps only the layers (and ends) of ``stage_index``."""
    stage = copy.deepcopy(model)
    keep = {str(layer) for layer in run.stage_layers[stage_index]}
    for name in list(stage.layers.keys()):
        if name not in keep:
            del stage.layers[name]
    if stage_index != 0:
        stage.tok_embeddings = None
    if stage_index != run.num_stages - 1:
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
    group = pp_mesh.get_group()
    stages = [
        PipelineStage(module, index, run.num_stages, device, group=group)
        for module, index in zip(modules, stage_indices, strict=True)
    ]
    if run.schedule == "interleaved-1f1b":
        return ScheduleInterleaved1F1B(stages, n_microbatches=run.microbatches, loss_fn=loss_fn)
    single = Schedule1F1B if run.schedule == "1f1b" else ScheduleGPipe
    return single(stages[0], n_microbatches=run.microbatches, loss_fn=loss_fn)
