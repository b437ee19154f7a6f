"""A live session's fold on its own thread: every batch folded once and in order, the bulk kinds left out
(counted, recorded all the same, and said) past the backlog's bound and nothing else, and an error of the
fold's raised on the session's thread."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor, wait
from pathlib import Path

import pytest

from meshtop.probes.arrivals import Arrivals
from meshtop.probes.events import Event
from meshtop.recordings.folding import FoldThread
from meshtop.recordings.manifest import Manifest, write_manifest
from meshtop.recordings.reader import open_recording
from meshtop.recordings.recorder import Ending, SessionRecorder
from meshtop.recordings.session_fold import Folded, SessionFold
from meshtop.tui.alerts import alerts_of
from meshtop.tui.state import DashboardState
from tests.kit.recordings import description
from tests.recordings.test_session_fold import batches


def recorder_in(directory: Path) -> SessionRecorder:
    run = description(dp=2)
    write_manifest(directory, Manifest(run=run))
    return SessionRecorder(SessionFold(run), directory, Manifest(run=run))


def hand_over(recorder: SessionRecorder, folding: FoldThread, given: list[list[Event]]) -> list[Arrivals]:
    """Each batch recorded, then handed to the fold, as the session thread does; the batches handed over."""
    handed = []
    for events in given:
        arrivals = Arrivals(events)
        recorder.write(arrivals)
        folding.put(arrivals)
        handed.append(arrivals)
    return handed


def test_every_batch_is_folded_once_in_order_and_passed_on(tmp_path: Path) -> None:
    recorder = recorder_in(tmp_path)
    seen: list[str] = []
    steps: list[int] = []

    def then(arrivals: Arrivals, folded: Folded) -> None:
        seen.extend(f"{item.kind}:{getattr(item, 'rank', '')}" for item in arrivals.items)
        steps.extend(step.step for step in folded.steps)

    folding = FoldThread(recorder, then)
    sent = []
    for events in batches(5):
        arrivals = Arrivals(events)
        sent.extend(f"{event.kind}:{getattr(event, 'rank', '')}" for event in events)
        recorder.write(arrivals)
        folding.put(arrivals)
    folding.close()
    assert seen == sent and steps == [0, 1, 2, 3, 4]
    [row] = recorder.session.figures().collectives
    assert row.count == 10 and not recorder.session.left_out


def test_past_the_backlog_only_the_bulk_kinds_waiting_are_left_out_and_all_is_recorded(tmp_path: Path) -> None:
    """The fold is held on its first batch (the starts) while the other 10 wait, an all-reduce and a step each
    (20 events, bound 14): from the 8th on, each batch leaves the oldest 2 all-reduces waiting out (6 in all);
    every step still completes."""
    recorder = recorder_in(tmp_path)
    holding, release = threading.Event(), threading.Event()

    def then(arrivals: Arrivals, folded: Folded) -> None:
        holding.set()
        release.wait(30)

    folding = FoldThread(recorder, then, backlog=14)
    first, *rest = batches(5)
    hand_over(recorder, folding, [first])
    assert holding.wait(30)
    handed = hand_over(recorder, folding, rest)
    release.set()
    folding.close()
    session = recorder.session
    assert session.left_out == {"collective": 6}
    assert [arrivals.count for arrivals in handed] == [2] * 10  # what the caller handed over stays whole
    assert session.steps_completed == 5
    [row] = session.figures().collectives
    assert row.count == 4
    state = DashboardState(session.run, session=session)
    state.coalesced = session.left_out.total()  # as the live source counts them
    assert any(alert.text.startswith("6 collective and sample events left out") for alert in alerts_of(state))
    recorder.close(Ending(status="completed", duration_s=1.0))
    assert len(open_recording(tmp_path).arrow("collective")) == 10


def test_an_error_of_the_fold_is_raised_on_the_sessions_thread(tmp_path: Path) -> None:
    recorder = recorder_in(tmp_path)

    def then(arrivals: Arrivals, folded: Folded) -> None:
        raise ValueError("the console's terminal went away")

    folding = FoldThread(recorder, then)
    folding.put(Arrivals(batches(1)[0]))
    with pytest.raises(ValueError, match="terminal went away"):
        folding.close()


def test_leaving_the_bulk_out_never_waits_for_the_session_lock_the_fold_holds(tmp_path: Path) -> None:
    """The session's lock held (as the fold holds it while it folds a thousand ranks' step): the session
    thread's hand-overs past the backlog still return while it is held; the events they left out are counted
    once the fold takes the next batch. (The hand-over may take its time on a loaded machine, but must end
    before the lock is let go.)"""
    recorder = recorder_in(tmp_path)
    folding = FoldThread(recorder, lambda arrivals, folded: None, backlog=2)
    session = recorder.session
    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        with session.lock:
            held.set()
            release.wait(30)

    holder = threading.Thread(target=hold)
    holder.start()
    assert held.wait(30)
    with ThreadPoolExecutor(1) as pool:
        handing = pool.submit(hand_over, recorder, folding, batches(5))
        # generous, for a loaded machine: only a hand-over waiting for the lock takes this long
        returned = handing in wait([handing], timeout=20).done
        release.set()
        holder.join()
    assert returned, "the hand-over waited for the session's lock"
    handing.result()  # its error, if it raised one
    folding.close()
    assert session.left_out["collective"] > 0 and session.steps_completed == 5
