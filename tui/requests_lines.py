"""The requests panel of an inference run or a served load: counts, rates, latency percentiles over time, the
client's and the server's own lines (the Overview's top for inference)."""

from __future__ import annotations

from rich.text import Text

from meshtop.recordings.metrics.requests import LATENCIES
from meshtop.tui.charts import human_rate, sparkline
from meshtop.tui.state import DashboardState
from meshtop.tui.summary_text import SERVER_GAUGES, human_seconds, per_second
from meshtop.tui.view_records import RequestsView


def output_rate(value: float | None) -> str:
    """Output tokens/s as the header and the requests panel write it (``- tok/s`` before the first)."""
    return "- tok/s" if value is None else human_rate(value, " tok/s")


def request_counts(view: RequestsView) -> str:
    """``60/64 completed · 4 failed · 3.20 req/s · 1.2k tok/s out`` (and goodput with SLOs, and the requests
    an endpoint's stopped load did not send)."""
    figures = view.figures
    done = f"{figures.completed:,}/{view.total:,}" if view.total is not None else f"{figures.completed:,}"
    parts = [f"{done} completed", f"{figures.failed:,} failed"]
    if figures.not_sent:
        parts.append(f"{figures.not_sent:,} not sent")
    parts += [per_second(figures.request_throughput_per_s, "req/s"), f"{output_rate(figures.output_tokens_per_s)} out"]
    if figures.goodput_per_s is not None:
        parts.append(f"goodput {per_second(figures.goodput_per_s, 'req/s')}")
    if figures.slo_met_of_completed is not None:  # of the answers: over the load it would read as progress
        parts.append(f"SLO met {figures.slo_met_of_completed:.0%} of completed")
    return " · ".join(parts)


def requests_lines(state: DashboardState, width: int) -> Text:
    """An inference run's requests: counts and rates, then TTFT / TPOT / ITL / e2e p50 and p99 over the
    run with the recent values; the most frequent failure reason, if any failed."""
    view = state.requests_view()
    text = Text(no_wrap=True, overflow="ellipsis")
    if view is None:
        return text
    text.append("requests", style="bold underline")
    text.append(f"  {request_counts(view)}\n")
    if view.figures.failures:
        reason, count = view.figures.failures[0]
        text.append(f"  failed {count:,}: {reason}\n", style="yellow")
    if len(view.figures.per_replica) > 1:  # dp replicas, or an endpoint's (--endpoint URL1,URL2)
        rows = (
            f"{row.replica}: {row.completed:,} done, TTFT p50 {human_seconds(row.ttft_p50_s)}"
            for row in view.figures.per_replica
        )
        text.append(f"  replicas  {' · '.join(rows)}\n")
    history = max(0, width - 34)
    text.append(f"  {'latency':<8}{'p50':>10}{'p99':>10}  {'recent' if history else ''}\n", style="bold")
    for key, label in LATENCIES.items():
        p50, p99 = view.p50_p99(key)
        text.append(f"  {label:<8}{human_seconds(p50):>10}{human_seconds(p99):>10}  ")
        text.append(sparkline(view.history[key], history, low=0.0) + "\n", style="cyan")
    if (client := view.figures.client) is not None:  # an endpoint's load generator: did it keep to the load?
        text.append(
            f"  client  send lag p50 {human_seconds(client.send_lag_p50_s)}  p99 {human_seconds(client.send_lag_p99_s)}"
        )
        if client.asked_rate_per_s is not None and client.achieved_rate_per_s is not None:
            text.append(f"  sent {client.achieved_rate_per_s:,.2f} of {client.asked_rate_per_s:,.2f} req/s asked")
        if client.cpu_mean_pct is not None:
            text.append(f"  CPU {client.cpu_mean_pct:.0f} %")
        if view.figures.warmup:
            text.append(f"  ({view.figures.warmup} warmup left out)")
        text.append("\n")
        if client.limited:
            text.append(f"  {client.limited}\n", style="yellow")
    if (server := view.server) is not None:  # the engine's own view: its queue and KV cache, as it says them
        text.append("  server", style="bold")
        spark = max(0, (width - 60) // 2)
        for name, (label, scale, unit) in SERVER_GAUGES.items():
            if (gauge := server.gauges.get(name)) is not None:
                text.append(
                    f"  {label} {(gauge['last'] or 0) * scale:,.0f}{unit} (max {(gauge['max'] or 0) * scale:,.0f})"
                )
                if spark and name != "requests_running":
                    text.append(" " + sparkline(view.server_history.get(name, ()), spark, low=0.0), style="cyan")
        if preempted := server.counters.get("preemptions"):
            text.append(f"  preemptions {preempted:,.0f}", style="yellow")
        if not server.gauges:
            text.append(f"  {server.series:,} series (no engine meshtop knows)")
        text.append("\n")
    return text
