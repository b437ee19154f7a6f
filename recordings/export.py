"""Export a recording: a trace for ui.perfetto.dev (Chrome trace JSON), or one CSV per table."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from recordings.reader import Recording

# One process per rank in the trace; inside it, one track per kind of work.
TRACKS = {"steps": 1, "stages": 2, "collectives": 3}


def _us(ns: float) -> float:
    return ns / 1000.0


def trace_events(recording: Recording) -> list[dict[str, Any]]:
    """Chrome trace events: steps, stage actions and collectives as slices, memory and load as counters."""
    events: list[dict[str, Any]] = []
    ranks = sorted(set(recording.table("rank_started")["rank"]) | set(recording.table("step")["rank"]))
    for rank in ranks:
        events.append({"ph": "M", "name": "process_name", "pid": int(rank), "args": {"name": f"rank {rank}"}})
        for track, tid in TRACKS.items():
            events.append({"ph": "M", "name": "thread_name", "pid": int(rank), "tid": tid, "args": {"name": track}})
    for row in recording.table("step").itertuples():
        events.append({"ph": "X", "name": f"step {row.step}", "cat": "step", "pid": int(row.rank),
                       "tid": TRACKS["steps"], "ts": _us(row.start_ns), "dur": row.duration_s * 1e6,
                       "args": {"loss": None if row.loss != row.loss else row.loss, "tokens": int(row.tokens)}})
    for row in recording.table("stage_action").itertuples():
        events.append({"ph": "X", "name": f"{row.action} mb{row.microbatch}", "cat": "stage", "pid": int(row.rank),
                       "tid": TRACKS["stages"], "ts": _us(row.start_ns), "dur": _us(row.end_ns - row.start_ns),
                       "args": {"stage": int(row.stage), "step": row.step}})
    for row in recording.table("collective").itertuples():
        events.append({"ph": "X", "name": f"{row.op} ({row.group})", "cat": "collective", "pid": int(row.rank),
                       "tid": TRACKS["collectives"], "ts": _us(row.start_ns), "dur": _us(row.end_ns - row.start_ns),
                       "args": {"bytes": int(row.bytes), "group_size": int(row.group_size), "dtype": row.dtype,
                                "peer": None if row.peer != row.peer else row.peer, "step": row.step}})
    for row in recording.table("memory").itertuples():
        values = {"weights": row.weights_bytes, "grads": row.grads_bytes, "optimizer": row.optimizer_bytes}
        for name in ("activations_bytes", "kv_cache_bytes", "allocated_bytes", "rss_bytes"):
            value = getattr(row, name)
            if value == value and value is not None:
                values[name.removesuffix("_bytes")] = value
        events.append({"ph": "C", "name": "memory (bytes)", "pid": int(row.rank), "ts": _us(row.wall_ns),
                       "args": {k: float(v) for k, v in values.items()}})
    events += request_events(recording)
    for row in recording.table("process").itertuples():
        events.append({"ph": "C", "name": "cpu %", "pid": int(row.rank), "ts": _us(row.wall_ns),
                       "args": {"cpu": float(row.cpu_pct or 0.0)}})
    for row in recording.table("gpu").itertuples():
        events.append({"ph": "C", "name": f"gpu {row.gpu} utilization %", "pid": 10_000 + int(row.gpu),
                       "ts": _us(row.wall_ns), "args": {"gpu": float(row.utilization_pct or 0.0)}})
    return events


REQUESTS_PID = 20_000


def request_events(recording: Recording) -> list[dict[str, Any]]:
    """Inference: each request as an async slice (they overlap) from arrival to its last token, one track
    per replica, with an instant at its first token."""
    table = recording.table("request")
    events: list[dict[str, Any]] = []
    for replica in sorted({int(r) for r in table.replica}) if not table.empty else []:
        events.append({"ph": "M", "name": "process_name", "pid": REQUESTS_PID + replica,
                       "args": {"name": f"requests, replica {replica}"}})
    for row in table.itertuples():
        pid, ident = REQUESTS_PID + int(row.replica), int(row.request)
        common = {"cat": "request", "name": f"request {ident}", "pid": pid, "tid": 0, "id": ident}
        events.append({**common, "ph": "b", "ts": _us(row.arrival_ns),
                       "args": {"prompt_tokens": int(row.prompt_tokens), "output_tokens": int(row.output_tokens),
                                "status": row.status, "error": row.error}})
        if len(row.token_ns):
            events.append({**common, "ph": "n", "name": "first token", "ts": _us(int(row.token_ns[0]))})
        events.append({**common, "ph": "e", "ts": _us(row.end_ns)})
    return events


def export_perfetto(recording: Recording, path: Path) -> int:
    """Write the trace to ``path``; the number of trace events."""
    events = trace_events(recording)
    path.write_text(json.dumps({"traceEvents": events, "displayTimeUnit": "ms",
                                "metadata": {"meshtop_recording": str(recording.path)}}))
    return len(events)


def export_csv(recording: Recording, directory: Path) -> list[Path]:
    """One CSV per event table, and the manifest as JSON, into ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for kind in recording.kinds():
        target = directory / f"{kind}.csv"
        recording.table(kind).to_csv(target, index=False)
        written.append(target)
    (directory / "manifest.json").write_text(json.dumps(recording.manifest, indent=2))
    return written
