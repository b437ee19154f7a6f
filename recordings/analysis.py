"""The analysis shared by summary, compare and the TUI: plain pandas over a recording's tables."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from probes.bandwidth import bus_factor
from recordings.pipeline import stage_table
from recordings.reader import Recording
from recordings.requests import (
    COMPLETED, LATENCIES, QUANTILES, RequestLatency, Slo, failure_reason, is_inference, load_of, request_latency,
    unserved_reason,
)


def _quantiles(values: pd.Series, *names: str) -> dict[str, float | None]:
    if values.empty:
        return {name: None for name in names}
    return {name: float(values.quantile(QUANTILES[name])) for name in names}


def distribution(values: np.ndarray) -> dict[str, float | None]:
    """Mean, p50, p90 and p99 (linear interpolation, as :func:`recordings.requests.quantile`)."""
    if len(values) == 0:
        return {"mean": None, **{name: None for name in QUANTILES}}
    points = np.quantile(values, list(QUANTILES.values()))
    return {"mean": float(values.mean()), **{name: float(v) for name, v in zip(QUANTILES, points)}}


def job_status(recording: Recording) -> str:
    """completed, failed or interrupted (a manifest still saying ``running`` was cut short)."""
    return recording.status if recording.status != "running" else "interrupted"


def run_section(recording: Recording) -> dict[str, Any]:
    m = recording.manifest
    plan = m.get("plan", {})
    return {
        "dp": plan.get("dp"), "tp": plan.get("tp"), "pp": plan.get("pp"), "fsdp": plan.get("fsdp"),
        "world_size": plan.get("world_size"), "mode": m.get("mode"), "schedule": plan.get("schedule"),
        "microbatches": plan.get("microbatches"), "model": m.get("model", {}).get("name"),
        "device": m.get("device"), "dtype": m.get("dtype"), "instrumented": m.get("instrumented"),
        "status": job_status(recording),
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


def rank0_iterations(recording: Recording) -> pd.DataFrame:
    """An inference run's engine iterations as rank 0 (replica 0's leader) timed them.

    Iterations of different replicas are unrelated (each replica has its own count), so the
    train rule of one job step per step number over every rank does not apply.
    """
    steps = recording.table("step")
    return steps[steps["rank"] == 0].sort_values("step")


def steps_section(recording: Recording, requests: dict[str, Any] | None) -> dict[str, Any]:
    """Job steps (training), or rank 0's iterations with the requests' output tokens/s (inference, whose
    ``requests`` section is given)."""
    if is_inference(recording.manifest):
        times = rank0_iterations(recording)["duration_s"].astype(float)
        tokens_per_s = requests["output_tokens_per_s"] if requests else None
        first = last = None
    else:
        complete = complete_job_steps(recording)
        times = complete["duration_s"] if not complete.empty else pd.Series(dtype=float)
        rate = (complete.tokens / complete.duration_s) if not complete.empty else pd.Series(dtype=float)
        losses = complete["loss"].dropna() if not complete.empty else pd.Series(dtype=float)
        tokens_per_s = float(rate.median()) if not rate.empty else None
        first = float(losses.iloc[0]) if not losses.empty else None
        last = float(losses.iloc[-1]) if not losses.empty else None
    return {
        "count": len(times),
        "time_s": {**_quantiles(times, "p50", "p90"), "mean": float(times.mean()) if not times.empty else None},
        "tokens_per_s": {"p50": tokens_per_s},
        "loss": {"first": first, "last": last},
    }


@dataclass(frozen=True)
class ServedRequests:
    """An inference recording's request table folded into per-request latencies (compare reuses it)."""

    rows: pd.DataFrame
    """One row per request that reached a worker (the last report if one came twice)."""
    completed: pd.DataFrame
    latencies: list[RequestLatency]
    """Those of ``completed``, in its order."""
    slo: Slo
    good: np.ndarray
    """Per completed request: whether it met every SLO of the load."""
    window_s: float | None
    """First arrival to last end of the completed requests: what the rates are over."""

    def values(self, name: str) -> np.ndarray:
        """Every completed request's ``ttft_s``, ``tpot_s`` or ``e2e_s`` where it applies; ``itl_s``: every gap."""
        if name == "itl_s":
            return np.fromiter((gap for latency in self.latencies for gap in latency.gaps_s), dtype=float)
        found = (getattr(latency, name) for latency in self.latencies)
        return np.fromiter((value for value in found if value is not None), dtype=float)

    def per_s(self, count: float) -> float | None:
        return count / self.window_s if self.window_s else None

    @property
    def request_rate(self) -> float | None:
        return self.per_s(len(self.completed))

    @property
    def output_token_rate(self) -> float | None:
        return self.per_s(int(self.completed.output_tokens.sum()))

    @property
    def goodput(self) -> float | None:
        """Completed requests that met every SLO, per second."""
        return self.per_s(int(self.good.sum()))


def served_requests(recording: Recording) -> ServedRequests:
    rows = recording.table("request").drop_duplicates(subset="request", keep="last")
    completed = rows[rows.status == COMPLETED]
    latencies = [request_latency(arrival_ns=int(arrival), first_token_ns=None if pd.isna(first) else int(first),
                                 end_ns=int(end), output_tokens=int(tokens), token_ns=times)
                 for arrival, first, end, tokens, times in zip(completed.arrival_ns, completed.first_token_ns,
                                                               completed.end_ns, completed.output_tokens,
                                                               completed.token_ns)]
    slo = Slo.of(recording.manifest)
    window = (int(completed.end_ns.max()) - int(completed.arrival_ns.min())) / 1e9 if not completed.empty else 0.0
    return ServedRequests(rows=rows, completed=completed, latencies=latencies, slo=slo,
                          good=np.array([slo.met(latency) for latency in latencies], dtype=bool),
                          window_s=window if window > 0 else None)


def requests_section(recording: Recording) -> dict[str, Any] | None:
    """Counts, failures with their reasons, latencies, rates, goodput and each replica (``None`` for training).

    Requests of the load without a row were never served: they count as failed, with the job's end as reason.
    """
    manifest = recording.manifest
    if not is_inference(manifest):
        return None
    served = served_requests(recording)
    rows, completed, slo = served.rows, served.completed, served.slo
    count = max(int(load_of(manifest).get("requests") or 0), len(rows))
    failures = Counter(failure_reason(None if pd.isna(error) else str(error))
                       for error in rows.loc[rows.status != COMPLETED, "error"])
    if count > len(rows):
        failures[unserved_reason(job_status(recording))] += count - len(rows)
    good = int(served.good.sum())
    return {
        "count": count, "completed": len(completed), "failed": count - len(completed),
        "failures": [{"reason": reason, "count": n} for reason, n in failures.most_common()],
        **{name: distribution(served.values(name)) for name in LATENCIES},
        "window_s": served.window_s,
        "request_throughput_per_s": served.request_rate,
        "output_tokens_per_s": served.output_token_rate,
        "slo": {"ttft_s": slo.ttft_s, "tpot_s": slo.tpot_s} if slo.given else None,
        "goodput_per_s": served.goodput if slo.given else None,
        "slo_met": good / count if slo.given and count else None,
        "per_replica": replica_rows(recording, served),
    }


def replica_rows(recording: Recording, served: ServedRequests) -> list[dict[str, Any]]:
    """Each dp replica's completed requests, output tokens/s (over the job's window, so the replicas add up
    to the total) and TTFT p50; a replica that served nothing is listed too."""
    dp = int(recording.manifest.get("plan", {}).get("dp") or 1)
    completed = served.completed
    ttft = pd.Series([latency.ttft_s for latency in served.latencies], index=completed.index, dtype=float)
    rows = []
    for replica in sorted(set(range(dp)) | {int(r) for r in served.rows.replica}):
        mine = completed.replica == replica
        times = ttft[mine].dropna().to_numpy()
        rows.append({"replica": replica, "completed": int(mine.sum()),
                     "output_tokens_per_s": served.per_s(int(completed.output_tokens[mine].sum())),
                     "ttft_s": {"p50": float(np.median(times)) if len(times) else None}})
    return rows


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


def inference_stage_rows(recording: Recording) -> pd.DataFrame:
    """An inference run's iterations with their rank's pipeline stage (``pp_rank``), where the
    pipeline wait was measured: ``busy_s`` is the iteration less that wait."""
    steps = recording.table("step").dropna(subset=["pipeline_wait_s"])
    started = recording.table("rank_started")
    if steps.empty or started.empty:
        return pd.DataFrame(columns=["rank", "step", "pp_rank", "duration_s", "pipeline_wait_s", "busy_s"])
    table = steps.merge(started[["rank", "pp_rank"]], on="rank")
    return table.assign(busy_s=table.duration_s - table.pipeline_wait_s)


def stages_section(recording: Recording) -> list[dict[str, Any]]:
    """Per pipeline stage: mean busy and idle time per step (iteration) and the bubble fraction."""
    if is_inference(recording.manifest):
        if int(recording.manifest.get("plan", {}).get("pp") or 1) <= 1:
            return []
        table = inference_stage_rows(recording)
        return [{"stage": int(stage), "busy_s": float(part.busy_s.mean()), "idle_s": float(part.pipeline_wait_s.mean()),
                 "bubble_fraction": float(part.pipeline_wait_s.sum() / part.duration_s.sum())
                 if part.duration_s.sum() > 0 else 0.0}
                for stage, part in table.groupby("pp_rank")]
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
    requests = requests_section(recording)
    return {
        "recording": str(recording.path),
        "run": run_section(recording),
        "steps": steps_section(recording, requests),
        "requests": requests,
        "collectives": collectives_section(recording),
        "stages": stages_section(recording),
        "memory": memory,
        "most_loaded_rank": loaded["rank"] if loaded else None,
        "ranks": ranks_section(recording),
        "problems": list(recording.problems),
    }
