"""Entry point of each rank, started by torchrun: ``python -m meshtop.runner.rank.worker RUN_JSON``."""

from __future__ import annotations

import gc
import itertools
import json
import os
import socket
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import record

from meshtop.probes.activations import SavedActivations
from meshtop.probes.device_clock import poll
from meshtop.probes.events import RankStarted, StageAction, StepTiming
from meshtop.probes.groups import GroupDirectory
from meshtop.probes.instrument import Instrumentation
from meshtop.probes.memory import parameters_of
from meshtop.probes.shipper import EventShipper, open_sink
from meshtop.probes.sink import EventSink
from meshtop.probes.wire import node_of_this_rank, start_of_this_rank
from meshtop.runner.plan import ResolvedRun
from meshtop.runner.rank.faults import Fault, fault_from_env
from meshtop.runner.rank.mesh import MeshCoordinates, build_mesh, coordinates, local_device
from meshtop.runner.rank.serve import OP_NAMES, OpTiming, build_serving, serve
from meshtop.runner.rank.train import build_training, timed_step
from meshtop.runner.rank.until import RunUntilStopped

PHASES_WAIT_S = 1.0
"""How long a step's device-timed phases are waited for: the step synchronised the device at its end, so
their marks have completed and the clock's new anchor, on an idle stream, completes at once."""
MEMORY_EVERY_NS = 500_000_000
"""Inference reports memory twice a second, not after each of its many small ops."""


def rank_started(
    coords: MeshCoordinates, device: torch.device, *, stages: tuple[int, ...], local_parameters: int
) -> RankStarted:
    world_size, restart = start_of_this_rank()
    return RankStarted(
        rank=coords.rank,
        pid=os.getpid(),
        host=socket.gethostname(),
        device=str(device),
        pp_rank=coords.pp,
        dp_rank=coords.dp,
        tp_rank=coords.tp,
        stages=stages,
        local_parameters=local_parameters,
        wall_ns=time.time_ns(),
        node=node_of_this_rank(),
        world_size=world_size,
        restart=restart,
    )


def train_rank(
    run: ResolvedRun,
    *,
    mesh: Any,
    coords: MeshCoordinates,
    device: torch.device,
    sink: EventSink,
    probes: Instrumentation,
    fault: Fault | None,
    groups: GroupDirectory,
) -> None:
    rank = coords.rank
    job = build_training(run, mesh=mesh, coords=coords, device=device)
    if job.embedding_group is not None:  # a pipeline's tied-embedding ends (Megatron-LM's "embedding group")
        groups.add("embedding", job.embedding_group)
    probes.watch_memory(parameters=parameters_of(job.modules), optimizer=job.optimizer)
    if run.activations and probes.enabled:
        activations = SavedActivations()
        activations.leave_out(parameters_of(job.modules))
        activations.install()  # this thread runs every forward, the pipeline schedule's too
        probes.watch_activations(activations)
    sink.emit(
        rank_started(
            coords,
            device,
            stages=tuple(job.stage_indices) if run.plan.pp > 1 else (),
            local_parameters=job.local_parameters(),
        )
    )
    tokens = run.batch_size * run.seq_len
    until = None
    if run.steps is None:
        assert run.time_limit_s is not None, "a run until stopped has a time limit"
        until = RunUntilStopped.for_this_rank(rank, run.time_limit_s)
    for step in range(run.steps) if run.steps is not None else itertools.count():
        if fault is not None:
            fault.maybe_fire(rank=rank, step=step)
        probes.step_started(step)
        outcome = timed_step(job, step, phases=probes.phases)
        pipeline_wait_s = probes.step_ended(step)
        windows = probes.take_phases()
        if windows is not None:
            poll(windows.ready, PHASES_WAIT_S, interval_s=0.0001)  # the device was synchronised: at once
        kinds, starts, ends = windows.final() if windows is not None else (None, (), ())
        sink.emit(
            StepTiming(
                rank=rank,
                step=step,
                start_ns=outcome.start_ns,
                duration_s=outcome.duration_s,
                tokens=tokens,
                loss=outcome.loss,
                forward_backward_s=outcome.forward_backward_s,
                instrumented=probes.enabled,
                pipeline_wait_s=pipeline_wait_s,
                cpu_s=outcome.cpu_s,
                phases=kinds,
                phase_start_ns=starts,
                phase_end_ns=ends,
            )
        )
        if until is not None and until.ends_after(step):
            break


def serve_rank(
    run: ResolvedRun,
    *,
    mesh: Any,
    coords: MeshCoordinates,
    device: torch.device,
    sink: EventSink,
    probes: Instrumentation,
    fault: Fault | None,
) -> None:
    """Serve the load: each op of the replica is this rank's step (its time since the previous op ended)."""
    rank = coords.rank
    job = build_serving(run, mesh=mesh, coords=coords, device=device)
    probes.watch_memory(parameters=parameters_of([job.model]), optimizer=None)
    sink.emit(
        rank_started(
            coords, device, stages=(coords.pp,) if run.plan.pp > 1 else (), local_parameters=job.local_parameters()
        )
    )
    dist.barrier()  # the replicas start their loads together
    step, last_end_ns, memory_at_ns = 0, time.time_ns(), 0
    probes.set_step(step)

    def on_op(timing: OpTiming) -> None:
        nonlocal step, last_end_ns, memory_at_ns
        op = timing.op
        sink.emit(
            StepTiming(
                rank=rank,
                step=step,
                start_ns=last_end_ns,
                duration_s=(timing.end_ns - last_end_ns) / 1e9,
                tokens=len(op.slots),
                loss=None,
                forward_backward_s=(timing.end_ns - timing.start_ns) / 1e9,
                instrumented=probes.enabled,
                pipeline_wait_s=timing.wait_s if run.plan.pp > 1 else None,
            )
        )
        if probes.enabled:
            sink.emit(
                StageAction(
                    rank=rank,
                    step=step,
                    stage=coords.pp,
                    microbatch=op.id,
                    action=OP_NAMES[op.kind],
                    start_ns=timing.start_ns,
                    end_ns=timing.end_ns,
                )
            )
            if timing.end_ns - memory_at_ns >= MEMORY_EVERY_NS:
                probes.memory_snapshot(step, kv_cache_bytes=job.cache.nbytes)
                memory_at_ns = timing.end_ns
        step, last_end_ns = step + 1, timing.end_ns
        if fault is not None:
            fault.maybe_fire(rank=rank, step=step)
        probes.set_step(step)

    serve(job, emit=sink.emit, on_op=on_op)
    probes.memory_snapshot(step, kv_cache_bytes=job.cache.nbytes)
    probes.set_step(None)  # what follows (the closing barrier) is no op's


@record
def main(argv: list[str]) -> None:
    run = ResolvedRun.from_json(json.loads(Path(argv[0]).read_text()))
    fault = fault_from_env()
    rank, local_rank = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"])
    device = local_device(run.device, local_rank)
    dist.init_process_group(backend="nccl" if run.device == "cuda" else "gloo")
    sink = open_sink(rank)
    probes = Instrumentation(rank=rank, sink=sink, device=device, enabled=run.instrument)
    if isinstance(sink, EventShipper):
        sink.before_shipment = probes.shipment
    try:
        mesh = build_mesh(device_type=run.device, pp=run.plan.pp, dp=run.plan.dp, tp=run.plan.tp)
        groups = GroupDirectory.from_mesh(mesh)
        probes.install(groups=groups, pipeline=run.plan.pp > 1 and run.mode == "train", phases=run.mode == "train")
        coords = coordinates(run, rank)
        if run.mode == "infer":
            serve_rank(run, mesh=mesh, coords=coords, device=device, sink=sink, probes=probes, fault=fault)
        else:
            train_rank(
                run, mesh=mesh, coords=coords, device=device, sink=sink, probes=probes, fault=fault, groups=groups
            )
        dist.barrier()
    finally:
        probes.uninstall()
        sink.close()
        dist.destroy_process_group()


if __name__ == "__main__":
    # The logits that leave a replicated or tensor-parallel model can be a view;
    # nothing modifies them in place, so FSDP2's caution does not apply here.
    warnings.filterwarnings("ignore", message=r"FSDP2-wrapped module .* returned a view tensor")
    torch.set_num_threads(max(1, int(os.environ.get("OMP_NUM_THREADS", "1"))))
    main(sys.argv[1:])
    gc.freeze()  # the interpreter's last full collection, over torch's objects, would delay the job's end ~1 s
