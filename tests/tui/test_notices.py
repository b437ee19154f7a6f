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
from meshtop.recordings.notices import Notices, ranks_text, server_state_line, stack_dump_text
from tests.kit.recordings import description
from tests.recordings.test_run_fold_by_hand import endpoint_run

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


def test_a_servers_line_says_its_state_its_time_and_its_last_line_where_it_has_one() -> None:
    """Starting: whole seconds, and the log line after a colon, none where there is no line (nor a trailing
    colon); a line of its own ending in X keeps it. Ready: the time to ready, to a tenth of a second. Stopped
    or failed: the state, and the line where there is one."""

    def line_of(state: str, elapsed_s: float, line: str | None) -> str:
        return server_state_line(ServerState(wall_ns=1, state=state, elapsed_s=elapsed_s, line=line))

    assert line_of("starting", 12.3, None) == "server starting (12 s)"
    assert line_of("starting", 3.0, "compiling graphs, mode MAX") == "server starting (3 s): compiling graphs, mode MAX"
    assert line_of("ready", 41.2, None) == "server ready after 41.2 s"
    assert line_of("stopped", 50.0, None) == "server stopped"
    assert line_of("failed", 13.0, "exit code 1") == "server failed: exit code 1"


def test_a_stack_that_came_empty_is_its_heading_alone() -> None:
    dump = StackDump(rank=1, pid=42, wall_ns=4, text=None, error=None)
    assert stack_dump_text(dump) == "stack of rank 1 (pid 42):"


def test_ranks_in_a_row_are_a_range_and_a_rank_alone_is_itself() -> None:
    """{0, 1, 2, 3, 7}: a range ends where the next rank is not one more (0-3), and 7 alone is 7, not 7-7."""
    assert ranks_text({7, 0, 3, 1, 2}) == "0-3,7"
    assert ranks_text([5]) == "5"


def test_each_notice_has_its_events_time_and_a_ranks_stack_is_kept() -> None:
    """A stack dump at 4 ns (info) and a hang at 5 ns (error) are noticed at their own times; the stack is kept as
    the rank's last; torch's verdict alone, at 6 ns, is for information."""
    notices = Notices()
    dump = StackDump(rank=1, pid=42, wall_ns=4, text="File a.py", error=None)
    said = notices.take([dump, HANG])
    assert [(notice.severity, notice.wall_ns) for notice in said] == [("info", 4), ("error", 5)]
    assert notices.stacks == {1: dump}
    [verdict] = notices.take([VERDICT])
    assert (verdict.severity, verdict.wall_ns) == ("info", 6)


def test_the_collectors_drops_refusals_summed_and_a_probe_off_on_one_rank_are_said_at_their_times() -> None:
    """Drops the collector counted are the collector's; two refusals of one reason sum (1 + 2 = 3, said as
    messages); a probe off on a single rank is said; each notice at its event's time."""
    notices = Notices()
    said = notices.take(
        [
            EventsDropped(wall_ns=10, rank=None, where="collector", count=5),
            FramesRefused(wall_ns=11, reason="malformed", count=1),
            FramesRefused(wall_ns=12, reason="malformed", count=2),
            ProbeOff(rank=3, wall_ns=13, probe="memory", reason="no CUDA"),
            ServerState(wall_ns=14, state="ready", elapsed_s=2.0, line=None),
        ]
    )
    assert [(notice.text, notice.wall_ns) for notice in said] == [
        ("5 telemetry events dropped by the collector (buffer full)", 10),
        ("the collector refused 1 message (malformed): not from this job's ranks, whose events are unaffected", 11),
        ("the collector refused 2 messages (malformed): not from this job's ranks, whose events are unaffected", 12),
        ("probe off: memory: no CUDA; the job runs on without it", 13),
        ("server ready after 2.0 s", 14),
    ]
    assert notices.refused == {"malformed": 3}


def test_what_holds_is_nothing_at_first_then_the_server_starting_or_failed_at_its_time() -> None:
    notices = Notices()
    assert notices.standing(description(dp=2), 9) == []
    notices.take([ServerState(wall_ns=7, state="starting", elapsed_s=12.3, line="Loading weights")])
    [starting] = notices.standing(description(dp=2), 9)
    assert (starting.severity, starting.text, starting.wall_ns) == (
        "info",
        "server starting (12 s): Loading weights",
        7,
    )
    notices.take([ServerState(wall_ns=8, state="failed", elapsed_s=13.0, line="exit code 1")])
    [failed] = notices.standing(description(dp=2), 9)
    assert (failed.severity, failed.text, failed.wall_ns) == ("error", "server failed: exit code 1", 8)
    notices.take([ServerState(wall_ns=9, state="ready", elapsed_s=14.0, line=None)])
    assert notices.standing(description(dp=2), 9) == []


def test_what_holds_is_timed_by_its_events_or_now_and_a_probe_off_everywhere_says_every_rank() -> None:
    """dp 2: a probe off on ranks 0 and 1 is off on every rank. The hang (5 ns) and torch's verdict (6 ns) hold
    at their own times; the probe off, the drops and the refusals, which have none of their own, at now (9 ns)."""
    notices = Notices()
    notices.take(
        [ProbeOff(rank=rank, wall_ns=1, probe="stages", reason="old torch") for rank in (0, 1)]
        + [
            EventsDropped(wall_ns=2, rank=0, where="worker", count=7),
            FramesRefused(wall_ns=3, reason="malformed", count=20),
            HANG,
            VERDICT,
        ]
    )
    standing = [(notice.text, notice.wall_ns) for notice in notices.standing(description(dp=2), 9)]
    assert standing == [
        (f"hang: no progress for 31 s; {REPORT}", 5),
        ("rank 1 never entered all_reduce #4 of group 0", 6),
        ("probe off: stages on every rank: old torch", 9),
        ("7 telemetry events dropped (buffers full)", 9),
        ("the collector refused 20 messages not from this job (malformed 20)", 9),
    ]


def test_an_endpoints_probes_off_are_named_without_ranks() -> None:
    """An endpoint's probes run on this machine and the server, not on ranks: each probe off is said as it is,
    every one of them, as a warning at now."""
    notices = Notices()
    notices.take(
        [
            ProbeOff(rank=0, wall_ns=1, probe="gpu", reason="no NVML"),
            ProbeOff(rank=0, wall_ns=1, probe="server metrics", reason="no /metrics"),
        ]
    )
    standing = [(notice.severity, notice.text, notice.wall_ns) for notice in notices.standing(endpoint_run(), 9)]
    assert standing == [
        ("warning", "probe off: gpu: no NVML", 9),
        ("warning", "probe off: server metrics: no /metrics", 9),
    ]


def test_torch_verdict_of_several_findings_is_one_notice_a_finding_a_line() -> None:
    verdict = FlightVerdict(wall_ns=6, verdict="rank 1 never entered all_reduce #4\nrank 3 too", error=None, dumps="fr")
    [said] = Notices().take([verdict])
    assert said.text == "rank 1 never entered all_reduce #4\nrank 3 too"
