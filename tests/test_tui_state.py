"""The dashboard's plain-Python side: state folding, alerts, filters, playback, the live backlog."""

from __future__ import annotations

from pathlib import Path

import pytest

from probes.arrivals import Arrivals
from probes.errors import MeshtopError
from probes.events import (
    CollectiveTiming, EventsDropped, GpuSample, RankExited, RankStarted, StageAction, StepTiming,
)
from recordings.analysis import summarize
from recordings.reader import open_recording
from recordings.replay import load_timeline
from recordings.samples import SAMPLE
from runner.plan import RunSpec, resolve
from tui.filters import parse_rank_filter
from tui.sources import LiveSource, Playback, ReplaySource
from tui.state import HISTORY, DashboardState, RankView

MS = 1_000_000


def description(world: int = 4, pp: int = 1) -> dict[str, object]:
    return {"plan": {"label": "test", "world_size": world, "pp": pp, "microbatches": 2},
            "model": {"name": "tiny", "parameters": 1000, "n_layers": 2, "dim": 8},
            "device": "cpu", "dtype": "fp32", "steps": 10, "seq_len": 4, "mode": "train", "instrumented": True}


def started(rank: int, pp_rank: int = 0, dp_rank: int = 0) -> RankStarted:
    return RankStarted(rank=rank, pid=100 + rank, host="h", device="cpu", pp_rank=pp_rank, dp_rank=dp_rank,
                       tp_rank=0, stages=(), local_parameters=10, wall_ns=0)


def step(rank: int, number: int, duration_s: float, start_ns: int = 0, fb: float | None = None) -> StepTiming:
    return StepTiming(rank=rank, step=number, start_ns=start_ns, duration_s=duration_s, tokens=100, loss=1.0,
                      forward_backward_s=fb)


def collective(rank: int, number: int, seconds: float, op: str = "all_reduce") -> CollectiveTiming:
    return CollectiveTiming(rank=rank, step=number, op=op, group="dp", group_size=4, peer=None, bytes=1 << 20,
                            dtype="float32", start_ns=0, end_ns=int(seconds * 1e9), clock="completion")


@pytest.fixture(scope="module")
def sample_replayed() -> tuple[DashboardState, dict[str, object]]:
    recording = open_recording(SAMPLE)
    state = DashboardState(recording.manifest)
    state.apply(load_timeline(recording).events)
    return state, summarize(open_recording(SAMPLE))


def test_replaying_the_sample_agrees_with_the_recordings_analysis(sample_replayed) -> None:
    state, summary = sample_replayed
    assert state.steps_done == summary["steps"]["count"] == 40
    counts = {(row.group, row.op): row.count for row in state.collective_rows()}
    assert counts == {(row["group"], row["op"]): row["count"] for row in summary["collectives"]}
    bubbles = state.bubble_history()
    for stage in summary["stages"]:  # the same formula, folded live vs computed with pandas
        live = sum(bubbles[stage["stage"]]) / len(bubbles[stage["stage"]])
        assert live == pytest.approx(stage["bubble_fraction"], abs=1e-9)
    assert state.most_loaded_rank() == summary["most_loaded_rank"]
    assert {view.status for view in state.ranks.values()} == {"exited 0"}


def test_the_state_stays_bounded_however_long_the_run() -> None:
    state = DashboardState(description(world=2))
    for number in range(HISTORY * 3):
        state.apply([collective(0, number, 0.001), collective(1, number, 0.001),
                     step(0, number, 0.01), step(1, number, 0.01)])
    assert state.steps_done == HISTORY * 3
    assert len(state.steps) == HISTORY
    stats = state.collectives[("dp", "all_reduce")]
    assert stats.count == HISTORY * 6
    assert len(stats.durations_s) <= 512 and len(stats.history) == HISTORY
    assert len(stats.per_step_s) == 0  # folded away as steps complete


def test_collective_share_of_the_step_is_time_per_rank_over_step_time() -> None:
    state = DashboardState(description(world=2))
    for number in range(5):
        state.apply([collective(0, number, 0.002), collective(1, number, 0.004),
                     step(0, number, 0.010), step(1, number, 0.010)])
    row = state.collective_rows()[0]
    assert row.step_share == pytest.approx(0.3)  # (2 + 4) / 2 ms of a 10 ms step
    assert row.p50_s in (0.002, 0.004) and row.p99_s == 0.004
    assert row.busbw_gbps is not None and row.busbw_gbps > 0


def test_a_rank_slower_than_its_peers_is_called_a_straggler() -> None:
    state = DashboardState(description(world=4))
    state.apply([started(rank, dp_rank=rank) for rank in range(4)])
    for number in range(5):
        for rank in range(4):
            compute = 0.020 if rank == 3 else 0.010  # the others wait for rank 3 in their all-reduce
            state.apply([collective(rank, number, 0.025 - compute), step(rank, number, 0.025)])
    assert [rank for rank, _ in state.stragglers()] == [3]
    assert any("rank 3 is a straggler: 2.00x" in alert.text for alert in state.alerts())


def test_alerts_name_a_failed_rank_low_headroom_and_dropped_telemetry() -> None:
    state = DashboardState(description(world=2))
    state.apply([
        started(0), started(1),
        RankExited(rank=1, wall_ns=5, exit_code=-9, signal="SIGKILL", error="killed"),
        GpuSample(gpu=0, wall_ns=1, name="H200", memory_used_bytes=95, memory_total_bytes=100, utilization_pct=99,
                  memory_utilization_pct=None, power_w=500, sm_clock_mhz=1980, temperature_c=60,
                  pcie_tx_bytes_per_s=None, pcie_rx_bytes_per_s=None, nvlink_tx_bytes_per_s=None,
                  nvlink_rx_bytes_per_s=None),
        EventsDropped(wall_ns=2, rank=0, where="worker", count=7),
    ])
    texts = [(alert.severity, alert.text) for alert in state.alerts()]
    assert texts[0] == ("error", "rank 1 killed by SIGKILL: killed")
    assert ("warning", "GPU 0 memory headroom 5% (below 10%)") in texts
    assert ("warning", "7 telemetry events dropped (buffers full)") in texts


def test_pipeline_timeline_places_actions_within_their_step() -> None:
    state = DashboardState(description(world=2, pp=2))
    state.apply([started(0, pp_rank=0), started(1, pp_rank=1)])
    state.apply([
        StageAction(rank=0, step=0, stage=0, microbatch=0, action="forward", start_ns=0, end_ns=2 * MS),
        StageAction(rank=1, step=0, stage=1, microbatch=0, action="forward", start_ns=2 * MS, end_ns=4 * MS),
        StageAction(rank=1, step=0, stage=1, microbatch=0, action="backward", start_ns=4 * MS, end_ns=8 * MS),
        StageAction(rank=0, step=0, stage=0, microbatch=0, action="backward", start_ns=8 * MS, end_ns=10 * MS),
        step(0, 0, 0.012, fb=0.010), step(1, 0, 0.012, fb=0.010),
    ])
    [drawn] = state.pipeline_steps()
    assert drawn.span_s == pytest.approx(0.010)
    assert [(s.start_s, s.action) for s in drawn.lanes[1]] == [(0.002, "forward"), (0.004, "backward")]
    assert drawn.bubble == {0: pytest.approx(0.6), 1: pytest.approx(0.4)}


@pytest.mark.parametrize(("text", "kept"), [
    ("", [0, 1, 2, 3, 4, 5, 6, 7]), ("0-2,7", [0, 1, 2, 7]), ("pp=1", [4, 5, 6, 7]),
    ("dp=0 pp=1", [4, 6]), ("5, pp=1", [5]),
])
def test_rank_filter_selects_by_number_and_mesh_position(text: str, kept: list[int]) -> None:
    views = [RankView(rank=r, pp_rank=r // 4, dp_rank=r % 2) for r in range(8)]
    keep = parse_rank_filter(text)
    assert [v.rank for v in views if keep(v)] == kept


@pytest.mark.parametrize(("text", "message"), [("3-1", "runs backwards"), ("xx=1", "is not a rank filter")])
def test_a_bad_rank_filter_is_one_clear_error(text: str, message: str) -> None:
    with pytest.raises(MeshtopError, match=message):
        parse_rank_filter(text)


def test_playback_steps_seeks_and_rebuilds_when_going_back() -> None:
    now = [0.0]
    source = ReplaySource(open_recording(SAMPLE), clock=lambda: now[0])
    playback = source.playback
    source.start()
    first = source.poll()
    assert not first.reset
    assert all(t <= playback.start_ns for t in source.timeline.times_ns[:len(first.events)])
    now[0] = 5.0  # five seconds of wall time at 2x: ten seconds of recording
    playback.speed = 2.0
    moved = source.poll()
    assert source.now_ns() - playback.start_ns == 10_000_000_000 and moved.events
    playback.seek_step(20)
    assert playback.current_step() == 20
    playback.step_forward()
    assert playback.current_step() == 21 and playback.paused
    forward = source.poll()
    assert not forward.reset
    playback.step_back()
    playback.step_back()
    assert playback.current_step() == 19
    back = source.poll()
    assert back.reset and len(back.events) == sum(1 for t in source.timeline.times_ns if t <= playback.position_ns)
    with pytest.raises(MeshtopError, match="no step 41 in this recording"):
        playback.seek_step(40)


def test_playback_speed_moves_through_fixed_steps() -> None:
    playback = Playback(load_timeline(open_recording(SAMPLE)), clock=lambda: 0.0)
    playback.faster()
    assert playback.speed == 2.0
    playback.slower()
    playback.slower()
    assert playback.speed == 0.5


def test_live_backlog_for_the_screen_is_bounded_and_counts_what_it_drops(tmp_path: Path) -> None:
    run = resolve(RunSpec(device="cpu"), gpus_visible=0)
    source = LiveSource(run, directory=tmp_path, manifest=None, backlog=100)
    for number in range(30):
        source._take(Arrivals([step(0, number, 0.01)] * 10), [])  # the session thread's callback
    update = source.poll()
    assert len(update.events) <= 100
    assert source.dropped_for_screen == 300 - len(update.events)
    assert update.events[-1].step == 29  # the newest are kept
    assert source.poll().events == []
