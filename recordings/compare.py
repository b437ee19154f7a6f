"""Before / after: the same metrics of two recordings side by side, with whether each change is real.

A change is called significant when the per-step distributions of the two
runs differ (two-sided Mann-Whitney U test, normal approximation, p < 0.01)
and the medians differ by more than 1 %; figures with one value per run
(peak memory) count when they move by more than 2 %. Runs that did different
work (model, lengths, batch, dtype, mode, load) are compared anyway, with a
warning, since the comparison is then unfair.

Inference runs are compared per request (TTFT, TPOT, inter-token latency and
end-to-end latency are distributions over the requests, so the same test
applies) and by their request and output-token rates (one value per run), in
place of the training steps; rank 0's iteration time stands for the step time.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd

from recordings.analysis import (
    complete_job_steps, inference_stage_rows, rank0_iterations, rank_peaks, served_requests, timed_collectives,
)
from recordings.pipeline import stage_table
from recordings.reader import Recording
from recordings.requests import LATENCIES, LOAD_KEYS, is_inference, load_of

P_VALUE = 0.01
MIN_CHANGE = 0.01
SINGLE_VALUE_CHANGE = 0.02
SAME_WORK = ("mode", "dtype", "seq_len", "batch_size")


def mann_whitney_p(a: np.ndarray, b: np.ndarray) -> float:
    """Two-sided p-value of the Mann-Whitney U test (normal approximation, tie-corrected)."""
    n, m = len(a), len(b)
    if n < 2 or m < 2:
        return 1.0
    ranks = pd.Series(np.concatenate([a, b])).rank().to_numpy()
    u = ranks[:n].sum() - n * (n + 1) / 2
    _, counts = np.unique(np.concatenate([a, b]), return_counts=True)
    ties = ((counts**3 - counts).sum()) / ((n + m) * (n + m - 1))
    variance = n * m / 12 * ((n + m + 1) - ties)
    if variance <= 0:
        return 1.0
    z = (u - n * m / 2) / math.sqrt(variance)
    return math.erfc(abs(z) / math.sqrt(2))


def metric(name: str, a: np.ndarray | float | None, b: np.ndarray | float | None) -> dict[str, Any]:
    """One row: medians, ratio b / a, and whether the change is beyond noise."""
    if isinstance(a, np.ndarray) and isinstance(b, np.ndarray):
        a_value = float(np.median(a)) if len(a) else None
        b_value = float(np.median(b)) if len(b) else None
        ratio = b_value / a_value if a_value and b_value is not None else None
        significant = bool(ratio is not None and abs(ratio - 1) > MIN_CHANGE and mann_whitney_p(a, b) < P_VALUE)
    else:
        a_value = None if a is None else float(a)  # type: ignore[arg-type]
        b_value = None if b is None else float(b)  # type: ignore[arg-type]
        ratio = b_value / a_value if a_value and b_value is not None else None
        significant = bool(ratio is not None and abs(ratio - 1) > SINGLE_VALUE_CHANGE)
    return {"name": name, "a": a_value, "b": b_value, "ratio": ratio, "significant": significant}


def _comm_per_step(recording: Recording) -> dict[str, np.ndarray]:
    table = timed_collectives(recording)
    if table.empty:
        return {}
    per_rank = table.groupby(["group", "op", "step", "rank"])["duration_s"].sum()
    per_step = per_rank.groupby(["group", "op", "step"]).max()  # the busiest rank's time in that op
    return {f"{group}/{op}": part.to_numpy() for (group, op), part in per_step.groupby(["group", "op"])}


def _busbw(recording: Recording) -> dict[str, np.ndarray]:
    out = {}
    for (group, op), part in timed_collectives(recording).groupby(["group", "op"]):
        values = part.busbw_gbps.dropna()
        if (part.bytes > 0).any() and not values.empty:
            out[f"{group}/{op}"] = values.to_numpy()
    return out


def _bubbles(recording: Recording) -> dict[int, np.ndarray]:
    """Each stage's bubble fraction per step (training) or per iteration (inference: wait over duration)."""
    if is_inference(recording.manifest):
        rows = inference_stage_rows(recording)
        rows = rows[rows.duration_s > 0]
        return {int(stage): (part.pipeline_wait_s / part.duration_s).to_numpy(float)
                for stage, part in rows.groupby("pp_rank")}
    table = stage_table(recording.table("stage_action"), recording.table("step"), recording.table("rank_started"))
    return {int(stage): part.bubble_fraction.to_numpy() for stage, part in table.groupby("pp_rank")}


def _headroom(recording: Recording, peaks: dict[int, float]) -> float | None:
    """Device memory left on the most loaded rank's GPU at its peak (CUDA recordings only)."""
    loaded = max(peaks, key=peaks.__getitem__)
    totals = recording.table("memory").query("rank == @loaded").device_total_bytes.dropna()
    return float(totals.iloc[-1] - peaks[loaded]) if not totals.empty else None


def unfair_differences(a: Recording, b: Recording) -> list[str]:
    """Why the two runs did not do the same work, if they did not."""
    warnings = []
    model_a, model_b = a.manifest.get("model", {}).get("name"), b.manifest.get("model", {}).get("name")
    if model_a != model_b:
        verb = "served" if is_inference(a.manifest) else "trained"
        warnings.append(f"the runs {verb} different models ({model_a} vs {model_b})")
    for key in SAME_WORK:
        if a.manifest.get(key) != b.manifest.get(key):
            warnings.append(f"the runs differ in {key} ({a.manifest.get(key)} vs {b.manifest.get(key)})")
    if is_inference(a.manifest) and is_inference(b.manifest):
        load_a, load_b = load_of(a.manifest), load_of(b.manifest)
        for key in LOAD_KEYS:
            if load_a.get(key) != load_b.get(key):
                warnings.append(f"the runs differ in load {key} ({load_a.get(key)} vs {load_b.get(key)})")
    return warnings


def _step_metrics(a: Recording, b: Recording) -> list[dict[str, Any]]:
    """Training: the job's step time and throughput per step."""
    steps_a, steps_b = complete_job_steps(a), complete_job_steps(b)
    return [
        metric("step time (s)", steps_a.duration_s.to_numpy(float), steps_b.duration_s.to_numpy(float)),
        metric("throughput (tokens/s)", (steps_a.tokens / steps_a.duration_s).to_numpy(float),
               (steps_b.tokens / steps_b.duration_s).to_numpy(float)),
    ]


def _request_metrics(a: Recording, b: Recording) -> list[dict[str, Any]]:
    """Inference: rank 0's iteration time, each request latency, and the request / output-token rates
    (goodput too when both runs set the same SLOs, else it measures different things)."""
    served_a, served_b = served_requests(a), served_requests(b)
    metrics = [metric("iteration time (s)", rank0_iterations(a).duration_s.to_numpy(float),
                      rank0_iterations(b).duration_s.to_numpy(float))]
    metrics += [metric(f"{name} (s)", served_a.values(key), served_b.values(key)) for key, name in LATENCIES.items()]
    metrics.append(metric("request throughput (requests/s)", served_a.request_rate, served_b.request_rate))
    metrics.append(metric("output throughput (tokens/s)", served_a.output_token_rate, served_b.output_token_rate))
    if served_a.slo.given and served_a.slo == served_b.slo:
        metrics.append(metric("goodput (requests/s)", served_a.goodput, served_b.goodput))
    return metrics


def compare(a: Recording, b: Recording) -> dict[str, Any]:
    """Every comparable metric of ``a`` (before) and ``b`` (after)."""
    inference = is_inference(a.manifest) and is_inference(b.manifest)
    metrics = _request_metrics(a, b) if inference else _step_metrics(a, b)
    comm_a, comm_b = _comm_per_step(a), _comm_per_step(b)
    for key in sorted(set(comm_a) | set(comm_b)):
        metrics.append(metric(f"{key} time per step (s)", comm_a.get(key, np.array([])), comm_b.get(key, np.array([]))))
    bw_a, bw_b = _busbw(a), _busbw(b)
    for key in sorted(set(bw_a) & set(bw_b)):
        metrics.append(metric(f"{key} busbw (GB/s)", bw_a[key], bw_b[key]))
    bub_a, bub_b = _bubbles(a), _bubbles(b)
    for stage in sorted(set(bub_a) & set(bub_b)):
        metrics.append(metric(f"stage {stage} bubble", bub_a[stage], bub_b[stage]))
    peaks_a, peaks_b = rank_peaks(a.table("memory")), rank_peaks(b.table("memory"))
    for rank in sorted(set(peaks_a) & set(peaks_b)):
        metrics.append(metric(f"rank {rank} peak memory (bytes)", peaks_a[rank], peaks_b[rank]))
    if peaks_a and peaks_b:
        metrics.append(metric("most loaded rank peak memory (bytes)", max(peaks_a.values()), max(peaks_b.values())))
        room_a, room_b = _headroom(a, peaks_a), _headroom(b, peaks_b)
        if room_a is not None and room_b is not None:
            metrics.append(metric("most loaded GPU headroom (bytes)", room_a, room_b))
    return {"a": str(a.path), "b": str(b.path), "warnings": unfair_differences(a, b), "metrics": metrics,
            "problems": [*a.problems, *b.problems]}
