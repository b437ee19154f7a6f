"""Many nodes without launching any: the options, the clock shift, the head's collector and its fleet."""

from __future__ import annotations

import socket
import time
from dataclasses import replace
from pathlib import Path

import pytest

from meshtop.probes.arrivals import Arrivals, EncodedEvents, encode_lines
from meshtop.probes.collector import Collector
from meshtop.probes.events import CollectiveTiming, EventsDropped, NodeClock, RequestDone, StepTiming, on_node
from meshtop.probes.wire import event_sections, pack, read_frame
from meshtop.recordings.manifest import read_manifest, start_manifest
from meshtop.recordings.metrics.steps import StepFolder
from meshtop.recordings.recorder import Ending, SessionRecorder
from meshtop.recordings.session_fold import SessionFold
from meshtop.runner.errors import PlanError
from meshtop.runner.job.control import JobControl
from meshtop.runner.multinode.fleet import Fleet, NodeEnd, Ping, RankEnded, message
from meshtop.runner.multinode.nodes import HeadAddress, Nodes, nodes_from_options, split_endpoint
from meshtop.runner.plan import RunSpec, resolve
from meshtop.runner.results import JobResult, RankExit, RankFailure, root_cause
from meshtop.runner.session import relay as relay_module
from meshtop.runner.session.relay import Relay
from meshtop.tui.state import DashboardState
from tests.kit import events
from tests.kit.commands import run_meshtop
from tests.kit.events import fold_events, gpu_sample, reported
from tests.kit.recordings import elastic_script

ROOT = Path(__file__).resolve().parents[2]


class Clock:
    """A fleet's clock that moves only when the test moves it (a busy machine does not stretch a window)."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def ping(node: int, host: str = "b", **clock: int) -> dict[str, object]:
    """Node ``node``'s ping, as the head's collector hands it to the fleet."""
    return {"node": node, **message("ping", Ping(t0=0, host=host, **clock))}


def bye(node: int, status: str, *ranks: tuple[int, int, str | None, str | None, float]) -> dict[str, object]:
    """Node ``node``'s last word: ``status``, and each rank's (rank, exit code, signal, error, failed at)."""
    ended = tuple(
        RankEnded(exit=RankExit(rank=rank, exit_code=code, signal=signal, error=error), failed_at=when)
        for rank, code, signal, error, when in ranks
    )
    return {"node": node, **message("bye", NodeEnd(status=status, ranks=ended))}


def head_of(count: int) -> Nodes:
    """Node 0 of a job on ``count`` nodes: the head, whose fleet is nodes 1 to ``count - 1``."""
    return Nodes(count=count, rank=0, endpoint="127.0.0.1:29400", run_id="test")


def test_a_node_joins_torchruns_c10d_rendezvous() -> None:
    nodes = nodes_from_options(nnodes="2", node_rank=1, endpoint="10.0.0.5:29500", run_id="job7")
    assert nodes is not None and not nodes.head
    assert nodes.launcher_args(4) == (
        "--nnodes=2",
        "--node-rank=1",
        "--nproc-per-node=4",
        "--rdzv-backend=c10d",
        "--rdzv-endpoint=10.0.0.5:29500",
        "--rdzv-id=job7",
    )
    assert nodes.store_key == "meshtop/job7/head"
    assert nodes.others == (1,)
    named = nodes_from_options(nnodes="3", node_rank=1, endpoint="127.0.0.1:1", run_id=None, head_node=1)
    assert named is not None and named.head and named.others == (0, 2)
    assert nodes_from_options(nnodes="2:2", node_rank=1, endpoint="h", run_id=None).endpoint == "h:29400"
    assert nodes_from_options(nnodes=None, node_rank=None, endpoint=None, run_id=None) is None
    assert nodes_from_options(nnodes="1", node_rank=0, endpoint=None, run_id=None) is None


def test_an_elastic_script_joins_with_its_node_range() -> None:
    nodes = nodes_from_options(nnodes="1:3", node_rank=2, endpoint="127.0.0.1:29500", run_id="e", elastic=True)
    assert nodes is not None and nodes.elastic and (nodes.min_count, nodes.count) == (1, 3)
    assert nodes.launcher_args(2)[:2] == ("--nnodes=1:3", "--node-rank=2")
    assert nodes.others == (1, 2)
    fixed = nodes_from_options(nnodes="2:2", node_rank=1, endpoint="h:1", run_id=None, elastic=True)
    assert fixed is not None and not fixed.elastic and fixed.launcher_args(1)[0] == "--nnodes=2"


def test_the_head_listens_where_the_others_reach_the_rendezvous() -> None:
    loopback = nodes_from_options(nnodes="2", node_rank=0, endpoint="127.0.0.1:29500", run_id=None)
    assert loopback is not None and loopback.bind_address() == ("127.0.0.1", 0)
    chosen = nodes_from_options(
        nnodes="2", node_rank=0, endpoint="127.0.0.1:29500", run_id=None, collector_bind="0.0.0.0:7000"
    )
    assert chosen is not None and chosen.bind_address() == ("0.0.0.0", 7000)
    with pytest.raises(PlanError, match=r"--rdzv-endpoint host 'a\.\.b': .*idna"):  # not a ValueError
        nodes_from_options(nnodes="2", node_rank=0, endpoint="a..b:29500", run_id=None)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (dict(nnodes="2", node_rank=None, endpoint="h:1"), "--nnodes 2 needs --node-rank I"),
        (dict(nnodes="2", node_rank=2, endpoint="h:1"), "--node-rank 2: give a node rank from 0 to 1"),
        (dict(nnodes="2", node_rank=0, endpoint=None), "--nnodes 2 needs --rdzv-endpoint HOST:PORT"),
        (dict(nnodes="1:4", node_rank=0, endpoint="h:1"), "the built-in runner's plan fixes its ranks"),
        (dict(nnodes="3:2", node_rank=0, endpoint="h:1", elastic=True), "MIN is above MAX"),
        (dict(nnodes="1:2", node_rank=2, endpoint="h:1", elastic=True), "give a node rank from 0 to 1"),
        (dict(nnodes="two", node_rank=0, endpoint="h:1"), "--nnodes 'two' is not N or MIN:MAX"),
        (dict(nnodes="2", node_rank=0, endpoint="h:99999"), "is not HOST:PORT"),
        (dict(nnodes="2", node_rank=0, endpoint="h:1", backend="static"), "--rdzv-backend static"),
        (dict(nnodes=None, node_rank=1, endpoint=None), "--node-rank is for a job on many nodes"),
        (dict(nnodes="2", node_rank=0, endpoint="h:1", collector_bind=":x"), "--collector-bind ':x' is not"),
        (dict(nnodes="2", node_rank=0, endpoint="h:1", head_node=2), "--head-node 2: give a node rank from 0 to 1"),
        (dict(nnodes=None, node_rank=None, endpoint=None, head_node=1), "--head-node is for a job on many nodes"),
    ],
)
def test_node_options_that_cannot_work_name_the_fix(options: dict[str, object], message: str) -> None:
    with pytest.raises(PlanError, match=message):
        nodes_from_options(run_id=None, **options)  # type: ignore[arg-type]


def test_endpoints() -> None:
    assert split_endpoint("node0:29500") == ("node0", 29500)
    assert split_endpoint("[::1]:29500") == ("::1", 29500)
    assert split_endpoint("node0") == ("node0", 29400)


def test_a_plan_splits_evenly_over_the_nodes() -> None:
    run = resolve(RunSpec(device="cpu"), gpus_visible=0, nodes=2)
    assert run.plan.world_size == 4  # two CPU ranks on each node by default
    with pytest.raises(PlanError, match="do not split evenly over 2 nodes"):
        resolve(RunSpec(device="cpu", dp=3), gpus_visible=0, nodes=2)


def test_an_event_moves_onto_the_heads_clock() -> None:
    offset = -5_000_000_000
    op = CollectiveTiming(
        rank=2,
        op="all_reduce",
        group="dp",
        group_size=4,
        peer=None,
        bytes=8,
        dtype="float32",
        step=1,
        start_ns=10_000_000_000,
        end_ns=10_000_500_000,
        clock="completion",
        waited_ns=300_000,
    )
    moved = on_node(op, offset_ns=offset, node=1)
    assert (moved.start_ns, moved.end_ns, moved.waited_ns) == (5_000_000_000, 5_000_500_000, 300_000)
    request = RequestDone(
        request=1,
        replica=0,
        rank=0,
        prompt_tokens=3,
        output_tokens=2,
        arrival_ns=100,
        first_token_ns=None,
        end_ns=300,
        token_ns=(200, 300),
        status="ok",
        error=None,
        output_ids=(1, 2),
    )
    moved_request = on_node(request, offset_ns=1000, node=1)
    assert (moved_request.arrival_ns, moved_request.first_token_ns, moved_request.token_ns) == (
        1100,
        None,
        (1200, 1300),
    )
    gpu = gpu_sample(
        gpu=0,
        wall_ns=7,
    )
    assert (on_node(gpu, offset_ns=3, node=1).node, on_node(gpu, offset_ns=3, node=1).wall_ns) == (1, 10)


def test_the_heads_collector_takes_its_nodes_and_refuses_others() -> None:
    asked: list[dict[str, object]] = []

    def answer(header: dict[str, object], connection: int) -> dict[str, object]:
        asked.append({**header, "connection": connection})
        return {"t1": 42}

    collector = Collector(nodes=(1,), on_control=answer).start()
    try:
        with socket.create_connection(collector.address, timeout=5) as sock:
            sock.sendall(pack({"token": collector.token, "rank": 0, "node": 1, "control": "ping", "t0": 1}))
            reply = read_frame(sock)
            assert reply is not None and reply[0] == {"t1": 42}
            listed, body = event_sections([events.step(2)])
            sock.sendall(pack({"token": collector.token, "rank": 0, "dropped": 0, "node": 1, "sections": listed}, body))
        with socket.create_connection(collector.address, timeout=5) as sock:
            sock.sendall(pack({"token": collector.token, "rank": 0, "node": 2, "control": "ping", "t0": 1}))
            assert read_frame(sock) is None  # node 2 is not one of a two-node job's
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and not (collector.counts.unknown_node and len(asked) >= 3):
            time.sleep(0.02)
        assert collector.counts.unknown_node == 1
        # its events said it is alive, its connection closed: said once, with the connection's number
        assert [(h["control"], h["connection"]) for h in asked] == [("ping", 1), ("data", 1), ("closed", 1)]
        assert [e.rank for item in collector.drain() for e in item.events()] == [2]  # type: ignore[union-attr]
    finally:
        collector.stop()


def test_a_relay_whose_queue_is_full_counts_each_dropped_event_and_the_head_records_the_count(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Node 1's relay holds 5 events at most; its ranks report before it has reached the head, so nothing
    leaves the queue meanwhile. Steps 0-2 are queued (3 held), a block of 4 steps (3 + 4 = 7 > 5) is dropped
    whole (4), steps 7-8 are queued (5 held), step 9 (6 > 5) is dropped (1): 5 forwarded, 4 + 1 = 5 dropped,
    which the head's collector records as one ``events_dropped`` of 5 from node 1."""
    monkeypatch.setattr(relay_module, "MAX_QUEUED", 5)
    block = [events.step(1, number) for number in (3, 4, 5, 6)]
    arrivals = Arrivals([events.step(1, 0), events.step(1, 1), events.step(1, 2)])
    arrivals.items.append(EncodedEvents(kind=StepTiming.kind, rank=1, lines=encode_lines(block), count=4))
    arrivals.add([events.step(1, 7), events.step(1, 8), events.step(1, 9)])

    def answer(header: dict[str, object], connection: int) -> dict[str, object]:
        return {"t1": time.time_ns()}

    head = Collector(nodes=(1,), on_control=answer).start()
    try:
        address = HeadAddress(address=head.address, token=head.token, host="head")
        node = Relay(
            Nodes(count=2, rank=1, endpoint="127.0.0.1:29400", run_id="test"),
            JobControl(),
            find=lambda nodes, going: address,
        )
        node.forward(arrivals)
        assert node.dropped == 5  # 4 (the block) + 1 (step 9)
        node.start().finish(None)  # its last word: what is queued, and the count of what was not
        assert node.head_lost is None and node.dropped == 0  # the count went to the head with the events
        received: list[object] = []
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not any(isinstance(item, EventsDropped) for item in received):
            received += head.drain()
            time.sleep(0.02)
    finally:
        head.stop()
    received += head.drain()
    steps = [
        e.step
        for item in received
        if isinstance(item, EncodedEvents)
        for e in item.events()
        if isinstance(e, StepTiming)
    ]
    assert steps == [0, 1, 2, 7, 8]
    assert [(e.rank, e.where, e.count) for e in received if isinstance(e, EventsDropped)] == [(None, "node 1", 5)]


def test_a_fleet_of_no_other_nodes_leaves_the_result_as_it_is(tmp_path: Path) -> None:
    """A job on one node: run_job follows it as the head's, with nothing to hear from, stop, wait for or merge."""
    single = Fleet()
    local = JobResult(
        status="failed",
        ranks=(RankExit(rank=0, exit_code=1, signal=None, error=None),),
        duration_s=1.0,
        log_path=tmp_path,
        root_cause=0,
    )
    single.settle()
    assert single.merge(local, {0}, 1) is local
    assert (single.lost(), single.failed(), single.stacks_in(), single.is_other(0), single.take_events()) == (
        None,
        None,
        True,
        False,
        [],
    )


def test_the_fleet_names_a_lost_node_and_merges_how_each_node_ended(tmp_path: Path) -> None:
    fleet = Fleet(head_of(3), silent_s=0.2, clock=Clock())  # no time passes: no node falls silent
    for node in (1, 2):
        reply = fleet.on_control(ping(node, f"h{node}", offset_ns=-5_000_000_000, rtt_ns=40_000), 1)
        assert reply["stop"] is None and reply["stacks"] is False
    clocks = fleet.take_events()
    assert [(e.node, e.offset_ns) for e in clocks if isinstance(e, NodeClock)] == [
        (1, -5_000_000_000),
        (2, -5_000_000_000),
    ]
    fleet.note_ranks(1, 2)
    fleet.note_ranks(1, 3)
    fleet.on_control(bye(2, "failed", (4, -9, "SIGKILL", None, 101.0), (5, 1, None, "peer", 100.0)), 1)
    assert fleet.failed() is not None and fleet.failed().node == 2  # type: ignore[union-attr]
    local = JobResult(
        status="failed",
        ranks=(
            RankExit(rank=0, exit_code=1, signal=None, error="peer"),
            RankExit(rank=1, exit_code=1, signal=None, error="peer"),
        ),
        duration_s=1.0,
        log_path=tmp_path,
        root_cause=0,
        failure_times={0: 100.0, 1: 100.0},
    )
    fleet.on_control(bye(1, "failed"), 1)
    merged = fleet.merge(local, {0, 1}, 6)
    # a rank a signal killed, not its peers' errors, though its launcher noticed it a second after they raised
    assert merged.status == "failed" and merged.root_cause == 4
    assert [r.rank for r in merged.ranks] == [0, 1, 2, 3, 4, 5]

    clock = Clock()
    fleet = Fleet(head_of(2), silent_s=0.2, clock=clock)
    fleet.on_control(ping(1), 1)
    fleet.note_ranks(1, 2)
    clock.now += 0.19
    assert fleet.lost() is None
    clock.now += 0.02
    lost = fleet.lost()
    assert lost is not None and lost.node == 1
    merged = fleet.merge(JobResult(status="interrupted", ranks=(), duration_s=1.0, log_path=tmp_path), {0, 1}, 3)
    assert merged.status == "failed" and merged.root_cause == 2
    assert merged.node_lost is not None and merged.node_lost.startswith("node 1 (host b, ranks 2) lost: nothing")
    fleet.stop("failed")
    assert fleet.on_control(ping(1), 1)["stop"] == "failed"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            [
                "record",
                "OUT",
                "--nnodes",
                "2",
                "--node-rank",
                "0",
                "--rdzv-endpoint",
                "h:1",
                "--",
                "torchrun",
                "examples/ddp.py",
            ],
            "--nnodes is torchrun's: give it to torchrun after --",
        ),
        (["record", "OUT", "--node-rank", "1"], "--node-rank is for a job on many nodes"),
        (
            ["record", "OUT", "--nnodes", "2", "--node-rank", "0", "--rdzv-endpoint", "127.0.0.1:1", "--dp", "3"],
            "do not split evenly over 2 nodes",
        ),
    ],
)
def test_bad_node_options_are_one_line(argv: list[str], message: str, tmp_path: Path) -> None:
    done = run_meshtop(*argv, cwd=ROOT, timeout_s=120)
    assert done.returncode == 2
    assert message in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert not (ROOT / "OUT").exists()


def test_a_node_that_reconnects_is_not_lost_and_one_that_does_not_is() -> None:
    clock = Clock()
    fleet = Fleet(head_of(2), reconnect_s=0.2, silent_s=10, clock=clock)
    fleet.on_control(ping(1), 1)
    fleet.on_control({"node": 1, "control": "closed"}, 1)
    fleet.on_control({"node": 1, "control": "data"}, 2)  # back on a new connection at once
    clock.now += 0.3
    assert fleet.lost() is None
    fleet.on_control({"node": 1, "control": "closed"}, 1)  # the old one closing late says nothing
    clock.now += 0.3
    assert fleet.lost() is None
    fleet.on_control({"node": 1, "control": "closed"}, 2)
    clock.now += 0.19
    assert fleet.lost() is None  # not yet: it may come back
    clock.now += 0.02
    lost = fleet.lost()
    assert lost is not None and lost.lost == "its stream to the head closed before it said how its ranks ended"


def test_a_stop_the_head_asked_for_keeps_the_heads_status(tmp_path: Path) -> None:
    """Ctrl-C on the head: the other nodes' ranks then fail against their stopped peers; the job was
    interrupted all the same."""
    fleet = Fleet(head_of(2))
    fleet.on_control(ping(1), 1)
    fleet.stop("interrupted")
    fleet.on_control(bye(1, "failed", (1, 1, None, "peer", 5.0)), 1)
    local = JobResult(
        status="interrupted",
        ranks=(RankExit(rank=0, exit_code=None, signal=None, error="stopped"),),
        duration_s=1.0,
        log_path=tmp_path,
    )
    merged = fleet.merge(local, {0}, 2)
    assert (merged.status, merged.root_cause) == ("interrupted", None)
    assert [r.exit_code for r in merged.ranks] == [None, 1]


def test_the_heads_own_rank_that_lost_its_peer_is_no_root_cause_beside_a_rank_that_failed_by_itself(
    tmp_path: Path,
) -> None:
    """The head's rank 0 says its peer went away, in the same second as node 1's rank 1 fails by itself: rank 1
    is the cause, as it would be were both on one node (the head's own ranks' errors count too)."""
    fleet = Fleet(head_of(2))
    fleet.on_control(ping(1), 1)
    fleet.on_control(bye(1, "failed", (1, 1, None, "CUDA out of memory", 10.5)), 1)
    local = JobResult(
        status="failed",
        ranks=(RankExit(rank=0, exit_code=1, signal=None, error="Connection closed by peer"),),
        duration_s=1.0,
        log_path=tmp_path,
        failure_times={0: 10.0},
    )
    merged = fleet.merge(local, {0}, 2)
    assert (merged.status, merged.root_cause) == ("failed", 1)


def test_a_node_silent_at_the_end_is_lost_and_told_to_stop() -> None:
    fleet = Fleet(head_of(2))
    fleet.on_control(ping(1), 1)
    fleet.settle(timeout_s=0.3)
    lost = fleet.lost()
    assert lost is not None and "did not say how its ranks ended" in (lost.lost or "")
    assert fleet.on_control(ping(1), 1)["stop"] == "failed"


def failed(exit_code: int, error: str | None, timestamp: float, signal: str | None = None) -> RankFailure:
    return RankFailure(exit_code=exit_code, signal=signal, error=error, timestamp=timestamp)


def test_the_root_cause_is_told_from_its_effects_within_a_second() -> None:
    """torchrun's timestamps are whole seconds: rank 0's peer error and rank 1's own come in the same one."""
    peer = "RuntimeError: [gloo/transport/tcp/pair.cc:553] Connection closed by peer [127.0.0.1]:23426"
    failures = {0: failed(1, peer, 100.0), 1: failed(1, "InjectedFault: on rank 1", 100.0)}
    assert root_cause(failures) == 1
    failures[2] = failed(-9, None, 101.0, signal="SIGKILL")
    assert root_cause(failures) == 2  # killed from outside: its peers' errors follow from it
    failures[3] = failed(-15, None, 99.0, signal="SIGTERM")
    assert root_cause(failures) == 2  # stopped by the launcher: never the cause


def test_a_rank_stopped_as_it_failed_by_itself_is_the_cause_not_the_peer_that_exited_first() -> None:
    """Seen in the soak: rank 0's out-of-memory error was written, rank 1's "connection closed" exited first,
    and the launcher then stopped rank 0 with SIGTERM."""
    oom = "OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"
    peer = "RuntimeError: [gloo/transport/tcp/pair.cc:553] Connection closed by peer [127.0.0.1]:32411"
    failures = {0: failed(-15, oom, 101.0, signal="SIGTERM"), 1: failed(1, peer, 100.0)}
    assert root_cause(failures) == 0
    failures[0] = replace(failures[0], error=peer)  # stopped while its own error was a peer's: an effect, after 1
    assert root_cause(failures) == 1
    # torchrun's words (no error of its own), even a second before the rank that failed
    failures[0] = replace(failures[0], error="Signal 15 (SIGTERM) received by PID 4242", timestamp=99.0)
    failures[1] = replace(failures[1], error=None)
    assert root_cause(failures) == 1


def test_a_gloo_error_that_blames_a_remote_worker_is_an_effect_even_a_second_earlier() -> None:
    gloo = (
        "RuntimeError: [gloo/transport/tcp/pair.cc:598] Read error [127.0.0.1]:48151. This is typically "
        "caused by a remote worker crashing. Check the logs of the remote worker before reporting an error."
    )
    failures = {0: failed(1, gloo, 100.0), 1: failed(1, "InjectedFault: on rank 1", 101.0)}
    assert root_cause(failures) == 1


def step(rank: int, number: int) -> StepTiming:
    """Each rank's loss its own (1.0 + rank): a step's mean loss says which ranks it averaged."""
    return events.step(rank, number, loss=1.0 + rank)


def test_a_step_folder_counts_the_ranks_of_each_start() -> None:
    """Told of 2 ranks, it completes the steps they finished; a later start of 3 ranks from step 5 on waits for 3
    there and for 2 before."""
    folder = StepFolder(4)
    assert not reported(folder, step(0, 0)) and not reported(folder, step(1, 0)) and not reported(folder, step(0, 1))
    done = folder.started(2)
    assert [s.step for s in done] == [0] and done[0].loss == 1.5 and list(folder.pending) == [1]
    assert folder.started(2) == [] and folder.started(0) == []
    assert reported(folder, step(1, 1))
    assert folder.started(3, first_step=5) == []
    assert not reported(folder, step(0, 5)) and not reported(folder, step(1, 5)) and reported(folder, step(2, 5))
    assert not reported(folder, step(0, 4)) and reported(folder, step(1, 4))


def test_an_elastic_scripts_world_is_what_its_ranks_say(tmp_path: Path) -> None:
    """Counted for MAX nodes (4 ranks) until the ranks say they are 2: the dashboard, the figures and the
    manifest on disk all follow, and the steps of 2 ranks complete; the built-in runner's plan never moves."""
    run = elastic_script(4)
    state = DashboardState(run)
    manifest = start_manifest(run, command_line=[], node_probes=None)
    recorder = SessionRecorder(SessionFold(run), tmp_path, manifest)
    early = [step(0, 0), step(1, 0)]
    assert recorder.take(Arrivals(early)).steps == []
    started = [events.rank_started(rank, world_size=2, dp_rank=rank) for rank in (0, 1)]
    completed = recorder.take(Arrivals(started)).steps
    assert [s.step for s in completed] == [0]
    assert read_manifest(tmp_path).run.plan.world_size == 2  # at once: a crash keeps it
    assert read_manifest(tmp_path).run.plan.label == "torchrun train.py (2 ranks)"
    fold_events(state.fold, [*early, *started, step(0, 1), step(1, 1)])
    assert state.info.world_size == 2
    state.fold.finish("completed")
    assert state.fold.steps.count == 2
    recorder.close(Ending(status="completed", duration_s=1.0))
    assert read_manifest(tmp_path).run.plan.world_size == 2
    builtin = resolve(RunSpec(device="cpu", dp=2), gpus_visible=0)
    described = builtin.describe()
    assert described.started_with(4) is described and elastic_script(2).started_with(0).world_size == 2


def test_a_last_word_that_is_not_one_is_a_failure() -> None:
    """Checked as the manifest is: a field of the wrong type, or a status meshtop does not know, says the node's
    part did not complete."""
    for says in ({"status": "completed", "ranks": "all fine"}, {"status": "done", "ranks": []}):
        fleet = Fleet(head_of(2))
        fleet.on_control(ping(1), 1)
        fleet.on_control({"node": 1, "control": "bye", "says": says}, 1)
        failed = fleet.failed()
        assert failed is not None and failed.bye is not None and failed.bye.ranks == ()
