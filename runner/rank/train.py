"""The training workload of one rank: build the parallel model, then step it."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh

from meshtop.probes.memory import local_numel
from meshtop.probes.phases import DATA, Phases
from meshtop.runner.plan import ResolvedRun
from meshtop.runner.rank.data import replica_batch, synthetic_tokens
from meshtop.runner.rank.data_parallel import apply_ddp, apply_fsdp, apply_replicate
from meshtop.runner.rank.mesh import MeshCoordinates
from meshtop.runner.rank.model import checkpoint_blocks, meta_transformer, next_token_loss
from meshtop.runner.rank.pipeline import build_schedule, cut_stage, embedding_group, sum_tied_gradients, tied_ends
from meshtop.runner.rank.precision import TORCH_DTYPES, fsdp_policy, master_weights_adamw
from meshtop.runner.rank.weights import init_weights

if TYPE_CHECKING:
    from torch.distributed.pipelining.schedules import _PipelineSchedule


@dataclass(kw_only=True, slots=True)
class TrainingJob:
    """Everything one rank needs to run a step."""

    run: ResolvedRun
    coords: MeshCoordinates
    device: torch.device
    modules: list[nn.Module]
    """This rank's model chunks (one, or ``v`` for interleaved pipelines)."""
    stage_indices: list[int]
    optimizer: torch.optim.Optimizer
    schedule: _PipelineSchedule | None
    embedding_group: dist.ProcessGroup | None = None
    """Pipelines of a tied model: the ranks of the two ends, whose gradients are summed each step."""
    tied_ends: list[torch.Tensor] = field(default_factory=list)
    """This rank's copies of the tied embedding (none unless it holds the first or the last stage)."""

    def local_parameters(self) -> int:
        """Parameter elements stored on this rank (the local shard of each DTensor)."""
        return sum(local_numel(p) for module in self.modules for p in module.parameters())

    @property
    def holds_first_stage(self) -> bool:
        return self.schedule is None or 0 in self.stage_indices

    @property
    def holds_last_stage(self) -> bool:
        return self.schedule is None or self.run.plan.num_stages - 1 in self.stage_indices


def build_training(run: ResolvedRun, *, mesh: DeviceMesh, coords: MeshCoordinates, device: torch.device) -> TrainingJob:
    """Build the model on the meta device, parallelise it, then materialise and initialise it; its recipe
    (``run.precision``, ``run.checkpoint``) applied."""
    whole = meta_transformer(run.shape, TORCH_DTYPES[run.parameter_dtype])
    checkpoint_blocks(whole, run.checkpoint)
    stage_indices = run.plan.stages_of(coords.pp)  # [0] without a pipeline
    chunks = [cut_stage(whole, run=run, stage_index=s) for s in stage_indices] if run.plan.pp > 1 else [whole]
    classic_ddp = run.plan.dp > 1 and not run.plan.fsdp and run.plan.tp == 1 and run.plan.pp == 1
    if run.plan.tp > 1:  # DTensor's import (meshtop.runner.rank.data_parallel says why here)
        from meshtop.runner.rank.tensor_parallel import apply_tensor_parallel, keep_gradients_sharded
    for chunk in chunks:
        if run.plan.tp > 1:
            apply_tensor_parallel(chunk, tp_mesh=mesh["tp"])
        if run.plan.fsdp:
            apply_fsdp(chunk, dp_mesh=mesh["dp"], policy=fsdp_policy(run))
        elif run.plan.dp > 1 and not classic_ddp:
            apply_replicate(chunk, dp_mesh=mesh["dp"])
        chunk.to_empty(device=device)
        chunk.tie_weights()  # to_empty gives a plain tied parameter a new one in each module
        init_weights(chunk, model=run.shape, seed=run.seed, device=device)
        if run.plan.tp > 1 and run.plan.dp == 1:  # with dp, FSDP2 / replicate reduce gradients to each shard already
            keep_gradients_sharded(chunk)
    modules: list[nn.Module] = list(chunks)
    if classic_ddp:
        modules = [apply_ddp(chunks[0], dp_mesh=mesh["dp"], device=device)]
    parameters = [p for module in modules for p in module.parameters()]
    optimizer = (
        master_weights_adamw(parameters, lr=1e-3, weight_decay=0.0)
        if run.master_weights
        else torch.optim.AdamW(parameters, lr=1e-3, weight_decay=0.0)
    )
    schedule = None
    if run.plan.pp > 1:
        schedule = build_schedule(
            modules, run=run, stage_indices=stage_indices, pp_mesh=mesh["pp"], device=device, loss_fn=next_token_loss
        )
    group = embedding_group(run, mesh=mesh)
    return TrainingJob(
        run=run,
        coords=coords,
        device=device,
        modules=modules,
        stage_indices=stage_indices,
        optimizer=optimizer,
        schedule=schedule,
        embedding_group=group,
        tied_ends=tied_ends(chunks) if group is not None else [],
    )


def train_step(job: TrainingJob, step: int, phases: Phases | None = None) -> tuple[float | None, float]:
    """One forward, backward and optimizer step (``phases``: where the batch's making is marked as data).

    Returns this rank's loss (``None`` if it computes none) and the seconds
    spent in forward and backward, before the optimizer.
    """
    run = job.run
    if phases is not None:
        phases.begin(DATA)
    tokens = synthetic_tokens(
        step=step, seed=run.seed, batch_size=run.batch_size, seq_len=run.seq_len, vocab_size=run.shape.vocab_size
    )
    inputs, targets = replica_batch(tokens, dp_rank=job.coords.dp, dp=run.plan.dp)
    inputs, targets = inputs.to(job.device), targets.to(job.device)
    if phases is not None:
        phases.end(DATA)
    for module in job.modules:  # the model's gradients (a master-weights optimizer holds other tensors)
        module.zero_grad(set_to_none=True)
    loss: float | None = None
    started = time.perf_counter()
    if job.schedule is None:
        step_loss = next_token_loss(job.modules[0](inputs), targets)
        step_loss.backward()
        loss = step_loss.item()
    else:
        losses: list[torch.Tensor] = []
        args = (inputs,) if job.holds_first_stage else ()
        last = job.holds_last_stage
        job.schedule.step(*args, target=targets if last else None, losses=losses if last else None)
        if last:
            loss = torch.stack([part.detach().float() for part in losses]).mean().item()
        if job.embedding_group is not None:
            sum_tied_gradients(job.tied_ends, group=job.embedding_group)
    synchronize(job.device)
    forward_backward_s = time.perf_counter() - started
    job.optimizer.step()
    return loss, forward_backward_s


def synchronize(device: torch.device) -> None:
    """Wait for the device's queued work, so a host clock measures it."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@dataclass(frozen=True, slots=True)
class StepOutcome:
    start_ns: int
    duration_s: float
    forward_backward_s: float
    loss: float | None
    cpu_s: float
    """CPU seconds of the whole process (every thread) during the step."""


def timed_step(job: TrainingJob, step: int, phases: Phases | None = None) -> StepOutcome:
    """Run ``step`` and time it (the device is synchronised at both ends)."""
    synchronize(job.device)
    start_ns, started, cpu_started = time.time_ns(), time.perf_counter(), time.process_time()
    loss, forward_backward_s = train_step(job, step, phases)
    synchronize(job.device)
    return StepOutcome(
        start_ns, time.perf_counter() - started, forward_backward_s, loss, time.process_time() - cpu_started
    )
