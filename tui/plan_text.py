"""``meshtop plan``'s report as readable text: one row per plan, its most loaded rank, and why a plan cannot run."""

from __future__ import annotations

from typing import Any

from meshtop.tui.summary_text import aligned, human_bytes, human_seconds, or_dash

MEMORY_COLUMNS = (
    ("weights", "weights_bytes"),
    ("grads", "grads_bytes"),
    ("optim", "optimizer_bytes"),
    ("activ", "activations_bytes"),
    ("kv", "kv_cache_bytes"),
    ("total", "total_bytes"),
)


def short_bytes(count: float | None) -> str:
    """``1.5G``, ``312M``: a table cell's width."""
    if count is None:
        return "-"
    if count == 0:
        return "0"
    for unit in ("B", "K", "M", "G", "T"):
        if abs(count) < 1024 or unit == "T":
            return f"{count:.0f}{unit}" if unit == "B" or count >= 100 else f"{count:.1f}{unit}"
        count /= 1024
    return f"{count:.1f}T"


def traffic_cell(step_bytes: dict[str, int], group: str) -> str:
    total = sum(nbytes for key, nbytes in step_bytes.items() if key.split()[0] == group)
    return short_bytes(total) if total else "-"


def plan_lines(report: dict[str, Any]) -> list[str]:
    model = report["model"]
    head = f"{report['ranks']} {'GPUs' if report['device'] == 'cuda' else 'CPU ranks'}"
    if model is not None:
        count = model["parameters"]
        size = f"{count / 1e9:.2f} B" if count >= 1e9 else f"{count / 1e6:.1f} M"
        head = (
            f"model {model['name']} ({size} parameters, {model['n_layers']} layers), "
            f"{report['mode']}, {recipe_words(report)}, " + head
        )
    if report["batch_size"] is not None:
        head += f", global batch {report['batch_size']} x {report['seq_len']} tokens"
    memory = report["device_memory_bytes"]
    head += f", device memory {human_bytes(memory)}" if memory is not None else ", no device memory given"
    lines = [head, "", "per most loaded rank (bytes); traffic per step summed over ranks"]
    columns: tuple[tuple[str, str], ...] = MEMORY_COLUMNS
    if any(row["runs"] and row["peak"].get("recompute_bytes") for row in report["plans"]):
        columns += (("+recomp", "recompute_bytes"),)  # held during a block's backward: in fits, not in total
    groups = ["dp", "tp", "pp"]
    if any(key.split()[0] == "embedding" for row in report["plans"] if row["runs"] for key in row["step_bytes"]):
        groups.append("embedding")  # a tied model's two pipeline ends
    titles = [
        "plan",
        "schedule",
        *(label for label, _ in columns),
        "fits",
        "headroom",
        *(group[:5] for group in groups),
    ]
    widths = [-14, -13, *(8 for _ in columns), 6, 10, *(8 for _ in groups)]
    timed = any(row.get("comm_s") is not None for row in report["plans"])
    if timed:
        titles, widths = [*titles, "comm", "share"], [*widths, 10, 7]
    lines.append(aligned(titles, widths))
    notes: list[str] = []
    for row in report["plans"]:
        if not row["runs"]:
            notes.append(f"  {row['key']}: {row['reason']}")
            continue
        schedule = f"{row['schedule']} {row['microbatches']}mb" if row["schedule"] else "-"
        fits = "-" if row["fits"] is None else ("yes" if row["fits"] else "NO")
        cells = [row["key"], schedule, *(short_bytes(row["peak"].get(key)) for _, key in columns), fits]
        cells += [short_bytes(row["headroom_bytes"]), *(traffic_cell(row["step_bytes"], group) for group in groups)]
        if timed:
            share = row.get("comm_share")
            cells += [human_seconds(row.get("comm_s")), or_dash(share, ".0%")]
        lines.append(aligned(cells, widths))
        notes += [f"  {row['key']}: warning: {warning}" for warning in row["warnings"]]
    if len(columns) > len(MEMORY_COLUMNS):
        lines += ["", "+recomp: what a block's recomputation holds in its backward (checkpointing); fits counts it"]
    if notes:
        lines += ["", "plans that cannot run, and warnings:", *notes]
    return lines


def recipe_words(report: dict[str, Any]) -> str:
    """``fp32``, ``mixed precision (bf16 compute, fp32 master weights)``, ``bf16, checkpoint full``."""
    words = str(report["dtype"])
    if report.get("precision") == "mixed":
        words = "mixed precision (bf16 compute, fp32 master weights)"
    if report.get("checkpoint") not in (None, "none"):
        words += f", checkpoint {report['checkpoint']}"
    return words


def percent_error(value: float | None) -> str:
    return "-" if value is None else f"{value:+.0%}" if abs(value) >= 0.005 else "0%"


MEASURED_COLUMNS = {
    "train": (("#", 2), ("plan", -14), ("tok/s", 10), ("step p50", 10), ("comm", 6), ("bubble", 8)),
    "infer": (("#", 2), ("plan", -14), ("goodput/s", 10), ("req/s", 8), ("TTFT p50", 10), ("TPOT p50", 10)),
}
ERROR_COLUMNS = (("peak", 8), ("pred", 8), ("err", 6), ("state", 7), ("activ", 7), ("traffic", 9), ("bubble", 8))
"""The prediction side: measured and predicted peak, then the error of each predicted figure."""
SWEEP_COLUMNS = {mode: columns + ERROR_COLUMNS for mode, columns in MEASURED_COLUMNS.items()}
"""(title, width) of each column of a sweep's ranked table, by mode; a negative width aligns left."""


def sweep_cells(row: dict[str, Any], mode: str) -> list[str]:
    """One ranked plan's cells, in :data:`SWEEP_COLUMNS` order."""
    measured, errors, predicted = row["measured"], row["errors"] or {}, row["predicted"] or {}
    assert measured is not None, "only ranked plans have cells"
    if mode == "infer":
        cells = [
            or_dash(measured["goodput_per_s"], ".2f"),
            or_dash(measured["requests_per_s"], ".2f"),
            or_dash(measured["ttft_p50_s"], ".1f", scale=1e3, unit="ms"),
            or_dash(measured["tpot_p50_s"], ".1f", scale=1e3, unit="ms"),
        ]
    else:
        cells = [
            or_dash(measured["tokens_per_s"], ",.0f"),
            human_seconds(measured["step_s"]),
            or_dash(measured["comm_share"], ".0%"),
            or_dash(measured["bubble"], ".0%"),
        ]
    state_keys = ("weights_bytes", "grads_bytes", "optimizer_bytes")
    state = (
        max((errors[key] for key in state_keys), key=abs)
        if errors and all(errors.get(key) is not None for key in state_keys)
        else None
    )
    traffic = errors.get("traffic_bytes")
    traffic_text = "-" if traffic is None else percent_error(traffic) + ("=" if errors.get("traffic_exact") else "")
    cells += [
        short_bytes(measured["peak_bytes"]),
        short_bytes(predicted.get("peak_bytes")),
        percent_error(errors.get("peak_bytes")),
        percent_error(state),
        percent_error(errors.get("activations_bytes")),
        traffic_text,
        or_dash(errors.get("bubble"), "+.0f", scale=100, unit="pt"),
    ]
    return [str(row["rank"]), row["key"], *cells]


def sweep_title(ranking: dict[str, Any]) -> str:
    model = ranking["model"]
    what = f"model {model['name']}, " if model else ""
    devices = "GPUs" if ranking["device"] == "cuda" else "CPU ranks"
    ranked_by = "goodput" if ranking["mode"] == "infer" else "tokens/s"
    return f"sweep {ranking['sweep']}: {what}{ranking['ranks']} {devices}, ranked by {ranked_by}"


def sweep_notes(ranking: dict[str, Any]) -> list[str]:
    """What the columns mean, then the plans that are not ranked and why."""
    notes = [
        "err: (measured - predicted) / predicted of the most loaded rank's peak; state: its weights, "
        "gradients and optimizer state; activ: its activations saved for backward; traffic: the step's "
        "collective bytes ('=': every rank's bytes and operations per group and op exactly as predicted); bubble: "
        "measured minus (p - 1) / (v m + p - 1)"
    ]
    if any(row["measured"] and row["measured"]["peak_kind"] == "accounted" for row in ranking["plans"]):
        notes.append(
            "peak on CPU: weights + gradients + optimizer state + activations saved for backward (the "
            "resident set is mostly torch itself)"
        )
    left = [
        f"  {row['key']}: {row['status']}" + (f": {row['reason']}" if row["reason"] else "")
        for row in ranking["plans"]
        if row["rank"] is None
    ]
    return notes + (["", "not ranked:", *left] if left else [])


def sweep_lines(ranking: dict[str, Any]) -> list[str]:
    """The sweep's ranked table: measured figures, then each prediction's error, then what did not run."""
    mode = ranking["mode"]
    titles, widths = zip(*SWEEP_COLUMNS[mode], strict=True)
    ranked = [aligned(sweep_cells(row, mode), widths, " ") for row in ranking["plans"] if row["rank"] is not None]
    return [sweep_title(ranking), "", aligned(titles, widths, " "), *ranked, "", *sweep_notes(ranking)]
