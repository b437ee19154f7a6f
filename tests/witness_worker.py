"""A rank that records one training step's communication twice: by meshtop's hooks and by torch's own records.

Run under torchrun with ``TORCH_FR_BUFFER_SIZE`` set: ``python -m tests.witness_worker RUN_JSON OUT_DIR``.
Steps 0 and 1 warm up (pipeline shape inference, DDP's bucket rebuild); step 2 is watched by both at once,
and neither shares code with the other:

- collectives by torch's flight recorder (``_dump_fr_trace_json``), which the process group's backend
  fills as it issues each operation: op, process group, sizes, dtypes;
- sends and receives by torch's profiler: gloo's flight recorder (torch 2.11-2.15) records no
  point-to-point operation, and the profiler's ``gloo:send`` / ``gloo:recv`` events carry the buffer's
  dims and type, the ``c10d::send`` / ``c10d::recv_`` event around each the peer's group rank.

Each rank writes OUT_DIR/rank-N.json: ``{"kernel", "witness_available", "hooks": [...], "witness": [...]}``,
each operation as ``[op, [global ranks of its group], bytes, dtype, peer]`` in the order it was issued.
Only the names of the ops are translated here (the backend's ``gloo:all_gather`` is ``all_gather``); the
bytes follow nccl-tests' S (the whole buffer) from the witness' own sizes.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.distributed_c10d import _resolve_process_group
from torch.profiler import ProfilerActivity, profile

from meshtop.probes.events import CollectiveTiming, Event
from meshtop.probes.groups import GroupDirectory
from meshtop.probes.instrument import Instrumentation
from meshtop.probes.sink import EventSink
from meshtop.runner.plan import ResolvedRun
from meshtop.runner.rank.mesh import MESH_DIMS, build_mesh, coordinates, local_device
from meshtop.runner.rank.pipeline import embedding_group
from meshtop.runner.rank.train import build_training, train_step
from tests.kit.flight import numel

WATCHED_STEP = 2
# The dispatcher's c10d ops by the names meshtop gives them (this test's own table).
C10D_NAMES = {
    "allreduce_": "all_reduce",
    "allreduce_coalesced_": "all_reduce",
    "allgather_": "all_gather",
    "_allgather_base_": "all_gather",
    "allgather_coalesced_": "all_gather",
    "allgather_into_tensor_coalesced_": "all_gather",
    "reduce_scatter_": "reduce_scatter",
    "_reduce_scatter_base_": "reduce_scatter",
    "reduce_scatter_tensor_coalesced_": "reduce_scatter",
    "broadcast_": "broadcast",
    "reduce_": "reduce",
    "gather_": "gather",
    "scatter_": "scatter",
    "alltoall_": "all_to_all",
    "alltoall_base_": "all_to_all",
    "barrier": "barrier",
}
POINT_TO_POINT = {"send": "send", "recv_": "recv", "recv_any_source_": "recv"}
# What the backend's flight record calls each op, where it differs: gloo carries a reduce-scatter out as an
# all-reduce of the whole input and records it under that name (torch 2.11-2.15).
BACKEND_NAMES = {"reduce_scatter": {"reduce_scatter", "all_reduce"}}


class ListSink(EventSink):
    def __init__(self) -> None:
        self.events: list[Event] = []
        self.from_lines = 0
        """How many of the events came written as JSON lines (the C++ kernel's, for groups it names itself)."""

    def emit(self, event: Event) -> None:
        self.events.append(event)

    def emit_lines(self, kind: str, lines: bytes, count: int) -> None:
        self.from_lines += count
        super().emit_lines(kind, lines, count)


C_TYPES = {"long int": "long", "short int": "short", "unsigned char": "uint8", "signed char": "int8"}


def dtype_of(dtype_name: str) -> torch.dtype:
    """A dtype as c10 names it (``Float``, ``BFloat16``) or the profiler does (``float``, ``c10::Half``)."""
    name = dtype_name.removeprefix("c10::").lower()
    return getattr(torch, C_TYPES.get(name, name))


def itemsize(dtype_name: str) -> int:
    return dtype_of(dtype_name).itemsize


def torch_dtype(dtype_name: str) -> str:
    return str(dtype_of(dtype_name)).removeprefix("torch.")


def flight_records() -> list[dict[str, Any]]:
    from torch._C._distributed_c10d import _dump_fr_trace_json  # where it is missing, the test skips first

    return json.loads(_dump_fr_trace_json(True, False)).get("entries", [])


def profiled_ops(trace: Path) -> list[dict[str, Any]]:
    """The c10d ops and gloo's point-to-point operations of a profiler trace (Chrome's format, which every
    release writes alike: torch 2.11's events in Python carry no dtypes), in the order they began."""
    events = json.loads(trace.read_text())["traceEvents"]
    wanted = [
        event
        for event in events
        if event.get("ph") == "X"
        and (event["name"].startswith("c10d::") or event["name"] in ("gloo:send", "gloo:recv"))
    ]
    return sorted(wanted, key=lambda event: event["ts"])


def witnessed(records: list[dict[str, Any]], profiled: list[dict[str, Any]], pp_ranks: list[int]) -> list[list[Any]]:
    """One step's operations as ``[op, ranks, bytes, dtype, peer]``, in the order they were issued.

    The op is the c10d op the profiler saw dispatched. A collective's group, sizes and dtype are the
    flight recorder's (its records and the dispatched collectives pair up in order). A send's or a
    receive's buffer is the profiler's ``gloo:send`` / ``gloo:recv`` event, its peer the group rank
    the c10d op was called with. Bytes follow nccl-tests' S, the whole buffer: for an all-gather the
    group size times the rank's input (the flight record's output sizes of a functional all-gather say
    ``[1, ...]`` on gloo).
    """
    dispatched = [event for event in profiled if event["name"].startswith("c10d::")]
    collectives = [
        C10D_NAMES[event["name"].removeprefix("c10d::")]
        for event in dispatched
        if event["name"].removeprefix("c10d::") not in POINT_TO_POINT
    ]
    assert len(collectives) == len(records), f"{len(collectives)} c10d collectives, {len(records)} records"
    ops = []
    for op, record in zip(collectives, records, strict=False):
        recorded_as = record["profiling_name"].split(":", 1)[-1]
        assert recorded_as in BACKEND_NAMES.get(op, {op}), f"{op} recorded as {recorded_as}"
        group = sorted(dist.get_process_group_ranks(_resolve_process_group(record["process_group"][0])))
        dtypes = record["input_dtypes"]
        nbytes = numel(record["input_sizes"]) * itemsize(dtypes[0]) if dtypes else 0
        ops.append(
            [
                op,
                group,
                nbytes * (len(group) if op == "all_gather" else 1),
                torch_dtype(dtypes[0]) if dtypes else None,
                None,
            ]
        )
    # c10d::send / recv_ (tensors, process group, peer, tag): the peer's group rank, as the call gave it
    peers = [
        pp_ranks[int(event["args"]["Concrete Inputs"][2])]
        for event in dispatched
        if event["name"].removeprefix("c10d::") in POINT_TO_POINT
    ]
    buffers = [event for event in profiled if event["name"] in ("gloo:send", "gloo:recv")]
    assert len(peers) == len(buffers), f"{len(peers)} c10d point-to-point ops, {len(buffers)} gloo ones"
    for event, peer in zip(buffers, peers, strict=False):
        dtype = event["args"]["Input type"][0]
        ops.append(
            [
                event["name"].split(":")[1],
                sorted(pp_ranks),
                numel(event["args"]["Input Dims"]) * itemsize(dtype),
                torch_dtype(dtype),
                peer,
            ]
        )
    return ops


def main(run_path: str, out_dir: str) -> None:
    run = ResolvedRun.from_json(json.loads(Path(run_path).read_text()))
    rank = int(os.environ["RANK"])
    device = local_device(run.device, int(os.environ["LOCAL_RANK"]))
    dist.init_process_group("gloo")
    sink = ListSink()
    probes = Instrumentation(rank=rank, sink=sink, device=device, enabled=True)
    mesh = build_mesh(device_type=run.device, pp=run.plan.pp, dp=run.plan.dp, tp=run.plan.tp)
    probes.install(groups=GroupDirectory.from_mesh(mesh), pipeline=run.plan.pp > 1)
    job = build_training(run, mesh=mesh, coords=coordinates(run, rank), device=device)
    # The groups by the names the hooks give them, from the mesh and the pipeline, not from the probes.
    groups = {dim: sorted(dist.get_process_group_ranks(mesh.get_group(dim))) for dim in MESH_DIMS}
    groups["world"] = list(range(dist.get_world_size()))
    tied = embedding_group(run, mesh=mesh)
    if tied is not None:
        groups["embedding"] = sorted(dist.get_process_group_ranks(tied))
    witness: list[list[Any]] = []
    for step in range(WATCHED_STEP + 1):
        probes.step_started(step)
        if step == WATCHED_STEP:
            before = max((entry["record_id"] for entry in flight_records()), default=-1)
            with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as profiled:
                train_step(job, step)
            probes.step_ended(step)
            records = sorted(
                (entry for entry in flight_records() if entry["record_id"] > before),
                key=lambda entry: entry["record_id"],
            )
            trace = Path(out_dir, f"profile-{rank}.json")
            profiled.export_chrome_trace(str(trace))
            witness = witnessed(records, profiled_ops(trace), groups["pp"])
        else:
            train_step(job, step)
            probes.step_ended(step)
    dist.barrier()
    probes.uninstall()
    hooks = [
        [e.op, groups[e.group], e.bytes, e.dtype, e.peer]
        for e in sorted(
            (e for e in sink.events if isinstance(e, CollectiveTiming) and e.step == WATCHED_STEP),
            key=lambda e: e.start_ns,
        )
    ]
    Path(out_dir, f"rank-{rank}.json").write_text(
        json.dumps(
            {
                "kernel": probes.collective_kernel,
                "witness_available": bool(flight_records()),
                "hooks": hooks,
                "witness": witness,
            }
        )
    )
    dist.destroy_process_group()


if __name__ == "__main__":
    main(*sys.argv[1:])
