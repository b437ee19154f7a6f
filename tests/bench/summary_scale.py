"""``meshtop summary`` of a 1024-rank, 1-hour recording: its time and its peak memory.

``python -m tests.bench.summary_scale [--ranks 1024] [--nodes 16] [--hours 1] [--step-s 5] [--keep DIR]``

The recording is the synthetic job of :class:`tests.bench.tui_frames.SyntheticSource` (dp x tp2 x pp2, 1F1B,
8 microbatches: 44 events a rank a step), ``--ranks`` ranks over ``--nodes`` hosts, a step every
``--step-s`` seconds for ``--hours``, with a process sample of each rank at 2 Hz and a GPU sample of each
rank's GPU at 10 Hz (the samplers' defaults). It is written as meshtop leaves a recording it closed
cleanly: a manifest and one Parquet table a kind (zstd). Writing it whole through the recorder would take
an hour of this machine, so one step of every rank is made as events, turned into tables, and written again
for each step with its times moved on, each time stamp and duration given a clock's jitter (up to 50 us;
without it Parquet stores the regular times in about a byte an event, and the figure would flatter).

Then ``meshtop summary`` runs in a process of its own, as a user runs it, timed, three times; its peak
resident memory is the kernel's (``ru_maxrss`` of the finished child). About 6 minutes on 2 cores with the
defaults (the writing 2 of them), 1.5 GB on disk.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from itertools import islice
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from meshtop.probes.events import DURATION_FIELDS, Event, ProcessSample
from meshtop.recordings.events_log import EVENTS_DIR
from meshtop.recordings.manifest import start_manifest, write_manifest
from meshtop.recordings.schema import table_of
from tests.bench.figures import NO_TARGET, Row, Spread, median
from tests.bench.tui_frames import SyntheticSource
from tests.kit.events import gpu_sample

STEP_KINDS = ("stage_action", "collective", "step", "memory")
"""The kinds a rank sends each step (the rest are samples, on their own clocks)."""
PROCESS_HZ, GPU_HZ = 2.0, 10.0
JITTER_NS = 50_000
ROWS_PER_WRITE = 2_000_000
"""Rows gathered before a write (one Parquet row group each)."""


def one_step(source: SyntheticSource) -> tuple[int, dict[str, pa.Table]]:
    """Step 1 of every rank of ``source`` as one table a kind, and that step's start (ns)."""
    events: list[Event] = []
    stream = source.job_events()
    for event in islice(stream, source.ranks, None):  # past the rank starts
        step = getattr(event, "step", None)
        if event.kind in STEP_KINDS and step == 1:
            events.append(event)
        elif step == 2:
            break
    start = min(event.start_ns for event in events if event.kind == "step")  # type: ignore[attr-defined]
    by_kind: dict[str, list[Event]] = {}
    for event in events:
        by_kind.setdefault(event.kind, []).append(event)
    return start, {kind: table_of(group) for kind, group in by_kind.items()}


def samples(source: SyntheticSource, origin_ns: int) -> dict[str, pa.Table]:
    """One process sample of each rank and one GPU sample of each rank's GPU, at ``origin_ns``."""
    processes = [
        ProcessSample(rank=r, pid=10_000 + r, wall_ns=origin_ns, cpu_pct=99.0, rss_bytes=8_000_000_000, threads=40)
        for r in range(source.ranks)
    ]
    gpus = [
        replace(
            gpu_sample(
                gpu=r % source.per_node,
                wall_ns=origin_ns,
                name="NVIDIA H200",
                memory_used_bytes=100_000_000_000,
                memory_total_bytes=141_000_000_000,
                utilization_pct=90.0,
                power_w=600.0,
            ),
            node=r // source.per_node,
        )
        for r in range(source.ranks)
    ]
    return {"process": table_of(processes), "gpu": table_of(gpus)}


def moved(table: pa.Table, by_ns: int, rng: np.random.Generator, step: int | None) -> pa.Table:
    """``table`` with every time stamp moved by ``by_ns`` (plus jitter), durations jittered by up to 2 %, and
    its step set to ``step`` where given."""
    columns = {}
    for name in table.column_names:
        column = table.column(name)
        if name.endswith("_ns") and name not in DURATION_FIELDS and pa.types.is_integer(column.type):
            jitter = rng.integers(0, JITTER_NS, len(table))
            columns[name] = pa.array(column.to_numpy(zero_copy_only=False) + by_ns + jitter, pa.int64())
        elif name.endswith("_ns") and pa.types.is_list(column.type):  # a step's phase windows
            lists = column.combine_chunks()
            values = lists.values.to_numpy(zero_copy_only=False) + by_ns + rng.integers(0, JITTER_NS, len(lists.values))
            columns[name] = pa.ListArray.from_arrays(lists.offsets, pa.array(values, pa.int64()), mask=lists.is_null())
        elif name in ("duration_s", "forward_backward_s") and pa.types.is_floating(column.type):
            values = column.to_numpy(zero_copy_only=False)
            columns[name] = pa.array(values * (1 + 0.02 * rng.random(len(table))), pa.float64())
        elif name == "step" and step is not None:
            columns[name] = pa.array(np.full(len(table), step, np.int64))
        else:
            columns[name] = column
    return pa.table(columns, schema=table.schema)


class KindWriter:
    """One kind's Parquet table, written in row groups of about :data:`ROWS_PER_WRITE` rows."""

    def __init__(self, path: Path, schema: pa.Schema, rows_per_write: int = ROWS_PER_WRITE) -> None:
        self.writer = pq.ParquetWriter(path, schema, compression="zstd")
        self.pending: list[pa.Table] = []
        self.rows = self.written = 0
        self.rows_per_write = rows_per_write

    def add(self, table: pa.Table) -> None:
        self.pending.append(table)
        self.rows += len(table)
        if self.rows >= self.rows_per_write:
            self.flush()

    def flush(self) -> None:
        if self.pending:
            self.writer.write_table(pa.concat_tables(self.pending))
            self.written += self.rows
            self.pending, self.rows = [], 0

    def close(self) -> int:
        self.flush()
        self.writer.close()
        return self.written


def write_fleet_recording(
    directory: Path, *, ranks: int, nodes: int, hours: float, step_s: float, rows_per_write: int = ROWS_PER_WRITE
) -> int:
    """A completed recording of the synthetic job in ``directory``, in row groups of about ``rows_per_write``
    rows; its number of events."""
    per_rank_step = 44
    rate = ranks * per_rank_step / step_s + ranks * PROCESS_HZ + min(ranks, 8) * GPU_HZ
    source = SyntheticSource(ranks, rate=rate, warm_events=0, per_node=ranks // nodes)
    directory.mkdir(parents=True, exist_ok=True)
    manifest = start_manifest(source.description, command_line=["bench"])
    write_manifest(directory, manifest)
    events = directory / EVENTS_DIR
    events.mkdir(exist_ok=True)
    origin = source._origin_ns
    starts = list(islice(source.job_events(), ranks))
    pq.write_table(table_of(starts), events / "rank_started.parquet", compression="zstd")
    step_start, step_tables = one_step(source)
    sample_tables = samples(source, origin)
    writers = {
        kind: KindWriter(events / f"{kind}.parquet", table.schema, rows_per_write)
        for kind, table in (*step_tables.items(), *sample_tables.items())
    }
    rng = np.random.default_rng(0)
    step_ns, steps = int(source.step_s * 1e9), int(hours * 3600 / source.step_s)
    for step in range(steps):
        for kind, table in step_tables.items():
            writers[kind].add(moved(table, origin + step * step_ns - step_start, rng, step))
    for kind, hz in (("process", PROCESS_HZ), ("gpu", GPU_HZ)):
        for tick in range(int(hours * 3600 * hz)):
            writers[kind].add(moved(sample_tables[kind], int(tick * 1e9 / hz), rng, None))
    total = ranks + sum(writer.close() for writer in writers.values())
    write_manifest(directory, replace(manifest, status="completed", steps_completed=steps))
    return total


def summary_run(directory: Path) -> tuple[float, int]:
    """``meshtop summary DIRECTORY`` in a process of its own: (seconds, peak resident bytes)."""
    probe = (
        "import resource, subprocess, sys, time\n"
        "t = time.perf_counter()\n"
        "done = subprocess.run([sys.executable, '-m', 'meshtop.tui.cli', 'summary', sys.argv[1]], "
        "stdout=subprocess.DEVNULL)\n"
        "print(done.returncode, time.perf_counter() - t, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)\n"
    )
    out = subprocess.run([sys.executable, "-c", probe, str(directory)], capture_output=True, text=True, check=True)
    code, seconds, peak_kib = out.stdout.split()
    if code != "0":
        raise RuntimeError(f"meshtop summary exited {code}")
    return float(seconds), int(peak_kib) * 1024


def rows(
    *, ranks: int = 1024, nodes: int = 16, hours: float = 1.0, step_s: float = 5.0, keep: Path | None = None
) -> list[Row]:
    with tempfile.TemporaryDirectory() as tmp:
        directory = keep or Path(tmp) / "fleet"
        started = time.perf_counter()
        count = write_fleet_recording(directory, ranks=ranks, nodes=nodes, hours=hours, step_s=step_s)
        write_s = time.perf_counter() - started
        disk = sum(path.stat().st_size for path in (directory / EVENTS_DIR).iterdir())
        runs = [summary_run(directory) for _ in range(3)]
    seconds, peaks = [s for s, _ in runs], [p for _, p in runs]
    case = f"{ranks} ranks, {nodes} nodes, {hours:g} h ({count / 1e6:.0f}M events)"
    note = f"{disk / 2**30:.2f} GiB on disk, written in {write_s:.0f} s; step every {step_s:g} s"
    return [
        Row("recordings", f"summary, {case}", median(seconds), "s", Spread.of(seconds), NO_TARGET, note=note),
        Row(
            "recordings",
            f"summary peak memory, {case}",
            max(peaks) / 2**30,
            "GiB",
            Spread.of([p / 2**30 for p in peaks]),
            NO_TARGET,
            note="peak resident set of the summary process",
        ),
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=1024)
    parser.add_argument("--nodes", type=int, default=16)
    parser.add_argument("--hours", type=float, default=1.0)
    parser.add_argument("--step-s", type=float, default=5.0)
    parser.add_argument("--keep", type=Path, help="write the recording here and keep it")
    args = parser.parse_args(argv)
    for row in rows(ranks=args.ranks, nodes=args.nodes, hours=args.hours, step_s=args.step_s, keep=args.keep):
        print(json.dumps(row.to_json()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
