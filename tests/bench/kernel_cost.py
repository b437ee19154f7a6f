"""What the collective hooks cost per operation, and per event on the shipper's thread, in one process.

``python -m tests.bench.kernel_cost [--json PATH]``

One gloo rank (``torchrun --nproc-per-node 1``, so no peer's scheduling
enters the timing) issues the same 4 KiB all-reduce in rounds of ROUND_OPS,
on the two paths real jobs take: ``dist.all_reduce`` and its ``Work.wait``
(DDP, FSDP, direct calls) and the functional all-reduce plus ``wait_tensor``
(DTensor, tensor parallelism; called as the ops ``_c10d_functional``, which
DTensor's Python wrapper calls, so that the wrapper's 150 us of Python do not
drown the hook's microsecond). The rounds cycle through no hooks, the C++
kernel and the Python kernel, in alternating order, so all three see the same
state of the machine; Python's garbage collector is paused during a round.

Each round is timed two ways: the calling thread's CPU time
(``time.thread_time_ns``: what the hooks cost the thread that issues the
collective, the figure the target is on) and wall time (which also holds the
completion callback on gloo's thread and the VM's scheduling noise). A
kernel's cost is the median of its rounds minus the median of the rounds
without hooks; the spread is the p25-p75 of the paired differences.

The shipper row: the C++ kernel's finished operations of a 20,000-operation
round, taken by ``CollectiveProbe.flush`` (the kernel writes the wire's JSON
lines) and put into a frame (``meshtop.probes.wire.encode_events``), in the shipper
thread's CPU time per event; beside it, the same for the same operations as
Python events (what every event cost before the kernel wrote them).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from meshtop.probes.arrivals import EncodedEvents, decode_lines
from tests.bench.figures import Row, Spread, Target

ROUND_OPS, ROUNDS = 200, 30
SHIPPER_OPS = 20_000
PATHS = ("direct", "functional")
KERNELS = ("none", "cpp", "python")
TARGETS = {"direct": Target(high=2.0), "functional": Target(high=3.0)}
SHIPPER_TARGET = Target(high=2.0)


def worker(out_path: str) -> None:
    """One rank: time every (path, kernel) over the rounds, then the shipper's work; write the results."""
    import torch
    import torch.distributed as dist

    from meshtop.probes.collectives import CollectiveProbe, GroupDirectory
    from meshtop.probes.events import Event
    from meshtop.probes.native import build, load
    from meshtop.probes.wire import encode_events

    dist.init_process_group("gloo")
    torch.set_num_threads(1)
    groups = GroupDirectory()
    groups.add("world", dist.group.WORLD)
    events: list[Event] = []
    blocks: list[tuple[bytes, int]] = []
    native = load(build())
    probes = {
        kernel: CollectiveProbe(
            rank=0,
            groups=groups,
            emit=events.append,
            step=lambda: 1,
            device_timing=False,
            native=native if kernel == "cpp" else None,
            emit_lines=lambda _kind, lines, count: blocks.append((lines, count)),
        )
        for kernel in ("cpp", "python")
    }
    tensor = torch.ones(1024)
    functional, group_name = torch.ops._c10d_functional, dist.group.WORLD.group_name

    def one_round(path: str, ops: int = ROUND_OPS) -> tuple[float, float]:
        """Microseconds per operation: (calling thread CPU, wall)."""
        gc.collect()
        gc.disable()
        cpu, wall = time.thread_time_ns(), time.perf_counter_ns()
        for _ in range(ops):
            if path == "direct":
                dist.all_reduce(tensor)
            else:
                functional.wait_tensor(functional.all_reduce(tensor, "sum", group_name))
        cpu, wall = time.thread_time_ns() - cpu, time.perf_counter_ns() - wall
        gc.enable()
        return cpu / ops / 1e3, wall / ops / 1e3

    results: dict[str, dict[str, list[list[float]]]] = {path: {k: [] for k in KERNELS} for path in PATHS}
    for path in PATHS:
        one_round(path)  # warm-up
        for round_index in range(ROUNDS):
            for kernel in KERNELS if round_index % 2 == 0 else KERNELS[::-1]:
                probe = probes.get(kernel)
                if probe is not None:
                    probe.install()
                results[path][kernel].append(list(one_round(path)))
                if probe is not None:
                    probe.uninstall()
                    time.sleep(0.01)  # the last completions land
                    probe.flush()
    counted = len(events) + sum(count for _, count in blocks)
    expected = 2 * len(PATHS) * ROUNDS * ROUND_OPS
    assert counted == expected, (counted, expected)

    events.clear()
    blocks.clear()
    probe = probes["cpp"]
    probe.install()
    one_round("direct", SHIPPER_OPS)
    probe.uninstall()
    time.sleep(0.05)
    cpu = time.thread_time_ns()
    probe.flush()
    frame = encode_events(
        token="t",
        rank=0,
        dropped=0,
        events=events,
        blocks=[EncodedEvents("collective", 0, lines, count) for lines, count in blocks],
    )
    lines_us = (time.thread_time_ns() - cpu) / SHIPPER_OPS / 1e3
    assert sum(count for _, count in blocks) == SHIPPER_OPS and len(frame) > 200 * SHIPPER_OPS
    decoded = [event for lines, _count in blocks for event in decode_lines(lines, "collective")[0]]
    cpu = time.thread_time_ns()
    encode_events(token="t", rank=0, dropped=0, events=decoded)
    events_us = (time.thread_time_ns() - cpu) / SHIPPER_OPS / 1e3
    Path(out_path).write_text(
        json.dumps({"rounds": results, "shipper": {"lines_us": lines_us, "events_us": events_us}})
    )
    dist.destroy_process_group()


def measure() -> dict:
    """Per path and kernel, (CPU, wall) microseconds per operation, one pair per round; and the shipper's cost."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "cost.json"
        subprocess.run(
            [
                sys.executable,
                "-m",
                "torch.distributed.run",
                "--standalone",
                "--nproc-per-node=1",
                "-m",
                "tests.bench.kernel_cost",
                "--worker",
                str(out),
            ],
            check=True,
            capture_output=True,
            env={**os.environ, "OMP_NUM_THREADS": "1"},
            timeout=600,
        )
        return json.loads(out.read_text())


def cost_us(rounds: dict[str, list[list[float]]], kernel: str, clock: int) -> float:
    """Median of ``kernel``'s rounds minus the median of the rounds without hooks (clock 0: CPU, 1: wall)."""
    return statistics.median(r[clock] for r in rounds[kernel]) - statistics.median(r[clock] for r in rounds["none"])


def rows() -> list[Row]:
    """Per path and kernel, the microseconds the calling thread spends per operation; then the shipper's per event."""
    results = measure()
    table = []
    for path, rounds in results["rounds"].items():
        bare_cpu = statistics.median(r[0] for r in rounds["none"])
        bare_wall = statistics.median(r[1] for r in rounds["none"])
        for kernel, label in (("cpp", "C++"), ("python", "Python")):
            differences = [hooked[0] - bare[0] for hooked, bare in zip(rounds[kernel], rounds["none"], strict=True)]
            table.append(
                Row(
                    "overhead",
                    f"per op, {label} kernel, {path} all_reduce 4 KiB, calling thread",
                    cost_us(rounds, kernel, 0),
                    "us",
                    Spread.of(differences, "p25-p75"),
                    TARGETS[path] if kernel == "cpp" else Target(),
                    note=f"CPU time; wall +{cost_us(rounds, kernel, 1):.1f} us; without hooks {bare_cpu:.0f} us CPU, "
                    f"{bare_wall:.0f} us wall per op; {ROUND_OPS}-op rounds",
                    details={"rounds_cpu_wall_us": rounds},
                )
            )
    shipper = results["shipper"]
    table.append(
        Row(
            "overhead",
            "shipper thread, per collective event, C++ kernel",
            shipper["lines_us"],
            "us",
            Spread.of([shipper["lines_us"]]),
            SHIPPER_TARGET,
            note=f"flush (the kernel's JSON lines) + frame, {SHIPPER_OPS:,} events; as Python events "
            f"{shipper['events_us']:.1f} us",
        )
    )
    return table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path)
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.worker)
        return
    results = measure()
    print(f"{'path':<11} {'none cpu/wall us':>17} {'C++ +cpu/+wall':>15} {'Python +cpu/+wall':>18}")
    for path, rounds in results["rounds"].items():
        bare = [statistics.median(r[clock] for r in rounds["none"]) for clock in (0, 1)]
        cpp = [cost_us(rounds, "cpp", clock) for clock in (0, 1)]
        python = [cost_us(rounds, "python", clock) for clock in (0, 1)]
        print(
            f"{path:<11} {bare[0]:>8.1f}/{bare[1]:<8.1f} {cpp[0]:>7.2f}/{cpp[1]:<7.2f} "
            f"{python[0]:>8.1f}/{python[1]:<8.1f}"
        )
    shipper = results["shipper"]
    print(f"shipper per event: C++ lines {shipper['lines_us']:.2f} us, Python events {shipper['events_us']:.2f} us")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
