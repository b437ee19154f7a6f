"""A rank that issues a fixed set of operations under the collective hooks and writes what they reported.

Run under torchrun with 2 ranks: ``python -m tests.kernel_worker OUT_DIR``.
The kernel is whichever ``MESHTOP_NATIVE_PROBE`` selects (the C++ one, or
``off``: Python), so ``tests/test_collective_kernels.py`` can check that both
report the same operations the same way. Rank 1 joins the second all-reduce
late, so rank 0's heartbeat shows it in flight.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed._functional_collectives import all_reduce as functional_all_reduce
from torch.distributed._functional_collectives import wait_tensor

from probes.events import CollectiveTiming, SamplerError
from probes.instrument import Instrumentation
from runner.mesh import build_mesh
from tests.coverage_worker import ListSink

LATE_S = 0.3


def main(out_dir: str) -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    sink = ListSink()
    probes = Instrumentation(rank=rank, sink=sink, device=torch.device("cpu"), enabled=True)
    mesh = build_mesh(device_type="cpu", pp=1, dp=1, tp=2)
    probes.install(mesh=mesh, pipeline=False)
    tp = mesh.get_group("tp")
    probes.step_started(3)
    tensor = torch.ones(1000)
    dist.all_reduce(tensor, group=tp)
    wait_tensor(functional_all_reduce(torch.ones(256, dtype=torch.bfloat16), "sum", tp))
    if rank == 1:
        time.sleep(LATE_S)
    work = dist.all_reduce(tensor, group=tp, async_op=True)
    progress = probes.progress() if rank == 0 else None
    work.wait()
    if rank == 0:
        dist.send(tensor, 1)
    else:
        dist.recv(tensor, 0)
    probes.set_step(None)
    output = torch.empty(500)
    dist.reduce_scatter_tensor(output, torch.ones(1000), group=tp)  # no future on gloo: ends at its wait
    dist.broadcast(torch.ones(10, dtype=torch.int64), src=0, group=tp)
    dist.barrier()
    probes.uninstall()
    report = {
        "kernel": probes.collective_kernel,
        "errors": [e.message for e in sink.events if isinstance(e, SamplerError)],
        "collectives": [dataclasses.asdict(e) for e in sink.events if isinstance(e, CollectiveTiming)],
        "progress": dataclasses.asdict(progress) if progress is not None else None,
    }
    Path(out_dir, f"rank-{rank}.json").write_text(json.dumps(report))
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
