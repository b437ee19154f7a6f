"""What the collective hooks cost per operation, and per event on the shipper's thread, in one process.

``python -m tests.bench.kernel_cost [--json PATH] [--backends fake,gloo]``

One rank issues the same 4 KiB all-reduce in rounds, on the two paths real
jobs take: ``dist.all_reduce`` and its ``Work.wait`` (DDP, FSDP, direct
calls) and the functional all-reduce plus ``wait_tensor`` (DTensor, tensor
parallelism; called as the ops ``_c10d_functional``, which DTensor's Python
wrapper calls, so that the wrapper's Python does not drown the hook's
microsecond). The rounds cycle through no hooks, the C++ kernel and the
Python kernel, in alternating order, so all three see the same state of the
machine.

The target rows are on torch's fake process group (``FakeStore``, backend
``fake``, world size 2): its all-reduce does no work and its work's future is
complete when it is returned, so the bare operation costs only the
dispatcher and the Python binding, and a fraction of a microsecond added by
the hooks stands out of the round-to-round noise. A gloo all-reduce costs
tens of times the hook's cost and varies by more than that cost from round
to round, so gloo's rows (one rank under ``torchrun --nproc-per-node 1``: no
peer's scheduling enters the timing) are reported without a target. The
hooks do the same work per operation on either backend (the kernels are
registered on the c10d dispatcher ops, not on a backend); the completion
callback, which on gloo runs on gloo's thread, runs on the calling thread
here, inside the figure. The counts of operations each
kernel recorded are checked against the operations issued.

Every round is timed on the calling thread's CPU clock
(``time.thread_time_ns``: what the hooks cost the thread that issues the
collective; the time the thread is not running does not count), with
Python's garbage collector paused, and on the wall clock (in the note). A
round is long enough (:data:`ROUND_OPS`) that a context switch's cold cache
is a small share of it. A kernel's cost is the median over rounds of the
round's per-operation time minus that of the same round index without hooks
(neighbours in time); the spread is the p25-p75 of those differences. The
bare operation's row is the rounds without hooks: their median and p25-p75.

The shipper row (on gloo): the C++ kernel's finished operations of a
20,000-operation round, taken by ``CollectiveProbe.flush`` (the kernel
writes the wire's JSON lines) and put into a frame
(``tests.kit.wire.encode_events``), in the shipper thread's CPU time per
event; beside it, the same for the same operations as Python events (what
every event cost before the kernel wrote them).
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

BACKENDS = ("fake", "gloo")
ROUND_OPS = {"fake": 2000, "gloo": 200}
"""Operations per round: some milliseconds of the bare operation on either backend (see above)."""
ROUNDS = {"fake": 40, "gloo": 30}
SHIPPER_OPS = 20_000
PATHS = ("direct", "functional")
KERNELS = ("none", "cpp", "python")
KERNEL_LABELS = {"cpp": "C++", "python": "Python"}
TARGETS = {"direct": Target(high=2.0), "functional": Target(high=3.0)}
"""On the fake backend only, where the figure resolves them (see above)."""
SHIPPER_TARGET = Target(high=2.0)


def worker(out_path: str, backend: str) -> None:
    """One rank: time every (path, kernel) over the rounds, then (gloo) the shipper's work; write the results."""
    import torch
    import torch.distributed as dist

    from meshtop.probes.collectives import CollectiveProbe, GroupDirectory
    from meshtop.probes.events import Event
    from meshtop.probes.native import build, load
    from tests.kit.wire import encode_events

    if backend == "fake":
        from torch.testing._internal.distributed.fake_pg import FakeStore

        dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=2)
    else:
        dist.init_process_group(backend)
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
    round_ops = ROUND_OPS[backend]

    def one_round(path: str, ops: int = round_ops) -> tuple[float, float]:
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
    recorded: dict[str, dict[str, int]] = {path: {k: 0 for k in probes} for path in PATHS}
    for path in PATHS:
        one_round(path)  # warm-up
        for round_index in range(ROUNDS[backend]):
            for kernel in KERNELS if round_index % 2 == 0 else KERNELS[::-1]:
                probe = probes.get(kernel)
                if probe is not None:
                    probe.install()
                results[path][kernel].append(list(one_round(path)))
                if probe is not None:
                    probe.uninstall()
                    time.sleep(0.01)  # the last completions land
                    probe.flush()
                    recorded[path][kernel] += len(events) + sum(count for _, count in blocks)
                    events.clear()
                    blocks.clear()
    expected = ROUNDS[backend] * round_ops
    assert all(count == expected for by_kernel in recorded.values() for count in by_kernel.values()), (
        recorded,
        expected,
    )
    output: dict[str, object] = {"backend": backend, "round_ops": round_ops, "recorded": recorded, "rounds": results}

    if backend == "gloo":
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
        output["shipper"] = {"lines_us": lines_us, "events_us": events_us}
    Path(out_path).write_text(json.dumps(output))
    dist.destroy_process_group()


def measure(backend: str) -> dict:
    """Per path and kernel, (CPU, wall) microseconds per operation, one pair per round; on gloo, the shipper's."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "cost.json"
        module = ["-m", "tests.bench.kernel_cost", "--worker", str(out), "--backends", backend]
        launcher = ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node=1"] if backend == "gloo" else []
        subprocess.run(
            [sys.executable, *launcher, *module],
            check=True,
            capture_output=True,
            env={**os.environ, "OMP_NUM_THREADS": "1"},
            timeout=600,
        )
        return json.loads(out.read_text())


def paired_differences(rounds: dict[str, list[list[float]]], kernel: str, clock: int) -> list[float]:
    """Each round's microseconds per operation with ``kernel`` minus the same round's without hooks
    (clock 0: CPU, 1: wall)."""
    return [hooked[clock] - bare[clock] for hooked, bare in zip(rounds[kernel], rounds["none"], strict=True)]


def rows_of(result: dict) -> list[Row]:
    """The rows of one backend's :func:`measure`: per path, the bare operation (fake) and each kernel's cost."""
    backend, round_ops = result["backend"], result["round_ops"]
    table = []
    for path, rounds in result["rounds"].items():
        bare_cpu = [r[0] for r in rounds["none"]]
        bare_wall = statistics.median(r[1] for r in rounds["none"])
        what = f"{path} all_reduce 4 KiB, {backend}, calling thread"
        if backend == "fake":
            table.append(
                Row(
                    "overhead",
                    f"per op, no hooks, {what}",
                    statistics.median(bare_cpu),
                    "us",
                    Spread.of(bare_cpu, "p25-p75"),
                    note=f"CPU time; {bare_wall:.1f} us wall; {round_ops}-op rounds",
                )
            )
        for kernel, label in KERNEL_LABELS.items():
            differences = paired_differences(rounds, kernel, 0)
            wall = statistics.median(paired_differences(rounds, kernel, 1))
            bare = (
                f"; without hooks {statistics.median(bare_cpu):.1f} us CPU, {bare_wall:.1f} us wall per op"
                if backend != "fake"
                else ""
            )
            table.append(
                Row(
                    "overhead",
                    f"per op, {label} kernel, {what}",
                    statistics.median(differences),
                    "us",
                    Spread.of(differences, "p25-p75"),
                    TARGETS[path] if kernel == "cpp" and backend == "fake" else Target(),
                    note=f"CPU time, paired rounds; wall {wall:+.1f} us{bare}; {round_ops}-op rounds, "
                    f"{result['recorded'][path][kernel]:,} operations recorded",
                    details={"rounds_cpu_wall_us": rounds},
                )
            )
    if shipper := result.get("shipper"):
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


def rows(backends: tuple[str, ...] = BACKENDS) -> list[Row]:
    """Per backend, path and kernel, the microseconds the calling thread spends per operation; the shipper's."""
    return [row for backend in backends for row in rows_of(measure(backend))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, help="also write the rows as JSON, with every round")
    parser.add_argument("--backends", default=",".join(BACKENDS), help=f"of {','.join(BACKENDS)}")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    backends = tuple(name for name in args.backends.split(",") if name)
    if args.worker:
        worker(args.worker, backends[0])
        return
    table = rows(backends)
    print(f"{'case':<74} {'value':>7} {'p25..p75 (or min..max)':>22} {'n':>3} {'target':>7} met  note")
    for row in table:
        met = "-" if row.met is None else "yes" if row.met else "NO"
        print(
            f"{row.case:<74} {row.value:>7.2f} {row.spread.low:>10.2f}..{row.spread.high:<10.2f} {row.spread.reps:>3} "
            f"{row.target!s:>7} {met:<4} {row.note}"
        )
    if args.json:
        args.json.write_text(json.dumps([row.to_json() for row in table], indent=2))


if __name__ == "__main__":
    main()
