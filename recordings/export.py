"""Export a recording: a trace for ui.perfetto.dev (Chrome trace JSON), or one CSV per table."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from meshtop.probes.events import ServerMetric
from meshtop.recordings.metrics.server import ServerFold
from meshtop.recordings.reader import Recording
from meshtop.recordings.schema import events_of
from meshtop.recordings.tables import to_frame

# One process per rank in the trace; inside it, one track per kind of work.
TRACKS = {"steps": 1, "stages": 2, "collectives": 3}
REQUESTS_PID = 2_000_000
SERVER_PID = 3_000_000
"""An endpoint's engine, from its ``/metrics``."""
GPU_PID = 1_000_000
"""Trace process ids past every rank's (a rank's is its number): GPUs, then the request replicas."""
GPUS_PER_NODE = 64
"""GPU tracks each node's GPUs may take (node n's GPU g is ``GPU_PID + 64 n + g``)."""
MEMORY_COUNTERS = (
    "weights_bytes",
    "grads_bytes",
    "optimizer_bytes",
    "activations_bytes",
    "kv_cache_bytes",
    "allocated_bytes",
    "rss_bytes",
)


def _us(ns: float) -> float:
    return ns / 1000.0


def trace_events(recording: Recording) -> list[dict[str, Any]]:
    """Chrome trace events: steps, stage actions and collectives as slices, memory and load as counters."""
    events: list[dict[str, Any]] = []
    ranks = sorted(
        set(recording.arrow("rank_started").column("rank").to_pylist())
        | set(recording.arrow("step").column("rank").to_pylist())
    )
    nodes = recording.manifest.nodes
    where = {
        rank: f" · node {node.node} {node.host or '?'}" for node in nodes for rank in node.ranks if len(nodes) > 1
    }  # on many nodes each rank's process says where it ran
    for rank in ranks:
        events.append(
            {"ph": "M", "name": "process_name", "pid": rank, "args": {"name": f"rank {rank}{where.get(rank, '')}"}}
        )
        for track, tid in TRACKS.items():
            events.append({"ph": "M", "name": "thread_name", "pid": rank, "tid": tid, "args": {"name": track}})
    for row in recording.arrow("step").to_pylist():
        events.append(
            {
                "ph": "X",
                "name": f"step {row['step']}",
                "cat": "step",
                "pid": row["rank"],
                "tid": TRACKS["steps"],
                "ts": _us(row["start_ns"]),
                "dur": row["duration_s"] * 1e6,
                "args": {"loss": row["loss"], "tokens": row["tokens"]},
            }
        )
    for row in recording.arrow("stage_action").to_pylist():
        events.append(
            {
                "ph": "X",
                "name": f"{row['action']} mb{row['microbatch']}",
                "cat": "stage",
                "pid": row["rank"],
                "tid": TRACKS["stages"],
                "ts": _us(row["start_ns"]),
                "dur": _us(row["end_ns"] - row["start_ns"]),
                "args": {"stage": row["stage"], "step": row["step"]},
            }
        )
    for row in recording.arrow("collective").to_pylist():
        events.append(
            {
                "ph": "X",
                "name": f"{row['op']} ({row['group']})",
                "cat": "collective",
                "pid": row["rank"],
                "tid": TRACKS["collectives"],
                "ts": _us(row["start_ns"]),
                "dur": _us(row["end_ns"] - row["start_ns"]),
                "args": {
                    "bytes": row["bytes"],
                    "group_size": row["group_size"],
                    "dtype": row["dtype"],
                    "peer": row["peer"],
                    "step": row["step"],
                    "waited_ns": row["waited_ns"],
                    "overlapped": row["overlapped"],
                },
            }
        )
    for row in recording.arrow("memory").to_pylist():
        values = {name.removesuffix("_bytes"): float(row[name]) for name in MEMORY_COUNTERS if row[name] is not None}
        events.append(
            {"ph": "C", "name": "memory (bytes)", "pid": row["rank"], "ts": _us(row["wall_ns"]), "args": values}
        )
    events += request_events(recording)
    for row in recording.arrow("process").to_pylist():
        events.append(
            {
                "ph": "C",
                "name": "cpu %",
                "pid": row["rank"],
                "ts": _us(row["wall_ns"]),
                "args": {"cpu": float(row["cpu_pct"] or 0.0)},
            }
        )
    for row in recording.arrow("gpu").to_pylist():
        node = f"node {row['node']} " if len(nodes) > 1 else ""
        events.append(
            {
                "ph": "C",
                "name": f"{node}gpu {row['gpu']} utilization %",
                "pid": GPU_PID + GPUS_PER_NODE * row["node"] + row["gpu"],
                "ts": _us(row["wall_ns"]),
                "args": {"gpu": float(row["utilization_pct"] or 0.0)},
            }
        )
    events += server_events(recording)
    return events


def server_events(recording: Recording) -> list[dict[str, Any]]:
    """An endpoint's engine: each common series of its ``/metrics`` (running, waiting, KV-cache use, ...) as a
    counter track, its value at each scrape by the metrics core's rules (:mod:`meshtop.recordings.metrics.server`)."""
    if recording.manifest.run.endpoint is None:
        return []
    fold = ServerFold()
    for event in events_of("server_metric", recording.arrow("server_metric")):
        if isinstance(event, ServerMetric):
            fold.add(event)
    timeline = fold.timeline()
    if not timeline:
        return []
    events: list[dict[str, Any]] = [{"ph": "M", "name": "process_name", "pid": SERVER_PID, "args": {"name": "server"}}]
    for wall_ns, name, value in timeline:
        events.append({"ph": "C", "name": name, "pid": SERVER_PID, "ts": _us(wall_ns), "args": {name: value}})
    return events


def request_events(recording: Recording) -> list[dict[str, Any]]:
    """Inference: each request as an async slice (they overlap) from arrival to its last token, one track
    per replica, with an instant at its first token."""
    rows = recording.arrow("request").to_pylist()
    events: list[dict[str, Any]] = []
    for replica in sorted({row["replica"] for row in rows}):
        events.append(
            {
                "ph": "M",
                "name": "process_name",
                "pid": REQUESTS_PID + replica,
                "args": {"name": f"requests, replica {replica}"},
            }
        )
    for row in rows:
        pid, ident = REQUESTS_PID + row["replica"], row["request"]
        common = {"cat": "request", "name": f"request {ident}", "pid": pid, "tid": 0, "id": ident}
        events.append(
            {
                **common,
                "ph": "b",
                "ts": _us(row["arrival_ns"]),
                "args": {
                    "prompt_tokens": row["prompt_tokens"],
                    "output_tokens": row["output_tokens"],
                    "status": row["status"],
                    "error": row["error"],
                },
            }
        )
        if row["token_ns"]:
            events.append({**common, "ph": "n", "name": "first token", "ts": _us(row["token_ns"][0])})
        events.append({**common, "ph": "e", "ts": _us(row["end_ns"])})
    return events


def export_perfetto(recording: Recording, path: Path) -> int:
    """Write the trace to ``path``; the number of trace events."""
    events = trace_events(recording)
    path.write_text(
        json.dumps(
            {"traceEvents": events, "displayTimeUnit": "ms", "metadata": {"meshtop_recording": str(recording.path)}}
        )
    )
    return len(events)


def _csv_ready(table: pa.Table) -> pa.Table:
    """Lists (a request's token times) as ``1 2 3`` text: CSV has no lists."""
    columns = []
    for column in table.columns:
        if pa.types.is_list(column.type):
            column = pc.binary_join(pc.cast(column, pa.list_(pa.string())), " ")
        columns.append(column)
    return pa.Table.from_arrays(columns, names=table.column_names)


def export_csv(recording: Recording, directory: Path) -> list[Path]:
    """One CSV per event table (integers as integers, a missing value empty), and the manifest as JSON,
    into ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for kind in recording.kinds():
        target = directory / f"{kind}.csv"
        to_frame(kind, _csv_ready(recording.arrow(kind))).to_csv(target, index=False)
        written.append(target)
    (directory / "manifest.json").write_text(json.dumps(recording.manifest.to_json(), indent=2))
    return written
