"""Collector ingest: events / s the collector absorbs from 8 producer processes, and what it dropped.

Each producer is a process that connects to a :class:`probes.collector.Collector`
in this process and sends length-prefixed frames of the shipper's wire format
(``probes.wire.encode`` of ``{"token", "rank", "dropped", "events"}``, 5,000
events a frame: a shipper sending 20,000 events / s in 250 ms batches) as
fast as the socket takes them. The frames are encoded before the clock
starts, so the producers' cost is the socket's only and the figure is the
collector's: parsing, rebuilding events and queueing them, with a consumer
thread draining the queue as meshtop's session does. The events are a real
job's mix (``tui_frames.SyntheticSource``, 64 ranks). Rate = events received / (last
event drained - start). Drops: events the collector refused (its queue
full, bad frames) or that never arrived.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from itertools import islice
from pathlib import Path

from probes.collector import Collector
from probes.wire import encode
from tests.bench.figures import NO_TARGET, Row, Spread, Target, median

PRODUCERS = 8
FRAME_EVENTS = 5_000
TARGET = Target(low=200_000)
DRAIN_TIMEOUT_S = 60.0


def produce(address: tuple[str, int], frame: bytes, frames: int) -> None:
    """A producer process: connect, say ready, wait for the go (a line on stdin), send ``frames`` copies of ``frame``."""
    with socket.create_connection(address) as sock:
        print("ready", flush=True)
        sys.stdin.readline()
        for _ in range(frames):
            sock.sendall(frame)


def start_producer(address: tuple[str, int], frame_path: Path, frames: int) -> subprocess.Popen[str]:
    """A producer in a fresh interpreter that imports only this module (multiprocessing's spawn would import
    the suite, textual and pandas included, into each of the 8), once it is connected."""
    producer = subprocess.Popen([sys.executable, "-m", "tests.bench.ingest", address[0], str(address[1]),
                                 str(frame_path), str(frames)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert producer.stdout is not None and producer.stdout.readline().strip() == "ready"
    return producer


@dataclass(frozen=True, slots=True)
class Ingested:
    events: int
    seconds: float
    dropped: int

    @property
    def rate(self) -> float:
        return self.events / self.seconds


def drain_until(collector: Collector, expected: int, stop: threading.Event) -> tuple[int, float]:
    """Drain the queue until ``expected`` events came (or ``stop``): how many, and when the last one came."""
    received, last = 0, time.perf_counter()
    while received < expected and not stop.is_set():
        got = len(collector.drain())
        if got:
            received, last = received + got, time.perf_counter()
        else:
            time.sleep(0.001)
    return received, last


def ingest_once(records: list[dict[str, object]], producers: int, frames: int) -> Ingested:
    """One run: ``producers`` processes each sending ``frames`` frames of ``records``."""
    collector = Collector().start()
    workers: list[subprocess.Popen[str]] = []
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for rank in range(producers):
                path = Path(tmp) / f"frame-{rank}"
                path.write_bytes(encode({"token": collector.token, "rank": rank, "dropped": 0, "events": records}))
                workers.append(start_producer(collector.address, path, frames))
        expected = producers * frames * len(records)
        stop = threading.Event()
        timer = threading.Timer(DRAIN_TIMEOUT_S, stop.set)
        timer.start()
        started = time.perf_counter()
        for worker in workers:
            assert worker.stdin is not None
            worker.stdin.write("go\n")
            worker.stdin.flush()
        received, last = drain_until(collector, expected, stop)
        timer.cancel()
        for worker in workers:
            worker.wait(10)
        time.sleep(0.2)  # anything late still counts as received, not as dropped
        received += len(collector.drain())
    finally:
        for worker in workers:
            if worker.poll() is None:
                worker.kill()
                worker.wait()
        collector.stop()
    counts = collector.counts
    refused = counts.queue_full + counts.bad_events + counts.malformed + counts.oversized + counts.bad_token
    return Ingested(received, last - started, max(refused, expected - received))


def job_records(count: int) -> list[dict[str, object]]:
    """The first ``count`` events of the synthetic 64-rank job, as the shipper sends them."""
    # Imported here: the producer processes import this module and need no textual.
    from tests.bench.tui_frames import SyntheticSource

    return [event.to_record() for event in islice(SyntheticSource(64, warm_events=0).job_events(), count)]


def row(records: list[dict[str, object]], producers: int, reps: int, target: Target) -> Row:
    """``reps`` runs of ``producers`` processes sending 200,000 events in all."""
    frames = max(1, 200_000 // (producers * len(records)))
    runs = [ingest_once(records, producers=producers, frames=frames) for _ in range(reps)]
    rates = [run.rate for run in runs]
    dropped = sum(run.dropped for run in runs)
    rate = median(rates)
    met = target.met(rate)
    return Row("ingest", f"collector, {producers} producer{'s' * (producers > 1)}", rate, "events/s",
               Spread.of(rates), target, met=None if met is None else met and not dropped,
               note=f"{dropped:,} dropped of {sum(run.events for run in runs) + dropped:,}; "
                    f"{len(records):,}-event frames",
               details={"runs": [{"events": r.events, "seconds": r.seconds, "dropped": r.dropped} for r in runs]})


def rows(reps: int = 3) -> list[Row]:
    """The target, with 8 producers; and 1 producer, to show what the 8 connections' threads cost."""
    records = job_records(FRAME_EVENTS)
    return [row(records, PRODUCERS, reps, TARGET), row(records, 1, reps, NO_TARGET)]

if __name__ == "__main__":
    host, port, frame_file, frame_count = sys.argv[1:5]
    produce((host, int(port)), Path(frame_file).read_bytes(), int(frame_count))
