"""A rank that issues a fixed set of operations under the collective hooks and writes what they reported.

Run under torchrun with 2 ranks: ``python -m tests.kernel_worker OUT_DIR``.
The kernel is whichever ``MESHTOP_NATIVE_PROBE`` selects (the C++ one, or
``off``: Python), so ``tests/probes/test_collective_kernels.py`` can check that both
report the same operations the same way. Rank 1 joins the second all-reduce
late, so rank 0's heartbeat shows it in flight.

Then, after ``scenarios_from_ns``, one step per way of waiting (see
:data:`SCENARIOS`), separated by untagged barriers. Where rank 1 comes late,
rank 0's operations are still in flight when it waits or issues the next, so
rank 0's waits and overlaps are certain; rank 1's are not (its peer is
already there) and are asserted only where they are.
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

from meshtop.probes.events import CollectiveTiming, SamplerError
from meshtop.probes.groups import GroupDirectory
from meshtop.probes.instrument import Instrumentation
from meshtop.runner.rank.mesh import build_mesh
from tests.witness_worker import ListSink

LATE_S = 0.3
WORK_BEFORE_WAIT_S = 0.1
"""Rank 0's time between issuing an async operation and waiting for it."""
SCENARIOS = {
    "sync": 10,  # a synchronous all-reduce, rank 1 late: rank 0 waits from issue to end
    "done_before_wait": 11,  # async, waited only once it has completed: no wait
    "waited_in_flight": 12,  # async, rank 1 late, rank 0 waits after some work: waited < in flight
    "same_group": 13,  # two async all-reduces on tp in flight together
    "two_groups": 14,  # one on tp, one on another group, in flight together
}
NAMING_STEPS = {"first": 20, "named": 21, "renamed": 22}
ODD_NAMES = ('mesh "odd" \\ dim\t\u2713', "renamed")
"""A group named as no JSON writer may take for granted (quotes, a backslash, a tab, non-ASCII), then renamed."""
"""Scenario name: the step its operations are tagged with."""


def come_late(rank: int, key: str) -> None:
    """Rank 0 says it is about to issue; rank 1 hears it and only then sleeps ``LATE_S``, so rank 1 comes late
    to rank 0's operation however either was held up before (a loaded machine once delayed rank 0 past the
    sleep of a rank 1 that had simply slept from their last common operation)."""
    store = dist.distributed_c10d._get_default_store()
    if rank == 0:
        store.set(key, "issuing")
    else:
        store.wait([key])
        time.sleep(LATE_S)


def run_scenarios(rank: int, probes: Instrumentation, tp: dist.ProcessGroup, other: dist.ProcessGroup) -> None:
    """The ways of waiting that ``waited_ns`` and ``overlapped`` tell apart, each in its own step."""
    a, b = torch.ones(1000), torch.ones(1000)
    scenario = ""

    def late() -> None:
        come_late(rank, f"late-{scenario}")

    def step(name: str) -> None:
        nonlocal scenario
        scenario = name
        probes.set_step(None)
        dist.barrier(group=tp)  # the previous scenario has ended on both ranks
        probes.set_step(SCENARIOS[name])

    step("sync")
    late()
    dist.all_reduce(a, group=tp)

    step("done_before_wait")
    work = dist.all_reduce(a, group=tp, async_op=True)
    while not work.is_completed():
        time.sleep(0.001)
    work.wait()

    step("waited_in_flight")
    late()
    work = dist.all_reduce(a, group=tp, async_op=True)
    if rank == 0:
        time.sleep(WORK_BEFORE_WAIT_S)
    work.wait()

    step("same_group")
    late()
    first = dist.all_reduce(a, group=tp, async_op=True)
    second = dist.all_reduce(b, group=tp, async_op=True)
    first.wait()
    second.wait()

    step("two_groups")
    late()
    first = dist.all_reduce(a, group=tp, async_op=True)
    second = dist.all_reduce(b, group=other, async_op=True)
    first.wait()
    second.wait()
    probes.set_step(None)


def run_naming(probes: Instrumentation, groups: GroupDirectory, odd: dist.ProcessGroup) -> None:
    """An all-reduce on ``odd`` before the C++ kernel can name it (Python does, and teaches it), one after it
    can, and one after the directory renamed the group: each drained before the next."""
    tensor = torch.ones(10)
    groups.add(ODD_NAMES[0], odd)
    for name, step in NAMING_STEPS.items():
        if name == "renamed":
            groups.add(ODD_NAMES[1], odd, replace=True)
        probes.set_step(step)
        dist.all_reduce(tensor, group=odd)
        probes.set_step(None)
        probes.flush()


def main(out_dir: str) -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    sink = ListSink()
    probes = Instrumentation(rank=rank, sink=sink, device=torch.device("cpu"), enabled=True)
    mesh = build_mesh(device_type="cpu", pp=1, dp=1, tp=2)
    other = dist.new_group([0, 1])  # before the hooks: its set-up traffic is not one of the expected operations
    odd = dist.new_group([0, 1])
    groups = GroupDirectory.from_mesh(mesh)
    probes.install(groups=groups, pipeline=False)
    tp = mesh.get_group("tp")
    assert other.group_name != tp.group_name
    probes.step_started(3)
    tensor = torch.ones(1000)
    dist.all_reduce(tensor, group=tp)
    wait_tensor(functional_all_reduce(torch.ones(256, dtype=torch.bfloat16), "sum", tp))
    come_late(rank, "late-first")
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
    scenarios_from_ns = time.time_ns()
    run_scenarios(rank, probes, tp, other)
    dist.barrier()
    probes.flush()
    lines_before_naming = sink.from_lines
    run_naming(probes, groups, odd)
    naming_from_lines = sink.from_lines - lines_before_naming
    dist.barrier()
    probe = probes._collectives
    assert probe is not None
    # every work has ended: nothing may stay where a wait finds a work (a stale output storage would keep
    # the work alive, and send a later functional wait on a reused storage to it)
    left = {"in_flight": probes.progress().in_flight, "waitable": len(probe._in_flight.waitable)}
    left["by_storage"] = len(probe._in_flight.by_storage)
    probes.uninstall()
    report = {
        "scenarios_from_ns": scenarios_from_ns,
        "kernel": probes.collective_kernel,
        "errors": [e.message for e in sink.events if isinstance(e, SamplerError)],
        "collectives": [dataclasses.asdict(e) for e in sink.events if isinstance(e, CollectiveTiming)],
        "progress": dataclasses.asdict(progress) if progress is not None else None,
        "from_lines": sink.from_lines,
        "naming_from_lines": naming_from_lines,
        "left": left,
    }
    Path(out_dir, f"rank-{rank}.json").write_text(json.dumps(report))
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
