"""The telemetry stream: shipper to collector, with tokens, limits and counted drops."""

from __future__ import annotations

import json
import random
import socket
import struct
import time

import pytest

from meshtop.probes import collector as collector_module
from meshtop.probes.arrivals import Arrivals, EncodedEvents, encode_lines
from meshtop.probes.collector import Collector
from meshtop.probes.events import CollectiveTiming, EventsDropped, StepTiming
from meshtop.probes.shipper import EventShipper
from meshtop.probes.wire import HEADER, MAX_FRAME_BYTES, FrameError, pack, read_frame, sections
from tests.kit.events import collective, step
from tests.kit.wire import encode_events


def wait_for(collector: Collector, count: int, timeout_s: float = 10.0) -> list:
    """The events received (decoded) once ``count`` came, or at the timeout."""
    arrivals, deadline = Arrivals(), time.monotonic() + timeout_s
    while arrivals.count < count and time.monotonic() < deadline:
        arrivals.items.extend(collector.drain())
        time.sleep(0.02)
    return arrivals.events()


@pytest.fixture
def collector():
    running = Collector().start()
    yield running
    running.stop()


def test_collector_binds_to_loopback_by_default(collector: Collector) -> None:
    assert collector.address[0] == "127.0.0.1"
    assert len(collector.token) >= 32


def test_events_shipped_from_two_ranks_arrive_whole(collector: Collector) -> None:
    shippers = [EventShipper(address=collector.address, token=collector.token, rank=r) for r in range(2)]
    for number in range(500):
        for rank, shipper in enumerate(shippers):
            shipper.emit(step(rank, number))
    for shipper in shippers:
        shipper.close()
    received = wait_for(collector, 1000)
    assert len(received) == 1000
    assert sorted((e.rank, e.step) for e in received) == [(r, n) for r in range(2) for n in range(500)]
    assert collector.counts.bad_token == collector.counts.malformed == 0


def test_full_worker_buffer_drops_are_counted_and_reported(collector: Collector) -> None:
    shipper = EventShipper(address=collector.address, token=collector.token, rank=3, capacity=100)
    for number in range(1000):  # far faster than the 250 ms shipping period
        shipper.emit(step(3, number))
    shipper.close()
    received = wait_for(collector, 101)
    steps = [e for e in received if isinstance(e, StepTiming)]
    drops = [e for e in received if isinstance(e, EventsDropped)]
    assert len(steps) + sum(d.count for d in drops) == 1000
    assert len(steps) >= 100
    assert all(d.rank == 3 and d.where == "worker" for d in drops)


def test_events_already_written_as_lines_are_shipped_as_they_are_beside_the_others(collector: Collector) -> None:
    # The C++ collective probe hands the shipper blocks of JSON lines: more of them than one frame holds,
    # and one the buffer has no room for (counted as dropped, not sent).
    blocks = [[collective(5, 1_000 * b + n) for n in range(count)] for b, count in enumerate((12_000, 9_000, 9_000))]
    lines = [encode_lines(block) for block in blocks]
    one_too_many = encode_lines(blocks[0][:5_000])
    shipper = EventShipper(address=collector.address, token=collector.token, rank=5, capacity=30_003)
    for number in range(3):
        shipper.emit(step(5, number))
    for block, encoded in zip(blocks, lines, strict=True):  # well within one shipping period
        shipper.emit_lines("collective", encoded, len(block))
    shipper.emit_lines("collective", one_too_many, 5_000)  # 35,003 held > capacity (a block counts its events)
    shipper.close()
    received = wait_for(collector, 30_003 + 1)
    assert sorted(e.step for e in received if isinstance(e, StepTiming)) == [0, 1, 2]
    assert [e for e in received if isinstance(e, CollectiveTiming)] == [e for block in blocks for e in block]
    assert sum(e.count for e in received if isinstance(e, EventsDropped)) == 5_000


def test_shipper_without_collector_never_blocks_the_caller() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # nothing listens there once closed
    shipper = EventShipper(address=("127.0.0.1", port), token="x", rank=0, capacity=1000)
    started = time.perf_counter()
    for number in range(5000):
        shipper.emit(step(0, number))
    assert time.perf_counter() - started < 1.0
    shipper.close()
    assert shipper.dropped >= 4000


def raw_send(address: tuple[str, int], data: bytes) -> None:
    with socket.create_connection(address, timeout=5) as sock:
        sock.sendall(data)
        time.sleep(0.05)


def test_bad_token_malformed_and_oversized_messages_are_rejected_and_counted(collector: Collector) -> None:
    good = [step(0, 1)]
    lines = encode_lines(good)
    raw_send(collector.address, encode_events(token="wrong", rank=0, dropped=0, events=good))
    raw_send(collector.address, pack({"token": None, "rank": 0, "sections": []}))
    raw_send(collector.address, HEADER.pack(12) + b"not json!!!\n")
    raw_send(collector.address, HEADER.pack(MAX_FRAME_BYTES + 1) + b"x" * 100)
    raw_send(collector.address, pack({"token": collector.token, "rank": 0, "sections": "nope"}))
    raw_send(collector.address, pack({"token": collector.token, "rank": 0, "sections": [["martian", 1, 10]]}))
    raw_send(collector.address, pack({"token": collector.token, "rank": 0, "sections": [[["step"], 1, 10]]}))
    raw_send(
        collector.address, pack({"token": collector.token, "rank": 0, "sections": [["step", 2, len(lines)]]}, lines)
    )  # says 2 events, holds 1
    raw_send(
        collector.address,
        pack({"token": collector.token, "rank": 0, "sections": [["step", 1, len(lines)]]}, lines + b"trailing"),
    )
    raw_send(collector.address, encode_events(token=collector.token, rank=0, dropped=0, events=good))
    received = wait_for(collector, 1)
    time.sleep(0.2)
    counts = collector.counts
    assert (counts.bad_token, counts.oversized) == (2, 1)
    assert counts.malformed == 6
    assert [(e.rank, e.step) for e in received] == [(0, 1)]


def test_events_that_do_not_decode_are_counted_where_they_are_decoded() -> None:
    lines = (
        encode_lines([step(0, 1)])
        + b'{"kind":"step","rank":0}\n{"kind":"martian"}\n7\nnot json\n'
        + encode_lines([step(0, 2)])
        + encode_lines([EventsDropped(wall_ns=1, rank=0, where="worker", count=1)])
    )
    block = EncodedEvents("step", 0, lines, 7)
    assert [(e.rank, e.step) for e in block.events()] == [(0, 1), (0, 2)]
    assert block.bad == 5  # missing fields, unknown kind, not an object, not JSON, a kind other than the block's


def test_a_message_keeps_each_kind_as_the_recording_lines_it_sent() -> None:
    events = [step(0, 1), EventsDropped(wall_ns=1, rank=0, where="worker", count=2), step(0, 2)]
    frame = encode_events(token="t", rank=4, dropped=0, events=events)
    a, b = socket.socketpair()
    with a, b:
        a.sendall(frame)
        header, body = read_frame(b)
    blocks = sections(header, body)
    assert [(block.kind, block.rank, block.count) for block in blocks] == [("events_dropped", 4, 1), ("step", 4, 2)]
    assert blocks[1].lines == encode_lines([events[0], events[2]])
    assert [json.loads(line)["step"] for line in blocks[1].lines.splitlines()] == [1, 2]


@pytest.mark.parametrize("line_bytes", [20, 2_000], ids=["counted by bytes.count", "counted by numpy"])
def test_a_section_is_taken_only_when_it_holds_its_count_of_whole_lines(line_bytes: int) -> None:
    """Random bodies cut into random sections, some said wrongly: ``sections`` takes a message exactly when each
    section holds its count of lines and ends with one, and the sizes add up to the body (the rule a section at a
    time, as the collector checked it before it counted a body's lines in one pass); with lines of 2 KB the
    bodies are past :data:`meshtop.probes.wire.COUNT_WITH_NUMPY_FROM`, the other way of counting."""
    rng = random.Random(7)
    line = b'{"rank":0,"step":1,"pad":"' + b"x" * line_bytes + b'"}\n'
    taken = refused = 0
    for _ in range(300):
        counts = [rng.randint(1, 40) for _ in range(rng.randint(1, 4))]
        body = b"".join(line * count for count in counts)
        listed = [["step", count, len(line) * count] for count in counts]
        match rng.randrange(5):
            case 0:  # one section says a line more and the next a line fewer: the total is right
                if len(listed) > 1 and listed[1][1] > 1:
                    listed[0][1] += 1
                    listed[1][1] -= 1
            case 1:  # a section cut inside a line
                listed[-1][2] -= 1
                body = body[:-1]
            case 2:  # bytes past the last section
                body += b"{}\n"
            case 3:  # a section's bytes moved onto the next, lines and all
                if len(listed) > 1:
                    listed[0][2] -= len(line)
                    listed[1][2] += len(line)
            case 4:  # each section starts with an empty line (a line all the same, bad where it is decoded)
                body = b"".join(b"\n" + line * count for count in counts)
                listed = [["step", count + 1, len(line) * count + 1] for count in counts]
        expected, offset = True, 0
        for _, count, nbytes in listed:
            part = body[offset : offset + nbytes]
            offset += nbytes
            expected &= len(part) == nbytes and part.count(b"\n") == count and part.endswith(b"\n")
        expected &= offset == len(body)
        try:
            blocks = sections({"rank": 3, "sections": listed}, body)
        except FrameError:
            assert not expected, listed
            refused += 1
            continue
        assert expected, listed
        assert [block.count for block in blocks] == [count for _, count, _ in listed]
        assert b"".join(block.lines for block in blocks) == body
        taken += 1
    assert taken > 50 and refused > 50


@pytest.mark.slow  # 200 connections of garbage, 50 ms each: 10 s
def test_collector_survives_random_garbage_and_keeps_serving(collector: Collector) -> None:
    generator = random.Random(7)
    for _ in range(200):
        size = generator.randint(0, 64)
        garbage = bytes(generator.getrandbits(8) for _ in range(size))
        if generator.random() < 0.5:  # a plausible header in front of garbage
            garbage = struct.pack(">I", generator.randint(0, 4096)) + garbage
        raw_send(collector.address, garbage)
    shipper = EventShipper(address=collector.address, token=collector.token, rank=5)
    shipper.emit(step(5, 42))
    shipper.close()
    received = wait_for(collector, 1)
    assert [(e.rank, e.step) for e in received] == [(5, 42)]


def send_steps(collector: Collector, steps: range) -> None:
    raw_send(
        collector.address,
        encode_events(token=collector.token, rank=0, dropped=0, events=[step(0, n) for n in steps]),
    )


def drained_steps(collector: Collector) -> list[int]:
    return [e.step for e in Arrivals(collector.drain()).events()]


def queue_state(collector: Collector, expected: tuple[int, int], timeout_s: float = 10.0) -> tuple[int, int]:
    """The collector's ``(queued, queue_full)`` once it is ``expected``, or as it is at the timeout: its reading
    thread gets there late on a loaded machine."""
    deadline = time.monotonic() + timeout_s
    while (state := (collector.queued, collector.counts.queue_full)) != expected and time.monotonic() < deadline:
        time.sleep(0.01)
    return state


def test_collector_refuses_what_cannot_fit_and_stops_reading_near_its_bound(monkeypatch) -> None:
    """The pause is made longer than any test's wait, so that a loaded machine cannot end it before the queue is
    drained (the end of a pause has a test of its own, below). A state reached is held a while before it is
    taken: the 10 sent last, were they read, would be refused, and the state would only pass through."""
    monkeypatch.setattr(collector_module, "PAUSE_MAX_S", 60.0)
    small = Collector(max_queue_events=60).start()
    try:
        send_steps(small, range(70))  # can never fit: refused whole, counted
        send_steps(small, range(40))  # under three quarters of the bound: the next is read
        send_steps(small, range(20))  # fits exactly
        send_steps(small, range(10))  # past three quarters: waits in its socket, unread
        assert queue_state(small, (60, 70)) == (60, 70)
        time.sleep(0.3)  # the 10 stay unread (read, they would be refused)
        assert (small.queued, small.counts.queue_full) == (60, 70)
        assert drained_steps(small) == [*range(40), *range(20)]
        assert queue_state(small, (10, 70)) == (10, 70)  # read once there was room: not lost
    finally:
        small.stop()


def test_a_collector_full_for_long_serves_on_and_refuses_what_does_not_fit(monkeypatch) -> None:
    """The 20 wait out the pause, then are read and refused: they can be refused no sooner than the pause after
    the first message was sent (a bound a loaded machine only makes easier), where a collector that did not
    pause would refuse them as they came, within the 0.1 s the two sends take."""
    monkeypatch.setattr(collector_module, "PAUSE_MAX_S", 0.5)  # a node's pings wait no longer
    small = Collector(max_queue_events=60).start()
    try:
        started = time.monotonic()
        send_steps(small, range(50))
        send_steps(small, range(20))
        state = queue_state(small, (50, 20))
        waited = time.monotonic() - started
        assert state == (50, 20)  # not drained for long: read, refused
        assert waited >= collector_module.PAUSE_MAX_S  # paused: the 20 waited
    finally:
        small.stop()


def test_wire_frames_are_length_prefixed_with_a_json_header_line() -> None:
    frame = pack({"a": 1}, b"body")
    (length,) = HEADER.unpack(frame[:4])
    head, body = frame[4 : 4 + length].split(b"\n", 1)
    assert (json.loads(head), body) == ({"a": 1}, b"body")


def test_sections_put_rank_starts_first_and_the_steps_after_what_they_close() -> None:
    from meshtop.probes.events import CollectiveTiming, RankStarted, StageAction

    started = RankStarted(
        rank=0,
        pid=1,
        host="h",
        device="cpu",
        pp_rank=0,
        dp_rank=0,
        tp_rank=0,
        stages=(0,),
        local_parameters=1,
        wall_ns=1,
    )
    send = CollectiveTiming(
        rank=0,
        step=1,
        op="send",
        group="pp",
        group_size=2,
        peer=1,
        bytes=4,
        dtype="float32",
        start_ns=1,
        end_ns=2,
        clock="completion",
    )
    forward = StageAction(rank=0, step=1, stage=0, microbatch=0, action="forward", start_ns=1, end_ns=2)
    emitted = [step(0, 0), started, send, step(0, 1), forward, send]  # a message cut between two steps
    a, b = socket.socketpair()
    with a, b:
        a.sendall(encode_events(token="t", rank=0, dropped=0, events=emitted))
        header, body = read_frame(b)
    blocks = sections(header, body)
    assert [block.kind for block in blocks] == ["rank_started", "collective", "stage_action", "step"]
    assert [getattr(e, "step", None) for e in Arrivals(blocks).events()] == [None, 1, 1, 1, 0, 1]


def test_sections_that_are_empty_or_miscounted_and_bad_numbers_are_malformed(collector: Collector) -> None:
    lines = encode_lines([step(0, 1)])
    token = collector.token
    for header, body in (
        ({"rank": 0, "sections": [["step", 0, 3]]}, b"zzz"),  # no events, yet bytes that would join the next line
        ({"rank": 0, "sections": [["step", 0, 0]]}, b""),
        ({"rank": True, "sections": [["step", 1, len(lines)]]}, lines),
        ({"rank": 0, "dropped": -5, "sections": [["step", 1, len(lines)]]}, lines),
        ({"rank": 0, "sections": [["step", 1, len(lines) - 1]]}, lines[:-1]),  # no final newline
    ):
        raw_send(collector.address, pack({"token": token, **header}, body))
    raw_send(collector.address, pack({"token": token, "rank": 0, "sections": [["step", 1, len(lines)]]}, lines))
    assert [(e.rank, e.step) for e in wait_for(collector, 1)] == [(0, 1)]
    time.sleep(0.2)
    assert collector.counts.malformed == 5


def test_hostile_headers_are_counted_and_the_collector_serves_on(collector: Collector) -> None:
    deep = b"[" * 100_000
    huge = b'{"token": "x", "rank": ' + b"9" * 5000 + b"}"
    for payload in (deep + b"\n", huge + b"\n"):
        raw_send(collector.address, HEADER.pack(len(payload)) + payload)
    raw_send(collector.address, pack({"token": "\ud800", "rank": 0, "sections": []}))
    shipper = EventShipper(address=collector.address, token=collector.token, rank=2)
    shipper.emit(step(2, 7))
    shipper.close()
    assert [(e.rank, e.step) for e in wait_for(collector, 1)] == [(2, 7)]
    assert (collector.counts.malformed, collector.counts.bad_token) == (2, 1)


def test_lines_that_are_not_one_event_each_decode_to_none_without_raising() -> None:
    good = encode_lines([step(0, 1)])
    two_on_one_line = good.rstrip(b"\n") + b"," + good
    split = b'{"kind":"step","rank":0,\n"step":3}\n'
    for lines, bad in (
        (two_on_one_line + good, 1),
        (split + good, 2),
        (b"9" * 5000 + b"\n" + good, 1),
        (b"[" * 100_000 + b"\n" + good, 1),
    ):
        block = EncodedEvents("step", 0, lines, lines.count(b"\n"))
        assert [(e.rank, e.step) for e in block.events()] == [(0, 1)]
        assert block.bad == bad


def test_the_queue_is_bounded_in_bytes_too(monkeypatch) -> None:
    """As for the bound in events: the pause outlasts the test, and the state reached is held a while."""
    monkeypatch.setattr(collector_module, "PAUSE_MAX_S", 60.0)
    small = Collector(max_queue_bytes=16_000).start()
    try:
        for _ in range(3):
            send_steps(small, range(30))  # 7,421 bytes each: two fit, the third waits past 12,000 bytes
        assert queue_state(small, (60, 0)) == (60, 0)
        time.sleep(0.3)  # the third stays unread (read, it would be refused)
        assert (small.queued, small.counts.queue_full) == (60, 0)
        small.drain()
        assert queue_state(small, (30, 0)) == (30, 0)
    finally:
        small.stop()


def test_a_connection_silent_past_the_read_timeout_is_closed_and_the_others_served(monkeypatch) -> None:
    monkeypatch.setattr(collector_module, "READ_TIMEOUT_S", 0.3)
    running = Collector().start()
    try:
        with socket.create_connection(running.address, timeout=5) as silent:
            silent.sendall(HEADER.pack(100))  # a frame begun, never finished
            assert silent.recv(1) == b""  # closed by the collector within about a second
        shipper = EventShipper(address=running.address, token=running.token, rank=3)
        shipper.emit(step(3, 9))
        shipper.close()
        assert [(e.rank, e.step) for e in wait_for(running, 1)] == [(3, 9)]
    finally:
        running.stop()
