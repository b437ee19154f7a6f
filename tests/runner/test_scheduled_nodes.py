"""Two loopback nodes started as a scheduler starts them: the same ``meshtop record`` command on both, no node
option, each node told its place only by its environment (SLURM's, or a Kubernetes PyTorchJob pod's). They make
one recording that holds both nodes' ranks."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from meshtop.recordings.reader import open_recording
from meshtop.recordings.schema import events_of
from tests.conftest import SCHEDULER_VARIABLE
from tests.kit.commands import meshtop
from tests.kit.ports import free_port

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]


def both_nodes(command: list[str], envs: list[dict[str, str]]) -> list[str]:
    """Run ``command`` once a node, each with its environment over this one's (less any scheduler's), at once,
    to the end: each node's output, after both exited 0."""
    base = {name: value for name, value in os.environ.items() if not SCHEDULER_VARIABLE.match(name)}
    processes = [
        subprocess.Popen(
            command, cwd=ROOT, env={**base, **env}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        for env in envs
    ]
    try:
        outputs = [process.communicate(timeout=300)[0] for process in processes]
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
    assert [process.returncode for process in processes] == [0, 0], [out[-3000:] for out in outputs]
    return outputs


def assert_one_recording_of_both_nodes(out: Path, steps: int) -> None:
    recording = open_recording(out)
    manifest = recording.manifest
    assert manifest.status == "completed" and manifest.run.plan.world_size == 4
    assert [(node.node, len(node.ranks)) for node in manifest.nodes] == [(0, 2), (1, 2)]
    started = events_of("rank_started", recording.arrow("rank_started"))
    assert {(e.rank, e.node) for e in started} == {(r, n.node) for n in manifest.nodes for r in n.ranks}
    assert {e.rank for e in events_of("step", recording.arrow("step"))} == {0, 1, 2, 3}
    assert manifest.steps_completed == steps


def test_srun_starts_the_built_in_runner_on_two_nodes_with_no_node_option(tmp_path: Path) -> None:
    """SLURM's count, node id and host list; the port an sbatch script exports (``MASTER_PORT``)."""
    port = free_port()
    out = tmp_path / "rec"
    slurm = {"SLURM_NNODES": "2", "SLURM_JOB_NODELIST": "localhost", "MASTER_PORT": str(port)}
    command = meshtop("record", out, "--device", "cpu", "--dp", "4", "--steps", "2", "--batch-size", "4")
    head, node1 = both_nodes(command, [{**slurm, "SLURM_NODEID": "0"}, {**slurm, "SLURM_NODEID": "1"}])
    where = "(SLURM_NNODES, SLURM_NODEID, SLURM_JOB_NODELIST, MASTER_PORT): 2 nodes, this is node {}, head localhost:"
    assert f"nodes from the environment {where.format(0)}{port}" in head
    assert f"nodes from the environment {where.format(1)}{port}" in node1
    assert "streaming to the head at" in node1 and "recording:" in head
    assert_one_recording_of_both_nodes(out, steps=2)


def test_a_pytorchjob_pod_runs_a_torchrun_script_on_two_nodes_with_no_node_option(tmp_path: Path) -> None:
    """PET_NNODES and PET_NODE_RANK (torchrun's own variables) and the unprefixed MASTER_ADDR and MASTER_PORT;
    torchrun after -- is given neither a node count, a rank nor a rendezvous."""
    port = free_port()
    out = tmp_path / "rec"
    pod = {"PET_NNODES": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
    command = meshtop(
        "record", out, "--device", "cpu", "--", "torchrun", "--nproc-per-node", "2", "examples/ddp.py", "--steps", "2"
    )
    head, node1 = both_nodes(command, [{**pod, "PET_NODE_RANK": "0"}, {**pod, "PET_NODE_RANK": "1"}])
    assert re.search(
        rf"nodes from the environment \(PET_NNODES, PET_NODE_RANK, MASTER_ADDR, MASTER_PORT\): "
        rf"2 nodes, this is node 0, head 127\.0\.0\.1:{port}",
        head,
    )
    assert "this is node 1" in node1 and "streaming to the head at 127.0.0.1:" in node1
    assert_one_recording_of_both_nodes(out, steps=2)
    script = open_recording(out).manifest.run.script
    assert script is not None
    assert script.launcher_args[:4] == (
        "--rdzv-backend=c10d",
        "--nnodes=2",
        "--node-rank=0",
        f"--rdzv-endpoint=127.0.0.1:{port}",
    )
    assert script.environment["PET_NNODES"] == "2" and script.environment["MASTER_PORT"] == str(port)
