"""What the collective hooks cost per operation: the C++ and the Python kernel against none, in one process.

``python -m tests.bench.kernel_cost [--json PATH]``

One gloo rank (``torchrun --nproc-per-node 1``, so no peer's scheduling
enters the timing) issues the same 4 KiB all-reduce in rounds of ROUND_OPS,
on the two paths real jobs take: ``dist.all_reduce`` (DDP, FSDP, direct
calls) and DTensor's functional all-reduce plus its wait (tensor
parallelism). The rounds cycle through no hooks, the C++ kernel and the
Python kernel, in alternating order, so all three see the same state of the
machine; each kernel's cost is the median of its rounds minus the median of
the rounds without hooks. A round's events are drained after it is timed.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tests.bench.figures import Row, Spread

ROUND_OPS, ROUNDS = 300, 12
PATHS = ("direct", "functional")
KERNELS = ("none", "cpp", "python")


def worker(out_path: str) -> None:
    """One rank: time every (path, kernel) over the rounds and write the per-op microseconds."""
    import torch
    import torch.distributed as dist
    from torch.distributed._functional_collectives import all_reduce, wait_tensor

    from probes.collectives import CollectiveProbe, GroupDirectory
    from probes.events import Event
    from probes.native import build, load

    dist.init_process_group("gloo")
    torch.set_num_threads(1)
    groups = GroupDirectory()
    groups.add("world", dist.group.WORLD)
    events: list[Event] = []
    native = load(build())
    probes = {
        kernel: CollectiveProbe(rank=0, groups=groups, emit=events.append, step=lambda: 1, device_timing=False,
                                native=native if kernel == "cpp" else None)
        for kernel in ("cpp", "python")
    }
    tensor = torch.ones(1024)

    def one_round(path: str) -> float:
        started = time.perf_counter()
        for _ in range(ROUND_OPS):
            if path == "direct":
                dist.all_reduce(tensor)
            else:
                wait_tensor(all_reduce(tensor, "sum", dist.group.WORLD))
        return (time.perf_counter() - started) / ROUND_OPS * 1e6

    results: dict[str, dict[str, list[float]]] = {path: {kernel: [] for kernel in KERNELS} for path in PATHS}
    for path in PATHS:
        one_round(path)  # warm-up
        for round_index in range(ROUNDS):
            for kernel in KERNELS if round_index % 2 == 0 else KERNELS[::-1]:
                probe = probes.get(kernel)
                if probe is not None:
                    probe.install()
                results[path][kernel].append(one_round(path))
                if probe is not None:
                    probe.uninstall()
                    time.sleep(0.01)  # the last completions land
                    probe.flush()
    counted = len(events)
    expected = 2 * len(PATHS) * ROUNDS * ROUND_OPS
    assert counted == expected, (counted, expected)
    Path(out_path).write_text(json.dumps(results))
    dist.destroy_process_group()


def measure() -> dict[str, dict[str, list[float]]]:
    """Microseconds per operation, by path and kernel, one value per round."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "cost.json"
        subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=1",
                        "-m", "tests.bench.kernel_cost", "--worker", str(out)], check=True, capture_output=True,
                       env={**os.environ, "OMP_NUM_THREADS": "1"}, timeout=600)
        return json.loads(out.read_text())


def cost_us(rounds: dict[str, list[float]], kernel: str) -> float:
    return statistics.median(rounds[kernel]) - statistics.median(rounds["none"])


def rows() -> list[Row]:
    """One row per path and kernel: microseconds added per operation; the spread is the rounds' differences."""
    results = measure()
    table = []
    for path, rounds in results.items():
        for kernel, label in (("cpp", "C++"), ("python", "Python")):
            differences = [hooked - bare for hooked, bare in zip(rounds[kernel], rounds["none"], strict=True)]
            table.append(Row("overhead", f"per op, {label} kernel, {path} all_reduce 4 KiB, 1 rank",
                             cost_us(rounds, kernel), "us", Spread.of(differences, "p25-p75"),
                             note=f"{statistics.median(rounds['none']):.0f} us per op without hooks; "
                                  f"{ROUND_OPS}-op rounds",
                             details={"rounds_us": rounds}))
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
    print(f"{'path':<11} {'no hooks us':>11} {'C++ +us':>8} {'Python +us':>10}")
    for path, rounds in results.items():
        print(f"{path:<11} {statistics.median(rounds['none']):>11.1f} {cost_us(rounds, 'cpp'):>8.1f} "
              f"{cost_us(rounds, 'python'):>10.1f}")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
