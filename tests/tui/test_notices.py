"""A session's notices, one fold for both readers: ``record``'s console prints what :meth:`Notices.take` raises,
each once, and the dashboard's Alerts show what :meth:`Notices.standing` says holds."""

from __future__ import annotations

from meshtop.probes.events import (
    EventsDropped,
    FlightVerdict,
    FramesRefused,
    HangDetected,
    ProbeOff,
    ServerState,
    StackDump,
)
from meshtop.recordings.notices import Notices
from tests.kit.recordings import description

REPORT = "rank 0 waits in a collective; rank 1 is not in one: look there first"
HANG = HangDetected(wall_ns=5, timeout_s=30.0, silent_s=31.4, report=REPORT)
VERDICT = FlightVerdict(wall_ns=6, verdict="rank 1 never entered all_reduce #4 of group 0", error=None, dumps="fr")


def test_the_console_hears_each_notice_once_in_the_words_it_prints() -> None:
    """A probe off on two ranks is said once; torch's verdict beside a hang of the same batch is not said (the
    hang's report holds it), alone it is; a server's failure is the job's verdict, not a notice."""
    notices = Notices()
    said = notices.take(
        [
            ProbeOff(rank=rank, wall_ns=1, probe="pipeline stages", reason="torch 2.99 has no _wait_batch_p2p")
            for rank in (0, 1)
        ]
        + [
            EventsDropped(wall_ns=2, rank=3, where="worker", count=7),
            FramesRefused(wall_ns=3, reason="malformed", count=1),
            StackDump(rank=1, pid=42, wall_ns=4, text="File a.py\nFile b.py", error=None),
            HANG,
            VERDICT,
            ServerState(wall_ns=7, state="starting", elapsed_s=12.3, line="Loading weights"),
            ServerState(wall_ns=8, state="failed", elapsed_s=13.0, line="exit code 1"),
        ]
    )
    assert [(notice.severity, notice.text) for notice in said] == [
        ("warning", "probe off: pipeline stages: torch 2.99 has no _wait_batch_p2p; the job runs on without it"),
        ("warning", "7 telemetry events dropped by rank 3 (buffer full)"),
        (
            "warning",
            "the collector refused 1 message (malformed): not from this job's ranks, whose events are unaffected",
        ),
        ("info", "stack of rank 1 (pid 42):\n  File a.py\n  File b.py"),
        (
            "error",
            f"no rank made progress for 31 s (hang timeout 30 s): {REPORT}\n"
            "stack dumps of every rank follow; stopping the job",
        ),
        ("info", "server starting (12 s): Loading weights"),
    ]
    assert [notice.text for notice in notices.take([VERDICT])] == ["rank 1 never entered all_reduce #4 of group 0"]


def test_the_dashboard_sees_what_holds_summed_grouped_and_until_progress() -> None:
    notices = Notices()
    notices.take(
        [
            ProbeOff(rank=1, wall_ns=1, probe="stages", reason="old torch"),
            ProbeOff(rank=2, wall_ns=1, probe="stages", reason="old torch"),
            EventsDropped(wall_ns=2, rank=0, where="worker", count=7),
            EventsDropped(wall_ns=2, rank=None, where="collector", count=1_000),
            FramesRefused(wall_ns=3, reason="malformed", count=20),
            FramesRefused(wall_ns=3, reason="bad token", count=1),
            HANG,
            VERDICT,
        ]
    )
    standing = [(notice.severity, notice.text) for notice in notices.standing(description(dp=4), 9)]
    assert standing == [
        ("error", f"hang: no progress for 31 s; {REPORT}"),
        ("error", "rank 1 never entered all_reduce #4 of group 0"),
        ("warning", "probe off: stages on ranks 1-2: old torch"),
        ("warning", "1,007 telemetry events dropped (buffers full)"),
        ("warning", "the collector refused 21 messages not from this job (bad token 1, malformed 20)"),
    ]
    notices.progressed()
    assert notices.hang is None
    first = notices.standing(description(dp=4), 9)[0]  # torch's verdict, without a hang: for information
    assert (first.severity, first.text) == ("info", "rank 1 never entered all_reduce #4 of group 0")
