"""One rank of the bus-bandwidth check: the same all-reduces timed by meshtop's hooks and by a plain loop.

The plain loop times ``dist.all_reduce`` with ``perf_counter`` while the hooks
are not installed, so it times torch alone; the hooks then time the same
calls, installed. The two alternate in rounds, so that both see the same
state of the machine. The loop's time still holds torch's Python call around
the operation, which the hooks' (from the c10d op's start to its completion)
do not.

Run under torchrun: ``python -m tests.bench.busbw_worker OUT_JSON``.
"""

from __future__ import annotations

import json
import statistics
import sys
import time

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

from meshtop.probes.collectives import CollectiveProbe, GroupDirectory
from meshtop.probes.events import CollectiveTiming, Event
from meshtop.probes.native import from_environment
from meshtop.recordings.metrics.bandwidth import busbw_gbps

SIZES_BYTES = (64 * 1024, 1024 * 1024, 8 * 1024 * 1024, 32 * 1024 * 1024)
WARMUP, ROUNDS, REPEATS = 5, 3, 10


def main(out_path: str) -> None:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("dp",))
    events: list[Event] = []
    native, why_not = from_environment()  # the kernel the suite's jobs use (the C++ one where built)
    probe = CollectiveProbe(
        rank=rank,
        groups=GroupDirectory.from_mesh(mesh),
        emit=events.append,
        step=lambda: None,
        device_timing=False,
        native=native,
    )
    rows = []
    group = mesh.get_group("dp")
    for size in SIZES_BYTES:
        tensor = torch.ones(size // 4)
        for _ in range(WARMUP):
            dist.all_reduce(tensor, group=group)
        loop = []
        events.clear()
        for _ in range(ROUNDS):
            dist.barrier()
            for _ in range(REPEATS):
                started = time.perf_counter()
                dist.all_reduce(tensor, group=group)
                loop.append(time.perf_counter() - started)
            probe.install()
            dist.barrier()
            for _ in range(REPEATS):
                dist.all_reduce(tensor, group=group)
            time.sleep(0.05)  # let the last completion callback land
            probe.uninstall()
            probe.flush()
        hooked = [e.duration_s for e in events if isinstance(e, CollectiveTiming) and e.op == "all_reduce"]
        assert len(hooked) == ROUNDS * REPEATS, (len(hooked), ROUNDS * REPEATS)
        loop_s, hook_s = statistics.median(loop), statistics.median(hooked)
        rows.append(
            {
                "bytes": size,
                "group_size": world,
                "loop_busbw_gbps": busbw_gbps("all_reduce", world, size, loop_s),
                "hook_busbw_gbps": busbw_gbps("all_reduce", world, size, hook_s),
                "loop_median_s": loop_s,
                "hook_median_s": hook_s,
                "kernel": "cpp" if native is not None else f"python ({why_not or 'chosen'})",
            }
        )
    if rank == 0:
        with open(out_path, "w") as out:
            json.dump(rows, out)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
