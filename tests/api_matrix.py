"""Every public collective API once, on two gloo ranks, each call watched by torch's flight recorder.

A plain torchrun script (it imports nothing of meshtop's), run by ``tests/runner/test_collective_apis.py``
under ``meshtop record``: ``torchrun --nproc-per-node 2 tests/api_matrix.py OUT_DIR`` with
``TORCH_FR_BUFFER_SIZE`` set. Each case is one call of an API (or the few calls one use of it takes: a
send with its receive), between two wall-clock stamps, with how it is waited on: at once, late (after
other work), or never. Each rank writes OUT_DIR/cases-N.json: per case its name, its stamps and the
flight records the backend made for it, as ``[profiling name, group ranks, input sizes, input dtypes,
output sizes, output dtypes]``; the test pairs them with what meshtop recorded between the stamps.
"""

from __future__ import annotations

import json
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as functional
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.distributed_c10d import _resolve_process_group
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard

warnings.simplefilter("ignore")  # deprecations differ by release (reduce_scatter_tensor's new name in 2.13)
FLOATS = 8
"""Each rank's tensor holds 8 float32 values (32 bytes), unless a case says otherwise."""
CASES: dict[str, Callable[[], None]] = {}
LINGER_S = 0.2
"""How long a case that never waits on its work leaves it to finish before the next case starts."""
NEVER_COMPLETE = """gloo completes a work without a future (a reduce-scatter, a send, a receive) only inside a wait
on it: one nobody waits on never completes (its output is never written), so no case leaves one unwaited."""


def case(function: Callable[[], None]) -> Callable[[], None]:
    CASES[function.__name__] = function
    return function


def ones(count: int = FLOATS, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.ones(count, dtype=dtype)


def other() -> int:
    return 1 - dist.get_rank()


# -- torch.distributed ------------------------------------------------------------------------------


@case
def all_reduce() -> None:
    dist.all_reduce(ones())


@case
def all_reduce_bfloat16() -> None:
    dist.all_reduce(ones(16, torch.bfloat16))


@case
def all_reduce_waited_late() -> None:
    work = dist.all_reduce(ones(), async_op=True)
    torch.randn(64, 64) @ torch.randn(64, 64)
    work.wait()


@case
def all_reduce_never_waited() -> None:
    dist.all_reduce(ones(), async_op=True)
    time.sleep(LINGER_S)


@case
def all_reduce_in_inference_mode() -> None:
    with torch.inference_mode():
        dist.all_reduce(ones())


@case
def all_gather_list() -> None:
    dist.all_gather([ones(), ones()], ones())


@case
def all_gather_into_tensor() -> None:
    dist.all_gather_into_tensor(ones(2 * FLOATS), ones())


@case
def reduce_scatter_list() -> None:
    dist.reduce_scatter(ones(), [ones(), ones()])


@case
def reduce_scatter_tensor() -> None:
    dist.reduce_scatter_tensor(ones(), ones(2 * FLOATS))


@case
def reduce_scatter_tensor_waited_late() -> None:
    work = dist.reduce_scatter_tensor(ones(), ones(2 * FLOATS), async_op=True)
    torch.randn(64, 64) @ torch.randn(64, 64)
    assert work is not None
    work.wait()


@case
def all_to_all_list() -> None:
    dist.all_to_all([ones(), ones()], [ones(), ones()])


@case
def all_to_all_single() -> None:
    dist.all_to_all_single(ones(2 * FLOATS), ones(2 * FLOATS))


@case
def broadcast() -> None:
    dist.broadcast(ones(), src=0)


@case
def reduce() -> None:
    dist.reduce(ones(), dst=0)


@case
def gather() -> None:
    dist.gather(ones(), [ones(), ones()] if dist.get_rank() == 0 else None, dst=0)


@case
def scatter() -> None:
    dist.scatter(ones(), [ones(), ones()] if dist.get_rank() == 0 else None, src=0)


@case
def barrier() -> None:
    dist.barrier()


@case
def monitored_barrier() -> None:
    dist.monitored_barrier()


@case
def send_recv() -> None:
    if dist.get_rank() == 0:
        dist.send(ones(), dst=1)
    else:
        dist.recv(ones(), src=0)


@case
def isend_irecv() -> None:
    work = dist.isend(ones(), dst=1) if dist.get_rank() == 0 else dist.irecv(ones(), src=0)
    assert work is not None
    work.wait()


@case
def batch_isend_irecv() -> None:
    operations = [dist.P2POp(dist.isend, ones(), other()), dist.P2POp(dist.irecv, ones(), other())]
    if dist.get_rank() == 1:
        operations.reverse()  # rank 1 receives first: gloo pairs sends and receives in order
    for work in dist.batch_isend_irecv(operations):
        work.wait()


@case
def all_gather_object() -> None:
    gathered: list[Any] = [None, None]
    dist.all_gather_object(gathered, {"rank": dist.get_rank()})


@case
def broadcast_object_list() -> None:
    dist.broadcast_object_list([{"from": 0}], src=0)


@case
def gather_object() -> None:
    dist.gather_object({"rank": dist.get_rank()}, [None, None] if dist.get_rank() == 0 else None, dst=0)


@case
def scatter_object_list() -> None:
    dist.scatter_object_list([None], [{"to": 0}, {"to": 1}] if dist.get_rank() == 0 else None, src=0)


@case
def send_recv_object_list() -> None:
    if dist.get_rank() == 0:
        dist.send_object_list([{"from": 0}], dst=1)
    else:
        dist.recv_object_list([None], src=0)


@case
def coalescing_manager_all_reduce() -> None:
    with dist._coalescing_manager(async_ops=True) as coalesced:
        dist.all_reduce(ones())
        dist.all_reduce(ones())
    coalesced.wait()


@case
def coalescing_manager_all_gather() -> None:
    with dist._coalescing_manager(async_ops=True) as coalesced:
        dist.all_gather_into_tensor(ones(2 * FLOATS), ones())
        dist.all_gather_into_tensor(ones(2 * FLOATS), ones())
    coalesced.wait()


@case
def coalescing_manager_reduce_scatter() -> None:
    with dist._coalescing_manager(async_ops=True) as coalesced:
        dist.reduce_scatter_tensor(ones(), ones(2 * FLOATS))
        dist.reduce_scatter_tensor(ones(), ones(2 * FLOATS))
    coalesced.wait()


# -- functional collectives: waited (``* 1`` uses the result, which waits) and never waited ------------


def world() -> dist.ProcessGroup:
    group = dist.group.WORLD
    assert group is not None
    return group


def functional_calls() -> dict[str, Callable[[], Any]]:
    return {
        "all_reduce": lambda: functional.all_reduce(ones(), "sum", world()),
        "all_gather_tensor": lambda: functional.all_gather_tensor(ones(), 0, world()),
        "reduce_scatter_tensor": lambda: functional.reduce_scatter_tensor(ones(2 * FLOATS), "sum", 0, world()),
        "all_to_all_single": lambda: functional.all_to_all_single(ones(2 * FLOATS), None, None, world()),
        "broadcast": lambda: functional.broadcast(ones(), 0, world()),
        "all_reduce_coalesced": lambda: functional.all_reduce_coalesced([ones(), ones()], "sum", world()),
        "all_gather_into_tensor_coalesced": lambda: functional.all_gather_into_tensor_coalesced(
            [ones(), ones()], world()
        ),
        "reduce_scatter_tensor_coalesced": lambda: functional.reduce_scatter_tensor_coalesced(
            [ones(2 * FLOATS), ones(2 * FLOATS)], "sum", [0, 0], world()
        ),
    }


def use(result: Any) -> None:
    for tensor in result if isinstance(result, list) else [result]:
        assert float((tensor * 1).sum()) > 0


def add_functional_cases() -> None:
    for name, call in functional_calls().items():
        CASES[f"functional_{name}"] = lambda call=call: use(call())
        if name.startswith("reduce_scatter"):
            continue  # gloo completes a reduce-scatter only in a wait on it (NEVER_COMPLETE)

        def never_waited(call: Callable[[], Any] = call) -> None:
            call()
            time.sleep(LINGER_S)

        CASES[f"functional_{name}_never_waited"] = never_waited


add_functional_cases()


# -- DTensor redistributions --------------------------------------------------------------------------


def redistribution(source: list[Any], target: list[Any], *, partial: bool = False) -> Callable[[], None]:
    def run() -> None:
        mesh = init_device_mesh("cpu", (2,), mesh_dim_names=("tp",))
        local = torch.ones(4, FLOATS) if partial else torch.ones(2, FLOATS)
        tensor = DTensor.from_local(local, mesh, source, run_check=False)
        moved = tensor.redistribute(mesh, target)
        assert float(moved.to_local().sum()) > 0

    return run


CASES["dtensor_shard_to_replicate"] = redistribution([Shard(0)], [Replicate()])
CASES["dtensor_partial_to_replicate"] = redistribution([Partial()], [Replicate()], partial=True)
CASES["dtensor_partial_to_shard"] = redistribution([Partial()], [Shard(0)], partial=True)
CASES["dtensor_shard0_to_shard1"] = redistribution([Shard(0)], [Shard(1)])


# -- the run ----------------------------------------------------------------------------------------


def flight_records() -> list[dict[str, Any]]:
    from torch._C._distributed_c10d import _dump_fr_trace_json

    return json.loads(_dump_fr_trace_json(True, False)).get("entries", [])


def described(record: dict[str, Any]) -> list[Any]:
    group = _resolve_process_group(record["process_group"][0])
    return [
        record["profiling_name"],
        sorted(dist.get_process_group_ranks(group)),
        record["input_sizes"],
        record["input_dtypes"],
        record["output_sizes"],
        record["output_dtypes"],
    ]


def main(out_dir: str) -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    model = torch.nn.Linear(FLOATS, FLOATS)  # one optimizer step a case: meshtop's step marks
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    results = []
    for name, run in CASES.items():
        dist.barrier()  # no case's traffic runs into the next one's stamps
        time.sleep(0.01)
        last = max((entry["record_id"] for entry in flight_records()), default=-1)
        start_ns = time.time_ns()
        unsupported = None
        try:
            run()
        except RuntimeError as error:  # gloo of torch 2.11 has no list all_to_all: c10d says so before it sends
            if "does not support" not in str(error):
                raise
            unsupported = str(error)
        end_ns = time.time_ns()
        records = [entry for entry in flight_records() if entry["record_id"] > last]
        results.append(
            {
                "case": name,
                "start_ns": start_ns,
                "end_ns": end_ns,
                "records": [described(record) for record in sorted(records, key=lambda e: e["record_id"])],
                "unsupported": unsupported,
            }
        )
        model(torch.ones(FLOATS)).sum().backward()
        optimizer.step()
        optimizer.zero_grad()
    dist.barrier()
    Path(out_dir, f"cases-{rank}.json").write_text(json.dumps(results))
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
