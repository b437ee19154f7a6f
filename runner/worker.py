"""Entry point of each rank, started by torchrun: ``python -m runner.worker RUN_JSON``."""

from __future__ import annotations

import json
import os
import socket
import sys
import time
import warnings
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import record

from probes.events import RankStarted, StepTiming
from probes.instrument import Instrumentation
from probes.shipper import EventShipper
from probes.sink import EventSink
from probes.wire import ADDRESS_ENV, TOKEN_ENV, parse_address
from runner.faults import fault_from_env
from runner.mesh import build_mesh, coordinates, local_device
from runner.plan import ResolvedRun
from runner.train import build_training, timed_step

OVERHEAD_BLOCK_ENV = "MESHTOP_OVERHEAD_BLOCK"
"""Benchmarks only: switch the hooks on and off every N steps, to time both in one job."""


def open_sink(rank: int) -> EventSink:
    """The collector named by the launcher's environment; a do-nothing sink without one."""
    address, token = os.environ.get(ADDRESS_ENV), os.environ.get(TOKEN_ENV)
    if not address or not token:
        return EventSink()
    return EventShipper(address=parse_address(address), token=token, rank=rank)


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
        sink.heartbeat = probes.progress
    try:
        mesh = build_mesh(device_type=run.device, pp=run.pp, dp=run.dp, tp=run.tp)
        probes.install(mesh=mesh, pipeline=run.pp > 1)
        coords = coordinates(rank, dp=run.dp, tp=run.tp)
        job = build_training(run, mesh=mesh, coords=coords, device=device)
        probes.watch_memory(modules=job.modules, optimizer=job.optimizer)
        sink.emit(RankStarted(rank=rank, pid=os.getpid(), host=socket.gethostname(), device=str(device),
                              pp_rank=coords.pp, dp_rank=coords.dp, tp_rank=coords.tp,
                              stages=tuple(job.stage_indices) if run.pp > 1 else (),
                              local_parameters=job.local_parameters(), wall_ns=time.time_ns()))
        tokens = run.batch_size * run.seq_len
        block = int(os.environ.get(OVERHEAD_BLOCK_ENV, "0"))
        for step in range(run.steps):
            if fault is not None:
                fault.maybe_fire(rank=rank, step=step)
            if block and run.instrument and step % block == 0:
                probes.set_enabled((step // block) % 2 == 0)
            probes.step_started(step)
            outcome = timed_step(job, step)
            pipeline_wait_s = probes.step_ended(step)
            sink.emit(StepTiming(rank=rank, step=step, start_ns=outcome.start_ns, duration_s=outcome.duration_s,
                                 tokens=tokens, loss=outcome.loss, forward_backward_s=outcome.forward_backward_s,
                                 instrumented=probes.enabled, pipeline_wait_s=pipeline_wait_s))
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
