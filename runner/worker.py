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
from probes.sink import EventSink, JsonLinesSink
from runner.faults import fault_from_env
from runner.mesh import build_mesh, coordinates, local_device
from runner.plan import ResolvedRun
from runner.train import build_training, timed_step

SESSION_DIR_ENV = "MESHTOP_SESSION_DIR"


def open_sink(rank: int) -> EventSink:
    """The sink named by the launcher's environment; a do-nothing one without it."""
    session = os.environ.get(SESSION_DIR_ENV)
    return JsonLinesSink(Path(session) / "events" / f"rank-{rank}.jsonl") if session else EventSink()


@record
def main(argv: list[str]) -> None:
    run = ResolvedRun.from_json(json.loads(Path(argv[0]).read_text()))
    fault = fault_from_env()
    rank, local_rank = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"])
    device = local_device(run.device, local_rank)
    dist.init_process_group(backend="nccl" if run.device == "cuda" else "gloo")
    sink = open_sink(rank)
    try:
        mesh = build_mesh(device_type=run.device, pp=run.pp, dp=run.dp, tp=run.tp)
        coords = coordinates(rank, dp=run.dp, tp=run.tp)
        job = build_training(run, mesh=mesh, coords=coords, device=device)
        sink.emit(RankStarted(rank=rank, pid=os.getpid(), host=socket.gethostname(), device=str(device),
                              pp_rank=coords.pp, dp_rank=coords.dp, tp_rank=coords.tp,
                              stages=tuple(job.stage_indices) if run.pp > 1 else (),
                              local_parameters=job.local_parameters(),
                              wall_ns=time.time_ns()))
        tokens = run.batch_size * run.seq_len
        for step in range(run.steps):
            if fault is not None:
                fault.maybe_fire(rank=rank, step=step)
            start_ns, duration_s, loss = timed_step(job, step)
            sink.emit(StepTiming(rank=rank, step=step, start_ns=start_ns, duration_s=duration_s,
                                 tokens=tokens, loss=loss))
        dist.barrier()
    finally:
        sink.close()
        dist.destroy_process_group()


if __name__ == "__main__":
    # The logits that leave a replicated or tensor-parallel model can be a view;
    # nothing modifies them in place, so FSDP2's caution does not apply here.
    warnings.filterwarnings("ignore", message=r"FSDP2-wrapped module .* returned a view tensor")
    torch.set_num_threads(max(1, int(os.environ.get("OMP_NUM_THREADS", "1"))))
    main(sys.argv[1:])
