"""Recordings made by hand, the way meshtop writes them, and recordings being written by a job (shared by
tests and benchmarks)."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from meshtop.probes.events import Event
from meshtop.recordings.events_log import EventWriter
from meshtop.recordings.manifest import Manifest, RunDescription, Script, script_plan, write_manifest
from meshtop.recordings.node_parts import read_parts
from meshtop.recordings.tables import compact, read_json_lines, read_node_rows
from meshtop.runner.plan import RunSpec, resolve


def description(*, device: str | None = None, dtype: str | None = None, **spec: Any) -> RunDescription:
    """The run description meshtop writes for ``RunSpec(**spec)`` on CPU, with the device and dtype
    changed afterwards where given (a CUDA run described without a GPU here)."""
    run = resolve(RunSpec(device="cpu", **spec), gpus_visible=0).describe()
    changes = {name: value for name, value in (("device", device), ("dtype", dtype)) if value is not None}
    return dataclasses.replace(run, **changes) if changes else run


def with_model(run: RunDescription, **changes: Any) -> RunDescription:
    return dataclasses.replace(run, model=dataclasses.replace(run.model, **changes))


def elastic_script(world_size: int) -> RunDescription:
    """A user's ``torchrun train.py`` counted for ``world_size`` ranks (an elastic job says its size later)."""
    script = Script(
        command=("torchrun", "train.py"),
        launcher_args=("train.py",),
        path="/w/train.py",
        module=None,
        args=(),
        sha256=None,
        working_dir="/w",
    )
    return RunDescription(
        plan=script_plan("train.py", world_size),
        mode="train",
        model=None,
        dtype=None,
        device="cpu",
        steps=None,
        batch_size=None,
        microbatch_size=None,
        seq_len=None,
        seed=None,
        instrumented=True,
        script=script,
    )


def write_recording(
    directory: Path,
    events: Iterable[Event],
    *,
    run: RunDescription,
    status: str = "completed",
    parquet: bool = False,
    **manifest: Any,
) -> Path:
    """A recording of ``events`` in ``directory``, closed with ``status`` (compacted with ``parquet``)."""
    directory.mkdir(parents=True, exist_ok=True)
    write_manifest(directory, Manifest(run=run, status=status, **manifest))
    writer = EventWriter(directory)
    writer.write(list(events))
    writer.close()
    if parquet:
        compact(directory)
    return directory


def recorded_so_far(recording: Path, kind: str) -> list[dict[str, Any]]:
    """The rows of a table of ``recording`` while it is written (its JSON lines, a half-written last line left
    out, and what other nodes streamed, on the head's clock)."""
    path = recording / "events" / f"{kind}.jsonl"
    rows = read_json_lines(path, kind).table.to_pylist() if path.exists() else []
    streamed = read_node_rows(read_parts(recording / "events"), kind)
    return rows + (streamed.table.to_pylist() if streamed is not None else [])


def wait_for_steps(recording: Path, count: int, *, ranks: Iterable[int], timeout_s: float = 180) -> list[int]:
    """Wait until each of ``ranks`` has ``count`` steps in ``recording`` (being written); the pids of the ranks
    started so far."""
    ranks = list(ranks)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        stepped = [row["rank"] for row in recorded_so_far(recording, "step")]
        if all(stepped.count(rank) >= count for rank in ranks):
            return [row["pid"] for row in recorded_so_far(recording, "rank_started")]
        time.sleep(0.2)
    raise AssertionError(f"ranks {ranks} did not reach {count} steps in {timeout_s} s")


def fleet_recording(
    directory: Path, *, ranks: int, nodes: int, steps: int = 12, slow_node: int | None = None, slow: float = 2.0
) -> Path:
    """A data-parallel job of ``ranks`` ranks spread evenly over ``nodes`` nodes (hosts ``node0``...), each step
    0.1 s give or take 1 % by rank, the ranks of ``slow_node`` ``slow`` times as long: what a rank grid and its
    attention filter are checked on."""
    from tests.kit.events import rank_started, step

    per_node = ranks // nodes
    events: list[Event] = [
        rank_started(rank, world_size=ranks, dp_rank=rank, node=rank // per_node, host=f"node{rank // per_node}")
        for rank in range(ranks)
    ]
    for number in range(steps):
        for rank in range(ranks):
            length = 0.1 * (1 + (rank % 3 - 1) * 0.01) * (slow if rank // per_node == slow_node else 1.0)
            events.append(step(rank, number, length, tokens=8 * ranks))
    return write_recording(directory, events, run=fleet_description(ranks, nodes))


def fleet_description(ranks: int, nodes: int) -> RunDescription:
    """A data-parallel GPU job of ``ranks`` ranks on ``nodes`` nodes, as meshtop describes it."""
    plan = resolve(RunSpec(dp=ranks, model="tiny", device="cuda"), gpus_visible=ranks // nodes, nodes=nodes)
    return plan.describe()
