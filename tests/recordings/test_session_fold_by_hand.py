"""A session's batches read into tables, worked by hand: the pieces :data:`DECODE_BYTES` cuts, the columns a torn
batch is read without, each clock's rows moved by its own offset (and this machine's left as they are), blocks
whose counts are not their lines read apart, a kind not read passed over; and a session that ends without an
end event still fails the requests it never served."""

from __future__ import annotations

import copy

import pyarrow as pa
import pytest

from meshtop.probes.arrivals import Arrivals, EncodedEvents, encode_lines
from meshtop.probes.events import Event
from meshtop.recordings import session_fold
from meshtop.recordings.metrics.steps import PHASE_TIMES
from meshtop.recordings.replay import in_kind_order
from meshtop.recordings.schema import tables_of
from meshtop.recordings.session_fold import SessionFold, arrival_tables
from tests.kit.events import rank_progress, rank_started, step
from tests.kit.recordings import description
from tests.recordings.test_session_fold import batches, phased_batches

MS = 1_000_000
WITHOUT_PHASES = {"step": frozenset(PHASE_TIMES)}


def block(
    events: list[Event], *, node: int | None = None, offset_ns: int = 0, bad: bytes = b"", count: int = 0
) -> EncodedEvents:
    """``events`` as one rank's block (``bad``: lines after them that are no event; ``count``: what the block
    says it holds, its events where 0), streamed from ``node`` with its clock ``offset_ns`` behind."""
    lines = encode_lines(events) + bad
    return EncodedEvents(events[0].kind, 0, lines, count or len(events), node=node, offset_ns=offset_ns)


def phased_step(number: int) -> Event:
    """Rank 0's step ``number``, 10 ms from 1 s + 20 ms a step, forward its first 5 ms (lines of one length)."""
    start = 1_000_000_000 + number * 20 * MS
    return step(0, number, 0.010, start_ns=start, phases="f", phase_start_ns=(start,), phase_end_ns=(start + 5 * MS,))


def rows(batches: list[tuple[str, pa.Table]]) -> list[tuple[int, int, int]]:
    """(rank, wall_ns, node) of every rank_started row, table after table."""
    out = []
    for _, table in batches:
        columns = table.select(["rank", "wall_ns", "node"]).to_pydict()
        out += list(zip(columns["rank"], columns["wall_ns"], columns["node"], strict=True))
    return out


def test_blocks_of_exactly_decode_bytes_are_one_piece_and_every_piece_is_read_without_the_columns_asked(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Four blocks of L bytes on this machine's clock, DECODE_BYTES = 2L: blocks 1-2 fill the first piece
    exactly (2L is not past 2L), block 3 would pass it, so blocks 3-4 are the second: two tables of two steps,
    each read without the phase times."""
    blocks = [block([phased_step(number)]) for number in range(4)]
    assert len({len(item.lines) for item in blocks}) == 1
    monkeypatch.setattr(session_fold, "DECODE_BYTES", 2 * len(blocks[0].lines))
    tables = arrival_tables(Arrivals(blocks), {"step"}, WITHOUT_PHASES)
    assert [(kind, table.column("step").to_pylist()) for kind, table in tables] == [("step", [0, 1]), ("step", [2, 3])]
    assert all(set(PHASE_TIMES).isdisjoint(table.column_names) for _, table in tables)


def test_several_nodes_blocks_read_at_once_leave_out_the_columns_asked_and_move_each_by_its_offset() -> None:
    tables = arrival_tables(
        Arrivals([block([phased_step(0)], node=1, offset_ns=1_000), block([phased_step(1)], node=2, offset_ns=2_000)]),
        {"step"},
        WITHOUT_PHASES,
    )
    [(_, table)] = tables
    assert set(PHASE_TIMES).isdisjoint(table.column_names)
    assert table.column("start_ns").to_pylist() == [1_000_000_000 + 1_000, 1_020_000_000 + 2_000]


def test_this_machines_rows_keep_their_node_and_time_beside_a_nodes_moved_rows() -> None:
    """Rank 0 runs here (node 0, at 100 ns); rank 1's start comes from node 1, whose clock is 1,000 ns behind."""
    here = block([rank_started(0, wall_ns=100, node=0)])
    there = block([rank_started(1, wall_ns=100, node=1)], node=1, offset_ns=1_000)
    assert rows(arrival_tables(Arrivals([here, there]), {"rank_started"})) == [(0, 100, 0), (1, 1_100, 1)]


def test_blocks_whose_lines_are_not_their_counts_are_each_read_on_their_own_clock() -> None:
    """Rows cannot be dealt to blocks by their counts when a line is bad or a count is not its lines: each
    clock's blocks are read apart. Node 1's clock is 1,000 ns behind, node 2's 2,000."""
    bad = b"not an event\n"
    # every block a node's, one line bad: node 1 gives rank 0 at 1,100, node 2 rank 1 at 2,100
    nodes = [
        block([rank_started(0, wall_ns=100)], node=1, offset_ns=1_000, bad=bad),
        block([rank_started(1, wall_ns=100)], node=2, offset_ns=2_000),
    ]
    assert rows(arrival_tables(Arrivals(nodes), {"rank_started"})) == [(0, 1_100, 1), (1, 2_100, 2)]
    # no line bad, but this machine's block says 2 and holds 1: rank 1's start is still node 1's, moved
    miscounted = [
        block([rank_started(0, wall_ns=100)], count=2),
        block([rank_started(1, wall_ns=100)], node=1, offset_ns=1_000),
    ]
    assert rows(arrival_tables(Arrivals(miscounted), {"rank_started"})) == [(0, 100, 0), (1, 1_100, 1)]
    # as many rows as the counts say, by chance: here 2 lines counted 1, node 1 a line and a bad one counted 2
    by_chance = [
        block([rank_started(0, wall_ns=100), rank_started(2, wall_ns=100)], count=1),
        block([rank_started(1, wall_ns=100)], node=1, offset_ns=1_000, bad=bad, count=2),
    ]
    assert rows(arrival_tables(Arrivals(by_chance), {"rank_started"})) == [(0, 100, 0), (2, 100, 0), (1, 1_100, 1)]


def test_a_kind_not_read_is_passed_over_and_what_follows_it_is_read() -> None:
    tables = arrival_tables(Arrivals([rank_progress(0), step(0, 0)]), {"step"})
    assert [(kind, table.num_rows) for kind, table in tables] == [("step", 1)]


def test_a_session_that_ends_without_an_end_event_fails_the_requests_it_never_served() -> None:
    """The built-in load of 64 requests, none reported, the session broke ("failed"): all 64 failed, not served."""
    session = SessionFold(description(mode="infer", dp=1))
    session.finish("failed")
    figures = session.figures().requests
    assert figures is not None
    assert figures.failures == (("not served: the job ended failed first", 64),)


def test_a_copy_folds_on_its_own_from_the_steps_the_session_had_taken() -> None:
    """A dp-2 session took the starts and steps 0 and 1 (5 batches), and left 4 all-reduces out. Its copy (as a
    replay keeps to seek back to) has its kinds and counts, a lock of its own, and is the copy of the same
    session wherever it was referred to; it folds on alone: rank 1's step 2 completes step 2 in the copy, which
    reports only that step, and the session stays at 2 steps and 4 left out."""
    session = SessionFold(description(dp=2))
    given = batches(3)
    for events in given[:5]:
        session.take(Arrivals(events))
    session.left_out["collective"] = 4
    copied, fold = copy.deepcopy((session, session.fold))
    assert fold is copied.fold and copied.kinds == session.kinds and copied.lock is not session.lock
    assert copied.take(Arrivals(given[5])).steps == []
    assert [step.step for step in copied.take(Arrivals(given[6])).steps] == [2]
    copied.left_out["collective"] += 1
    assert (copied.steps_completed, copied.left_out) == (3, {"collective": 5})
    assert (session.steps_completed, session.left_out) == (2, {"collective": 4})


def test_tables_taken_as_they_are_are_whole_unless_said_torn() -> None:
    """A replay's slices (tables given, not a live batch): by default nothing is torn, so the 4 closed steps of
    phased_batches(4) all break down (2 ranks each: 8 rank-steps)."""
    session = SessionFold(description(dp=2))
    for events in phased_batches(4):
        session.take_tables(in_kind_order(tables_of(events)))
    session.finish("completed")
    breakdown = session.figures().breakdown
    assert session.fold.closed_torn == 0 and breakdown is not None and breakdown.steps == 8
