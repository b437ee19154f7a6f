"""Two nodes on one machine: two ``meshtop record`` processes joined by torchrun's c10d rendezvous on loopback.

Each node runs two CPU ranks; node 0 (the head) records all four. The job
computes what the same plan computes on one node, every event is on the
head's clock even when node 1's clock is 5 s off, and a node or a rank that
dies ends the job with the head naming it and no process left behind.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from pathlib import Path

import psutil
import pytest

from meshtop.probes.events import StageAction, StepTiming
from meshtop.recordings.metrics.steps import StepFolder
from meshtop.recordings.reader import open_recording
from meshtop.recordings.schema import events_of
from tests.kit.commands import meshtop, run_meshtop
from tests.kit.events import reported
from tests.kit.jobs import RTOL, LaunchedRun, alive, launch
from tests.kit.ports import free_port
from tests.kit.recordings import recorded_so_far, wait_for_steps

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
SITE_HOOKS = Path(__file__).resolve().parents[1] / "site_hooks"
STEPS = 4
BATCH = 8
SHIFT_S = 5.0


def start_node(
    out: Path, node: int, port: int, *options: str, env: dict[str, str] | None = None, log: Path
) -> subprocess.Popen[str]:
    command = meshtop(
        "record",
        str(out),
        "--device",
        "cpu",
        "--nnodes",
        "2",
        "--node-rank",
        str(node),
        "--rdzv-endpoint",
        f"127.0.0.1:{port}",
        "--rdzv-id",
        f"test{port}",
        *options,
    )
    with log.open("w") as sink:
        return subprocess.Popen(
            command,
            cwd=ROOT,
            stdout=sink,
            stderr=subprocess.STDOUT,
            text=True,
            env={**os.environ, **(env or {})},
            start_new_session=True,
        )


def two_nodes(
    tmp_path: Path, *options: str, node1_env: dict[str, str] | None = None, timeout_s: float = 300
) -> tuple[int, int, str, str]:
    """Run the pair to the end: (node 0's exit code, node 1's, node 0's output, node 1's)."""
    port = free_port()
    logs = tmp_path / "head.log", tmp_path / "node1.log"
    head = start_node(tmp_path / "rec", 0, port, *options, log=logs[0])
    node1 = start_node(tmp_path / "rec", 1, port, *options, env=node1_env, log=logs[1])
    try:
        codes = head.wait(timeout=timeout_s), node1.wait(timeout=timeout_s)
    finally:
        for process in (head, node1):
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
    return codes[0], codes[1], logs[0].read_text(), logs[1].read_text()


def job_losses(steps: list[StepTiming], world: int) -> list[float]:
    folder = StepFolder(world)
    done = sorted(reported(folder, *steps), key=lambda s: s.step)
    return [s.loss for s in done if s.loss is not None]


def shifted_clock_env() -> dict[str, str]:
    path = os.pathsep.join(filter(None, (str(SITE_HOOKS), os.environ.get("PYTHONPATH"))))
    return {"PYTHONPATH": path, "MESHTOP_TEST_CLOCK_SHIFT_S": str(SHIFT_S)}


@pytest.fixture(scope="module")
def one_process(tmp_path_factory: pytest.TempPathFactory) -> LaunchedRun:
    """The model and data of every job here, on one process: what each plan must compute, on one node or two
    (tests/runner/test_parallel_equivalence.py holds each plan to it on one node)."""
    return launch(tmp_path_factory.mktemp("one"), dp=1, steps=STEPS, batch_size=BATCH)


@pytest.mark.parametrize(
    ("plan", "options"),
    [
        ("dp4", ("--dp", "4")),
        ("dp2xpp2", ("--dp", "2", "--pp", "2", "--microbatches", "2")),
        ("dp4-head1", ("--dp", "4", "--head-node", "1")),
    ],
)
def test_two_nodes_record_one_job(
    plan: str, options: tuple[str, ...], one_process: LaunchedRun, tmp_path: Path
) -> None:
    """dp2 x pp2 runs with node 1's clock 5 s ahead: its events still land inside the head's steps; with
    --head-node 1, node 1 records and node 0 streams to it."""
    shifted = plan == "dp2xpp2"
    streamer = 0 if plan.endswith("head1") else 1
    node0_code, node1_code, node0_out, node1_out = two_nodes(
        tmp_path,
        *options,
        "--steps",
        str(STEPS),
        "--batch-size",
        str(BATCH),
        node1_env=shifted_clock_env() if shifted else None,
    )
    assert (node0_code, node1_code) == (0, 0), node0_out[-3000:] + node1_out[-3000:]
    streamer_out = node1_out if streamer == 1 else node0_out
    assert "streaming to the head at 127.0.0.1:" in streamer_out
    assert "the job completed" in streamer_out
    assert "recording:" in (node0_out if streamer == 1 else node1_out)

    recording = open_recording(tmp_path / "rec")
    manifest = recording.manifest
    assert manifest.status == "completed"
    assert [node.node for node in manifest.nodes] == [0, 1]
    assert sorted(r for node in manifest.nodes for r in node.ranks) == [0, 1, 2, 3]
    assert all(len(node.ranks) == 2 and node.host == socket.gethostname() for node in manifest.nodes)
    started = events_of("rank_started", recording.arrow("rank_started"))
    assert {(e.rank, e.node) for e in started} == {(r, n.node) for n in manifest.nodes for r in n.ranks}
    steps = [e for e in events_of("step", recording.arrow("step")) if isinstance(e, StepTiming)]
    assert {e.rank for e in steps} == {0, 1, 2, 3}
    assert {e.rank for e in events_of("collective", recording.arrow("collective"))} == {0, 1, 2, 3}

    assert one_process.result.status == "completed"
    assert job_losses(steps, 4) == pytest.approx(one_process.losses, rel=RTOL)

    offset, rtt = manifest.nodes[streamer].clock_offset_ns, manifest.nodes[streamer].clock_rtt_ns
    assert offset is not None and rtt is not None and manifest.nodes[1 - streamer].clock_offset_ns == 0
    # the head stamps its clock inside the round trip and the node takes its middle: off by at most half of it
    # (the fastest of a round of pings; a busy machine makes it longer, and the bound with it)
    bound = rtt / 2 + 1
    if not shifted:
        assert abs(offset) <= bound, (offset, rtt)
        return
    assert abs(offset + SHIFT_S * 1e9) <= bound, (offset, rtt)  # the head's clock minus node 1's
    windows: dict[int, tuple[int, int]] = {}
    for step in steps:
        start, end = step.start_ns, step.start_ns + int(step.duration_s * 1e9)
        low, high = windows.get(step.step, (start, end))
        windows[step.step] = (min(low, start), max(high, end))
    actions = [e for e in events_of("stage_action", recording.arrow("stage_action")) if isinstance(e, StageAction)]
    assert {e.rank for e in actions} == {0, 1, 2, 3}
    slack = bound + 50_000_000  # the offset's error, and 50 ms for a step's edges as each rank timed them
    for action in actions:
        low, high = windows[action.step]
        assert low - slack <= action.start_ns and action.end_ns <= high + slack, (action, windows[action.step])


def processes_of(*roots: subprocess.Popen[str]) -> list[int]:
    pids = []
    for root in roots:
        with contextlib.suppress(psutil.NoSuchProcess):
            pids += [root.pid, *(child.pid for child in psutil.Process(root.pid).children(recursive=True))]
    return pids


@pytest.mark.parametrize("victim", ["a rank of node 1", "the head's meshtop"])  # node 1's meshtop: tests/soak.py
def test_a_node_or_rank_that_dies_ends_the_job(victim: str, tmp_path: Path) -> None:
    port = free_port()
    out = tmp_path / "rec"
    head = start_node(out, 0, port, "--dp", "4", "--steps", "100000", log=tmp_path / "head.log")
    node1 = start_node(out, 1, port, "--dp", "4", "--steps", "100000", log=tmp_path / "node1.log")
    try:
        # every rank's steps, not rank 0's alone: node 1's starts come through its relay, and rank 0 on the head
        # recorded its third step 0.1 s before node 1's second start came in (seen in a CI rehearsal)
        wait_for_steps(out, 3, ranks=range(4))
        everything = processes_of(head, node1)
        started = recorded_so_far(out, "rank_started")  # node 1's come in its part of the recording
        ranks = {event["rank"]: event["pid"] for event in started}
        on_node1 = sorted(event["rank"] for event in started if event["node"] == 1)
        assert len(on_node1) == 2  # torchrun numbers the nodes its own way: node 1 may hold ranks 0 and 1
        if victim == "node 1's meshtop":
            node1.send_signal(signal.SIGKILL)
        elif victim == "the head's meshtop":
            head.send_signal(signal.SIGKILL)
        else:
            os.kill(ranks[on_node1[0]], signal.SIGKILL)
        head_code = head.wait(timeout=120)
        node1_code = node1.wait(timeout=60)
    finally:
        for process in (head, node1):
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
    head_out, node1_out = (tmp_path / "head.log").read_text(), (tmp_path / "node1.log").read_text()
    if victim == "the head's meshtop":
        assert (head_code, node1_code) == (-signal.SIGKILL, 1), node1_out[-3000:]
        assert "meshtop: node 1 of 2: lost the head" in node1_out, node1_out[-3000:]
    elif victim == "node 1's meshtop":
        assert (head_code, node1_code) == (1, -signal.SIGKILL), head_out[-3000:]
        assert f"node 1 (host {socket.gethostname()}, ranks {on_node1[0]}, {on_node1[1]}) lost" in head_out, head_out[
            -3000:
        ]
    else:
        assert (head_code, node1_code) == (1, 1), head_out[-3000:] + node1_out[-3000:]
        assert f"rank {on_node1[0]} failed first: signal SIGKILL" in head_out, head_out[-3000:]
    deadline = time.monotonic() + 30
    while alive(everything + list(ranks.values())) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert alive(everything + list(ranks.values())) == []
    recording = open_recording(out)
    assert recording.manifest.status == ("running" if victim == "the head's meshtop" else "failed")
    summary = run_meshtop("summary", str(out), cwd=ROOT, timeout_s=120)
    assert summary.returncode == 0, summary.stderr
    if victim != "the head's meshtop":  # the head writes the nodes into the manifest when it closes it
        assert "node 1" in summary.stdout


def script_node(out: Path, node: int, port: int, nnodes: str, *script: str) -> list[str]:
    """``meshtop record`` of a torchrun script on node ``node`` (``script``: torchrun options, then the script)."""
    return meshtop(
        "record",
        str(out),
        "--device",
        "cpu",
        "--",
        "torchrun",
        "--nnodes",
        nnodes,
        "--node-rank",
        str(node),
        "--nproc-per-node",
        "2",
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        f"127.0.0.1:{port}",
        "--rdzv-id",
        f"script{port}",
        *(script or ("examples/ddp.py",)),
    )


@pytest.mark.parametrize("nnodes", ["2", "1:2"])
def test_a_users_torchrun_script_on_two_nodes(nnodes: str, tmp_path: Path) -> None:
    """The node options are torchrun's own, after --: the same command on both nodes but the node rank; an
    elastic range (1:2) starts with both, as they came, and its ranks say they are 4."""
    port = free_port()
    commands = [script_node(tmp_path / "rec", node, port, nnodes) for node in (0, 1)]  # both come at once
    processes = [
        subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for command in commands
    ]
    outputs = [process.communicate(timeout=300)[0] for process in processes]
    assert [process.returncode for process in processes] == [0, 0], outputs
    manifest = open_recording(tmp_path / "rec").manifest
    assert manifest.status == "completed" and manifest.run.plan.world_size == 4
    assert [len(node.ranks) for node in manifest.nodes] == [2, 2]
    steps = events_of("step", open_recording(tmp_path / "rec").arrow("step"))
    assert {e.rank for e in steps} == {0, 1, 2, 3}


def test_an_elastic_job_runs_on_the_nodes_that_came(tmp_path: Path) -> None:
    """--nnodes 1:2 with only the head there: torchrun starts it with 2 ranks after its last call. Counted for
    2 nodes (4 ranks) until then, the recording says 2 ranks on one node and folds every step over them.

    A node that comes later would make torchrun start every rank again with it (followed as any restart is,
    below), but torch 2.13's own torchrun fails that scale-up on one machine: two plain torchruns, the second
    8 s after the first, both time out in the rendezvous's next round (docs/multinode.md)."""
    port = free_port()
    out = tmp_path / "rec"
    done = subprocess.run(
        script_node(out, 0, port, "1:2", "--rdzv-conf", "last_call_timeout=1", "tests/restart_job.py", "--steps", "6"),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    recording = open_recording(out)
    manifest = recording.manifest
    assert manifest.status == "completed" and manifest.run.plan.world_size == 2
    assert manifest.run.plan.label == "torchrun restart_job.py (2 ranks)"
    assert [(node.node, node.ranks) for node in manifest.nodes] == [(0, (0, 1))]
    assert manifest.steps_completed == 6  # folded over the 2 ranks there are, not the 4 of two nodes
    assert {e.world_size for e in events_of("rank_started", recording.arrow("rank_started"))} == {2}


def test_a_rank_that_fails_once_is_restarted_by_torchrun_and_the_job_completes(tmp_path: Path) -> None:
    """--max-restarts 1 on one node: rank 1 fails at step 5 of the first start; torchrun starts both ranks
    again and they run their 8 steps, recorded as steps 5 to 12 after the first start's 0 to 4."""
    out = tmp_path / "rec"
    done = run_meshtop(
        "record",
        str(out),
        "--device",
        "cpu",
        "--",
        "torchrun",
        "--standalone",
        "--nproc-per-node",
        "2",
        "--max-restarts",
        "1",
        "tests/restart_job.py",
        "--steps",
        "8",
        "--fail-at",
        "5",
        cwd=ROOT,
        timeout_s=300,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    recording = open_recording(out)
    assert recording.manifest.status == "completed"
    starts = sorted(
        {
            (e.restart, e.first_step)  # type: ignore[attr-defined]
            for e in events_of("rank_started", recording.arrow("rank_started"))
        }
    )
    base = starts[1][1]
    assert starts == [(0, 0), (1, base)] and base >= 5  # rank 0 may have finished step 5 before rank 1 failed
    steps = [e for e in events_of("step", recording.arrow("step")) if isinstance(e, StepTiming)]
    assert sorted(e.step for e in steps if e.step >= base) == sorted(list(range(base, base + 8)) * 2)
    assert recording.manifest.steps_completed == 5 + 8
    summary = run_meshtop("summary", str(out), cwd=ROOT, timeout_s=120)
    assert f"torchrun started the ranks 2 times: 2 ranks from step 0, 2 ranks from step {base}" in summary.stdout
    assert "steps: 13 " in summary.stdout, summary.stdout
