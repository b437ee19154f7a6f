"""The dashboard's alerts: what needs the user's eye now, from the state's views and the metrics core's figures.

Each alert reads a figure or an event the state keeps (:class:`meshtop.tui.state.DashboardState`); none
computes one of its own.
"""

from __future__ import annotations

from dataclasses import dataclass

from meshtop.tui.state import DashboardState, ranks_text


@dataclass(frozen=True, slots=True)
class Alert:
    severity: str
    """error, warning or info."""
    text: str
    wall_ns: int


def alerts_of(state: DashboardState) -> list[Alert]:
    """What needs the user's eye now, the worst first."""
    now = state.clock_ns or 0
    alerts = []
    for view in sorted((view for view in state.ranks.values() if view.exited is not None), key=lambda v: v.rank):
        exited = view.exited
        if exited is not None and exited.exit_code not in (0, None):
            why = f": {exited.error}" if exited.error else ""
            alerts.append(Alert("error", f"rank {view.rank} {view.status}{why}", exited.wall_ns))
    server = state.server_state  # a server meshtop started: its startup, or why it failed
    if server is not None and server.state in ("starting", "failed"):
        severity, what = ("info", f"server starting ({server.elapsed_s:.0f} s)") if server.state == "starting" else (
            "error", "server failed"
        )  # fmt: skip
        alerts.append(Alert(severity, f"{what}: {server.line or ''}".rstrip(": "), server.wall_ns))
    if state.hang is not None:
        verdict = state.hang.report.splitlines()[0]
        alerts.append(
            Alert("error", f"hang: no progress for {state.hang.silent_s:.0f} s; {verdict}", state.hang.wall_ns)
        )
    if state.flight is not None:  # torch's analyzer, beside meshtop's own verdict
        severity = "error" if state.hang is not None else "info"
        for line in state.flight.lines():
            alerts.append(Alert(severity, line, state.flight.wall_ns))
    if state.ended is not None and state.ended.status == "failed" and state.ended.root_cause_rank is not None:
        alerts.append(
            Alert("error", f"job failed; rank {state.ended.root_cause_rank} failed first", state.ended.wall_ns)
        )
    for (probe, reason), ranks in sorted(state.probes_off.items()):
        if state.info.endpoint is not None:  # its probes are this machine's and the server's, not ranks'
            alerts.append(Alert("warning", f"probe off: {probe}: {reason}", now))
            continue
        where = "every rank" if len(ranks) == state.info.world_size else f"ranks {ranks_text(ranks)}"
        alerts.append(Alert("warning", f"probe off: {probe} on {where}: {reason}", now))
    for straggler in state.stragglers():
        alerts.append(Alert("warning", straggler.verdict, now))
    for row, room in state.low_headroom():
        text = f"rank {row.rank} memory headroom {room:.0%} at its peak (below {state.headroom_alert:.0%})"
        alerts.append(Alert("warning", text, now))
    requests = state.figures().requests
    if requests is not None and requests.failed and requests.failures:
        reason, count = requests.failures[0]
        text = f"failed requests: {requests.failed:,}; most often ({count:,}): {reason}"
        alerts.append(Alert("warning", text, now))
    if requests is not None and requests.client is not None and requests.client.limited:
        alerts.append(Alert("warning", requests.client.limited, now))
    if state.dropped:
        alerts.append(Alert("warning", f"{state.dropped:,} telemetry events dropped (buffers full)", now))
    if state.refused:
        reasons = ", ".join(f"{reason} {count:,}" for reason, count in sorted(state.refused.items()))
        text = f"the collector refused {sum(state.refused.values()):,} messages not from this job ({reasons})"
        alerts.append(Alert("warning", text, now))
    with state.session.reading() as fold:
        left_out = sum(fold.rejected.values())
        torn = fold.closed_torn
    if left_out:
        alerts.append(
            Alert(
                "warning",
                f"{left_out:,} events that cannot be this job's left out (a rank outside it, an end before its start)",
                now,
            )
        )
    if state.coalesced:
        alerts.append(
            Alert(
                "info",
                f"{state.coalesced:,} collective and sample events left out of the live view to keep up "
                "(the recording has them all; summary reads them)",
                now,
            )
        )
    if torn and state.coalesced:
        alerts.append(
            Alert(
                "info",
                f"{torn:,} steps not broken down live: their collectives were left out to keep up "
                "(summary breaks every step down)",
                now,
            )
        )
    if state.sampler_errors:
        alerts.append(Alert("info", f"{state.sampler_errors} sampler errors; last: {state.last_sampler_error}", now))
    return alerts
