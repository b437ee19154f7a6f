"""The dashboard's alerts: what needs the user's eye now, from the state's views and the metrics core's figures.

Each alert reads a figure, a notice or an event the state keeps (:class:`meshtop.tui.state.DashboardState`); none
computes one of its own.
"""

from __future__ import annotations

from meshtop.recordings.metrics.blocker import blocker_of
from meshtop.recordings.notices import Notice
from meshtop.tui.state import DashboardState

SEVERITIES = ("error", "warning", "info")
"""The alerts' order: the worst first."""


def alerts_of(state: DashboardState) -> list[Notice]:
    """What needs the user's eye now, the worst first: the ranks that failed, the session's notices
    (:class:`meshtop.recordings.notices.Notices`), and what the figures show (what blocks the run among them:
    :mod:`meshtop.recordings.metrics.blocker`)."""
    now = state.clock_ns or 0
    alerts = []
    errors: dict[int, str | None] = {}
    for view in state.rank_views(lambda view: view.exited is not None):
        exited = view.exited
        if exited is not None and exited.exit_code not in (0, None):
            errors[view.rank] = exited.error
            why = f": {exited.error}" if exited.error else ""
            alerts.append(Notice("error", f"rank {view.rank} {view.status}{why}", exited.wall_ns))
    if state.ended is not None and state.ended.status == "failed" and state.ended.root_cause_rank is not None:
        alerts.append(
            Notice("error", f"job failed; rank {state.ended.root_cause_rank} failed first", state.ended.wall_ns)
        )
    alerts += state.notices.standing(state.info, now)
    said = [("warning", straggler.verdict) for straggler in state.stragglers()]
    server = state.notices.server
    server_failure: tuple[str, ...] = ()
    if server is not None and server.state == "failed":  # why, and its log's last lines where the run has them
        started = state.info.endpoint.server if state.info.endpoint is not None else None
        server_failure = (server.line or "", *(started.log_tail if started is not None else ()))
    if (blocker := blocker_of(state.figures(), errors, server_failure)) is not None:
        severity = "warning" if blocker.kind == "fit" else "info"
        said.append((severity, f"blocker: {blocker.kind}\n  {blocker.evidence}\n  try: {blocker.suggestion}"))
    for row, room in state.low_headroom():
        text = f"rank {row.rank} memory headroom {room:.0%} at its peak (below {state.headroom_alert:.0%})"
        said.append(("warning", text))
    requests = state.figures().requests
    if requests is not None and requests.failed and requests.failures:
        reason, count = requests.failures[0]
        said.append(("warning", f"failed requests: {requests.failed:,}; most often ({count:,}): {reason}"))
    if requests is not None and requests.client is not None and requests.client.limited:
        said.append(("warning", requests.client.limited))
    with state.session.reading() as fold:
        left_out = sum(fold.rejected.values())
        torn = fold.closed_torn
    if left_out:
        text = f"{left_out:,} events that cannot be this job's left out (a rank outside it, an end before its start)"
        said.append(("warning", text))
    if state.coalesced:
        why = "(the recording has them all; summary reads them)"
        said.append(
            ("info", f"{state.coalesced:,} collective and sample events left out of the live view to keep up {why}")
        )
    if torn and state.coalesced:
        why = "(summary breaks every step down)"
        said.append(("info", f"{torn:,} steps not broken down live: their collectives were left out to keep up {why}"))
    if state.sampler_errors:
        said.append(("info", f"{state.sampler_errors} sampler errors; last: {state.last_sampler_error}"))
    alerts += [Notice(severity, text, now) for severity, text in said]
    return sorted(alerts, key=lambda alert: SEVERITIES.index(alert.severity))
