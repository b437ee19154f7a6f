"""The summary of a recording as readable text."""

from __future__ import annotations

from typing import Any


def human_bytes(count: float | None) -> str:
    if count is None:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(count) < 1024 or unit == "TiB":
            return f"{count:.0f} {unit}" if unit == "B" else f"{count:.1f} {unit}"
        count /= 1024
    return f"{count:.1f} TiB"


def seconds(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value * 1e3:.2f} ms" if value < 1 else f"{value:.3f} s"


def summary_lines(summary: dict[str, Any]) -> list[str]:
    run, steps = summary["run"], summary["steps"]
    plan = f"dp{run['dp']}{' (fsdp)' if run['fsdp'] else ''} x tp{run['tp']} x pp{run['pp']}"
    if run["schedule"]:
        plan += f" ({run['schedule']}, {run['microbatches']} mb)"
    lines = [
        f"recording {summary['recording']}: {run['status']}",
        f"  {plan} · model {run['model']} · {run['device']} {run['dtype']} · {run['world_size']} ranks"
        + ("" if run["instrumented"] else " · not instrumented"),
        f"steps: {steps['count']}  p50 {seconds(steps['time_s']['p50'])}  p90 {seconds(steps['time_s']['p90'])}"
        f"  mean {seconds(steps['time_s']['mean'])}"
        + (f"  {steps['tokens_per_s']['p50']:,.0f} tok/s" if steps["tokens_per_s"]["p50"] else ""),
    ]
    if summary["collectives"]:
        lines.append("collectives (all ranks, in steps):")
        lines.append(f"  {'group':<6}{'op':<16}{'count':>7}{'bytes':>12}{'total':>12}{'p50':>11}{'p99':>11}{'busbw p50':>12}")
        for row in summary["collectives"]:
            busbw = row["busbw_gbps"]["p50"]
            lines.append(f"  {row['group']:<6}{row['op']:<16}{row['count']:>7}{human_bytes(row['bytes']):>12}"
                         f"{seconds(row['time_s']['total']):>12}{seconds(row['time_s']['p50']):>11}"
                         f"{seconds(row['time_s']['p99']):>11}{(f'{busbw:.2f} GB/s' if busbw else '-'):>12}")
    if summary["stages"]:
        lines.append("pipeline stages (mean per step):")
        for row in summary["stages"]:
            lines.append(f"  stage {row['stage']}: busy {seconds(row['busy_s'])}  idle {seconds(row['idle_s'])}"
                         f"  bubble {row['bubble_fraction']:.1%}")
    if summary["memory"]:
        lines.append("memory (last step; peak over the run):")
        for row in summary["memory"]:
            marker = "  <- most loaded" if row["rank"] == summary["most_loaded_rank"] else ""
            lines.append(f"  rank {row['rank']}: peak {human_bytes(row['peak_bytes'])}  weights "
                         f"{human_bytes(row['weights_bytes'])}  grads {human_bytes(row['grads_bytes'])}  optimizer "
                         f"{human_bytes(row['optimizer_bytes'])}  activations {human_bytes(row['activations_bytes'])}"
                         f"{marker}")
    failed = [r for r in summary["ranks"] if r["exit_code"] not in (0, None)]
    for rank in failed:
        how = f"signal {rank['signal']}" if rank["signal"] else f"exit code {rank['exit_code']}"
        lines.append(f"rank {rank['rank']}: {how}: {rank['error'] or ''}".rstrip(": "))
    return lines


def comparison_lines(comparison: dict[str, Any]) -> list[str]:
    lines = [f"A: {comparison['a']}", f"B: {comparison['b']}"]
    lines += [f"warning: {warning}: the comparison is unfair" for warning in comparison["warnings"]]
    lines.append(f"  {'metric':<44}{'A':>14}{'B':>14}{'B / A':>9}")
    for row in comparison["metrics"]:
        ratio = f"{row['ratio']:.3f}" if row["ratio"] is not None else "-"
        mark = "  *" if row["significant"] else ""
        lines.append(f"  {row['name']:<44}{figure(row['name'], row['a']):>14}{figure(row['name'], row['b']):>14}"
                     f"{ratio:>9}{mark}")
    lines.append("  * beyond run-to-run noise (Mann-Whitney p < 0.01 on the per-step values, and over 1 %)")
    return lines


def figure(name: str, value: float | None) -> str:
    if value is None:
        return "-"
    if "(bytes)" in name:
        return human_bytes(value)
    if "(s)" in name:
        return seconds(value)
    return f"{value:,.3f}" if value < 1000 else f"{value:,.0f}"
