"""A rank that counts one training step's collectives two ways: meshtop's hooks and CommDebugMode.

Run under torchrun: ``python -m tests.coverage_worker RUN_JSON OUT_DIR``. Steps
0 and 1 warm up (pipeline shape inference, DDP's bucket rebuild); step 2 is
counted by meshtop's hooks; step 3, identical in structure, is counted by
PyTorch's CommDebugMode. Two steps, because a TorchDispatchMode intercepts
functional collectives before the dispatcher key meshtop hooks, so the two
cannot watch the very same call. Each rank writes both counts to
OUT_DIR/rank-N.json.
"""

from __future__ import annotations

import json
import os
import sys
from collections import Counter
from pathlib import Path

import torch.distributed as dist
from torch.distributed.tensor.debug import CommDebugMode
from torch.utils._python_dispatch import TorchDispatchMode

from probes.collectives import C10D_OPS, GroupDirectory
from probes.events import CollectiveTiming, Event
from probes.instrument import Instrumentation
from probes.sink import EventSink
from runner.mesh import build_mesh, coordinates, local_device
from runner.plan import ResolvedRun
from runner.train import build_training, train_step

# CommDebugMode names functional collectives by their own ops.
FUNCTIONAL_OPS = {
    "all_reduce": "all_reduce", "all_reduce_coalesced": "all_reduce",
    "all_gather_into_tensor": "all_gather", "all_gather_into_tensor_coalesced": "all_gather",
    "reduce_scatter_tensor": "reduce_scatter", "reduce_scatter_tensor_coalesced": "reduce_scatter",
    "all_to_all_single": "all_to_all", "broadcast": "broadcast",
}


class CommCounter(CommDebugMode):
    """CommDebugMode's own counting, without its module tracker.

    The tracker's forward hooks fail under ``torch.distributed.pipelining`` on
    torch 2.13 (IndexError in ``_fw_set_module_hook``); the counts do not use it.
    """

    def __enter__(self) -> CommCounter:
        self.comm_counts.clear()
        self.comm_module_counts.clear()
        self.comm_module_counts["Global"] = {"forward": Counter(), "backward": Counter()}
        self.comm_module_operation_counts.clear()
        tracker = self.advanced_module_tracker  # counting reads its "current module"
        tracker.name, tracker.parent_list = "Global", ["Global"]
        tracker.module_parents_dict.clear()
        tracker.module_parents_dict["Global"] = set()
        TorchDispatchMode.__enter__(self)
        return self

    def __exit__(self, *args: object) -> None:
        TorchDispatchMode.__exit__(self, *args)


class ListSink(EventSink):
    def __init__(self) -> None:
        self.events: list[Event] = []

    def emit(self, event: Event) -> None:
        self.events.append(event)


def plain_name(op: object) -> str:
    name = str(op).split(".")[-1]
    if name in C10D_OPS:
        return C10D_OPS[name].op
    return FUNCTIONAL_OPS.get(name, name)


def main(run_path: str, out_dir: str) -> None:
    run = ResolvedRun.from_json(json.loads(Path(run_path).read_text()))
    rank = int(os.environ["RANK"])
    device = local_device(run.device, int(os.environ["LOCAL_RANK"]))
    dist.init_process_group("gloo")
    sink = ListSink()
    probes = Instrumentation(rank=rank, sink=sink, device=device, enabled=True)
    mesh = build_mesh(device_type=run.device, pp=run.pp, dp=run.dp, tp=run.tp)
    probes.install(groups=GroupDirectory.from_mesh(mesh), pipeline=run.pp > 1)
    job = build_training(run, mesh=mesh, coords=coordinates(run, rank), device=device)
    for step in range(4):
        probes.step_started(step)
        if step == 3:
            with (CommCounter() if run.pp > 1 else CommDebugMode()) as comm_mode:
                train_step(job, step)
        else:
            train_step(job, step)
        probes.step_ended(step)
    dist.barrier()
    probes.uninstall()
    hooks = Counter(f"{e.op}/{e.group}" for e in sink.events if isinstance(e, CollectiveTiming) and e.step == 2)
    reference = Counter()
    for op, count in comm_mode.get_comm_counts().items():
        reference[plain_name(op)] += count
    Path(out_dir, f"rank-{rank}.json").write_text(json.dumps(
        {"kernel": probes.collective_kernel, "hooks": hooks, "comm_debug_mode": reference}))
    dist.destroy_process_group()


if __name__ == "__main__":
    main(*sys.argv[1:])
