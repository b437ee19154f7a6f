"""The metrics core folds steps, memory, process and GPU samples a whole table at a time (``summary``) to the
same figures, to the last bit, as it folds them an event at a time (the dashboard), and a recording read by
only the columns the fold reads folds as the whole recording does."""

from __future__ import annotations

import random
from itertools import pairwise
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from meshtop.probes.events import (
    CollectiveTiming,
    Event,
    MemorySnapshot,
    ProcessSample,
    RankStarted,
    StageAction,
    StepTiming,
)
from meshtop.recordings.manifest import RunDescription
from meshtop.recordings.metrics import run as run_module
from meshtop.recordings.metrics.run import COLUMNS_READ, TABLE_KINDS, RunFold
from meshtop.recordings.reader import open_recording
from meshtop.recordings.replay import KIND_ORDER
from meshtop.recordings.samples import SAMPLE
from meshtop.recordings.schema import batches_of, events_of
from meshtop.recordings.summary import fold_recording, summarize
from tests.kit.events import gpu_sample
from tests.kit.recordings import description, write_recording

STEP_NS = 20_000_000


def job_events(*, steps: int = 12, seed: int = 0) -> list[Event]:
    """A dp2 x pp2 job's events, with the jitter of real clocks: each rank's steps, collectives, stage actions
    and memory, process and GPU samples."""
    rng = random.Random(seed)
    events: list[Event] = [
        RankStarted(
            rank=rank,
            pid=rank,
            host="h",
            device="cpu",
            pp_rank=rank // 2,
            dp_rank=rank % 2,
            tp_rank=0,
            stages=(rank // 2,),
            local_parameters=10,
            wall_ns=0,
        )
        for rank in range(4)
    ]
    for step in range(steps):
        for rank in range(4):
            start = step * STEP_NS + rng.randrange(100_000)
            for index in range(3):
                begin = start + index * 2_000_000 + rng.randrange(500_000)
                events.append(
                    CollectiveTiming(
                        rank=rank,
                        step=step,
                        op="all_reduce" if index else "send",
                        group="dp" if index else "pp",
                        group_size=2,
                        peer=None,
                        bytes=1 << 20,
                        dtype="float32",
                        start_ns=begin,
                        end_ns=begin + rng.randrange(1, 3_000_000),
                        clock="completion",
                        waited_ns=rng.randrange(1_000_000) if rank % 2 else None,
                        overlapped=index == 2,
                    )
                )
                events.append(
                    StageAction(
                        rank=rank,
                        step=step,
                        stage=rank // 2,
                        microbatch=index,
                        action="forward",
                        start_ns=begin,
                        end_ns=begin + rng.randrange(4_000_000),
                    )
                )
            events.append(
                StepTiming(
                    rank=rank,
                    step=step,
                    start_ns=start,
                    duration_s=0.015 * (1 + rng.random()),
                    tokens=64,
                    loss=rng.random() if rank >= 2 else None,
                    forward_backward_s=0.012 * (1 + rng.random()),
                )
            )
            events.append(
                MemorySnapshot(
                    rank=rank,
                    step=step,
                    wall_ns=start + 1,
                    weights_bytes=100,
                    grads_bytes=100,
                    optimizer_bytes=200,
                    activations_bytes=rng.randrange(1000),
                    kv_cache_bytes=None,
                    allocated_bytes=500,
                    reserved_bytes=600,
                    peak_allocated_bytes=rng.randrange(10_000) if rank else None,
                    device_used_bytes=None,
                    device_total_bytes=80_000,
                    rss_bytes=rng.randrange(10_000),
                )
            )
            events.append(
                ProcessSample(
                    rank=rank,
                    pid=rank,
                    wall_ns=start + 2,
                    cpu_pct=50.0,
                    rss_bytes=rng.randrange(20_000) if step % 3 else None,
                    threads=4,
                )
            )
        events.append(
            gpu_sample(
                gpu=step % 2,
                wall_ns=step * STEP_NS,
                name="NVIDIA H100 80GB HBM3" if step else "",
                memory_used_bytes=1,
                memory_total_bytes=2,
                utilization_pct=50.0,
                memory_utilization_pct=10.0,
                power_w=300.0,
                sm_clock_mhz=1500.0,
                temperature_c=60.0,
                power_limit_w=700.0 if step > 1 else None,
            )
        )
    return events


def tables_of(events: list[Event]) -> list[tuple[str, pa.Table]]:
    """Each kind's events as one table, in the order a recording's tables are folded."""
    by_kind: dict[str, list[pa.Table]] = {}
    for kind, table in batches_of(events):
        by_kind.setdefault(kind, []).append(table)
    return [(kind, pa.concat_tables(by_kind[kind])) for kind in KIND_ORDER if kind in by_kind]


def cut(tables: list[tuple[str, pa.Table]], seed: int) -> list[tuple[str, pa.Table]]:
    """Each table cut into a few slices at random places, the slices in the tables' order."""
    rng = np.random.default_rng(seed)
    pieces = []
    for kind, table in tables:
        edges = [0, *np.sort(rng.integers(0, len(table) + 1, size=4)).tolist(), len(table)]
        pieces += [(kind, table.slice(a, b - a)) for a, b in pairwise(edges) if b > a]
    return pieces


def folded_both_ways(run: RunDescription, tables: list[tuple[str, pa.Table]]) -> tuple[RunFold, RunFold]:
    """(tables folded a table at a time, as ``summary`` does; the same folded as events, as the dashboard does)."""
    by_table, by_event = RunFold(run), RunFold(run)
    for kind, table in tables:
        by_table.apply(kind, table)
        if kind in TABLE_KINDS:
            by_event.apply_events(events_of(kind, table))
        else:
            by_event.apply(kind, table)
    by_table.finish("completed")
    by_event.finish("completed")
    return by_table, by_event


def assert_same_fold(by_table: RunFold, by_event: RunFold) -> None:
    assert by_table.figures() == by_event.figures()
    assert list(by_table.closed) == list(by_event.closed)
    assert by_table.memory.last == by_event.memory.last
    assert by_table.gpu_models == by_event.gpu_models
    assert (by_table.rejected, by_table.starts) == (by_event.rejected, by_event.starts)


def no_events_for_tables(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make the fold fail if it turns a table of a column-wise kind into events (its fallback)."""

    def refuse(kind: str, table: pa.Table) -> list[Event]:
        assert kind not in TABLE_KINDS, f"{kind} table folded as events"
        return events_of(kind, table)

    monkeypatch.setattr(run_module, "events_of", refuse)


def test_a_recordings_tables_fold_column_wise_to_what_their_events_fold_to(monkeypatch: pytest.MonkeyPatch) -> None:
    recording = open_recording(SAMPLE)
    tables = [(kind, recording.arrow(kind)) for kind in KIND_ORDER if kind in recording.kinds()]
    by_table, by_event = folded_both_ways(recording.manifest.run, tables)
    assert_same_fold(by_table, by_event)
    assert by_table.closed_count > 0 and by_table.figures().steps.count > 0
    no_events_for_tables(monkeypatch)  # a clean recording's tables take the columns' way, none as events
    columns_only = RunFold(recording.manifest.run)
    for kind, table in tables:
        columns_only.apply(kind, table)
    columns_only.finish("completed")
    assert columns_only.figures() == by_table.figures()


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_jobs_tables_cut_anywhere_fold_column_wise_to_what_their_events_fold_to(seed: int) -> None:
    tables = tables_of(job_events(seed=seed))
    assert_same_fold(*folded_both_ways(description(dp=2, pp=2), tables))
    assert_same_fold(*folded_both_ways(description(dp=2, pp=2), cut(tables, seed)))


def _snapshot(record: dict[str, object]) -> MemorySnapshot:
    record = dict(record)
    record.pop("kind", None)
    return MemorySnapshot(**record)  # type: ignore[arg-type]


def test_irregular_step_and_memory_tables_fold_as_their_events_do() -> None:
    events = job_events(seed=3)
    steps = [e for e in events if isinstance(e, StepTiming)]
    last_memory = [e for e in events if isinstance(e, MemorySnapshot)][-1]
    same_moment = _snapshot({**last_memory.to_record(), "weights_bytes": 7})  # a tie: the later one counts
    odd: list[Event] = [
        steps[5],
        steps[-3],
        steps[1],  # reported again: after the step closed, before it closed, long after
        StepTiming(rank=9, step=2, start_ns=0, duration_s=0.01, tokens=64, loss=1.0),  # not a rank of the job
        StepTiming(rank=1, step=3, start_ns=0, duration_s=-0.01, tokens=64, loss=1.0),  # a negative step time
        same_moment,
    ]
    late_and_shuffled = [*events, *odd, *reversed(steps[8:16])]
    for tables in (tables_of(late_and_shuffled), cut(tables_of(late_and_shuffled), 4)):
        by_table, by_event = folded_both_ways(description(dp=2, pp=2), tables)
        assert_same_fold(by_table, by_event)
        assert by_table.rejected["step"] == 2 and by_table.memory.last[3].weights_bytes == 7


def test_a_recording_read_by_the_columns_the_fold_reads_folds_as_the_whole_recording(tmp_path: Path) -> None:
    whole = open_recording(SAMPLE)
    kinds = whole.kinds()
    fold = RunFold(whole.manifest.run)
    for kind in sorted(kinds, key=KIND_ORDER.index):
        fold.apply(kind, whole.arrow(kind))
    fold.finish("completed")
    assert fold_recording(open_recording(SAMPLE)).figures() == fold.figures()

    # A row without a value its event needs, in a column the fold does not read, is left out either way.
    table = pq.read_table(SAMPLE / "events" / "collective.parquet")
    clock = table.column("clock").to_pylist()
    clock[3] = None
    damaged = tmp_path / "damaged"
    write_recording(damaged, [], run=whole.manifest.run)
    (damaged / "events").mkdir(exist_ok=True)
    pq.write_table(
        table.set_column(table.schema.get_field_index("clock"), "clock", pa.array(clock, pa.string())),
        damaged / "events" / "collective.parquet",
    )
    read = open_recording(damaged)
    assert len(read.arrow("collective", COLUMNS_READ["collective"])) == len(table) - 1
    assert read.arrow("collective", COLUMNS_READ["collective"]).equals(
        open_recording(damaged).arrow("collective").select(list(COLUMNS_READ["collective"]))
    )
    assert summarize(open_recording(damaged))["collectives"]
