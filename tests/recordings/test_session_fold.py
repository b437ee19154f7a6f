"""One fold per session: the session's batches are folded once, and the manifest's step count, ``/metrics``, the
dashboard and the console's figures are all read from that fold; readers take steps by position, so none
takes a step from another; a reader on another thread never sees a batch half folded."""

from __future__ import annotations

import threading
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
from meshtop.recordings.recorder import Ending, SessionRecorder
from meshtop.recordings.replay import in_kind_order
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
    assert state.fold is session.fold
    assert [s.step for s in state.steps] == [0, 1, 2, 3, 4] and state.steps_done == 5
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
