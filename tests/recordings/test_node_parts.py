"""What another node streams reaches the head unread, on that node's clock, and every reader puts it on the
head's: the live fold, a recording still being written (or killed), and the compacted recording."""

from __future__ import annotations

import functools
import socket
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from meshtop.probes.arrivals import Arrivals, EncodedEvents, encode_lines
from meshtop.probes.collector import Collector
from meshtop.probes.events import Event, StepTiming, on_node
from meshtop.probes.kinds import FOLDED_KINDS, PROGRESS_KINDS
from meshtop.probes.wire import FrameError, event_sections, pack, sections
from meshtop.recordings import tables
from meshtop.recordings.events_log import EVENTS_DIR, EventWriter
from meshtop.recordings.manifest import Manifest
from meshtop.recordings.node_parts import COMPRESS_FROM_BYTES, part_name
from meshtop.recordings.reader import open_recording
from meshtop.recordings.recorder import Ending, SessionRecorder
from meshtop.recordings.schema import events_of
from meshtop.recordings.session_fold import SessionFold, arrival_tables
from meshtop.recordings.tables import compact
from tests.kit import events
from tests.kit.recordings import fleet_description, write_recording

OFFSET = -5_000_000_000
"""Node 1's clock is 5 s ahead of the head's."""


def node_events() -> list[Event]:
    """What node 1 reports, on its clock: its ranks' steps and collectives (tuples of times included), and a
    sample of its GPU (a kind that names its node)."""
    return [
        events.step(2, 1, start_ns=20_000_000_000, phase_start_ns=(20_000_000_000, 20_100_000_000)),
        events.step(3, 1, start_ns=20_000_000_001),
        events.collective(2, 1, every_ns=20_000_000_000, waited=True),
        events.gpu_sample(gpu=0, wall_ns=20_000_000_002, utilization_pct=50.0),
    ]


def streamed(items: list[Event], offset_ns: int = OFFSET) -> list[EncodedEvents]:
    """``items`` as the head's collector takes them from node 1's relay: blocks, with the node's offset."""
    listed, body = event_sections(items)
    header = {"token": "t", "rank": 0, "dropped": 0, "node": 1, "offset_ns": offset_ns, "sections": listed}
    return sections(header, body)


def on_head(items: list[Event]) -> list[Event]:
    return [on_node(event, offset_ns=OFFSET, node=1) for event in items]


def by_kind(items: list[Event]) -> dict[str, list[Event]]:
    grouped: dict[str, list[Event]] = {}
    for event in items:
        grouped.setdefault(event.kind, []).append(event)
    return grouped


def test_a_nodes_blocks_decode_onto_the_heads_clock_as_events_and_as_tables() -> None:
    blocks = streamed(node_events())
    assert {(block.node, block.offset_ns) for block in blocks} == {(1, OFFSET)}
    decoded_events = [event for block in blocks for event in block.events()]
    assert sorted(map(repr, decoded_events)) == sorted(map(repr, on_head(node_events())))
    tables = arrival_tables(Arrivals(blocks), {"step", "collective", "gpu"})
    decoded = {kind: events_of(kind, table) for kind, table in tables}
    assert decoded == by_kind(on_head(node_events()))
    assert decoded["gpu"][0].node == 1 and decoded["step"][0].phase_start_ns == (15_000_000_000, 15_100_000_000)


def test_a_node_that_sends_a_bad_offset_is_refused() -> None:
    listed, body = event_sections([events.step(2, 1)])
    for offset in (1.5, 10**16, True):
        header = {"token": "t", "rank": 0, "dropped": 0, "node": 1, "offset_ns": offset, "sections": listed}
        try:
            sections(header, body)
        except FrameError as error:
            assert "offset" in str(error)
        else:
            raise AssertionError(f"offset {offset!r} was taken")


def test_the_heads_collector_tags_a_nodes_blocks_with_its_clock() -> None:
    collector = Collector(nodes=(1,), on_control=lambda header, connection: {}).start()
    try:
        listed, body = event_sections(node_events())
        header = {"token": collector.token, "rank": 0, "dropped": 0, "node": 1, "offset_ns": OFFSET}
        with socket.create_connection(collector.address, timeout=5) as sock:
            sock.sendall(pack({**header, "sections": listed}, body))
        deadline, taken = time.monotonic() + 5, []
        while time.monotonic() < deadline and sum(item.count for item in taken) < 4:  # type: ignore[union-attr]
            taken += collector.drain()
            time.sleep(0.01)
        assert {(item.node, item.offset_ns) for item in taken} == {(1, OFFSET)}  # type: ignore[union-attr]
    finally:
        collector.stop()


def test_a_recording_keeps_a_nodes_blocks_as_they_came_and_reads_them_on_the_heads_clock(tmp_path: Path) -> None:
    head = [events.step(0, 1, start_ns=15_000_000_000), events.step(1, 1, start_ns=15_000_000_000)]
    directory = write_recording(tmp_path / "rec", head, run=fleet_description(4, 2), status="running")
    writer = EventWriter(directory)
    writer.write(streamed(node_events()))
    writer.write(streamed([events.step(2, 2, start_ns=21_000_000_000)], offset_ns=OFFSET + 7))
    writer.close()
    part = directory / EVENTS_DIR / part_name(1)
    assert part.exists() and encode_lines(node_events()[:2]) in part.read_bytes()  # as they came, on node 1's clock
    with part.open("ab") as file:  # killed while writing a frame
        file.write(b'{"kind":"step","count":3,"bytes":500,"offset_ns":0}\n{"rank":9')
    live = open_recording(directory)
    steps = sorted(events_of("step", live.arrow("step")), key=lambda e: (e.step, e.rank))  # type: ignore[attr-defined]
    assert [(e.rank, e.step, e.start_ns) for e in steps] == [  # type: ignore[attr-defined]
        (0, 1, 15_000_000_000),
        (1, 1, 15_000_000_000),
        (2, 1, 15_000_000_000),
        (3, 1, 15_000_000_001),
        (2, 2, 16_000_000_007),
    ]
    assert "gpu" in live.kinds() and events_of("gpu", live.arrow("gpu"))[0].node == 1  # type: ignore[attr-defined]
    assert any("3 event(s) in a frame cut short" in problem for problem in live.problems)
    compact(directory)
    assert not part.exists()
    closed = open_recording(directory)
    for kind in ("step", "collective", "gpu"):
        assert sorted(map(repr, events_of(kind, closed.arrow(kind)))) == sorted(
            map(repr, events_of(kind, live.arrow(kind)))
        )


@pytest.mark.parametrize("kinds", [PROGRESS_KINDS, FOLDED_KINDS], ids=["headless", "folded"])
def test_the_manifest_lists_each_nodes_gpus_from_their_samples(kinds: frozenset[str], tmp_path: Path) -> None:
    """The head's own GPU and node 1's two (streamed), each once, as first sampled; whether the session's fold
    reads the samples (a dashboard) or not (a headless ``record``)."""
    run = fleet_description(4, 2)
    recorder = SessionRecorder(SessionFold(run, kinds=kinds), tmp_path, Manifest(run=run))
    sample = functools.partial(events.gpu_sample, name="NVIDIA H200", memory_total_bytes=141 << 30)
    recorder.take(Arrivals([sample(gpu=0, wall_ns=1), *streamed([sample(gpu=0), sample(gpu=1)])]))
    recorder.take(Arrivals(streamed([sample(gpu=1, memory_total_bytes=1), sample(gpu=2, power_limit_w=700.0)])))
    recorder.close(Ending(status="completed", duration_s=1.0))
    manifest = open_recording(tmp_path).manifest
    assert [(g.node, g.gpu, g.memory_total_bytes, g.power_limit_w) for g in manifest.gpus] == [
        (0, 0, 141 << 30, None),
        (1, 0, 141 << 30, None),
        (1, 1, 141 << 30, None),
        (1, 2, 141 << 30, 700.0),
    ]
    assert [(n.node, n.gpus) for n in manifest.nodes] == [(0, (0,)), (1, (0, 1, 2))]


@pytest.mark.parametrize("bad_line", [False, True], ids=["parsed together", "a bad line: parsed apart"])
def test_every_nodes_blocks_of_a_kind_land_each_on_its_own_clock(bad_line: bool) -> None:
    local = [events.step(0, 1, start_ns=1000), events.step(1, 1, start_ns=1001)]
    first, second = (
        [events.step(2, 1, start_ns=2000)],
        [events.step(3, 1, start_ns=3000, phase_start_ns=(3000, 3010)), events.step(4, 1, start_ns=3001)],
    )
    blocks = [EncodedEvents("step", 0, encode_lines(local), 2)]
    for node, offset, items in ((1, -500, first), (2, 70, second)):
        (block,) = streamed(items, offset_ns=offset)
        blocks.append(EncodedEvents("step", 0, block.lines, block.count, node=node, offset_ns=offset))
    if bad_line:
        blocks[1] = EncodedEvents("step", 0, blocks[1].lines + b"not json\n", 2, node=1, offset_ns=-500)
    tables = arrival_tables(Arrivals(blocks), {"step"})
    steps: list[StepTiming] = [e for _, table in tables for e in events_of("step", table)]  # type: ignore[misc]
    assert sorted((e.rank, e.start_ns) for e in steps) == [(0, 1000), (1, 1001), (2, 1500), (3, 3070), (4, 3071)]
    phases = {e.rank: e.phase_start_ns for e in steps}
    assert phases[3] == (3070, 3080) and phases[4] == ()


def test_several_nodes_blocks_alone_are_moved_at_once_each_row_by_its_nodes_offset() -> None:
    """No block of this machine's among them: the rows of every node are moved in one go (an offset a row)."""
    nodes = {
        1: (-500, [events.step(2, 1, start_ns=2000, phase_start_ns=(2000, 2005))]),
        2: (70, [events.step(3, 1, start_ns=3000, phase_start_ns=(3000, 3010)), events.step(4, 1, start_ns=3001)]),
        3: (0, [events.step(5, 1, start_ns=4000, phase_start_ns=(4000,))]),
    }
    blocks = []
    for node, (offset, items) in nodes.items():
        (block,) = streamed(items, offset_ns=offset)
        blocks.append(EncodedEvents("step", 0, block.lines, block.count, node=node, offset_ns=offset))
    tables = arrival_tables(Arrivals(blocks), {"step"})
    assert len(tables) == 1
    steps: list[StepTiming] = list(events_of("step", tables[0][1]))  # type: ignore[arg-type]
    assert [(e.rank, e.start_ns, e.phase_start_ns) for e in steps] == [
        (2, 1500, (1500, 1505)),
        (3, 3070, (3070, 3080)),
        (4, 3071, ()),
        (5, 4000, (4000,)),
    ]
    samples = [events.gpu_sample(gpu=0, wall_ns=100), events.gpu_sample(gpu=1, wall_ns=200)]
    blocks = [
        EncodedEvents("gpu", 0, encode_lines([sample]), 1, node=node, offset_ns=offset)
        for sample, (node, offset) in zip(samples, ((1, 10), (2, 20)), strict=True)
    ]
    ((_, table),) = arrival_tables(Arrivals(blocks), {"gpu"})
    assert table.column("node").to_pylist() == [1, 2]
    assert table.column("wall_ns").to_pylist() == [110, 220]


def big_block(first_step: int, steps: int, offset_ns: int = OFFSET) -> list[EncodedEvents]:
    """Node 1's collectives of ``steps`` steps from ``first_step``: one block past COMPRESS_FROM_BYTES."""
    made = [
        events.collective(rank, step, 0.002, every_ns=20_000_000)
        for step in range(first_step, first_step + steps)
        for rank in (2, 3)
    ]
    return streamed(made, offset_ns=offset_ns)


def test_a_big_block_is_kept_compressed_and_read_back_line_for_line(tmp_path: Path) -> None:
    """Node 1's 400 collectives (past COMPRESS_FROM_BYTES) are kept as LZ4 in its part, a small block as it
    came; the recording still being written and the compacted one read the same events, on the head's clock."""
    directory = write_recording(tmp_path / "rec", [], run=fleet_description(4, 2), status="running")
    (block,) = big_block(0, 200)
    assert len(block.lines) >= COMPRESS_FROM_BYTES
    writer = EventWriter(directory)
    writer.write([block, *streamed([events.step(2, 1, start_ns=21_000_000_000)])])
    writer.close()
    part = (directory / EVENTS_DIR / part_name(1)).read_bytes()
    assert b'"codec":"lz4"' in part and block.lines not in part and len(part) < len(block.lines) / 3
    assert encode_lines([events.step(2, 1, start_ns=21_000_000_000)]) in part  # small: as it came
    ((_, table),) = arrival_tables(Arrivals([block]), {"collective"})  # on the head's clock, as the live fold
    want = sorted(map(repr, events_of("collective", table)))
    live = open_recording(directory)
    assert not live.problems
    assert sorted(map(repr, events_of("collective", live.arrow("collective")))) == want
    compact(directory)
    assert sorted(map(repr, events_of("collective", open_recording(directory).arrow("collective")))) == want


def test_a_compressed_frame_whose_bytes_are_damaged_is_counted_lost_and_the_next_ones_read(tmp_path: Path) -> None:
    directory = write_recording(tmp_path / "rec", [], run=fleet_description(4, 2), status="running")
    writer = EventWriter(directory)
    writer.write(big_block(0, 200))
    writer.write(big_block(200, 100))
    writer.close()
    path = directory / EVENTS_DIR / part_name(1)
    data = bytearray(path.read_bytes())
    body = data.index(b"\n") + 1
    data[body + 100 : body + 400] = bytes(300)  # inside the first frame's compressed bytes
    path.write_bytes(bytes(data))
    live = open_recording(directory)
    steps = {e.step for e in events_of("collective", live.arrow("collective"))}  # type: ignore[attr-defined]
    assert sorted(steps) == list(range(200, 300))
    assert any("400 event(s) in a frame cut short or damaged" in problem for problem in live.problems)


def test_a_clean_close_merges_a_few_blocks_at_a_time_never_across_a_clock_change_in_whole_row_groups(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The close writes a kind as it reads it (a thousand ranks' parts do not fit in memory), merging a run of
    frames of one clock offset up to a limit. Node 1's 700 collectives come in 7 frames of 50 steps (ranks 2
    and 3), its clock moved by 1 ms after the third; the limit is just over the first three frames' lines, so
    the clock's change, not the limit, ends the first run (frames 0-2), the limit the second (3-5). Each row
    is on its own frame's clock: collective ``step`` starts at ``step * 20 ms`` on node 1's clock and lasts
    2 ms; steps 0-149 move by -5 s, steps 150-349 by -5 s + 1 ms = -4.999 s. Row groups of 150 rows."""
    monkeypatch.setattr(tables, "ROW_GROUP_ROWS", 150)
    frames = [big_block(50 * n, 50, offset_ns=OFFSET if n < 3 else OFFSET + 1_000_000)[0] for n in range(7)]
    first_three = sum(len(frame.lines) for frame in frames[:3])
    monkeypatch.setattr(tables, "MERGE_BLOCK_BYTES", first_three + 1)
    assert sum(len(frame.lines) for frame in frames[3:6]) > first_three  # the limit ends the second run
    directory = write_recording(tmp_path / "rec", [], run=fleet_description(4, 2), status="running")
    writer = EventWriter(directory)
    for frame in frames:
        writer.write([frame])
    writer.close()

    def shift(step: int) -> int:
        return -5_000_000_000 if step < 150 else -4_999_000_000

    want = [
        (rank, step, step * 20_000_000 + shift(step), step * 20_000_000 + 2_000_000 + shift(step))
        for step in range(350)
        for rank in (2, 3)
    ]
    assert want[298:302] == [  # the last rows of the old clock, the first of the new
        (2, 149, -2_020_000_000, -2_018_000_000),  # 149 * 20 ms = 2.98 s, - 5 s
        (3, 149, -2_020_000_000, -2_018_000_000),
        (2, 150, -1_999_000_000, -1_997_000_000),  # 150 * 20 ms = 3 s, - 4.999 s
        (3, 150, -1_999_000_000, -1_997_000_000),
    ]

    def rows(merged: list[Event]) -> list[tuple[int, int, int, int]]:
        return [(e.rank, e.step, e.start_ns, e.end_ns) for e in merged]  # type: ignore[attr-defined]

    live = open_recording(directory)
    assert not live.problems
    assert sorted(rows(events_of("collective", live.arrow("collective")))) == sorted(want)
    compact(directory)
    path = directory / EVENTS_DIR / "collective.parquet"
    file = pq.ParquetFile(path)
    assert [file.metadata.row_group(i).num_rows for i in range(file.metadata.num_row_groups)] == [150] * 4 + [100]
    assert rows(events_of("collective", open_recording(directory).arrow("collective"))) == want  # as written
    assert not (directory / EVENTS_DIR / part_name(1)).exists()
