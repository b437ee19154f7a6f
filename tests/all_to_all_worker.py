"""A rank that moves rows of unequal count by all-to-all under the collective hooks, and writes what they reported.

Run under torchrun with 2 ranks: ``python -m tests.all_to_all_worker OUT_DIR``; the kernel is whichever
``MESHTOP_NATIVE_PROBE`` selects. The MoE case: each rank sends its peer a different number of rows than it
gets back, so a rank's input and output differ in size (:data:`SPLITS`). Step 1 is ``all_to_all_single``,
step 2 the functional one (both reach c10d's ``alltoall_base_``); gloo refuses the list form ``all_to_all``
with tensors of unequal size. Each rank writes OUT_DIR/rank-N.json: ``{"kernel", "errors", "collectives"}``,
the collectives of steps 1 and 2 only.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as functional

from meshtop.probes.events import CollectiveTiming, SamplerError
from meshtop.probes.groups import GroupDirectory
from meshtop.probes.instrument import Instrumentation
from tests.witness_worker import ListSink

ROW = 8
"""A row holds 8 float32 values: 32 bytes."""
SPLITS = {0: [3, 1], 1: [2, 3]}
"""The rows each rank sends to rank 0 and to rank 1: rank 0 keeps 3 and sends 1, rank 1 sends 2 and keeps 3."""
STEPS = {"all_to_all_single": 1, "functional_all_to_all_single": 2}


def received(rank: int) -> list[int]:
    """The rows this rank gets from rank 0 and from rank 1: what each of them sends it."""
    return [SPLITS[source][rank] for source in sorted(SPLITS)]


def rows(count: int, rank: int) -> torch.Tensor:
    return torch.full((count, ROW), float(rank))


def main(out_dir: str) -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    sink = ListSink()
    probes = Instrumentation(rank=rank, sink=sink, device=torch.device("cpu"), enabled=True)
    groups = GroupDirectory()
    groups.add("world", dist.group.WORLD)
    probes.install(groups=groups, pipeline=False)
    sent, got = SPLITS[rank], received(rank)

    probes.set_step(STEPS["all_to_all_single"])
    output = torch.empty(sum(got), ROW)
    dist.all_to_all_single(output, rows(sum(sent), rank), output_split_sizes=got, input_split_sizes=sent)
    # the rows really moved: the first got[0] came from rank 0, the rest from rank 1
    assert output.tolist() == [[0.0] * ROW] * got[0] + [[1.0] * ROW] * got[1], output

    probes.set_step(STEPS["functional_all_to_all_single"])
    moved = functional.all_to_all_single(rows(sum(sent), rank), got, sent, dist.group.WORLD)
    assert (moved * 1).tolist() == output.tolist(), moved  # ``* 1`` uses the result, which waits for it

    probes.set_step(None)
    dist.barrier()
    probes.flush()
    probes.uninstall()
    report = {
        "kernel": probes.collective_kernel,
        "errors": [e.message for e in sink.events if isinstance(e, SamplerError)],
        "collectives": [
            dataclasses.asdict(e) for e in sink.events if isinstance(e, CollectiveTiming) and e.step in STEPS.values()
        ],
    }
    Path(out_dir, f"rank-{rank}.json").write_text(json.dumps(report))
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
