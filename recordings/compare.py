"""Before / after: the same figures of two recordings side by side, with whether each change is real.

Every figure is the metrics core's (the one ``summary`` prints). A change is
called significant when the figure's per-step (per-request) values of the two
runs differ (two-sided Mann-Whitney U test, ``scipy.stats.mannwhitneyu``,
asymptotic, p < 0.01) and the figure moves by more than 1 %; figures with one
value per run (peak memory, rates, MFU) count when they move by more than 2 %.
Runs that did different work (model, lengths, batch, dtype, mode, load) are
compared anyway, with a warning, since the comparison is then unfair.

Communication is compared on exposed time per step (what the ranks waited),
never on summed in-flight time, which counts an asynchronous operation's
overlap with compute as if the step had waited for it.

The ranks and nodes that stand out are the rank grid's (the metrics core's
attention rule, :mod:`meshtop.recordings.metrics.attention`, at each run's
end): per measure, those of A and those of B, and whether the change fixed
them (``fixed``: A had some, B none), brought them (``new``), or neither
(``still``, ``none``).

What blocks each run (:mod:`meshtop.recordings.metrics.blocker`) is given for both, and whether its kind
changed: the change fixed one limit and met the next, or moved nothing that mattered.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
from scipy.stats import mannwhitneyu

from meshtop.recordings.manifest import LOAD_FILE, LOAD_WORK, RunDescription, Script
from meshtop.recordings.metrics.attention import MEASURES as GRID_MEASURES
from meshtop.recordings.metrics.attention import Attention, Scored
from meshtop.recordings.metrics.blocker import Blocker
from meshtop.recordings.metrics.breakdown import PARTS
from meshtop.recordings.metrics.gpus import LINK_LABELS
from meshtop.recordings.metrics.requests import LATENCIES
from meshtop.recordings.metrics.run import RunFold
from meshtop.recordings.reader import Recording
from meshtop.recordings.summary import blocker_json, fold_recording, recording_blocker

P_VALUE = 0.01
MIN_CHANGE = 0.01
SINGLE_VALUE_CHANGE = 0.02
SAME_WORK = ("mode", "dtype", "precision", "checkpoint", "seq_len", "batch_size")
RANKS_KEPT = 8
"""The ranks that stand out most, per run and measure, that a comparison names (it counts the rest)."""


def mann_whitney_p(a: np.ndarray, b: np.ndarray) -> float:
    """Two-sided p-value of the Mann-Whitney U test (normal approximation, tie-corrected); 1 for fewer
    than two values a side, or when every value is the same."""
    if len(a) < 2 or len(b) < 2 or np.ptp(np.concatenate([a, b])) == 0:
        return 1.0
    return float(mannwhitneyu(a, b, alternative="two-sided", method="asymptotic").pvalue)


def metric(
    name: str, a: float | None, b: float | None, samples: tuple[np.ndarray, np.ndarray] | None = None
) -> dict[str, Any]:
    """One row: the figure of each run, the ratio b / a, and whether the change is beyond noise (tested
    on ``samples``, the values the figures are of, where there are such)."""
    ratio = b / a if a and b is not None else None
    if samples is not None:
        significant = ratio is not None and abs(ratio - 1) > MIN_CHANGE and mann_whitney_p(*samples) < P_VALUE
    else:
        significant = ratio is not None and abs(ratio - 1) > SINGLE_VALUE_CHANGE
    return {"name": name, "a": a, "b": b, "ratio": ratio, "significant": bool(significant)}


def unfair_differences(a: Recording, b: Recording) -> list[str]:
    """Why the two runs did not do the same work, if they did not."""
    run_a, run_b = a.manifest.run, b.manifest.run
    warnings = []
    if run_a.name != run_b.name:
        verb = "served" if run_a.inference else "trained"
        warnings.append(f"the runs {verb} different models ({run_a.name} vs {run_b.name})")
    if run_a.script is not None and run_b.script is not None:
        warnings.extend(script_differences(run_a.script, run_b.script))
    for key in SAME_WORK:
        value_a, value_b = work_value(run_a, key), work_value(run_b, key)
        if value_a != value_b:
            warnings.append(f"the runs differ in {key} ({value_a} vs {value_b})")
    if (run_a.endpoint is None) != (run_b.endpoint is None):
        warnings.append("one run loaded a serving endpoint, the other the built-in model")
    elif run_a.endpoint is not None and run_b.endpoint is not None:
        warnings.extend(load_differences(a, b))
        if run_a.endpoint.api != run_b.endpoint.api:
            warnings.append(f"the runs used different APIs ({run_a.endpoint.api} vs {run_b.endpoint.api})")
        return warnings
    if run_a.load is not None and run_b.load is not None:
        for key in LOAD_WORK:
            if getattr(run_a.load, key) != getattr(run_b.load, key):
                warnings.append(
                    f"the runs differ in load {key} ({getattr(run_a.load, key)} vs {getattr(run_b.load, key)})"
                )
    return warnings


def work_value(run: RunDescription, key: str) -> object:
    """``key`` of ``run`` for :data:`SAME_WORK`; a built-in training run recorded before recipes had its dtype's
    precision and no checkpointing."""
    value = getattr(run, key)
    if value is None and run.script is None and run.endpoint is None and run.mode == "train":
        return {"precision": run.dtype, "checkpoint": "none"}.get(key)
    return value


def load_differences(a: Recording, b: Recording) -> list[str]:
    """Whether two endpoint runs sent the same load: the same requests (prompt, length, warmup) at the same
    offsets, read from each recording's ``load.jsonl``; the loop and rate where they differ."""
    load_a, load_b = a.manifest.run.load, b.manifest.run.load
    warnings = []
    if load_a is not None and load_b is not None:
        for key in ("concurrency", "request_rate_per_s", "burstiness", "ignore_eos", "duration_s"):
            if getattr(load_a, key) != getattr(load_b, key):
                warnings.append(f"the runs differ in load {key} ({getattr(load_a, key)} vs {getattr(load_b, key)})")
    sent_a, sent_b = sent_load(a.path), sent_load(b.path)
    if sent_a is None or sent_b is None:
        warnings.append(f"the load sent is not recorded in {a.path if sent_a is None else b.path} ({LOAD_FILE})")
    elif sent_a != sent_b:
        differ = sum(x != y for x, y in zip(sent_a, sent_b, strict=False)) + abs(len(sent_a) - len(sent_b))
        warnings.append(
            f"the runs sent different loads: {differ} of {max(len(sent_a), len(sent_b))} requests differ in prompt, "
            "length or send offset (`--same-load A` repeats A's)"
        )
    return warnings


def sent_load(directory: Path) -> list[str] | None:
    """The lines of a recording's ``load.jsonl``, each request as sent; ``None`` when it has none."""
    try:
        return (directory / LOAD_FILE).read_text().splitlines()
    except OSError:
        return None


def script_differences(a: Script, b: Script) -> list[str]:
    """Why two runs of scripts may not have done the same work: other code, arguments or launch."""
    differences = []
    if a.sha256 != b.sha256:
        differences.append(f"the scripts differ (sha256 {(a.sha256 or '-')[:12]} vs {(b.sha256 or '-')[:12]})")
    for what, value_a, value_b in (
        ("script arguments", a.args, b.args),
        ("tokens per step", a.tokens_per_step, b.tokens_per_step),
        ("activation measurement", a.activations, b.activations),
    ):
        if value_a != value_b:
            differences.append(f"the runs differ in {what} ({value_a} vs {value_b})")
    return differences


def _step_metrics(a: RunFold, b: RunFold) -> list[dict[str, Any]]:
    """Training: the job's step time and throughput per step, and MFU and the last step's loss where both
    have them."""
    fig_a, fig_b = a.figures(), b.figures()
    rows = [
        metric(
            "step time (s)",
            fig_a.steps.time_s["p50"],
            fig_b.steps.time_s["p50"],
            (a.steps.durations_s.values(), b.steps.durations_s.values()),
        ),
        metric(
            "throughput (tokens/s)",
            fig_a.steps.tokens_per_s,
            fig_b.steps.tokens_per_s,
            (a.steps.tokens_per_s.values(), b.steps.tokens_per_s.values()),
        ),
    ]
    if fig_a.mfu.value is not None and fig_b.mfu.value is not None:
        rows.append(metric("MFU", fig_a.mfu.value, fig_b.mfu.value))
    if all(loss is not None and math.isfinite(loss) for loss in (fig_a.steps.last_loss, fig_b.steps.last_loss)):
        rows.append(metric("loss (last step)", fig_a.steps.last_loss, fig_b.steps.last_loss))
    if fig_a.breakdown is not None and fig_b.breakdown is not None:
        for part in PARTS:
            one, two = a.breakdown.per_step[part], b.breakdown.per_step[part]
            rows.append(metric(f"{part} per step (s)", one.mean(), two.mean(), (one.values(), two.values())))
    return rows


def part_moved(metrics: list[dict[str, Any]]) -> str | None:
    """Which part of the step moved the most, of those whose change is beyond noise, in one line."""
    moved = [row for row in metrics if row["name"].endswith(" per step (s)") and row["significant"]]
    moved = [row for row in moved if row["name"].split(" per step")[0] in PARTS]
    if not moved:
        return None
    row = max(moved, key=lambda row: abs(row["b"] - row["a"]))
    part, change = row["name"].split(" per step")[0], row["b"] - row["a"]
    return f"the step's {part} moved the most: {'+' if change >= 0 else '-'}{abs(change) * 1e3:.2f} ms a step"


def milliseconds(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1e3


def _request_metrics(a: RunFold, b: RunFold) -> list[dict[str, Any]]:
    """Inference: rank 0's iteration time, each request latency (in ms, as a request's latencies are read), and
    the request / output-token rates (goodput too when both runs set the same SLOs, else it measures different
    things)."""
    assert a.requests is not None and b.requests is not None
    fig_a, fig_b = a.figures(), b.figures()
    req_a, req_b = fig_a.requests, fig_b.requests
    assert req_a is not None and req_b is not None
    rows = []
    if fig_a.steps.count or fig_b.steps.count:  # the built-in model's engine (an endpoint's is the server's)
        rows.append(
            metric(
                "iteration time (s)",
                fig_a.steps.time_s["p50"],
                fig_b.steps.time_s["p50"],
                (a.steps.durations_s.values(), b.steps.durations_s.values()),
            )
        )
    for key, name in LATENCIES.items():
        samples = (a.requests.latencies[key].values(), b.requests.latencies[key].values())
        for quantile in ("p50", "p90", "p99"):  # the whole distribution's test, at each of its quantiles
            one, two = req_a.latencies[key][quantile], req_b.latencies[key][quantile]
            rows.append(metric(f"{name} {quantile} (ms)", milliseconds(one), milliseconds(two), samples))
    rows.append(
        metric("request throughput (requests/s)", req_a.request_throughput_per_s, req_b.request_throughput_per_s)
    )
    rows.append(metric("output throughput (tokens/s)", req_a.output_tokens_per_s, req_b.output_tokens_per_s))
    if req_a.slo.given and req_a.slo == req_b.slo:
        rows.append(metric("goodput (requests/s)", req_a.goodput_per_s, req_b.goodput_per_s))
    rows.append(metric("failed requests", req_a.failed, req_b.failed))
    if fig_a.server is not None and fig_b.server is not None:  # the engine's own view, where both have it
        for name, label in (("requests_waiting", "server queue"), ("kv_cache_usage", "server KV-cache use")):
            gauge_a, gauge_b = fig_a.server.gauges.get(name), fig_b.server.gauges.get(name)
            if gauge_a is not None and gauge_b is not None:
                rows.append(metric(f"{label} mean", gauge_a["mean"], gauge_b["mean"]))
                rows.append(metric(f"{label} max", gauge_a["max"], gauge_b["max"]))
        if "preemptions" in fig_a.server.counters and "preemptions" in fig_b.server.counters:
            rows.append(
                metric("server preemptions", fig_a.server.counters["preemptions"], fig_b.server.counters["preemptions"])
            )
    if req_a.client is not None and req_b.client is not None:
        lags = milliseconds(req_a.client.send_lag_p99_s), milliseconds(req_b.client.send_lag_p99_s)
        rows.append(metric("client send lag p99 (ms)", *lags))
        if req_a.client.cpu_mean_pct is not None and req_b.client.cpu_mean_pct is not None:
            rows.append(metric("client CPU mean (% of a core)", req_a.client.cpu_mean_pct, req_b.client.cpu_mean_pct))
    return rows


def _gpu_metrics(a: RunFold, b: RunFold) -> list[dict[str, Any]]:
    """Each GPU both runs sampled: its peak memory used (the whole device's, NVML), mean utilisation, and the
    mean and peak of each link rate either run read (PCIe and NVLink, over the load for a serving run: the
    metrics core's :mod:`~meshtop.recordings.metrics.gpus`); one value a run, so the 2 % rule."""
    rows_a = {(row.node, row.gpu): row for row in a.figures().gpus}
    rows_b = {(row.node, row.gpu): row for row in b.figures().gpus}
    rows = []
    for key in sorted(set(rows_a) & set(rows_b)):
        one, two = rows_a[key], rows_b[key]
        name = f"GPU {key[1]}" if not key[0] else f"node {key[0]} GPU {key[1]}"
        rows.append(metric(f"{name} peak memory used (bytes)", one.peak_used_bytes, two.peak_used_bytes))
        rows.append(metric(f"{name} utilisation mean (%)", one.utilization_mean_pct, two.utilization_mean_pct))
        for link, label in LINK_LABELS.items():
            for which in ("mean", "peak"):
                pair = one.links[link][which], two.links[link][which]
                if pair != (None, None):
                    rows.append(metric(f"{name} {label} {which} (bytes/s)", *pair))
    return rows


def client_limits(a: RunFold, b: RunFold) -> list[str]:
    """A run whose load generator limited it (its send lag or its CPU), in one line each."""
    lines = []
    for name, fold in (("A", a), ("B", b)):
        requests = fold.figures().requests if fold.requests is not None else None
        if requests is not None and requests.client is not None and requests.client.limited:
            lines.append(f"{name} was {requests.client.limited}")
    return lines


def failure_differences(a: RunFold, b: RunFold) -> list[str]:
    """The requests that failed in one run and not the other, by reason (an endpoint's errors by kind)."""
    fig_a, fig_b = a.figures().requests, b.figures().requests
    if fig_a is None or fig_b is None:
        return []
    reasons_a, reasons_b = dict(fig_a.failures), dict(fig_b.failures)
    return [
        f"failed: {reason}: {reasons_a.get(reason, 0)} vs {reasons_b.get(reason, 0)}"
        for reason in sorted(set(reasons_a) | set(reasons_b))
        if reasons_a.get(reason, 0) != reasons_b.get(reason, 0)
    ]


def _communication_metrics(a: RunFold, b: RunFold) -> list[dict[str, Any]]:
    """Per (group, op): exposed time per step (training) and busbw, where both runs have it."""
    stats_a = {(s.group, s.op): s for s in a.collectives.stats}
    stats_b = {(s.group, s.op): s for s in b.collectives.stats}
    rows_a = {(r.group, r.op): r for r in a.figures().collectives}
    rows_b = {(r.group, r.op): r for r in b.figures().collectives}
    rows = []
    for key in sorted(set(stats_a) | set(stats_b)):
        name = "/".join(key)
        one, two = rows_a.get(key), rows_b.get(key)
        exposed = (one.exposed_per_step_s if one else None, two.exposed_per_step_s if two else None)
        if exposed != (None, None):
            samples = tuple(s[key].exposed_s.values() if key in s else np.array([]) for s in (stats_a, stats_b))
            rows.append(metric(f"{name} exposed time per step (s)", *exposed, samples))  # type: ignore[arg-type]
        if one and two and one.busbw_p50_gbps is not None and two.busbw_p50_gbps is not None:
            rows.append(
                metric(
                    f"{name} busbw (GB/s)",
                    one.busbw_p50_gbps,
                    two.busbw_p50_gbps,
                    (stats_a[key].busbw_gbps.values(), stats_b[key].busbw_gbps.values()),
                )
            )
    return rows


def _stage_and_memory_metrics(a: RunFold, b: RunFold) -> list[dict[str, Any]]:
    rows = []
    stages_a = {row.stage: row for row in a.figures().stages}
    stages_b = {row.stage: row for row in b.figures().stages}
    for stage in sorted(set(stages_a) & set(stages_b)):
        rows.append(
            metric(
                f"stage {stage} bubble",
                stages_a[stage].bubble_fraction,
                stages_b[stage].bubble_fraction,
                (a.stages.stages[stage].bubble.values(), b.stages.stages[stage].bubble.values()),
            )
        )
    peaks_a, peaks_b = a.memory.peaks(), b.memory.peaks()
    for rank in sorted(set(peaks_a) & set(peaks_b)):
        rows.append(metric(f"rank {rank} peak memory (bytes)", peaks_a[rank], peaks_b[rank]))
    if peaks_a and peaks_b:
        rows.append(metric("most loaded rank peak memory (bytes)", max(peaks_a.values()), max(peaks_b.values())))
        room_a, room_b = a.memory.headroom_bytes(), b.memory.headroom_bytes()
        if room_a is not None and room_b is not None:
            rows.append(metric("most loaded GPU headroom (bytes)", room_a, room_b))
    return rows


def grid_attention(fold: RunFold) -> dict[str, Attention]:
    """Each rank grid measure's attention at the end of a folded run (those no rank has a value of left out)."""
    found = {measure: fold.attention(measure) for measure in GRID_MEASURES}
    return {measure: attention for measure, attention in found.items() if attention.ranks}


def _standing_out_side(found: Attention | None) -> dict[str, Any]:
    """What stands out in one run on one measure: the flagged nodes, the first :data:`RANKS_KEPT` flagged ranks
    (the worst first) and how many ranks are flagged in all. ``z`` is ``None`` where it is infinite (most
    ranks alike to the microsecond: the crowd's MAD is 0)."""

    def row(key: str, scored: Scored) -> dict[str, Any]:
        return {key: scored.key, "value": scored.value, "z": None if math.isinf(scored.z) else scored.z}

    if found is None:
        return {"scored": False, "median": None, "nodes": [], "ranks": [], "flagged_ranks": 0}
    ranks = [row("rank", scored) for scored in found.ranks if scored.flagged]
    return {
        "scored": True,
        "median": found.median,
        "nodes": [row("node", scored) for scored in found.nodes if scored.flagged],
        "ranks": ranks[:RANKS_KEPT],
        "flagged_ranks": len(ranks),
    }


def standing_out(a: dict[str, Attention], b: dict[str, Attention]) -> list[dict[str, Any]]:
    """Per rank grid measure scored in either run (:func:`grid_attention`'s): what stands out in A and in B, and
    the verdict: ``fixed``, ``new``, ``still`` or ``none`` (see the module's docstring)."""
    rows = []
    for measure in GRID_MEASURES:
        if measure not in a and measure not in b:
            continue
        side_a, side_b = _standing_out_side(a.get(measure)), _standing_out_side(b.get(measure))
        before, after = (
            bool(side_a["flagged_ranks"] or side_a["nodes"]),
            bool(side_b["flagged_ranks"] or side_b["nodes"]),
        )
        verdict = "still" if before and after else "fixed" if before else "new" if after else "none"
        rows.append({"measure": measure, "a": side_a, "b": side_b, "verdict": verdict})
    return rows


def compare(a: Recording, b: Recording, folds: tuple[RunFold, RunFold] | None = None) -> dict[str, Any]:
    """Every comparable figure of ``a`` (before) and ``b`` (after); ``folds``: the two already folded
    (:func:`~meshtop.recordings.summary.fold_recording`'s), where the caller has them."""
    fold_a, fold_b = folds or (fold_recording(a), fold_recording(b))
    inference = fold_a.requests is not None and fold_b.requests is not None
    metrics = _request_metrics(fold_a, fold_b) if inference else _step_metrics(fold_a, fold_b)
    metrics += _communication_metrics(fold_a, fold_b)
    metrics += _gpu_metrics(fold_a, fold_b)
    endpoints = a.manifest.run.endpoint is not None and b.manifest.run.endpoint is not None
    if not endpoints:  # an endpoint's rank 0 is meshtop's load generator: its memory is not the server's
        metrics += _stage_and_memory_metrics(fold_a, fold_b)
    return {
        "a": str(a.path),
        "b": str(b.path),
        "warnings": unfair_differences(a, b) + client_limits(fold_a, fold_b),
        "metrics": metrics,
        "moved": None if inference else part_moved(metrics),
        "failures": failure_differences(fold_a, fold_b) if inference else [],
        "standing_out": standing_out(grid_attention(fold_a), grid_attention(fold_b)),
        "blocker": compared_blockers(recording_blocker(a, fold_a), recording_blocker(b, fold_b)),
        "problems": [*a.problems, *b.problems],
    }


def compared_blockers(a: Blocker | None, b: Blocker | None) -> dict[str, Any]:
    """What blocks each run (:mod:`meshtop.recordings.metrics.blocker`) and whether its kind changed."""
    changed = (a.kind if a is not None else None) != (b.kind if b is not None else None)
    return {"a": blocker_json(a), "b": blocker_json(b), "changed": changed}
