"""The figures the metrics core took over from the dashboard, the sweep and the planner's reader, each against
numbers worked out by hand: the straggler rule and per-rank compute time, headroom and what the memory bars
draw, the sweep's accounted peak, communication share, mean bubble and traffic per step, the measured rates."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pyarrow as pa
import pytest

from meshtop.probes.events import Event, MemorySnapshot, ProcessSample
from meshtop.recordings.metrics.collectives import (
    CollectiveRow,
    communication_share,
    last_full_step,
    step_traffic,
    typical_busbw_gbps,
)
from meshtop.recordings.metrics.figures import straggler_json
from meshtop.recordings.metrics.memory import MemoryFold, MemoryRow, accounted_bytes, other_bytes, plan_peak
from meshtop.recordings.metrics.pipeline import StageRow, mean_bubble
from meshtop.recordings.metrics.rates import measured_rates
from meshtop.recordings.metrics.run import RunFold
from meshtop.recordings.metrics.stragglers import compute_seconds
from meshtop.recordings.reader import open_recording
from meshtop.recordings.schema import table_of, tables_of
from meshtop.recordings.summary import summarize
from meshtop.recordings.sweep import measure
from meshtop.tui.alerts import alerts_of
from meshtop.tui.app import MeshtopApp
from meshtop.tui.sources import ReplaySource
from meshtop.tui.state import DashboardState
from meshtop.tui.summary_text import summary_lines
from meshtop.tui.views import memory_lines, memory_parts
from tests.kit.events import collective, fold_events, gpu_sample, step
from tests.kit.recordings import description, write_recording
from tests.kit.screen import screen_text

MS = 1_000_000
GIB = 1 << 30


def lagging_job(
    compute_ms: dict[int, int], steps: int = 8, data_ms: dict[int, int] | None = None, step_ms: int = 25
) -> list[Event]:
    """Steps of ``step_ms`` 5 ms apart; each rank computes ``compute_ms[rank]`` ms, then waits in an all-reduce
    for the rest of the step (what a rank's peers do while a slow rank computes). With ``data_ms``, each rank
    measured its phases: data for its first ``data_ms[rank]`` ms, forward for the rest of its compute."""
    events: list[Event] = []
    for number in range(steps):
        for rank, compute in compute_ms.items():
            every = {"every_ns": (step_ms + 5) * MS}
            events.append(
                collective(rank, number, (step_ms - compute) / 1e3, offset_ns=compute * MS, waited=True, **every)
            )
            timing = step(rank, number, step_ms / 1e3, tokens=1000, loss=2.0, **every)
            if data_ms is not None:
                start, data = timing.start_ns, data_ms[rank] * MS
                timing = replace(
                    timing,
                    phases="df",
                    phase_start_ns=(start, start + data),
                    phase_end_ns=(start + data, start + compute * MS),
                )
            events.append(timing)
    return events


STRAGGLING = {"steps": 24, "step_ms": 1000}
"""A job long enough for the straggler rule (tests/recordings/test_stragglers.py has it by hand): 24 steps of
1 s, a slow rank of four beyond chance from its 10th and named once that held 10 s of steps (its 19th)."""


def folded(run_events: list[Event], **spec: object) -> RunFold:
    """A finished run of ``run_events`` folded as ``summary`` folds a recording: a table a kind."""
    fold = RunFold(description(**spec))  # type: ignore[arg-type]
    for kind, table in tables_of(run_events):
        fold.apply(kind, table)
    fold.finish("completed")
    return fold


# -- stragglers --------------------------------------------------------------------------------------------


def test_compute_time_is_the_step_less_its_exposed_communication() -> None:
    assert compute_seconds({0: 0.025, 1: 0.025}, {0: 0.015}) == {0: pytest.approx(0.010), 1: 0.025}


def test_peers_are_the_ranks_of_the_same_stage() -> None:
    """Stage 1 computes 800 ms a step and stage 0 400 ms: different work, no straggler; were the four ranks one
    stage, rank 3 (the higher of two alike) would be the slowest of every step, at 2x the median of the other
    three (400, 400, 800 ms)."""
    job = lagging_job({0: 400, 1: 400, 2: 800, 3: 800}, **STRAGGLING)
    assert folded(job, dp=2, pp=2).figures().stragglers == ()
    one_stage = folded(job, dp=4).figures().stragglers
    assert [(s.rank, s.ratio) for s in one_stage] == [(3, pytest.approx(2.0))]  # 800 / 400


VERDICT = "rank 3 is the slowest in 100 % of steps: 2.00x its peers' compute time, cause unknown"


def test_summary_and_the_dashboard_name_the_same_straggler(tmp_path: Path) -> None:
    """Rank 3 computes 800 ms of a 1 s step, its three peers 400 ms (they wait 600 ms in the all-reduce, rank 3
    200 ms): 800 / 400 = 2.00x, the slowest in every step."""
    run = description(dp=4)
    events = lagging_job({0: 400, 1: 400, 2: 400, 3: 800}, **STRAGGLING)
    summary = summarize(open_recording(write_recording(tmp_path / "rec", events, run=run)))
    [straggler] = summary["stragglers"]
    assert straggler == {
        "rank": 3,
        "stage": 0,
        "compute_s": pytest.approx(0.800),
        "peers_compute_s": pytest.approx(0.400),
        "ratio": pytest.approx(2.0),
        "slowest_in": 1.0,
        "cause": None,  # no rank measured its phases: no cause
        "cause_share": None,
        "peers_cause_share": None,
        "verdict": VERDICT,
    }
    assert f"{VERDICT} (stage 0: 800.00 ms against 400.00 ms of compute a step, over its last steps)" in summary_lines(
        summary
    )
    state = DashboardState(run)
    state.apply_events(events)
    state.finish("completed")
    assert [straggler_json(s) for s in state.stragglers()] == summary["stragglers"]
    assert VERDICT in [alert.text for alert in alerts_of(state)]


def test_a_straggler_with_phases_is_named_with_its_cause_in_summary_and_the_dashboard(tmp_path: Path) -> None:
    """As above, and each rank measured its phases: rank 3's 800 ms are 400 of data and 400 of forward, its
    peers' 400 ms are 40 of data and 360 of forward. Rank 3 computes the most in every one of the 24 steps; of
    its own work, data grew beyond the rest: 400 / 1000 = 40 % of its step against 40 / 1000 = 4 %, while its
    forward grew from 36 % to 40 % (x 40/36), so data's own extra is 40 - 4 x 40/36 = 35.6 of its 40 points of
    extra compute."""
    run = description(dp=4)
    events = lagging_job({0: 400, 1: 400, 2: 400, 3: 800}, data_ms={0: 40, 1: 40, 2: 40, 3: 400}, **STRAGGLING)
    summary = summarize(open_recording(write_recording(tmp_path / "rec", events, run=run)))
    [straggler] = summary["stragglers"]
    assert (straggler["rank"], straggler["slowest_in"], straggler["cause"]) == (3, 1.0, "data")
    assert straggler["cause_share"] == pytest.approx(0.40) and straggler["peers_cause_share"] == pytest.approx(0.04)
    verdict = "rank 3 is the slowest in 100 % of steps: data 40 % of its step vs 4 % on the others"
    assert straggler["verdict"] == verdict
    assert f"{verdict} (stage 0: 800.00 ms against 400.00 ms of compute a step, over its last steps)" in summary_lines(
        summary
    )
    assert summary["breakdown"]["slowest_in"] == {"0": 0.0, "1": 0.0, "2": 0.0, "3": 1.0}
    assert summary["breakdown"]["straggler"] == straggler  # the one it explains, as the stragglers list has it
    state = DashboardState(run)
    state.apply_events(events)
    state.finish("completed")
    assert verdict in [alert.text for alert in alerts_of(state)]


async def test_the_steps_view_draws_each_ranks_parts_and_names_what_it_spends_above_the_mean(tmp_path: Path) -> None:
    """The job above in the dashboard's Steps view: rank 3's row names its data, 40 % of its step against the
    ranks' mean of (1 + 1 + 1 + 10) / 4 / 25 = 13 %; its peers spend nothing above the mean."""
    events = lagging_job({0: 10, 1: 10, 2: 10, 3: 20}, data_ms={0: 1, 1: 1, 2: 1, 3: 10})
    source = ReplaySource(open_recording(write_recording(tmp_path / "rec", events, run=description(dp=4))))
    source.playback.seek_fraction(1.0)
    source.playback.paused = True
    app = MeshtopApp(source)
    async with app.run_test(size=(120, 50)) as pilot:
        await pilot.press("5")
        await pilot.pause()
        rows = screen_text(app).splitlines()
    start = next(i for i, row in enumerate(rows) if "where the step goes (each rank's share)" in row)
    ranks = [row for row in rows[start + 1 : start + 5]]
    assert [row.split()[:2] for row in ranks] == [["rank", str(rank)] for rank in range(4)], rows
    assert ranks[3].endswith("data 40 % (mean 13 %)") and all(row.endswith("as the mean") for row in ranks[:3])
    assert "█ data █ forward █ backward █ optimizer █ communication █ bubble █ other" in rows[start + 5]
    assert rows[start + 6].lstrip().startswith("per step: data ") and " forward " in rows[start + 6]


# -- headroom and the memory bars --------------------------------------------------------------------------


def snapshot(rank: int, number: int, *, peak_gib: int, activations_gib: int) -> MemorySnapshot:
    return MemorySnapshot(
        rank=rank,
        step=number,
        wall_ns=number,
        weights_bytes=4 * GIB,
        grads_bytes=4 * GIB,
        optimizer_bytes=8 * GIB,
        activations_bytes=activations_gib * GIB,
        kv_cache_bytes=None,
        allocated_bytes=16 * GIB,
        reserved_bytes=None,
        peak_allocated_bytes=peak_gib * GIB,
        device_used_bytes=None,
        device_total_bytes=80 * GIB,
        rss_bytes=3 * GIB,
    )


SNAPSHOTS = [
    snapshot(0, 0, peak_gib=30, activations_gib=14),  # rank 0 peaks at step 0...
    snapshot(0, 1, peak_gib=20, activations_gib=2),  # ...and its last step held less
    snapshot(1, 0, peak_gib=25, activations_gib=9),
    snapshot(1, 1, peak_gib=28, activations_gib=12),
]


def test_headroom_is_the_device_total_less_the_allocators_peak() -> None:
    memory = MemoryFold()
    memory.add(table_of(SNAPSHOTS))
    rows = {row.rank: row for row in memory.rows()}
    assert (rows[0].peak_bytes, rows[0].headroom_bytes, rows[0].headroom_share) == (30 * GIB, 50 * GIB, 0.625)
    assert (rows[1].peak_bytes, rows[1].headroom_bytes, rows[1].headroom_share) == (28 * GIB, 52 * GIB, 0.65)
    assert memory.most_loaded_rank() == 0 and memory.headroom_bytes() == 50 * GIB  # the most loaded rank's
    assert rows[0].activations_bytes == 2 * GIB  # the categories: its last snapshot's


def test_memory_changes_only_when_a_peak_rises_or_the_last_snapshot_says_something_new() -> None:
    """What a live dashboard's figures are kept by: a thousand ranks' memory rows are built again only after a
    change the rows would show."""
    memory = MemoryFold()
    memory.add(table_of([SNAPSHOTS[0]]))
    changes = memory.changes
    memory.add(table_of([replace(SNAPSHOTS[0], step=1, wall_ns=1, peak_allocated_bytes=10 * GIB, rss_bytes=GIB)]))
    assert memory.changes == changes  # a later step that held the same and peaked lower
    memory.add_process(table_of([ProcessSample(rank=0, pid=1, wall_ns=2, cpu_pct=1.0, rss_bytes=2 * GIB, threads=1)]))
    assert memory.changes == changes  # a resident set under the peak
    memory.add_process(table_of([ProcessSample(rank=0, pid=1, wall_ns=3, cpu_pct=1.0, rss_bytes=4 * GIB, threads=1)]))
    assert memory.changes == changes + 1  # the resident set's peak rose
    memory.add(table_of([replace(SNAPSHOTS[0], step=2, wall_ns=2, activations_bytes=GIB)]))
    assert memory.changes == changes + 2  # its last snapshot's activations changed


def test_a_runs_figures_kept_between_changes_follow_each_change() -> None:
    """The per-rank figures are computed again only when their input changed (a GPU sample changes no rank's
    memory and closes no step), and always when it did."""
    fold = RunFold(description(dp=4, device="cuda"))
    fold_events(fold, SNAPSHOTS[:2])
    first = fold.figures()
    fold_events(fold, [gpu_sample(wall_ns=5)])
    kept = fold.figures()
    assert kept is not first and kept.memory is first.memory and kept.breakdown is first.breakdown
    fold_events(fold, [replace(SNAPSHOTS[1], step=2, wall_ns=2, peak_allocated_bytes=40 * GIB)])
    moved = fold.figures()
    assert {row.rank: row.peak_bytes for row in moved.memory} == {0: 40 * GIB}
    assert moved.headroom_bytes == 40 * GIB
    assert moved.breakdown is None and moved.stragglers == ()
    job = lagging_job({0: 400, 1: 400, 2: 400, 3: 800}, data_ms={0: 40, 1: 40, 2: 40, 3: 400}, **STRAGGLING)
    for kind, table in tables_of(job):  # as in the test above
        fold.apply(kind, table)
    closed = fold.figures()
    assert fold.closed_count == 22 and closed.breakdown is not None and closed.breakdown.steps == 4 * 22
    fold.finish("completed")  # its last two steps closed
    ended = fold.figures()
    assert ended.breakdown is not None and ended.breakdown.steps == 4 * 24
    assert [(straggler.rank, straggler.cause) for straggler in ended.stragglers] == [(3, "data")]


def test_the_memory_bars_and_the_most_loaded_marker_read_the_same_peak() -> None:
    """Rank 1's last snapshot (28 GiB) is above rank 0's (20 GiB), but rank 0 peaked higher (30 GiB): rank 0 is
    the most loaded, and its bar is the longer: 4 + 4 + 8 + 2 GiB of its last step and 12 GiB other, of 80 GiB."""
    state = DashboardState(description(dp=2, device="cuda"))
    state.apply_events(SNAPSHOTS)
    rows = state.memory_rows()
    parts, capacity = memory_parts(rows[0])
    assert capacity == 80 * GIB
    assert parts == {
        "weights": 4 * GIB,
        "grads": 4 * GIB,
        "optimizer": 8 * GIB,
        "activations": 2 * GIB,
        "kv cache": 0,
        "other": 12 * GIB,
    }
    assert sum(memory_parts(rows[1])[0].values()) == 28 * GIB
    lines = memory_lines(state, lambda view: True, 80, None).plain.splitlines()
    assert lines[0].startswith("▶rank 0") and lines[0].endswith("30.0 GiB/80.0 GiB")
    assert lines[1].startswith(" rank 1") and lines[1].endswith("28.0 GiB/80.0 GiB")


def test_a_rank_seen_only_by_the_process_sampler_draws_its_peak_resident_set() -> None:
    row = MemoryRow(
        rank=0,
        peak_bytes=900,
        weights_bytes=None,
        grads_bytes=None,
        optimizer_bytes=None,
        activations_bytes=None,
        kv_cache_bytes=None,
        device_total_bytes=None,
        headroom_bytes=None,
    )
    assert memory_parts(row) == ({"other": 900}, None) and row.headroom_share is None


# -- the sweep's figures -----------------------------------------------------------------------------------


def memory_row(rank: int, *, peak: int | None, weights: int | None, activations: int | None) -> MemoryRow:
    return MemoryRow(
        rank=rank,
        peak_bytes=peak,
        weights_bytes=weights,
        grads_bytes=None if weights is None else 2,
        optimizer_bytes=None if weights is None else 3,
        activations_bytes=activations,
        kv_cache_bytes=None,
        device_total_bytes=None,
        headroom_bytes=None,
    )


def test_the_accounted_peak_and_the_peak_a_plan_is_checked_against() -> None:
    rows = [
        memory_row(0, peak=500, weights=10, activations=20),  # accounted 10 + 2 + 3 + 20 = 35
        memory_row(1, peak=400, weights=10, activations=40),  # 55
        memory_row(2, peak=600, weights=None, activations=None),  # the process sampler's only: none accounted
    ]
    assert [accounted_bytes(row) for row in rows] == [35, 55, None]
    assert [other_bytes(row) for row in rows] == [465, 345, 600]  # the peak less what the snapshot names
    assert other_bytes(memory_row(3, peak=30, weights=10, activations=20)) == 0  # categories above the peak
    cpu, cuda = plan_peak(rows, cuda=False), plan_peak(rows, cuda=True)
    assert cpu is not None and (cpu.rank, cpu.bytes, cpu.kind) == (1, 55, "accounted")
    assert cuda is not None and (cuda.rank, cuda.bytes, cuda.kind) == (2, 600, "allocator")
    assert plan_peak([rows[2]], cuda=False) is None


def collective_row(*, share: float | None, busbw: float | None) -> CollectiveRow:
    return CollectiveRow(
        group="dp",
        op="all_reduce",
        count=1,
        bytes=1,
        in_flight_total_s=0.0,
        in_flight_p50_s=None,
        in_flight_p99_s=None,
        busbw_p50_gbps=busbw,
        busbw_ops=1,
        exposed_per_step_s=None,
        exposed_share=share,
        exposed_measured=None,
    )


def test_communication_share_sums_the_rows_and_stops_at_one() -> None:
    assert communication_share([collective_row(share=0.25, busbw=None), collective_row(share=0.5, busbw=None)]) == 0.75
    assert communication_share([collective_row(share=0.7, busbw=None), collective_row(share=0.6, busbw=None)]) == 1.0
    assert communication_share([collective_row(share=None, busbw=None)]) is None


def test_the_mean_bubble_is_the_mean_over_stages() -> None:
    rows = [
        StageRow(stage=0, busy_s=1, idle_s=0.25, bubble_fraction=0.2),
        StageRow(stage=1, busy_s=1, idle_s=1, bubble_fraction=0.5),
    ]
    assert mean_bubble(rows) == pytest.approx(0.35) and mean_bubble([]) is None


def test_traffic_per_step_sums_bytes_per_rank_group_and_op() -> None:
    table = pa.table(
        {
            "rank": [0, 0, 1, 0, 0],
            "step": [2, 2, 2, 1, 2],
            "group": ["dp", "dp", "dp", "dp", "pp"],
            "op": ["all_reduce", "all_reduce", "all_reduce", "all_reduce", "send"],
            "bytes": [100, 100, 100, 50, 10],
        }
    )
    assert step_traffic(table, 2) == {
        (0, "dp", "all_reduce"): (200, 2),
        (1, "dp", "all_reduce"): (100, 1),
        (0, "pp", "send"): (10, 1),
    }
    assert last_full_step(3) == 2 and last_full_step(0) is None


def test_a_sweep_plan_is_measured_with_the_cores_figures(tmp_path: Path) -> None:
    """Two ranks, 3 steps of 10 ms, each waiting 4 ms in a 1 MiB all-reduce: communication 40 % of the step;
    on CPU the peak is the accounted one (rank 1: 4 + 4 + 8 + 9 GiB)."""
    run = description(dp=2)
    events: list[Event] = [
        snapshot(0, 2, peak_gib=30, activations_gib=2),
        snapshot(1, 2, peak_gib=20, activations_gib=9),
    ]
    for number in range(3):
        for rank in (0, 1):
            events.append(collective(rank, number, 0.004, every_ns=20 * MS, offset_ns=6 * MS, waited=True))
            events.append(step(rank, number, 0.010, every_ns=20 * MS, tokens=1000))
    measured = measure(write_recording(tmp_path / "plan", events, run=run))
    assert (measured["peak_rank"], measured["peak_bytes"], measured["peak_kind"]) == (1, 25 * GIB, "accounted")
    assert measured["memory"]["1"]["accounted_bytes"] == 25 * GIB and measured["memory"]["0"]["peak_bytes"] == 30 * GIB
    assert measured["comm_share"] == pytest.approx(0.4) and measured["bubble"] is None
    assert measured["traffic_step"] == 2
    assert measured["traffic"] == [
        {"rank": 0, "group": "dp", "op": "all_reduce", "bytes": 1 << 20, "count": 1},
        {"rank": 1, "group": "dp", "op": "all_reduce", "bytes": 1 << 20, "count": 1},
    ]


# -- the rates the planner takes from a recording ----------------------------------------------------------


def test_measured_rates_are_the_median_busbw_and_the_flops_a_rank_achieved() -> None:
    fold = folded(lagging_job({0: 10, 1: 10}, steps=3), dp=2)  # 1000 tokens in 25 ms: 40,000 tok/s
    run, figures = fold.run, fold.figures()
    rows = (
        collective_row(share=None, busbw=1.0),
        collective_row(share=None, busbw=4.0),
        collective_row(share=None, busbw=None),
        collective_row(share=None, busbw=2.0),
    )
    assert typical_busbw_gbps(rows) == 2.0 and typical_busbw_gbps([]) is None
    assert run.model is not None and run.seq_len is not None
    model = run.model
    looked_up = 0 if model.tie_embeddings else model.vocab_size * model.dim  # an untied embedding: looked up
    per_token = 6 * (model.parameters - looked_up) + 12 * model.n_layers * model.dim * run.seq_len  # PaLM's
    rates = measured_rates(run, figures)
    assert rates.flops_per_s == pytest.approx(40_000 * per_token / 2)
    # one (group, op): every all-reduce moved 1 MiB in 15 ms over 2 ranks, busbw = S / t x 2 (n - 1) / n
    assert rates.busbw_gbps == pytest.approx((1 << 20) / 0.015 / 1e9 * 2 * (2 - 1) / 2)
