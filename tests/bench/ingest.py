"""Collector ingest: events / s that meshtop absorbs from 8 producer processes, and what it dropped.

Each producer is a process that connects to a :class:`meshtop.probes.collector.Collector`
in this process and sends frames of the shipper's wire format
(``tests.kit.wire.encode_events``, 5,000 events a frame: a shipper sending
20,000 events / s in 250 ms batches) as fast as the socket takes them. The
frames are encoded before the clock starts, so the producers' cost is the
socket's only. A consumer thread drains the collector as meshtop's session
does and does the session's work with what it drains:

- ``record``: what ``meshtop record`` does, the target's figure. A
  :class:`meshtop.recordings.recorder.SessionRecorder` appends every event to a recording
  on disk and folds what the console and the manifest read (steps, requests, the
  ranks' starts) into the session's one fold, and the kinds the console prints are
  decoded. With ``--metrics-port`` the fold takes every figure, as the dashboard's.
- ``dashboard``: every kind the screen reads decoded into typed tables as
  well, as a live dashboard's session thread does (``meshtop.tui.sources.screen_batches``;
  no target: the dashboard's own frame budget is the TUI figure).

The events are a real job's mix (``tui_frames.SyntheticSource``, 64 ranks
as dp16 x tp2 x pp2). Rate = events received / (last batch consumed -
start). Drops: events the collector refused (its queue full, bad frames) or
that never arrived.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from itertools import islice
from pathlib import Path

from meshtop.probes.arrivals import Arrivals
from meshtop.probes.collector import Collector
from meshtop.probes.events import Event
from meshtop.probes.kinds import PRINTED_KINDS
from meshtop.runner.job.allocator import keep_buffer_pages
from tests.bench.figures import NO_TARGET, Row, Spread, Target, median
from tests.kit.wire import encode_events

PRODUCERS = 8
FRAME_EVENTS = 5_000
EVENTS_PER_RUN = 800_000
TARGET = Target(low=200_000)
DASHBOARD_TARGET = Target(low=300_000)
"""Issue 20: every event decoded, as the live dashboard's session thread does."""
DRAIN_TIMEOUT_S = 60.0
RANKS = 64


def produce(address: tuple[str, int], frame: bytes, frames: int) -> None:
    """A producer process: connect, say ready, wait for the go (a line on stdin), send ``frames`` copies of
    ``frame``."""
    with socket.create_connection(address) as sock:
        print("ready", flush=True)
        sys.stdin.readline()
        for _ in range(frames):
            sock.sendall(frame)


def start_producer(address: tuple[str, int], frame_path: Path, frames: int) -> subprocess.Popen[str]:
    """A producer in a fresh interpreter that imports only this module (multiprocessing's spawn would import
    the suite, textual and pandas included, into each of the 8), once it is connected."""
    producer = subprocess.Popen(
        [sys.executable, "-m", "tests.bench.ingest", address[0], str(address[1]), str(frame_path), str(frames)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
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


class Consumer:
    """What a session does with each batch: the recording and the steps (``SessionRecorder``), and what its
    front end decodes: ``record`` the kinds its console prints, the dashboard its typed tables."""

    def __init__(self, directory: Path, front_end: str) -> None:
        # Imported here: the producer processes import this module and need neither torch nor textual.
        from meshtop.probes.kinds import FOLDED_KINDS, PROGRESS_KINDS
        from meshtop.recordings.manifest import Manifest
        from meshtop.recordings.recorder import SessionRecorder
        from meshtop.recordings.session_fold import Folded, SessionFold
        from meshtop.runner.plan import RunSpec, resolve

        run = resolve(RunSpec(dp=RANKS // 4, tp=2, pp=2, device="cpu"), gpus_visible=0).describe()
        from meshtop.tui.sources import screen_batches

        kinds = PROGRESS_KINDS if front_end == "record" else FOLDED_KINDS  # record without /metrics, as console.py
        self.recorder = SessionRecorder(SessionFold(run, kinds=kinds), directory, Manifest(run=run))
        if front_end == "record":
            self.decode: Callable[[Arrivals, Folded], object] = lambda arrivals, folded: arrivals.events(PRINTED_KINDS)
        else:
            self.decode = lambda arrivals, folded: screen_batches(arrivals, folded.tables)  # what the fold left

    def __call__(self, arrivals: Arrivals) -> None:
        self.decode(arrivals, self.recorder.take(arrivals))  # on disk, then into the session's one fold

    def close(self) -> None:
        assert self.recorder.writer is not None
        self.recorder.writer.close()


def drain_until(collector: Collector, consume: Consumer, expected: int, stop: threading.Event) -> tuple[int, float]:
    """Consume until ``expected`` events came (or ``stop``): how many, and when the last batch was done."""
    received, last = 0, time.perf_counter()
    while received < expected and not stop.is_set():
        arrivals = Arrivals(collector.drain())
        if arrivals.items:
            consume(arrivals)
            received, last = received + arrivals.count, time.perf_counter()
        else:
            time.sleep(0.001)
    return received, last


def ingest_once(events: list[Event], producers: int, frames: int, consumer: str) -> Ingested:
    """One run: ``producers`` processes each sending ``frames`` frames of ``events``."""
    collector = Collector().start()
    workers: list[subprocess.Popen[str]] = []
    tmp = tempfile.TemporaryDirectory()
    try:
        consume = Consumer(Path(tmp.name) / "recording", consumer)
        for rank in range(producers):
            path = Path(tmp.name) / f"frame-{rank}"
            path.write_bytes(encode_events(token=collector.token, rank=rank, dropped=0, events=events))
            workers.append(start_producer(collector.address, path, frames))
        expected = producers * frames * len(events)
        stop = threading.Event()
        timer = threading.Timer(DRAIN_TIMEOUT_S, stop.set)
        timer.start()
        started = time.perf_counter()
        for worker in workers:
            assert worker.stdin is not None
            worker.stdin.write("go\n")
            worker.stdin.flush()
        received, last = drain_until(collector, consume, expected, stop)
        timer.cancel()
        for worker in workers:
            worker.wait(10)
        time.sleep(0.2)  # anything late still counts as received, not as dropped
        late = Arrivals(collector.drain())
        consume(late)
        received += late.count
        consume.close()
    finally:
        tmp.cleanup()
        for worker in workers:
            if worker.poll() is None:
                worker.kill()
                worker.wait()
        collector.stop()
    counts = collector.counts
    refused = counts.queue_full + counts.malformed + counts.oversized + counts.bad_token
    return Ingested(received, last - started, max(refused, expected - received))


def job_events(count: int) -> list[Event]:
    """The first ``count`` events of the synthetic 64-rank job."""
    # Imported here: the producer processes import this module and need no textual.
    from tests.bench.tui_frames import SyntheticSource

    return list(islice(SyntheticSource(RANKS, warm_events=0).job_events(), count))


def row(events: list[Event], producers: int, reps: int, consumer: str, target: Target) -> Row:
    """``reps`` runs of ``producers`` processes sending :data:`EVENTS_PER_RUN` events in all."""
    frames = max(1, EVENTS_PER_RUN // (producers * len(events)))
    runs = [ingest_once(events, producers=producers, frames=frames, consumer=consumer) for _ in range(reps)]
    rates = [run.rate for run in runs]
    dropped = sum(run.dropped for run in runs)
    rate = median(rates)
    met = target.met(rate)
    return Row(
        "ingest",
        f"{consumer}, {producers} producer{'s' * (producers > 1)}",
        rate,
        "events/s",
        Spread.of(rates),
        target,
        met=None if met is None else met and not dropped,
        note=f"{dropped:,} dropped of {sum(run.events for run in runs) + dropped:,}; {len(events):,}-event frames",
        details={"runs": [{"events": r.events, "seconds": r.seconds, "dropped": r.dropped} for r in runs]},
    )


def rows(reps: int = 3) -> list[Row]:
    """The target: ``record``'s session with 8 producers; with 1 producer, to show what the 8 connections'
    threads cost; and the dashboard's session, which decodes every event."""
    keep_buffer_pages()  # as the head's meshtop does
    events = job_events(FRAME_EVENTS)
    return [
        row(events, PRODUCERS, reps, "record", TARGET),
        row(events, 1, reps, "record", NO_TARGET),
        row(events, PRODUCERS, reps, "dashboard", DASHBOARD_TARGET),
    ]


if __name__ == "__main__":
    host, port, frame_file, frame_count = sys.argv[1:5]
    produce((host, int(port)), Path(frame_file).read_bytes(), int(frame_count))
