"""A job's nodes from a scheduler's environment, without launching anything: SLURM's host lists, the order of
the command line, torchrun's ``PET_*`` variables and SLURM's, and what a script's torchrun is then given."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from meshtop.runner.errors import PlanError
from meshtop.runner.multinode.nodes import DEFAULT_RDZV_PORT
from meshtop.runner.multinode.scheduler import NodeValues, first_host, node_count, node_values
from meshtop.runner.script.command import resolve_script
from tests.kit.commands import one_line_error

ROOT = Path(__file__).resolve().parents[2]
SLURM = {"SLURM_NNODES": "4", "SLURM_NODEID": "2", "SLURM_JOB_NODELIST": "gpu[01-04]"}
PYTORCHJOB = {"PET_NNODES": "2", "PET_NODE_RANK": "1", "MASTER_ADDR": "job-master-0", "MASTER_PORT": "23456"}


@pytest.mark.parametrize(
    ("nodelist", "head"),
    [
        ("gpu[01-04,07],login2", "gpu01"),
        ("node-[1-3]", "node-1"),
        ("login2,gpu[01-04]", "login2"),
        ("gpu[007-010]", "gpu007"),  # the zeros as written
        ("rack[1-2]-gpu[08-09]", "rack1-gpu08"),  # a bracket in each part: the first of each
        ("gpu[3,1-2]", "gpu3"),  # as listed, not sorted
        ("c1.cluster.org,c2.cluster.org", "c1.cluster.org"),
        ("node_a", "node_a"),
        (" gpu[1-2] ", "gpu1"),
    ],
)
def test_the_first_host_of_a_slurm_host_list(nodelist: str, head: str) -> None:
    assert first_host(nodelist) == head


@pytest.mark.parametrize(
    "nodelist", ["", "gpu[", "gpu[1-2", "gpu[4-1]", "gpu[a-b]", "gpu[]", "gpu[1-]", "a,,b", ",a", "a b", "gpu[1]]"]
)
def test_a_host_list_that_cannot_be_read_is_refused_in_one_line(nodelist: str) -> None:
    with pytest.raises(PlanError) as refused:
        first_host(nodelist)
    assert str(refused.value) == (
        f"SLURM_JOB_NODELIST {nodelist!r} is not a host list meshtop reads (like gpu[01-04,07],login2): "
        "give the head's address yourself (--rdzv-endpoint HOST:PORT)"
    )


def values(env: dict[str, str], **given: object) -> NodeValues:
    options: dict[str, object] = {"nnodes": None, "node_rank": None, "endpoint": None, **given}
    return node_values(env=env, **options)  # type: ignore[arg-type]


def test_slurm_alone_gives_every_value_and_torchruns_c10d_port() -> None:
    found = values(SLURM)
    assert (found.nnodes, found.node_rank, found.endpoint) == ("4", 2, "gpu01:29400")
    assert found.note == (
        "nodes from SLURM (SLURM_NNODES, SLURM_NODEID, SLURM_JOB_NODELIST): 4 nodes, this is node 2, head gpu01:29400"
    )


def test_the_port_is_torchruns_c10d_default() -> None:
    from torch.distributed.elastic.rendezvous import c10d_rendezvous_backend

    assert DEFAULT_RDZV_PORT == c10d_rendezvous_backend.DEFAULT_PORT == 29400


def test_a_pytorchjob_pod_gives_its_pet_variables_and_the_unprefixed_master() -> None:
    found = values(PYTORCHJOB)
    assert (found.nnodes, found.node_rank, found.endpoint) == ("2", 1, "job-master-0:23456")
    assert found.found_in == ("PET_NNODES", "PET_NODE_RANK", "MASTER_ADDR", "MASTER_PORT")
    assert found.note is not None and found.note.startswith("nodes from the environment (PET_NNODES, ")


def test_the_command_line_wins_then_torchruns_variables_then_slurms_each_value_alone() -> None:
    both = {**SLURM, **PYTORCHJOB}
    found = values(both)
    assert (found.nnodes, found.node_rank, found.endpoint) == ("2", 1, "job-master-0:23456")  # PET_* over SLURM
    found = values(both, nnodes="3", endpoint="head:1234")  # the command line over both, the rank still PET's
    assert (found.nnodes, found.node_rank, found.endpoint) == ("3", 1, "head:1234")
    assert found.found_in == ("PET_NODE_RANK",)
    found = values({**SLURM, "PET_NODE_RANK": "3"})  # a PET_* variable over SLURM's, the rest SLURM's
    assert (found.nnodes, found.node_rank, found.endpoint) == ("4", 3, "gpu01:29400")
    found = values({**SLURM, "PET_RDZV_ENDPOINT": "store:5000", "MASTER_ADDR": "m"})  # the endpoint over a host
    assert found.endpoint == "store:5000"
    found = values({**SLURM, "PET_MASTER_ADDR": "pet", "MASTER_ADDR": "plain"})
    assert found.endpoint == "pet:29400"
    found = values({**SLURM, "MASTER_PORT": "6000"})  # an sbatch script's exported port, on SLURM's host
    assert found.endpoint == "gpu01:6000"
    found = values({**SLURM, "SLURM_STEP_NODELIST": "gpu[03-04]"})  # srun's step on 2 of the job's nodes
    assert found.endpoint == "gpu03:29400" and found.found_in[-1] == "SLURM_STEP_NODELIST"
    found = values({**SLURM, "MASTER_ADDR": "fd00::1"})
    assert found.endpoint == "[fd00::1]:29400"
    assert values(SLURM, nnodes="4", node_rank=2, endpoint="h:1").note is None  # all on the command line


def test_the_node_count_alone_follows_the_same_order() -> None:
    """What ``meshtop run`` asks to know whether it trains until q (one node) or a fixed number of steps."""
    assert node_count(None, SLURM) == 4
    assert node_count(None, {**SLURM, **PYTORCHJOB}) == 2
    assert node_count("1", SLURM) == 1
    assert node_count(None, {"PET_NNODES": "1:3"}) == 3
    assert node_count(None, {"MASTER_ADDR": "m"}) == 1


def test_on_one_node_nothing_else_is_read() -> None:
    """A MASTER_ADDR exported for another tool, a bad host list, or --nnodes 1 over a scheduler's count."""
    found = values({"MASTER_ADDR": "elsewhere", "SLURM_JOB_NODELIST": "gpu[", "SLURM_NODEID": "x"})
    assert found == NodeValues()
    assert values({**SLURM, "SLURM_NNODES": "1"}) == NodeValues(nnodes="1", found_in=("SLURM_NNODES",))
    assert values(SLURM, nnodes="1") == NodeValues(nnodes="1")
    assert values(SLURM, nnodes="1").note is None


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({**SLURM, "SLURM_NODEID": "4"}, "SLURM_NODEID='4' is not a node rank from 0 to 3"),
        ({**SLURM, "SLURM_NNODES": "two"}, "SLURM_NNODES='two' is not a node count N (or MIN:MAX)"),
        ({**PYTORCHJOB, "PET_NNODES": "4:2"}, "PET_NNODES='4:2' is not a node count N (or MIN:MAX)"),
        ({**PYTORCHJOB, "MASTER_PORT": "70000"}, "MASTER_PORT='70000' is not a port from 1 to 65535"),
        (
            {"SLURM_NNODES": "2"},
            "SLURM_NNODES=2 says 2 nodes, but nothing says which one this is: give --node-rank I "
            "(or set PET_NODE_RANK or SLURM_NODEID)",
        ),
    ],
)
def test_a_variable_that_does_not_hold_its_value_is_named(env: dict[str, str], message: str) -> None:
    with pytest.raises(PlanError, match="^" + re.escape(message)):
        values(env)


def test_a_scripts_torchrun_is_given_what_the_scheduler_said(monkeypatch: pytest.MonkeyPatch) -> None:
    """Written out before the user's own options, c10d where no rendezvous is named; what the command gives
    stays as it is."""
    monkeypatch.chdir(ROOT)
    for name, value in SLURM.items():
        monkeypatch.setenv(name, value)
    script = resolve_script(["torchrun", "--nproc-per-node", "2", "examples/ddp.py"], gpus_visible=0)
    assert script.launcher_args[:4] == (
        "--rdzv-backend=c10d",
        "--nnodes=4",
        "--node-rank=2",
        "--rdzv-endpoint=gpu01:29400",
    )
    assert script.world_size == 8
    assert script.nodes is not None and (script.nodes.count, script.nodes.rank) == (4, 2)
    assert script.nodes.endpoint == "gpu01:29400" and script.nodes.note is not None

    script = resolve_script(
        ["torchrun", "--nnodes", "4", "--rdzv-backend", "c10d", "--rdzv-endpoint", "h:9", "examples/ddp.py"],
        gpus_visible=0,
    )
    assert script.launcher_args[:1] == ("--node-rank=2",)
    assert script.nodes is not None and script.nodes.endpoint == "h:9"

    script = resolve_script(["examples/ddp.py"], gpus_visible=0)  # meshtop picks the ranks: 2 CPU ranks a node
    assert script.launcher_args[:5] == (
        "--rdzv-backend=c10d",
        "--nnodes=4",
        "--node-rank=2",
        "--rdzv-endpoint=gpu01:29400",
        "--nproc-per-node=2",
    )
    assert "--standalone" not in script.launcher_args

    monkeypatch.setenv("PET_NPROC_PER_NODE", "3")  # a pod's: torchrun's own variable, for meshtop's ranks too
    script = resolve_script(["examples/ddp.py"], gpus_visible=0)
    assert not any(arg.startswith("--nproc-per-node") for arg in script.launcher_args) and script.world_size == 12

    script = resolve_script(["torchrun", "--standalone", "--nproc-per-node", "2", "examples/ddp.py"], gpus_visible=0)

    assert script.nodes is None and script.launcher_args[0] == "--standalone"  # torchrun's one node


def test_a_rendezvous_the_command_names_is_not_replaced(monkeypatch: pytest.MonkeyPatch) -> None:
    """torchrun's static rendezvous (``--master-addr`` with no backend) is refused as it is without a scheduler."""
    monkeypatch.chdir(ROOT)
    for name, value in SLURM.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(PlanError, match=r"^--rdzv-backend static: meshtop follows a job on many nodes"):
        resolve_script(["torchrun", "--master-addr", "h", "--nproc-per-node", "2", "examples/ddp.py"], gpus_visible=0)


def test_a_bad_scheduler_variable_is_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(ROOT)
    for name, value in {**SLURM, "SLURM_JOB_NODELIST": "gpu[01-"}.items():
        monkeypatch.setenv(name, value)
    line = one_line_error(["record", str(tmp_path / "rec"), "--device", "cpu", "--dp", "4"], capsys)
    assert "SLURM_JOB_NODELIST 'gpu[01-' is not a host list meshtop reads" in line
    line = one_line_error(["record", str(tmp_path / "rec"), "--", "torchrun", "examples/ddp.py"], capsys)
    assert "SLURM_JOB_NODELIST 'gpu[01-' is not a host list meshtop reads" in line
    assert not (tmp_path / "rec").exists()
