"""The dashboard's plain-Python side: state folding, alerts, filters, playback, the live backlog."""

from __future__ import annotations

from collections import deque
from functools import partial
from pathlib import Path

import pytest

from meshtop.probes.arrivals import Arrivals
from meshtop.probes.errors import MeshtopError
from meshtop.probes.events import EventsDropped, FramesRefused, ProbeOff, ProcessSample, RankExited, StageAction
from meshtop.probes.kinds import COALESCIBLE_KINDS, SHOWN_KINDS
from meshtop.recordings.metrics.run import CLOSE_AFTER
from meshtop.recordings.reader import open_recording
from meshtop.recordings.replay import load_timeline
from meshtop.recordings.samples import SAMPLE
from meshtop.recordings.schema import table_of
from meshtop.recordings.session_fold import SessionFold
from meshtop.runner.plan import RunSpec, resolve
from meshtop.runner.session.session import BuiltinWork
from meshtop.tui.alerts import alerts_of
from meshtop.tui.filters import parse_rank_filter
from meshtop.tui.sources import LiveSource, Playback, ReplaySource, ScreenBacklog
from meshtop.tui.state import DashboardState
from meshtop.tui.view_records import HISTORY, RankView
from meshtop.tui.views import memory_lines
from tests.kit import events as kit
from tests.kit.events import memory_snapshot, rank_started
from tests.kit.recordings import description

MS = 1_000_000
STEP_NS = 10 * MS


step = partial(kit.step, every_ns=STEP_NS, tokens=100)
"""A step of each test's: steps start 10 ms apart."""
collective = partial(kit.collective, every_ns=STEP_NS, group_size=4, waited=True, overlapped=False)
"""A synchronous collective (waited on to its end) in a step, four ranks to the group."""


def dashboard(**spec: object) -> DashboardState:
    return DashboardState(description(**spec))


def test_the_state_stays_bounded_however_long_the_run() -> None:
    state = dashboard(dp=2)
    for number in range(HISTORY * 3):
        state.apply_events(
            [collective(0, number, 0.001), collective(1, number, 0.001), step(0, number, 0.01), step(1, number, 0.01)]
        )
    assert state.steps_done == HISTORY * 3
    assert len(state.steps) == HISTORY and len(state.fold.closed) == HISTORY
    [stats] = state.fold.collectives.stats
    assert stats.count == HISTORY * 6 and stats.exposed_s.count == HISTORY * 3 - CLOSE_AFTER
    assert len(state.fold.collectives.open_steps()) <= CLOSE_AFTER  # decided and let go as steps close
    [line] = state.collective_rows()
    assert len(line.history) == HISTORY


def test_p50_p99_interpolate_and_the_share_of_the_step_is_the_exposed_time_of_the_slowest_rank() -> None:
    state = dashboard(dp=2)
    for number in range(5):
        state.apply_events(
            [collective(0, number, 0.002), collective(1, number, 0.004), step(0, number, 0.010), step(1, number, 0.010)]
        )
    state.finish("completed")
    [line] = state.collective_rows()
    row = line.figures
    assert row.in_flight_p50_s == pytest.approx(0.003)  # [2, 2, 2, 2, 2, 4, 4, 4, 4, 4] ms: between the middle two
    assert row.in_flight_p99_s == pytest.approx(0.004)
    assert row.exposed_share == pytest.approx(0.4) and row.exposed_measured  # 4 of a 10 ms step, waits seen
    assert row.exposed_per_step_s == pytest.approx(0.004)
    assert row.busbw_p50_gbps is not None and row.busbw_p50_gbps > 0
    assert line.history == pytest.approx((0.004,) * 5)


def test_without_a_seen_wait_the_exposed_time_is_the_in_flight_bound_within_the_step() -> None:
    state = dashboard(dp=2)
    for number in range(3):
        events = [
            collective(rank, number, 0.004, offset_ns=offset, waited=False)
            for rank in (0, 1)
            for offset in (0, 2 * MS, 8 * MS)
        ]  # 0-4, 2-6 and 8-12 ms: 8 ms in the step
        state.apply_events([*events, step(0, number, 0.010), step(1, number, 0.010)])
    state.finish("completed")
    [row] = state.figures().collectives
    assert row.in_flight_total_s == pytest.approx(3 * 6 * 0.004)  # 72 ms in flight over 30 ms of steps
    assert row.exposed_per_step_s == pytest.approx(0.008)  # the union 0-6 and 8-10 ms, clipped to the step
    assert row.exposed_share == pytest.approx(0.8) and row.exposed_measured is False


def test_a_rank_slower_than_its_peers_is_called_a_straggler() -> None:
    state = dashboard(dp=4)
    state.apply_events([rank_started(rank, dp_rank=rank) for rank in range(4)])
    for number in range(24):  # 1 s steps: the straggler rule holds 10 s of steps before it names a rank
        for rank in range(4):
            compute = 0.8 if rank == 3 else 0.4  # the others wait for rank 3 in their all-reduce
            state.apply_events(
                [
                    collective(rank, number, 1.0 - compute, offset_ns=round(compute * 1e9), every_ns=1100 * MS),
                    step(rank, number, 1.0, start_ns=number * 1100 * MS),
                ]
            )
    assert [straggler.rank for straggler in state.stragglers()] == [3]
    assert any("rank 3 is the slowest in 100 % of steps: 2.00x" in alert.text for alert in alerts_of(state))


def test_alerts_name_a_failed_rank_low_headroom_dropped_telemetry_refused_frames_and_a_probe_that_is_off() -> None:
    state = dashboard(dp=2)
    state.apply_events(
        [
            rank_started(0),
            rank_started(1),
            RankExited(rank=1, wall_ns=5, exit_code=-9, signal="SIGKILL", error="killed"),
            memory_snapshot(  # 95 of 100 bytes at its peak: 5 % headroom
                0,
                95,
                weights_bytes=10,
                grads_bytes=10,
                optimizer_bytes=20,
                activations_bytes=50,
                allocated_bytes=40,
                reserved_bytes=96,
                device_total_bytes=100,
            ),
            EventsDropped(wall_ns=2, rank=0, where="worker", count=7),
            FramesRefused(wall_ns=2, reason="malformed", count=19),
            FramesRefused(wall_ns=3, reason="bad token", count=1),
            FramesRefused(wall_ns=4, reason="malformed", count=1),
            *(
                ProbeOff(rank=rank, wall_ns=3, probe="pipeline stages", reason="torch 2.99 has no _wait_batch_p2p")
                for rank in (0, 1)
            ),
        ]
    )
    texts = [(alert.severity, alert.text) for alert in alerts_of(state)]
    assert texts[0] == ("error", "rank 1 killed by SIGKILL: killed")
    assert ("warning", "rank 0 memory headroom 5% at its peak (below 10%)") in texts
    assert ("warning", "7 telemetry events dropped (buffers full)") in texts
    assert ("warning", "the collector refused 21 messages not from this job (bad token 1, malformed 20)") in texts
    assert ("warning", "probe off: pipeline stages on every rank: torch 2.99 has no _wait_batch_p2p") in texts


def test_memory_bars_draw_only_ranks_the_dashboard_shows_even_when_the_most_loaded_is_not_one() -> None:
    """Live, the session's fold (fed by the collector's thread) can know a rank's memory before the screen has
    read that rank start, and a filter can hide the most loaded rank: neither may break the frame (a KeyError
    once ended a live inference session) or draw a rank the dashboard does not show."""
    session = SessionFold(description(dp=2))
    state = DashboardState(session.run, session=session)
    session.take_tables([("memory", table_of([memory_snapshot(0, 900), memory_snapshot(1, 300)]))])
    state.apply("rank_started", table_of([rank_started(1)]))
    assert state.most_loaded_rank() == 0 and 0 not in state.ranks
    lines = memory_lines(state, lambda view: True, 80, 1).plain.splitlines()
    assert lines == [lines[0]] and lines[0].startswith(" rank 1")
    state.apply("rank_started", table_of([rank_started(0)]))
    assert memory_lines(state, lambda view: True, 80, 1).plain.startswith("▶rank 0")
    assert memory_lines(state, parse_rank_filter("1"), 80, 1).plain.splitlines()[0].startswith(" rank 1")


def test_the_hosts_and_nodes_follow_each_ranks_start_as_the_fold_has_it() -> None:
    """The grid labels every node a frame from :meth:`DashboardState.hosts`, the fold's: a rank seen first by its
    samples (its view on node 0, no host yet) moves to its node when its start comes."""
    state = DashboardState(description(dp=4))
    state.apply_events([rank_started(0, host="a", node=0), rank_started(1, host="a", node=0)])
    assert state.hosts() == {0: "a"} and state.fold.nodes == {0: 0, 1: 0}
    state.apply_events([memory_snapshot(2, 100)])
    assert state.ranks[2].node == 0 and state.hosts() == {0: "a"}
    state.apply_events([rank_started(2, host="b", node=1), rank_started(3, host="b", node=1)])
    assert state.hosts() == {0: "a", 1: "b"} and state.ranks[2].node == 1
    assert state.host_label(1) == "n1 b" and state.attention("step").measure == "step"


def test_a_live_screen_takes_process_samples_a_table_at_a_time_as_a_replay_takes_them_an_event_at_a_time() -> None:
    """The live screen reads the process table's columns (2 samples a second a rank: at a thousand ranks the
    kind it reads most); a replay, which feeds its own fold, decodes each sample: both show the same, and
    neither shows a rank outside the job (rank 7 of a 2-rank job). The live screen counts nothing itself: its
    session's fold counts what it leaves out."""
    samples = [
        ProcessSample(rank=rank, pid=100 + rank, wall_ns=at, cpu_pct=cpu, rss_bytes=rss, threads=4)
        for at, (rank, cpu, rss) in enumerate([(0, 50.0, 10), (1, None, 20), (7, 1.0, 1), (0, 70.0, None)])
    ]
    session = SessionFold(description(dp=2))
    live, replay = DashboardState(session.run, session=session), DashboardState(description(dp=2))
    live.apply("process", table_of(samples))
    replay.play([("process", table_of(samples))])
    assert sorted(live.ranks) == [0, 1] and live.ranks == replay.ranks
    zero = live.ranks[0]
    assert (zero.pid, zero.cpu_pct, zero.rss_bytes, list(zero.cpu_history)) == (100, 70.0, None, [50.0, 70.0])
    assert live.ranks[1].cpu_history == deque() and session.fold.rejected["process"] == 0


def test_a_live_screen_takes_gpu_samples_steps_and_memory_a_table_at_a_time_as_a_replay_takes_events() -> None:
    """The live screen reads the GPU table's columns, an event object for each GPU's last sample only, and of a
    step or memory table only the ranks (its session's fold has the rest): it shows what a replay, decoding each
    event, shows; a step of a rank outside the job (rank 7 of 2) or a negative step time shows no rank."""
    gpus = [
        kit.gpu_sample(gpu=gpu, node=node, wall_ns=at, utilization_pct=util, power_w=power)
        for at, (node, gpu, util, power) in enumerate(
            [(0, 0, 10.0, 100.0), (0, 1, None, 90.0), (1, 0, 30.0, None), (0, 0, 40.0, 120.0), (0, 1, 5.0, 95.0)]
        )
    ]
    steps = [kit.step(1, 0, 0.5), kit.step(7, 0, 0.5), kit.step(0, 0, -1.0)]
    session = SessionFold(description(dp=2))
    live, replay = DashboardState(session.run, session=session), DashboardState(description(dp=2))
    for kind, table in [
        ("gpu", table_of(gpus)),
        ("step", table_of(steps)),
        ("memory", table_of([memory_snapshot(0, 10)])),
    ]:
        live.apply(kind, table)
        replay.play([(kind, table)])
    assert list(live.ranks) == [1, 0] and live.ranks == replay.ranks
    assert live.gpus.keys() == replay.gpus.keys() == {(0, 0), (0, 1), (1, 0)}
    for key, view in live.gpus.items():
        other = replay.gpus[key]
        assert (view.sample, list(view.utilization), list(view.power_w)) == (
            other.sample,
            list(other.utilization),
            list(other.power_w),
        )
    first = live.gpus[0, 0]
    assert (first.sample.wall_ns, list(first.utilization), list(first.power_w)) == (3, [10.0, 40.0], [100.0, 120.0])
    assert list(live.gpus[0, 1].utilization) == [5.0]


def test_pipeline_timeline_places_actions_within_their_step() -> None:
    state = dashboard(dp=1, pp=2)
    state.apply_events([rank_started(0, pp_rank=0), rank_started(1, pp_rank=1)])
    state.apply_events(
        [
            StageAction(rank=0, step=0, stage=0, microbatch=0, action="forward", start_ns=0, end_ns=2 * MS),
            StageAction(rank=1, step=0, stage=1, microbatch=0, action="forward", start_ns=2 * MS, end_ns=4 * MS),
            StageAction(rank=1, step=0, stage=1, microbatch=0, action="backward", start_ns=4 * MS, end_ns=8 * MS),
            StageAction(rank=0, step=0, stage=0, microbatch=0, action="backward", start_ns=8 * MS, end_ns=10 * MS),
            step(0, 0, 0.012, start_ns=0, forward_backward_s=0.010),
            step(1, 0, 0.012, start_ns=0, forward_backward_s=0.010),
        ]
    )
    [drawn] = state.pipeline_steps()
    assert drawn.span_s == pytest.approx(0.010)
    assert [(s.start_s, s.action) for s in drawn.lanes[1]] == [(0.002, "forward"), (0.004, "backward")]
    assert drawn.bubble == {0: pytest.approx(0.6), 1: pytest.approx(0.4)}


@pytest.mark.parametrize(
    ("text", "kept"),
    [
        ("", [0, 1, 2, 3, 4, 5, 6, 7]),
        ("0-2,7", [0, 1, 2, 7]),
        ("pp=1", [4, 5, 6, 7]),
        ("dp=0 pp=1", [4, 6]),
        ("5, pp=1", [5]),
    ],
)
def test_rank_filter_selects_by_number_and_mesh_position(text: str, kept: list[int]) -> None:
    views = [RankView(rank=r, pp_rank=r // 4, dp_rank=r % 2) for r in range(8)]
    keep = parse_rank_filter(text)
    assert [v.rank for v in views if keep(v)] == kept


@pytest.mark.parametrize(("text", "message"), [("3-1", "runs backwards"), ("xx=1", "is not a rank filter")])
def test_a_bad_rank_filter_is_one_clear_error(text: str, message: str) -> None:
    with pytest.raises(MeshtopError, match=message):
        parse_rank_filter(text)


def test_playback_steps_seeks_and_goes_back_from_a_snapshot() -> None:
    now = [0.0]
    recording = open_recording(SAMPLE)
    source = ReplaySource(recording, clock=lambda: now[0], snapshot_rows=500)
    playback = source.playback
    state = DashboardState(recording.manifest.run)
    source.start()
    state = source.poll(state)
    opened = playback.position_ns  # where the data starts: the first rank's start, after the launch
    assert opened == source.timeline.data_start_ns() > playback.start_ns
    assert state.events == source.timeline.rows_until(opened)
    now[0] = 5.0  # five seconds of wall time at 2x: ten seconds of recording
    playback.speed = 2.0
    state = source.poll(state)
    assert source.now_ns() - opened == 10_000_000_000
    playback.seek_step(20)
    state = source.poll(state)
    assert playback.current_step() == 20 and state.steps_done == 21
    playback.step_forward()
    assert playback.current_step() == 21 and playback.paused
    forward = source.poll(state)
    assert forward is state and state.steps_done == 22
    playback.step_back()
    playback.step_back()
    assert playback.current_step() == 19
    back = source.poll(state)
    assert back is not state and back.steps_done == 20  # a copy of a snapshot, carried forward to step 20
    assert back.events == source.timeline.rows_until(playback.position_ns)
    with pytest.raises(MeshtopError, match="no step 41 in this recording"):
        playback.seek_step(40)
    playback.to_end()
    assert playback.at_end and source.poll(state).steps_done == 40
    playback.to_start()
    assert playback.position_ns == playback.start_ns and playback.paused
    assert source.poll(state).steps_done == 0


def test_a_replay_folds_a_bounded_number_of_rows_a_frame_and_catches_up() -> None:
    recording = open_recording(SAMPLE)
    source = ReplaySource(recording, clock=lambda: 0.0, rows_per_frame=1000)
    source.playback.seek_fraction(1.0)
    state = DashboardState(recording.manifest.run)
    frames = 0
    while not source.caught_up:
        before = state.events
        state = source.poll(state)
        assert state.events - before <= 1000 or frames == 0
        frames += 1
    assert frames >= source.timeline.rows // 1000 and state.steps_done == 40 and source.status == "completed"


def test_playback_speed_moves_through_fixed_steps() -> None:
    playback = Playback(load_timeline(open_recording(SAMPLE)), clock=lambda: 0.0)
    playback.faster()
    assert playback.speed == 2.0
    playback.slower()
    playback.slower()
    assert playback.speed == 0.5


def test_a_full_screen_backlog_skips_only_high_rate_events_and_never_a_rank_start_or_a_step(tmp_path: Path) -> None:
    run = resolve(RunSpec(device="cpu", dp=2, pp=2), gpus_visible=0)
    source = LiveSource(BuiltinWork(run), directory=tmp_path, manifest=None, backlog=100)
    events = [rank_started(rank, pp_rank=rank // 2, dp_rank=rank % 2) for rank in range(4)]
    for number in range(30):
        events += [collective(rank, number, 0.001) for rank in range(4) for _ in range(10)]
        events += [step(rank, number, 0.01) for rank in range(4)]
    arrivals = Arrivals(events)
    source._take(arrivals, source.session.take(arrivals))  # the session thread's, with far more than the screen holds
    state = source.poll(DashboardState(source.description, session=source.session))
    assert {rank: view.pp_rank for rank, view in state.ranks.items()} == {0: 0, 1: 0, 2: 1, 3: 1}
    assert state.steps_done == 30 and len(state.steps) == 30
    assert state.coalesced == source.backlog.skipped > 0
    assert state.events + state.coalesced == len(events)
    assert any("left out of the live view to keep up" in alert.text for alert in alerts_of(state))
    assert source.poll(state).events == state.events  # nothing twice


def test_the_backlog_keeps_order_and_skips_the_oldest_high_rate_batches_first() -> None:
    backlog = ScreenBacklog(limit=10)
    batches = [
        ("collective", table_of([collective(0, 0, 0.001)] * 8)),
        ("rank_started", table_of([rank_started(0)])),
        ("collective", table_of([collective(0, 1, 0.001)] * 8)),
    ]
    for batch in batches:
        backlog.put([batch])
    kinds = [kind for kind, _ in backlog.take_with_steps()[0]]
    assert kinds == ["rank_started", "collective"] and backlog.skipped == 8 and "collective" in COALESCIBLE_KINDS


def test_a_live_job_says_what_it_does_before_its_first_step() -> None:
    """The launcher's phase until a rank reports, then how many have, until the first step; nothing after it,
    and nothing in a replay (no launcher phase)."""
    state = DashboardState(description(dp=2))
    assert state.startup() is None  # a replay: no launcher
    state.launcher_phase = "building the C++ probe (first run only, ~30 s)"
    assert state.startup() == state.launcher_phase
    state.apply_events([rank_started(0)])
    assert state.startup() == "1 of 2 ranks started"
    state.apply_events([rank_started(1)])
    assert state.startup() == "every rank started, waiting for the first step"
    state.apply_events([step(0, 0, 0.005), step(1, 0, 0.005)])
    assert state.steps_done == 1 and state.startup() is None


def test_every_kind_the_screen_reads_is_one_a_live_screen_is_handed() -> None:
    """A live source hands the screen the shown kinds only (:data:`meshtop.probes.kinds.SHOWN_KINDS`): a reader
    of another kind would read it in a replay and never live."""
    assert DashboardState._READERS.keys() <= SHOWN_KINDS
