"""Recordings: bytes per event on disk, write rate, and load and summary time of large recordings.

A recording of a synthetic 64-rank dp x tp2 x pp2 job (``tui_frames.SyntheticSource``:
collectives, stage actions, steps, memory, process and GPU samples in a real
job's proportions, each time stamp and duration given a random jitter of up
to 50 us / 2 %, as real clocks have: without it Parquet stores the
synthetic job's perfectly regular times in about 1 byte per event) is
written the way meshtop writes one: batches of 2,000
events (a 10,000 events / s job's batch every 200 ms) through
:class:`meshtop.recordings.events_log.EventWriter`, then compacted to Parquet
(:func:`meshtop.recordings.tables.compact`). Generating the events is not timed.
Then, repeated: open it and load every table (``open_recording`` +
``table``), and ``summarize`` a freshly opened recording (what
``meshtop summary`` costs, its load included).
"""

from __future__ import annotations

import random
import tempfile
import time
from collections.abc import Callable
from dataclasses import fields, replace
from functools import cache
from itertools import islice
from pathlib import Path

from meshtop.probes.events import Event
from meshtop.recordings.events_log import EVENTS_DIR, EventWriter
from meshtop.recordings.manifest import start_manifest, write_manifest
from meshtop.recordings.reader import open_recording
from meshtop.recordings.summary import summarize
from meshtop.recordings.tables import compact
from tests.bench.figures import NO_TARGET, Row, Spread, Target, median
from tests.bench.tui_frames import SyntheticSource

BATCH = 2_000
RANKS = 64
LOAD_TARGET = Target(high=1.0)
SUMMARY_TARGETS = {1_000_000: Target(high=0.5)}
"""Issue 20: ``meshtop summary`` of a 1M-event recording in half a second."""
"""Seconds per million events."""
SIZES = (1_000_000, 3_000_000)
FULL_SIZES = (1_000_000, 3_000_000, 10_000_000)
JITTER_NS = 50_000
JITTER_SHARE = 0.02


@cache
def field_names(kind: type[Event]) -> frozenset[str]:
    return frozenset(f.name for f in fields(kind))


def roughen(event: Event, rng: random.Random) -> Event:
    """``event`` with the jitter of a real clock on its time stamps and durations."""
    base = rng.randrange(JITTER_NS)
    names = field_names(type(event))
    changes: dict[str, object] = {}
    for name in names & {"start_ns", "wall_ns"}:
        changes[name] = getattr(event, name) + base
    if "end_ns" in names:
        changes["end_ns"] = event.end_ns + base + rng.randrange(JITTER_NS)  # type: ignore[attr-defined]
    for name in names & {"duration_s", "forward_backward_s"}:
        if getattr(event, name) is not None:
            changes[name] = getattr(event, name) * (1 + JITTER_SHARE * rng.random())
    return replace(event, **changes) if changes else event


def write_recording(directory: Path, count: int) -> list[float]:
    """A completed recording of ``count`` synthetic events in ``directory``; the seconds of each batch's write."""
    source = SyntheticSource(RANKS, warm_events=0)
    manifest = start_manifest(source.description, command_line=["bench"])
    write_manifest(directory, manifest)
    writer = EventWriter(directory)
    stream, rng = source.job_events(), random.Random(0)
    batch_s = []
    for _ in range(count // BATCH):
        batch = [roughen(event, rng) for event in islice(stream, BATCH)]
        started = time.perf_counter()
        writer.write(batch)
        batch_s.append(time.perf_counter() - started)
    writer.close()
    write_manifest(directory, replace(manifest, status="completed"))
    return batch_s


def load_all(directory: Path) -> int:
    """Open the recording and load every table in its typed schema (what every reader starts from); the rows
    loaded."""
    recording = open_recording(directory)
    return sum(len(recording.arrow(kind)) for kind in recording.kinds())


def timed(function: Callable[..., object], *args: object) -> float:
    started = time.perf_counter()
    function(*args)
    return time.perf_counter() - started


def disk_bytes(directory: Path, suffix: str) -> int:
    return sum(path.stat().st_size for path in (directory / EVENTS_DIR).glob(f"*{suffix}"))


def measure(count: int, reps: int) -> list[Row]:
    """Write, compact, then ``reps`` loads and summaries of a recording of ``count`` events."""
    label = f"{count / 1e6:g}M events"
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp) / "rec"
        directory.mkdir()
        batch_s = write_recording(directory, count)
        jsonl_bytes = disk_bytes(directory, ".jsonl")
        compact_s = timed(compact, directory)
        parquet_bytes = disk_bytes(directory, ".parquet")
        loaded = load_all(directory)
        assert loaded == count, (loaded, count)
        load_s = [timed(load_all, directory) for _ in range(reps)]
        summary_s = [timed(lambda: summarize(open_recording(directory))) for _ in range(reps)]
    millions = count / 1e6
    write_rates = [BATCH / s for s in batch_s]
    return [
        Row(
            "recordings",
            f"bytes/event, {label}",
            parquet_bytes / count,
            "B/event",
            Spread(1, parquet_bytes / count, parquet_bytes / count),
            NO_TARGET,
            note=f"Parquet zstd; JSON lines while recording {jsonl_bytes / count:.0f} B",
        ),
        Row(
            "recordings",
            f"write, {label}",
            count / sum(batch_s),
            "events/s",
            Spread.of(write_rates, "p25-p75"),
            NO_TARGET,
            note=f"per {BATCH:,}-event batch; then compact {compact_s:.1f} s",
        ),
        Row(
            "recordings",
            f"load, {label}",
            median(load_s) / millions,
            "s per M events",
            Spread.of([s / millions for s in load_s]),
            LOAD_TARGET,
            note=f"{median(load_s):.2f} s in all",
        ),
        Row(
            "recordings",
            f"summary, {label}",
            median(summary_s),
            "s",
            Spread.of(summary_s),
            SUMMARY_TARGETS.get(count, NO_TARGET),
            note="open + summarize, load included",
        ),
    ]


def rows(full: bool = False, reps: int = 3) -> list[Row]:
    return [row for count in (FULL_SIZES if full else SIZES) for row in measure(count, reps)]
