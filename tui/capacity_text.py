"""A capacity sweep as text: the configurations ranked by capacity per GPU (``meshtop sweep OUT --endpoint``,
``meshtop summary OUT``), from :func:`meshtop.recordings.capacity.capacity_report`."""

from __future__ import annotations

from typing import Any

from meshtop.tui.summary_text import aligned


def number(value: float | None, unit: str = "") -> str:
    """``4.1``, ``-`` for none."""
    return "-" if value is None else f"{value:.3g}{unit}"


def ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1e3:.0f} ms"


def slo_words(report: dict[str, Any]) -> str:
    """``TTFT <= 500 ms, TPOT <= 50 ms, met by 95 % of the requests``."""
    slo = report["slo"]
    parts = [f"{name} <= {slo[key] * 1e3:g} ms" for name, key in (("TTFT", "ttft_s"), ("TPOT", "tpot_s")) if slo[key]]
    return ", ".join(parts) + f", met by {report['attainment']:.0%} of the requests".replace("%", " %")


def capacity_lines(report: dict[str, Any]) -> list[str]:
    """The ranked table, then why each configuration without capacity has none."""
    users = report["users"]
    concurrency = report["search"] == "concurrency"
    rate = "req/s (concurrency)" if concurrency else "req/s"
    header = ["configuration", f"capacity {rate}", "per GPU", "TTFT p99", "TPOT p99", "limited by"]
    if users is not None:
        header += ["needed", "GPUs"]
    rows = []
    for row in report["capacity"]:
        cells = [
            row["config"],
            number(row["requests_per_s"]) + (f" (at {row['rate']:g})" if concurrency and row["rate"] else ""),
            number(row["per_gpu"]),
            ms(row["ttft_p99_s"]),
            ms(row["tpot_p99_s"]),
            row["limited_by"] or "-",
        ]
        if users is not None:
            cells += [str(row["needed"] or "-"), str(row["needed_gpus"] or "-")]
        rows.append(cells)
    runs = report["runs"]
    done = sum(run["status"] == "completed" for run in runs)
    title = f"capacity within the SLO ({slo_words(report)}): {done} run(s) completed"
    if users is not None:
        offered = f"{users['users']} users x {users['rate_per_user']:g} req/s = {users['offered_per_s']:g} req/s"
        title += f"; offered load {offered}"
    widths = [max(len(cells[column]) for cells in (header, *rows)) for column in range(len(header))]
    widths[0] = -widths[0]  # the configuration aligned left, the figures right
    lines = [title, "", aligned(header, widths, "  "), *(aligned(cells, widths, "  ") for cells in rows), ""]
    for row in report["capacity"]:
        if row["reason"]:
            lines.append(f"{row['config']}: {row['reason']}")
    client = [run for run in runs if run["client_limited"]]
    for run in client:
        lines.append(f"{run['config']} at {run['rate']:g}: never counted as capacity: {run['why']}")
    return lines
