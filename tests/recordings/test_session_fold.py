"""One fold per session: the session's batches are folded once, and the manifest's step count, ``/metrics``, the
dashboard and the console's figures are all read from that fold; readers take steps by position, so none
takes a step from another; a reader on another thread never sees a batch half folded."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pyarrow as pa
import pytest
from prometheus_client.parser import text_string_to_metric_families

from meshtop.probes.arrivals import Arrivals, EncodedEvents, encode_lines
from meshtop.probes.events import Event
from meshtop.recordings import session_fold
from meshtop.recordings.manifest import Manifest, read_manifest, write_manifest
from meshtop.recordings.metrics.stragglers import WINDOW
from meshtop.recordings.prometheus import RunMetrics
from meshtop.recordings.reader import open_recording
from meshtop.recordings.recorder import Ending, SessionRecorder
from meshtop.recordings.replay import in_kind_order
from meshtop.recordings.schema import ARROW_JSON_FROM_BYTES
from meshtop.recordings.session_fold import SessionFold, arrival_tables
from meshtop.tui.alerts import alerts_of
from meshtop.tui.sources import screen_batches
from meshtop.tui.state import DashboardState
from tests.kit.events import collective, rank_started, step
from tests.kit.recordings import description

MS = 1_000_000


def batches(steps: int) -> list[list[Event]]:
    """A dp2 job's batches as a session receives them: the starts, then for each step rank 0's all-reduce and
    step in one batch and rank 1's in the next (so each step completes in the batch after it began)."""
    out: list[list[Event]] = [[rank_started(0, world_size=2), rank_started(1, world_size=2, dp_rank=1)]]
    for number in range(steps):
        for rank in (0, 1):
            every = {"every_ns": 20 * MS}
            out.append([collective(rank, number, 0.002, waited=True, **every), step(rank, number, 0.010, **every)])
    return out


def counted(metrics: RunMetrics, name: str) -> float:
    for family in text_string_to_metric_families(metrics.exposition().decode()):
        for sample in family.samples:
            if sample.name == name:
                return float(sample.value)
    raise AssertionError(f"no {name}")


def test_the_manifest_metrics_and_dashboard_read_the_one_fold(tmp_path: Path) -> None:
    run = description(dp=2)
    write_manifest(tmp_path, Manifest(run=run))
    session = SessionFold(run)
    recorder = SessionRecorder(session, tmp_path, Manifest(run=run))
    metrics = RunMetrics(run)
    metrics.follow(session)
    state = DashboardState(run, session=session)
    completed_by_batch = []
    stray = collective(7, 0, 0.002, waited=True, every_ns=20 * MS)  # rank 7 of a dp2 job: no figure counts it
    for events in [*batches(5), [stray]]:
        arrivals = Arrivals(events)
        folded = recorder.take(arrivals)  # what run_session does with each batch
        metrics.take(arrivals, folded)
        for kind, table in in_kind_order(screen_batches(arrivals, folded.tables)):
            state.apply(kind, table)
        state.take_steps(folded.steps)
        completed_by_batch.append([s.step for s in folded.steps])
    # 5 steps, each completed by rank 1's report, in the batch after rank 0's
    assert completed_by_batch == [[], [], [0], [], [1], [], [2], [], [3], [], [4], []]
    assert not state.feeds_fold and state.fold is session.fold
    assert [s.step for s in state.steps] == [0, 1, 2, 3, 4] and state.steps_done == 5
    assert session.steps_since(0) == list(state.steps)  # the dashboard took its steps by position: all still there
    assert session.steps_since(3) == list(state.steps)[3:]
    assert counted(metrics, "meshtop_steps_total") == 5 and counted(metrics, "meshtop_step_seconds_count") == 5
    seconds = [
        (sample.labels, sample.value)
        for family in text_string_to_metric_families(metrics.exposition().decode())
        for sample in family.samples
        if sample.name == "meshtop_collective_seconds_count"
    ]
    # from the fold's tables, the rows it keeps: both ranks' on their node (a series per node, not per rank)
    assert seconds == [({"op": "all_reduce", "group": "dp", "node": "0"}, 10.0)]
    [row] = session.figures().collectives
    assert row.count == 10  # 2 ranks x 5 steps, each all-reduce folded once though three readers read the fold
    assert state.figures() is session.figures()  # one fold, one set of figures
    recorder.close(Ending(status="completed", duration_s=1.0))
    assert read_manifest(tmp_path).steps_completed == 5


def test_a_reader_on_another_thread_never_sees_a_batch_half_folded() -> None:
    """The session thread folds 400 batches while the screen's thread reads every figure the dashboard draws:
    no read fails (a dict changing under an iteration), and the end is every step."""
    run = description(dp=2)
    session = SessionFold(run)
    state = DashboardState(run, session=session)
    failures: list[BaseException] = []
    done = threading.Event()

    def read() -> None:
        try:
            while not done.is_set():
                state.figures()
                alerts_of(state)
                state.collective_rows()
                state.bubble_history()
                state.memory_rows()
                state.stragglers()
                state._figures = None  # no cache: compute them again next time round
        except BaseException as error:
            failures.append(error)

    reader = threading.Thread(target=read)
    reader.start()
    try:
        for events in batches(200):
            session.take(Arrivals(events))
    finally:
        done.set()
        reader.join()
    assert not failures, failures
    assert session.steps_completed == 200 and session.figures().steps.count == 200


def test_a_live_fold_past_its_share_of_the_time_leaves_collectives_out_counted_and_records_them(
    tmp_path: Path,
) -> None:
    """Share 0: every take after the first (the ranks' starts) finds the fold over its share. The 10
    all-reduces are left out of the fold and the screen, counted, and still recorded; every step completes
    (steps are never left out) and the dashboard says so."""
    run = description(dp=2)
    write_manifest(tmp_path, Manifest(run=run))
    session = SessionFold(run, share=0.0)
    recorder = SessionRecorder(session, tmp_path, Manifest(run=run))
    state = DashboardState(run, session=session)
    left_out, on_screen = [], 0
    for events in batches(5):
        arrivals = Arrivals(events)
        folded = recorder.take(arrivals)
        left_out.append(sorted(folded.left_out))
        screen = screen_batches(arrivals, folded.tables, left_out=folded.left_out)
        on_screen += sum(len(table) for kind, table in screen if kind == "collective")
        state.take_steps(folded.steps)
    assert left_out == [[]] + [["collective", "stage_action"]] * 10
    assert session.left_out == {"collective": 10} and on_screen == 0
    assert session.figures().collectives == () and session.steps_completed == 5
    state.coalesced = session.left_out.total()
    assert any(alert.text.startswith("10 collective and sample events left out") for alert in alerts_of(state))
    recorder.close(Ending(status="completed", duration_s=1.0))
    assert len(open_recording(tmp_path).arrow("collective")) == 10


def test_a_fold_that_only_waited_for_the_lock_is_not_judged_behind() -> None:
    """The share counts the fold's own CPU: takes that each spent 0.25 s waiting (here for the session's lock,
    live for the interpreter's, held by the screen) fold every batch whole. Timed by the wall clock, the
    waits made the fold look slower at each take, and from the fifth on the collectives were left out."""
    run = description(dp=2)
    for events in batches(1):  # warm: a cold first fold (imports) costs far more than the rest
        SessionFold(run).take(Arrivals(events))
    session = SessionFold(run, share=0.5)
    starts, *work = [Arrivals(events) for events in batches(3)]
    session.take(starts)  # the fold's cost per event, its first measure
    time.sleep(0.05)  # the next batch comes later, as a session's do
    left_out = []
    for arrivals in work:
        held = threading.Event()

        def hold_the_lock(held: threading.Event = held) -> None:
            with session.lock:
                held.set()
                time.sleep(0.25)

        holder = threading.Thread(target=hold_the_lock)
        holder.start()
        held.wait()
        left_out.append(sorted(session.take(arrivals).left_out))  # waits for the lock inside the timed take
        holder.join()
    assert left_out == [[]] * 6 and not session.left_out
    assert session.figures().collectives[0].count == 6


def test_batches_taken_back_to_back_are_folded_whole_while_the_fold_keeps_within_its_share() -> None:
    """Two batches can come together (a collector's read, a producer catching up): the second a moment after
    the first began. Judged against that moment alone, the second looked behind and lost its collectives;
    judged over the last second, a fold busy a few ms of it folds both whole."""
    run = description(dp=2)
    for events in batches(1):  # warm: a cold first fold (imports) costs far more than the rest
        SessionFold(run).take(Arrivals(events))
    session = SessionFold(run, share=0.5)
    starts, *work = [Arrivals(events) for events in batches(6)]
    session.take(starts)
    time.sleep(0.05)
    left_out = []
    for first, second in zip(work[::2], work[1::2], strict=True):
        left_out += [sorted(session.take(first).left_out), sorted(session.take(second).left_out)]  # back to back
        time.sleep(0.05)
    assert left_out == [[]] * 12 and not session.left_out
    assert session.figures().collectives[0].count == 12


def test_a_fold_that_thought_itself_too_slow_measures_again_and_takes_the_bulk_back(monkeypatch) -> None:
    """A cost once measured far too high (here set: 1 s an event, as a cold first fold can measure) leaves the
    bulk out; after PROBE_S of that, one take folds whole and measures again, and the next keep the bulk."""
    monkeypatch.setattr(session_fold, "PROBE_S", 0.5)
    run = description(dp=2)
    session = SessionFold(run, share=0.5)
    starts, *work = [Arrivals(events) for events in batches(4)]
    session.take(starts)
    session._cost_s = 1.0
    left_out = []
    for arrivals in work:
        left_out.append(bool(session.take(arrivals).left_out))
        time.sleep(0.1)
    assert left_out[:2] == [True, True]  # behind since the first, and still within PROBE_S
    assert left_out[-3:] == [False] * 3  # 0.5 s on: one probe folds whole, and the cost is small since
    assert left_out == sorted(left_out, reverse=True)
    assert session._cost_s < 0.1  # measured again: a few ms an event here, not the 1 s set (a loaded CI's 10)


def test_a_probe_folds_at_most_probe_events_of_the_bulk_and_counts_the_rest(monkeypatch) -> None:
    """Measuring its cost again, a fold behind for PROBE_S folds the batch's first PROBE_EVENTS bulk events
    (here 3 of a batch of 10 all-reduces), not all of them: the rest are left out and counted."""
    monkeypatch.setattr(session_fold, "PROBE_S", 0.0)
    monkeypatch.setattr(session_fold, "PROBE_EVENTS", 3)
    run = description(dp=2)
    session = SessionFold(run, share=0.5)
    session.take(Arrivals(batches(0)[0]))
    session._cost_s = 1.0  # far too high: the next take is behind
    every = {"every_ns": 20 * MS}
    ten = [collective(rank, 0, 0.002, waited=True, **every) for rank in (0, 1) for _ in range(5)]
    assert sorted(session.take(Arrivals(ten)).left_out) == ["collective", "stage_action"]  # behind: all out
    probe = session.take(Arrivals(ten))  # behind for PROBE_S (0 s): measures again on 3 of them
    assert sorted(probe.left_out) == ["collective"]
    assert sum(len(table) for kind, table in probe.tables if kind == "collective") == 3
    assert session.left_out == {"collective": 10 + 7}
    assert session._cost_s < 1.0


def test_the_cost_a_fold_measures_counts_the_parse_on_arrows_threads() -> None:
    """A block parsed by Arrow's reader (past ARROW_JSON_FROM_BYTES) is parsed on Arrow's threads, outside
    the fold thread's CPU: the fold's cost counts the parse's wall time, so 20,000 collectives do not look
    free (counted by the thread's CPU alone, a thousand ranks' collectives were folded seconds at a time)."""
    run = description(dp=2)
    session = SessionFold(run)
    session.take(Arrivals(batches(0)[0]))
    every = {"every_ns": 20 * MS}
    many = [collective(rank % 2, 0, 0.002, waited=True, **every) for rank in range(20_000)]
    lines = encode_lines(many)
    assert len(lines) >= ARROW_JSON_FROM_BYTES
    began = time.perf_counter()
    session.take(Arrivals([EncodedEvents("collective", 0, lines, len(many))]))
    wall = time.perf_counter() - began
    assert session._spent[-1][1] >= 0.5 * wall  # the parse and the fold, not the fold's CPU alone


def test_blocks_past_decode_bytes_are_parsed_a_piece_at_a_time_into_the_same_rows(monkeypatch) -> None:
    """Three nodes' blocks, on their clocks, parsed whole and DECODE_BYTES at most at a time: the same rows."""
    every = {"every_ns": 20 * MS}
    blocks = [
        EncodedEvents(
            "collective",
            0,
            encode_lines([collective(rank, number, 0.002, waited=True, **every) for rank in (0, 1)]),
            2,
            node=node,
            offset_ns=node * 1_000,
        )
        for node in (1, 2, 3)
        for number in range(4)
    ]
    whole = pa.concat_tables(table for _, table in arrival_tables(Arrivals(blocks), {"collective"}))
    monkeypatch.setattr(session_fold, "DECODE_BYTES", 2 * len(blocks[0].lines))
    pieces = arrival_tables(Arrivals(blocks), {"collective"})
    assert len(pieces) > 1
    assert pa.concat_tables(table for _, table in pieces).equals(whole)
    last = collective(1, 3, 0.002, waited=True, **every)  # node 3's last, 3 us behind the head's clock
    assert whole.column("start_ns").to_pylist()[-1] == last.start_ns + 3_000


def phased_batches(steps: int) -> list[list[Event]]:
    """A dp2 job's batches, a step's events of both ranks in each: data 0-2 ms, forward 2-5, backward 5-9,
    optimizer 9-10 of a 10 ms step, the all-reduce waited 7-9 (2 ms of communication out of backward)."""
    out: list[list[Event]] = [[rank_started(0, world_size=2), rank_started(1, world_size=2, dp_rank=1)]]
    every = 20 * MS
    for number in range(steps):
        base = number * every
        windows = [("d", 0, 2), ("f", 2, 5), ("b", 5, 9), ("o", 9, 10)]
        phased = {
            "phases": "".join(letter for letter, _, _ in windows),
            "phase_start_ns": tuple(base + start * MS for _, start, _ in windows),
            "phase_end_ns": tuple(base + end * MS for _, _, end in windows),
        }
        out.append(
            [collective(rank, number, 0.002, waited=True, every_ns=every, offset_ns=7 * MS) for rank in (0, 1)]
            + [step(rank, number, 0.010, every_ns=every, **phased) for rank in (0, 1)]
        )
    return out


def test_steps_whose_collectives_a_live_fold_left_out_are_not_broken_down_nor_read_with_their_phases() -> None:
    """Batches 3 and 4 (steps 2 and 3) come without their all-reduces, left out to keep up. Step 4 began
    arriving in batch 4 too, so steps 2-4 close torn: counted, not in the breakdown or the stragglers' compute
    times (without the all-reduce, its 2 ms would count as backward), and the torn batches' steps are read
    without their phase times. Steps 0, 1 and 5 break down as a fold of everything does. A screen that takes
    the batches of every take at once gets each kind as one table (a step table read with its phase times and
    one read without them are one: a live screen's poll had failed on them)."""
    run = description(dp=2)
    whole, live = SessionFold(run), SessionFold(run)
    read_columns, to_screen = [], []
    for number, events in enumerate(phased_batches(6)):
        encoded = [
            EncodedEvents(
                kind, 0, encode_lines(e for e in events if e.kind == kind), sum(e.kind == kind for e in events)
            )
            for kind in dict.fromkeys(event.kind for event in events)
        ]
        whole.take(Arrivals(encoded))
        torn = number in (3, 4)
        kept = [item for item in encoded if not (torn and item.kind == "collective")]
        folded = live.take(Arrivals(kept), bulk_left_out=torn)
        read_columns += [set(table.column_names) for kind, table in folded.tables if kind == "step"]
        to_screen += screen_batches(Arrivals(kept), folded.tables, left_out=folded.left_out)
    for fold in (whole, live):
        fold.finish("completed")
    with_phases = [bool({"phase_start_ns", "phase_end_ns"} & columns) for columns in read_columns]
    assert with_phases == [True, True, False, False, True, True]
    everything, kept_whole = whole.figures().breakdown, live.figures().breakdown
    assert everything is not None and kept_whole is not None
    assert (whole.fold.closed_torn, live.fold.closed_torn) == (0, 3)
    assert (everything.steps, kept_whole.steps) == (12, 6)  # rank-steps
    for part, row in everything.parts.items():
        assert kept_whole.parts[part] == pytest.approx(row), part
    assert kept_whole.parts["communication"]["s_per_step"] == pytest.approx(0.002)
    assert [len(times) for times in live.fold.compute.recent.values()] == [3, 3]
    state = DashboardState(run, session=live)
    screen = dict(in_kind_order(to_screen))
    assert screen["step"].num_rows == 12 and screen["step"].column("phase_start_ns").null_count == 4
    for kind, table in screen.items():
        state.apply(kind, table)
    assert sorted(state.ranks) == [0, 1]
    state.coalesced = 4  # the all-reduces left out, as the live source counts them
    assert any(alert.text.startswith("3 steps not broken down live") for alert in alerts_of(state))
    assert [len(times) for times in whole.fold.compute.recent.values()] == [min(6, WINDOW)] * 2
