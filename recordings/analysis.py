"""The analysis shared by summary, compare and the TUI: plain pandas over a recording's tables."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from probes.bandwidth import bus_factor
from recordings.pipeline import stage_table
from recordings.reader import Recording


def _quantiles(values: pd.Series, *names: str) -> dict[str, float | None]:
    points = {"p50": 0.5, "p90": 0.9, "p99": 0.99}
    if values.empty:
        return {name: None for name in names}
    return {name: float(values.quantile(points[name])) for name in names}


def run_section(recording: Recording) -> dict[str, Any]:
    m = recording.manifest
    plan = m.get("plan", {})
    return {
        "dp": plan.get("dp"), "tp": plan.get("tp"), "pp": plan.get("pp"), "fsdp": plan.get("fsdp"),
        "world_size": plan.get("world_size"), "mode": m.get("mode"), "schedule": plan.get("schedule"),
        "microbatches": plan.get("microbatches"), "model": m.get("model", {}).get("name"),
        "device": m.get("device"), "dtype": m.get("dtype"), "instrumented": m.get("instrumented"),
        "status": recording.status if recording.status != "running" else "interrupted",
    }


def job_steps(steps: pd.DataFrame) -> pd.DataFrame:
    """One row per step of the whole job: the slowest rank's time, the mean loss of the ranks that have one."""
    if steps.empty:
        return pd.DataFrame(columns=["step", "duration_s", "tokens", "loss", "ranks"])
    grouped = steps.groupby("step")
    table = pd.DataFrame({
        "duration_s": grouped["duration_s"].max(),
        "tokens": grouped["tokens"].first(),
        "loss": grouped["loss"].mean(),
        "ranks": grouped["rank"].nunique(),
    }).reset_index()
    return table


def complete_job_steps(recording: Recording) -> pd.DataFrame:
    """The job's steps that every rank reported (an interrupted last step is left out)."""
    world = recording.manifest.get("plan", {}).get("world_size") or 1
    table = job_steps(recording.table("step"))
    return table[table.ranks == world] if not table.empty else table


def rank_peaks(memory: pd.DataFrame) -> dict[int, float]:
    """Each rank's peak memory: the allocator's peak on CUDA, else the largest RSS seen."""
    peaks = {}
    for rank, part in memory.groupby("rank"):
        source = part.peak_allocated_bytes.dropna()
        peak = source.max() if not source.empty else part.rss_bytes.dropna().max()
        if not pd.isna(peak):
            peaks[int(rank)] = float(peak)
    return peaks


def steps_section(recording: Recording) -> dict[str, Any]:
    complete = complete_job_steps(recording)
    times = complete["duration_s"] if not complete.empty else pd.Series(dtype=float)
    rate = (complete.tokens / complete.duration_s) if not complete.empty else pd.Series(dtype=float)
    losses = complete["loss"].dropna() if not complete.empty else pd.Series(dtype=float)
    return {
        "count": int(len(complete)),
        "time_s": {**_quantiles(times, "p50", "p90"), "mean": float(times.mean()) if not times.empty else None},
        "tokens_per_s": {"p50": float(rate.median()) if not rate.empty else None},
        "loss": {"first": float(losses.iloc[0]) if not losses.empty else None,
                 "last": float(losses.iloc[-1]) if not losses.empty else None},
    }


def timed_collectives(recording: Recording) -> pd.DataFrame:
    """The collectives issued inside steps, with ``duration_s`` and ``busbw_gbps`` (NaN where meaningless)."""
    table = recording.table("collective").dropna(subset=["step"]).copy()
    table["duration_s"] = (table.end_ns - table.start_ns) / 1e9
    factors = {key: bus_factor(key[0], int(key[1])) for key in set(zip(table.op, table.group_size))}
    factor = pd.Series([factors[key] for key in zip(table.op, table.group_size)], index=table.index, dtype=float)
    table["busbw_gbps"] = np.where(table.duration_s > 0, table.bytes / table.duration_s / 1e9 * factor, np.nan)
    return table


def collectives_section(recording: Recording) -> list[dict[str, Any]]:
    table = timed_collectives(recording)
    if table.empty:
        return []
    rows = []
    for (group, op), part in table.groupby(["group", "op"]):
        busbw = part["busbw_gbps"].dropna()
        rows.append({
            "group": group, "op": op, "count": int(len(part)), "bytes": int(part.bytes.sum()),
            "time_s": {"total": float(part.duration_s.sum()), **_quantiles(part.duration_s, "p50", "p99")},
            "busbw_gbps": {"p50": float(busbw.median()) if not busbw.empty else None},
        })
    return sorted(rows, key=lambda row: -row["time_s"]["total"])


def stages_section(recording: Recording) -> list[dict[str, Any]]:
    table = stage_table(recording.table("stage_action"), recording.table("step"), recording.table("rank_started"))
    if table.empty:
        return []
    means = table.groupby("pp_rank")[["busy_s", "idle_s", "bubble_fraction"]].mean()
    return [{"stage": int(stage), "busy_s": float(row.busy_s), "idle_s": float(row.idle_s),
             "bubble_fraction": float(row.bubble_fraction)} for stage, row in means.iterrows()]


def memory_section(recording: Recording) -> list[dict[str, Any]]:
    table = recording.table("memory")
    if table.empty:
        return []
    rows = []
    peaks = rank_peaks(table)
    for rank, part in table.sort_values("step").groupby("rank"):
        last = part.iloc[-1]
        peak = peaks.get(int(rank))
        rows.append({
            "rank": int(rank), "peak_bytes": None if peak is None else int(peak),
            "weights_bytes": int(last.weights_bytes), "grads_bytes": int(last.grads_bytes),
            "optimizer_bytes": int(last.optimizer_bytes),
            "activations_bytes": None if pd.isna(last.activations_bytes) else int(last.activations_bytes),
            "kv_cache_bytes": None if pd.isna(last.kv_cache_bytes) else int(last.kv_cache_bytes),
        })
    return rows


def ranks_section(recording: Recording) -> list[dict[str, Any]]:
    return [{"rank": r["rank"], "exit_code": r.get("exit_code"), "signal": r.get("signal"), "error": r.get("error")}
            for r in recording.manifest.get("ranks", [])]


def summarize(recording: Recording) -> dict[str, Any]:
    """The whole analysis as plain data (the JSON of ``meshtop summary --json``)."""
    memory = memory_section(recording)
    loaded = max(memory, key=lambda row: row["peak_bytes"] or 0) if memory else None
    return {
        "recording": str(recording.path),
        "run": run_section(recording),
        "steps": steps_section(recording),
        "collectives": collectives_section(recording),
        "stages": stages_section(recording),
        "memory": memory,
        "most_loaded_rank": loaded["rank"] if loaded else None,
        "ranks": ranks_section(recording),
        "problems": list(recording.problems),
    }
