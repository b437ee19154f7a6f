"""Export a recording: a trace for ui.perfetto.dev (Chrome trace JSON), or one CSV per table.

A trace of a large job is exported in part (:class:`TracePart`: some ranks, some steps): Perfetto's UI loads a
JSON trace in the browser, and one much over a gigabyte (:data:`PERFETTO_UI_BYTES`) does not open. Before
writing, the trace's size is estimated from the recording's rows and the size of each kind's first events as
JSON; a whole trace past the limit is refused in one line that says how to take a part.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from meshtop.probes.events import ServerMetric
from meshtop.recordings.manifest import RecordingError
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


PERFETTO_UI_BYTES = 1 << 30
"""About the largest JSON trace Perfetto's UI opens in a browser tab."""
SIZE_SAMPLE = 200
"""Events of each kind serialised to estimate a trace's size."""
RANGE = re.compile(r"^(\d+)(?:-(\d+))?$")


@dataclass(frozen=True, slots=True)
class TracePart:
    """What of a recording a trace holds: ``ranks`` (``None``: every one) and the steps ``first`` to ``last``
    (``None``: every one; counters and requests are kept over those steps' wall-clock span)."""

    ranks: frozenset[int] | None = None
    steps: tuple[int, int] | None = None


def parse_numbers(flag: str, text: str) -> list[tuple[int, int]]:
    """``0-7,512`` as [(0, 7), (512, 512)]; a :class:`RecordingError` naming ``flag`` for anything else."""
    spans = []
    for word in text.split(","):
        match = RANGE.match(word.strip())
        if match is None:
            raise RecordingError(f"{flag} {text!r}: give numbers and ranges, such as 0-7,512")
        first, last = int(match.group(1)), int(match.group(2) or match.group(1))
        if last < first:
            raise RecordingError(f"{flag} {text!r}: the range {word.strip()} runs backwards")
        spans.append((first, last))
    return spans


def trace_part(ranks: str | None, steps: str | None) -> TracePart:
    """The part ``--ranks`` and ``--steps`` ask for (``--steps`` one range: a trace is one span of time)."""
    chosen = None
    if ranks is not None:
        chosen = frozenset(rank for first, last in parse_numbers("--ranks", ranks) for rank in range(first, last + 1))
    span = None
    if steps is not None:
        spans = parse_numbers("--steps", steps)
        if len(spans) != 1:
            raise RecordingError(f"--steps {steps!r}: give one range of steps, such as 100-120")
        span = spans[0]
    return TracePart(ranks=chosen, steps=span)


def _us(ns: float) -> float:
    return ns / 1000.0


def _window(recording: Recording, part: TracePart) -> tuple[int, int] | None:
    """The wall-clock span of the part's steps (``None``: every step, or none recorded)."""
    if part.steps is None:
        return None
    steps = _rows(recording, "step", TracePart(ranks=part.ranks, steps=part.steps), None)
    if not steps.num_rows:
        raise RecordingError(f"no step {part.steps[0]}-{part.steps[1]} in {recording.path}")
    starts, lengths = steps.column("start_ns").to_pylist(), steps.column("duration_s").to_pylist()
    return min(starts), max(start + round(length * 1e9) for start, length in zip(starts, lengths, strict=True))


def _rows(recording: Recording, kind: str, part: TracePart, window: tuple[int, int] | None) -> pa.Table:
    """The rows of ``kind`` the part holds: its ranks, its steps (or, for rows of no step, its span of time)."""
    table = recording.arrow(kind)
    names = table.column_names
    if part.ranks is not None and "rank" in names:
        table = table.filter(pc.is_in(table.column("rank"), pa.array(sorted(part.ranks), pa.int64())))
    if part.steps is not None and "step" in names:
        first, last = part.steps
        column = table.column("step")
        table = table.filter(pc.and_(pc.greater_equal(column, first), pc.less_equal(column, last)))
    elif window is not None:
        clock = next((name for name in ("wall_ns", "arrival_ns") if name in names), None)
        if clock is not None:
            column = table.column(clock)
            table = table.filter(pc.and_(pc.greater_equal(column, window[0]), pc.less_equal(column, window[1])))
    return table


TRACE_KINDS = ("step", "stage_action", "collective", "memory", "request", "process", "gpu")
"""The kinds whose rows become trace events, in the trace's order: the trace's own (a step's slice above the work
it spans, then the samples), not the fold's (:data:`~meshtop.probes.kinds.FOLD_ORDER`)."""


def trace_events(recording: Recording, part: TracePart = TracePart()) -> list[dict[str, Any]]:
    """Chrome trace events of ``part``: steps, stage actions and collectives as slices, memory and load as
    counters."""
    window = _window(recording, part)
    events: list[dict[str, Any]] = []
    ranks = sorted(
        set(recording.arrow("rank_started").column("rank").to_pylist())
        | set(recording.arrow("step").column("rank").to_pylist())
    )
    if part.ranks is not None:
        ranks = [rank for rank in ranks if rank in part.ranks]
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
    for kind in TRACE_KINDS:
        rows = _rows(recording, kind, part, window).to_pylist()
        events += row_events(kind, rows, many_nodes=len(nodes) > 1)
    events += server_events(recording)
    return events


def row_events(kind: str, rows: list[dict[str, Any]], *, many_nodes: bool) -> list[dict[str, Any]]:
    """The trace events of ``rows`` of ``kind`` (one of :data:`TRACE_KINDS`; ``many_nodes``: a GPU's track names
    its node)."""
    if kind == "request":
        return request_events(rows)
    return [_row_event(kind, row, many_nodes) for row in rows]


def _row_event(kind: str, row: dict[str, Any], many_nodes: bool) -> dict[str, Any]:
    if kind == "step":
        loss = row["loss"]  # a diverged step's as text: JSON has no NaN
        args = {"loss": loss if loss is None or math.isfinite(loss) else str(loss), "tokens": row["tokens"]}
        return _slice(row, f"step {row['step']}", "step", "steps", row["duration_s"] * 1e6, args)
    if kind == "stage_action":
        name, args = f"{row['action']} mb{row['microbatch']}", {"stage": row["stage"], "step": row["step"]}
        return _slice(row, name, "stage", "stages", _us(row["end_ns"] - row["start_ns"]), args)
    if kind == "collective":
        args = {name: row[name] for name in ("bytes", "group_size", "dtype", "peer", "step", "waited_ns", "overlapped")}
        name = f"{row['op']} ({row['group']})"
        return _slice(row, name, "collective", "collectives", _us(row["end_ns"] - row["start_ns"]), args)
    if kind == "memory":
        values = {name.removesuffix("_bytes"): float(row[name]) for name in MEMORY_COUNTERS if row[name] is not None}
        return {"ph": "C", "name": "memory (bytes)", "pid": row["rank"], "ts": _us(row["wall_ns"]), "args": values}
    if kind == "process":
        cpu = {"cpu": float(row["cpu_pct"] or 0.0)}
        return {"ph": "C", "name": "cpu %", "pid": row["rank"], "ts": _us(row["wall_ns"]), "args": cpu}
    node = f"node {row['node']} " if many_nodes else ""
    return {
        "ph": "C",
        "name": f"{node}gpu {row['gpu']} utilization %",
        "pid": GPU_PID + GPUS_PER_NODE * row["node"] + row["gpu"],
        "ts": _us(row["wall_ns"]),
        "args": {"gpu": float(row["utilization_pct"] or 0.0)},
    }


def _slice(row: dict[str, Any], name: str, cat: str, track: str, dur_us: float, args: dict[str, Any]) -> dict[str, Any]:
    """A complete event on rank ``row['rank']``'s ``track``, from its ``start_ns``."""
    return {
        "ph": "X",
        "name": name,
        "cat": cat,
        "pid": row["rank"],
        "tid": TRACKS[track],
        "ts": _us(row["start_ns"]),
        "dur": dur_us,
        "args": args,
    }


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


def request_events(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Inference: each request of ``rows`` as an async slice (they overlap) from arrival to its last token, one
    track per replica, with an instant at its first token."""
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


def estimated_bytes(recording: Recording, part: TracePart = TracePart()) -> int:
    """About how large ``part``'s trace is: each kind's rows times the mean JSON size of the events of its first
    :data:`SIZE_SAMPLE` rows (a request makes three; the metadata events are left out)."""
    window = _window(recording, part)
    many_nodes = len(recording.manifest.nodes) > 1
    total = 0
    for kind in TRACE_KINDS:
        table = _rows(recording, kind, part, window)
        if not table.num_rows:
            continue
        sample = row_events(kind, table.slice(0, SIZE_SAMPLE).to_pylist(), many_nodes=many_nodes)
        each = sum(len(json.dumps(event)) + 2 for event in sample if event["ph"] != "M") / min(
            table.num_rows, SIZE_SAMPLE
        )
        total += int(each * table.num_rows)
    return total


def export_perfetto(recording: Recording, path: Path, part: TracePart = TracePart()) -> int:
    """Write ``part``'s trace to ``path``; the number of trace events. A whole trace past
    :data:`PERFETTO_UI_BYTES` is refused (a part asked for is written whatever its size, with a warning by the
    caller)."""
    if part == TracePart() and (size := estimated_bytes(recording)) > PERFETTO_UI_BYTES:
        raise RecordingError(
            f"the whole trace would be about {size / 2**30:.1f} GiB, more than Perfetto's UI opens (about "
            f"{PERFETTO_UI_BYTES / 2**30:.0f} GiB): export a part with --ranks (0-7,512) and --steps (100-120)"
        )
    events = trace_events(recording, part)
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
