"""nccl's device timing, where torch returns no work to follow (torch 2.11's blocking python collectives on a GPU).

Its real path runs on a GPU only (tests/probes/test_gpu.py); here the two device marks are scripted, so the rule
is checked on a CPU: a blocking op with no work is timed by marks on the current stream before and after the call,
read once the second has completed, and one with no marks (a CUDA graph being captured) ends as the call returns.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from meshtop.probes.c10d_ops import C10D_OPS
from meshtop.probes.collectives import CollectiveProbe
from meshtop.probes.events import CollectiveTiming, Event
from meshtop.probes.groups import GroupDirectory


@dataclass
class ScriptedMark:
    """A CUDA event's three methods, on a scripted device clock."""

    at_ms: float
    done: bool = False

    def record(self) -> None:
        pass

    def query(self) -> bool:
        return self.done

    def elapsed_time(self, end: ScriptedMark) -> float:
        return end.at_ms - self.at_ms


def wait_for(events: list[Event], count: int) -> None:
    deadline = time.monotonic() + 5
    while len(events) < count and time.monotonic() < deadline:
        time.sleep(0.005)


def test_a_blocking_op_without_work_is_timed_between_two_marks_on_the_current_stream() -> None:
    marks = [ScriptedMark(10.0, done=True), ScriptedMark(17.5)]
    events: list[Event] = []
    errors: list[str] = []
    probe = CollectiveProbe(
        rank=0, groups=GroupDirectory(), emit=events.append, step=lambda: 3, device_timing=True,
        on_error=errors.append, device_mark=lambda: marks.pop(0) if marks else None,
    )  # fmt: skip
    probe.install()
    try:
        group = probe.groups.named("world", 1)
        opened = probe._mark_now()  # what the kernel records before the call
        start_ns = time.time_ns()
        probe._track("allreduce_", C10D_OPS["allreduce_"], None, group, ([torch.ones(4)],), start_ns, opened)
        time.sleep(0.05)
        assert events == []  # the closing mark has not completed: the device is still on it
        probe._track("allreduce_", C10D_OPS["allreduce_"], None, group, ([torch.ones(4)],), start_ns, opened=None)
        wait_for(events, 1)
        [hosted] = events  # no marks (a graph being captured, or no device timing): ended as the call returned
        assert hosted.clock == "completion" and hosted.end_ns >= start_ns
        assert probe._nccl is not None
        closed = probe._nccl.pending[0][0].closed  # type: ignore[union-attr]
        closed.done = True
        wait_for(events, 2)
    finally:
        probe.uninstall()
    timed = [e for e in events if isinstance(e, CollectiveTiming) and e.clock == "cuda_events"]
    assert errors == [] and len(timed) == 1
    assert (timed[0].op, timed[0].bytes, timed[0].step) == ("all_reduce", 16, 3)
    assert timed[0].end_ns - timed[0].start_ns == 7_500_000  # the device's 7.5 ms between the marks
