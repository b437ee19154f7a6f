"""A session's notices: what ``record`` prints as it happens and the dashboard shows in its Alerts, from the kinds
the table marks printed (:data:`meshtop.probes.kinds.PRINTED_KINDS`): a rank's stack, a hang and torch's
flight-recorder verdict on it, telemetry dropped or refused, a probe off, a server meshtop started.

One fold takes these events for both readers. :meth:`Notices.take` folds a batch and returns the notices it
raised, each once, as they come (the console prints them). :meth:`Notices.standing` returns what holds now
(the dashboard draws it every frame): counts summed, a probe off grouped by its ranks, a hang until the job
makes progress again.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from meshtop.probes.events import (
    Event,
    EventsDropped,
    FlightVerdict,
    FramesRefused,
    HangDetected,
    ProbeOff,
    ServerState,
    StackDump,
)
from meshtop.recordings.manifest import RunDescription


@dataclass(frozen=True, slots=True)
class Notice:
    """One thing the user should read, in words."""

    severity: str
    """error, warning or info."""
    text: str
    """One line, or several (a stack dump)."""
    wall_ns: int


class Notices:
    """The notices of one session, folded from its events of the printed kinds (others pass by)."""

    def __init__(self) -> None:
        self.dropped = 0
        """Telemetry events lost before meshtop got them (full worker or collector buffers)."""
        self.refused: dict[str, int] = {}
        """Messages the collector refused, by reason."""
        self.probes_off: dict[tuple[str, str], set[int]] = {}
        """(probe, reason) -> the ranks it is off on."""
        self.hang: HangDetected | None = None
        """The hang reported last, until progress resumes (:meth:`progressed`)."""
        self.flight: FlightVerdict | None = None
        """torch's flight-recorder analyzer, last taken (at a hang, or with a stack dump asked for)."""
        self.server: ServerState | None = None
        """A server meshtop started for an endpoint's load: how it goes, last said."""
        self.stacks: dict[int, StackDump] = {}
        """Each rank's stack, last dumped."""

    def take(self, events: Iterable[Event]) -> list[Notice]:
        """Fold a batch of events; the notices it raised, in order. Each is said once: a probe off once however
        many ranks report it; torch's verdict not beside a hang of the same batch (the hang's report holds it);
        a server's failure not at all (the job's verdict says it)."""
        raised: list[Notice] = []
        hang_reported = False
        for event in events:
            if isinstance(event, StackDump):
                self.stacks[event.rank] = event
                raised.append(Notice("info", stack_dump_text(event), event.wall_ns))
            elif isinstance(event, HangDetected):
                self.hang, hang_reported = event, True
                text = (
                    f"no rank made progress for {event.silent_s:.0f} s (hang timeout {event.timeout_s:.0f} s): "
                    f"{event.report}\nstack dumps of every rank follow; stopping the job"
                )
                raised.append(Notice("error", text, event.wall_ns))
            elif isinstance(event, FlightVerdict):
                self.flight = event
                if not hang_reported:
                    raised.append(Notice("info", "\n".join(event.lines()), event.wall_ns))
            elif isinstance(event, EventsDropped):
                self.dropped += event.count
                where = f"rank {event.rank}" if event.rank is not None else "the collector"
                text = f"{event.count} telemetry events dropped by {where} (buffer full)"
                raised.append(Notice("warning", text, event.wall_ns))
            elif isinstance(event, FramesRefused):
                self.refused[event.reason] = self.refused.get(event.reason, 0) + event.count
                text = (
                    f"the collector refused {event.count} message{'s' * (event.count != 1)} ({event.reason}): "
                    "not from this job's ranks, whose events are unaffected"
                )
                raised.append(Notice("warning", text, event.wall_ns))
            elif isinstance(event, ServerState):
                self.server = event
                if event.state != "failed":
                    raised.append(Notice("info", server_state_line(event), event.wall_ns))
            elif isinstance(event, ProbeOff):
                ranks = self.probes_off.setdefault((event.probe, event.reason), set())
                if not ranks:
                    text = f"probe off: {event.probe}: {event.reason}; the job runs on without it"
                    raised.append(Notice("warning", text, event.wall_ns))
                ranks.add(event.rank)
        return raised

    def progressed(self) -> None:
        """A job step completed: the hang reported before is over."""
        self.hang = None

    def standing(self, run: RunDescription, now_ns: int) -> list[Notice]:
        """What holds now (``now_ns``: when a notice with no time of its own holds): a server starting or
        failed, a hang and torch's verdict on it, the probes off, the telemetry lost or refused."""
        notices: list[Notice] = []
        server = self.server
        if server is not None and server.state in ("starting", "failed"):
            notices.append(
                Notice("info" if server.state == "starting" else "error", server_state_line(server), server.wall_ns)
            )
        if self.hang is not None:
            verdict = self.hang.report.splitlines()[0]
            text = f"hang: no progress for {self.hang.silent_s:.0f} s; {verdict}"
            notices.append(Notice("error", text, self.hang.wall_ns))
        if self.flight is not None:  # torch's analyzer, beside meshtop's own verdict
            severity = "error" if self.hang is not None else "info"
            notices += [Notice(severity, line, self.flight.wall_ns) for line in self.flight.lines()]
        for (probe, reason), ranks in sorted(self.probes_off.items()):
            if run.endpoint is not None:  # its probes are this machine's and the server's, not ranks'
                notices.append(Notice("warning", f"probe off: {probe}: {reason}", now_ns))
                continue
            where = "every rank" if len(ranks) == run.world_size else f"ranks {ranks_text(ranks)}"
            notices.append(Notice("warning", f"probe off: {probe} on {where}: {reason}", now_ns))
        if self.dropped:
            notices.append(Notice("warning", f"{self.dropped:,} telemetry events dropped (buffers full)", now_ns))
        if self.refused:
            reasons = ", ".join(f"{reason} {count:,}" for reason, count in sorted(self.refused.items()))
            text = f"the collector refused {sum(self.refused.values()):,} messages not from this job ({reasons})"
            notices.append(Notice("warning", text, now_ns))
        return notices


def server_state_line(event: ServerState) -> str:
    """``server starting (12 s): Loading weights...``, ``server ready after 41.2 s``, ``server stopped``."""
    if event.state == "starting":
        return f"server starting ({event.elapsed_s:.0f} s): {event.line or ''}".rstrip(": ")
    if event.state == "ready":
        return f"server ready after {event.elapsed_s:.1f} s"
    return f"server {event.state}" + (f": {event.line}" if event.line else "")


def stack_dump_text(dump: StackDump) -> str:
    """``stack of rank 1 (pid 4242):`` and the stack, indented; or why it could not be taken."""
    if dump.error is not None:
        return f"stack of rank {dump.rank} (pid {dump.pid}): {dump.error}"
    return "\n".join(
        [f"stack of rank {dump.rank} (pid {dump.pid}):", *("  " + line for line in (dump.text or "").splitlines())]
    )


def ranks_text(ranks: Iterable[int]) -> str:
    """``0-3,7`` for {0, 1, 2, 3, 7}."""
    ordered = sorted(ranks)
    parts, start = [], None
    for index, rank in enumerate(ordered):
        if start is None:
            start = rank
        if index + 1 == len(ordered) or ordered[index + 1] != rank + 1:
            parts.append(str(start) if start == rank else f"{start}-{rank}")
            start = None
    return ",".join(parts)
