"""Following a recording as its writer appends to it (:mod:`meshtop.recordings.follow`): real files, written
as the event log writes them, read between and across the writer's writes."""

from __future__ import annotations

from pathlib import Path

from meshtop.probes.arrivals import EncodedEvents, encode_lines
from meshtop.probes.events import StepTiming
from meshtop.recordings.events_log import EVENTS_DIR, EventWriter
from meshtop.recordings.follow import RecordingTail
from meshtop.recordings.tables import compact


def step(rank: int, number: int) -> StepTiming:
    return StepTiming(rank=rank, step=number, start_ns=1_000 * number, duration_s=0.5, tokens=64, loss=2.0)


def steps_read(batches: list) -> list[tuple[int, int]]:  # type: ignore[type-arg]
    return [
        (rank, number)
        for kind, table in batches
        if kind == "step"
        for rank, number in zip(table.column("rank").to_pylist(), table.column("step").to_pylist(), strict=True)
    ]


def test_each_read_gives_what_was_written_since_the_last_once(tmp_path: Path) -> None:
    writer = EventWriter(tmp_path)
    tail = RecordingTail(tmp_path)
    assert tail.read() == []
    writer.write([step(0, 0), step(1, 0)])
    assert steps_read(tail.read()) == [(0, 0), (1, 0)]
    assert tail.read() == []
    writer.write([step(0, 1)])
    writer.write([step(1, 1)])
    assert steps_read(tail.read()) == [(0, 1), (1, 1)]
    assert tail.lost == 0


def test_a_line_cut_short_by_a_write_in_flight_is_read_whole_later_and_never_counted_lost(tmp_path: Path) -> None:
    (tmp_path / EVENTS_DIR).mkdir()
    path = tmp_path / EVENTS_DIR / "step.jsonl"
    lines = encode_lines([step(0, 0), step(0, 1)])
    cut = len(encode_lines([step(0, 0)])) + 7  # the second line's first 7 bytes
    path.write_bytes(lines[:cut])
    tail = RecordingTail(tmp_path)
    assert steps_read(tail.read()) == [(0, 0)]
    with path.open("ab") as file:
        file.write(lines[cut:])
    assert steps_read(tail.read()) == [(0, 1)]
    assert tail.lost == 0


def test_at_the_writers_end_a_line_still_cut_short_is_counted_lost(tmp_path: Path) -> None:
    (tmp_path / EVENTS_DIR).mkdir()
    lines = encode_lines([step(0, 0), step(0, 1)])
    (tmp_path / EVENTS_DIR / "step.jsonl").write_bytes(lines[:-3])
    tail = RecordingTail(tmp_path)
    assert steps_read(tail.read(to_end=True)) == [(0, 0)]
    assert tail.lost == 1


def test_a_damaged_line_is_counted_and_the_lines_around_it_are_read(tmp_path: Path) -> None:
    (tmp_path / EVENTS_DIR).mkdir()
    body = encode_lines([step(0, 0)]) + b"{not json\n" + encode_lines([step(0, 1)])
    (tmp_path / EVENTS_DIR / "step.jsonl").write_bytes(body)
    tail = RecordingTail(tmp_path)
    assert steps_read(tail.read()) == [(0, 0), (0, 1)]
    assert tail.lost == 1


def test_a_read_takes_at_most_its_bytes_and_the_next_goes_on(tmp_path: Path) -> None:
    writer = EventWriter(tmp_path)
    steps = [step(0, n) for n in range(100)]
    writer.write(steps)
    tail = RecordingTail(tmp_path, read_bytes=len(encode_lines(steps[:10])) + 5)  # ten lines and a piece of one
    first = steps_read(tail.read())
    assert first == [(0, n) for n in range(10)]
    read = list(first)
    while got := steps_read(tail.read()):
        read += got
    assert read == [(0, n) for n in range(100)]


def test_lines_compacted_away_after_the_first_read_are_still_read_to_their_end(tmp_path: Path) -> None:
    writer = EventWriter(tmp_path)
    writer.write([step(0, 0)])
    tail = RecordingTail(tmp_path)
    assert steps_read(tail.read()) == [(0, 0)]
    writer.write([step(0, 1), step(0, 2)])
    writer.close()
    compact(tmp_path)  # the clean close: the lines become Parquet and are removed
    assert not (tmp_path / EVENTS_DIR / "step.jsonl").exists()
    assert steps_read(tail.read(to_end=True)) == [(0, 1), (0, 2)]


def test_a_kind_compacted_before_it_was_found_is_read_from_its_table_at_the_end(tmp_path: Path) -> None:
    writer = EventWriter(tmp_path)
    writer.write([step(0, 0), step(0, 1)])
    writer.close()
    compact(tmp_path)
    tail = RecordingTail(tmp_path)
    assert tail.read() == []  # while the writer lives, only its lines are followed
    assert steps_read(tail.read(to_end=True)) == [(0, 0), (0, 1)]


def test_another_nodes_frames_are_read_whole_and_moved_onto_the_heads_clock(tmp_path: Path) -> None:
    writer = EventWriter(tmp_path)
    lines = encode_lines([step(8, 0), step(9, 0)])
    writer.write([EncodedEvents("step", 8, lines, 2, node=1, offset_ns=500)])
    part = tmp_path / EVENTS_DIR / "node1.frames"
    whole = part.read_bytes()
    tail = RecordingTail(tmp_path)
    part.write_bytes(whole[:-4])  # the frame's last bytes not yet written
    assert tail.read() == []
    with part.open("ab") as file:
        file.write(whole[-4:])
    batches = tail.read()
    assert steps_read(batches) == [(8, 0), (9, 0)]
    table = batches[0][1]
    assert table.column("start_ns").to_pylist() == [500, 500]  # 0 on node 1's clock, 500 ns behind the head's
    assert tail.lost == 0
