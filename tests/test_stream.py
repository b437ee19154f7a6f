"""The telemetry stream: shipper to collector, with tokens, limits and counted drops."""

from __future__ import annotations

import json
import random
import socket
import struct
import time

import pytest

from probes.collector import Collector
from probes.events import EventsDropped, StepTiming
from probes.shipper import EventShipper
from probes.wire import HEADER, MAX_FRAME_BYTES, encode


def step(rank: int, number: int) -> StepTiming:
    return StepTiming(rank=rank, step=number, start_ns=time.time_ns(), duration_s=0.01, tokens=512, loss=None)


def wait_for(collector: Collector, count: int, timeout_s: float = 10.0) -> list:
    received, deadline = [], time.monotonic() + timeout_s
    while len(received) < count and time.monotonic() < deadline:
        received.extend(collector.drain())
        time.sleep(0.02)
    return received


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
    good = {"token": collector.token, "rank": 0, "dropped": 0, "events": [step(0, 1).to_record()]}
    raw_send(collector.address, encode({**good, "token": "wrong"}))
    raw_send(collector.address, encode({**good, "token": None}))
    raw_send(collector.address, HEADER.pack(12) + b"not json!!!!")
    raw_send(collector.address, HEADER.pack(MAX_FRAME_BYTES + 1) + b"x" * 100)
    raw_send(collector.address, encode({**good, "events": "nope"}))
    raw_send(collector.address, encode({**good, "events": [{"kind": "step", "rank": 0}, {"kind": "martian"}, 7]}))
    raw_send(collector.address, encode(good))
    received = wait_for(collector, 1)
    time.sleep(0.2)
    counts = collector.counts
    assert (counts.bad_token, counts.oversized) == (2, 1)
    assert counts.malformed == 2
    assert counts.bad_events == 3
    assert [(e.rank, e.step) for e in received] == [(0, 1)]


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


def test_collector_queue_is_bounded_and_overflow_is_counted() -> None:
    small = Collector(max_queue_events=10).start()
    try:
        message = {"token": small.token, "rank": 0, "dropped": 0, "events": [step(0, n).to_record() for n in range(50)]}
        raw_send(small.address, encode(message))
        time.sleep(0.3)
        assert small.queued == 10
        assert small.counts.queue_full == 40
    finally:
        small.stop()


def test_wire_frames_are_length_prefixed_json() -> None:
    frame = encode({"a": 1})
    (length,) = HEADER.unpack(frame[:4])
    assert json.loads(frame[4:4 + length]) == {"a": 1}
