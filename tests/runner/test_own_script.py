"""A user's own torchrun script under meshtop: the examples in ``examples/`` recorded unmodified, and
checked against what the scripts themselves hold and what torch's own CommDebugMode counts in them.

The expected figures are computed here, from the examples' shapes and a
replica of their optimizer, or counted by CommDebugMode in a plain torchrun
run of the same script (``tests/comm_count.py``); never read from meshtop's
own tables.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import subprocess
import sys
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
import torch
from torch import nn

from meshtop.probes.events import RankStarted, StepTiming
from meshtop.recordings.metrics.run import fold_tables
from meshtop.runner.errors import PlanError
from meshtop.runner.script.attach import after_import
from meshtop.runner.script.command import resolve_script
from meshtop.runner.session.session import script_description
from meshtop.tui.cli import main
from tests.kit.commands import one_line_error, run_meshtop, summary_json
from tests.kit.events import gpu_sample
from tests.kit.jobs import assert_parts_add_up
from tests.kit.recordings import write_recording

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"
STEPS = 4
DIM = 64
MICROBATCHES = 4
COMM_DEBUG_OPS = {
    "c10d.allreduce_": "all_reduce",
    "c10d_functional.all_reduce": "all_reduce",
    "c10d.allgather_": "all_gather",
    "c10d._allgather_base_": "all_gather",
    "c10d._reduce_scatter_base_": "reduce_scatter",
    "c10d.broadcast_": "broadcast",
    "c10d.scatter_": "scatter",
}
"""CommDebugMode's op names, as the plain names meshtop's events carry (written out here, not taken from
meshtop's op table)."""
CPU_ONLY = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}


def cpu_meshtop(*argv: str, env: dict[str, str] | None = None, cwd: Path = REPO) -> subprocess.CompletedProcess[str]:
    """``meshtop ARGV`` with no GPU visible (the examples take CUDA where they see it)."""
    return run_meshtop(*argv, env={"CUDA_VISIBLE_DEVICES": "", **(env or {})}, cwd=cwd)


def torchrun(ranks: int, script: str) -> list[str]:
    return ["torchrun", "--standalone", f"--nproc-per-node={ranks}", script, "--steps", str(STEPS)]


def table(recording: Path, kind: str) -> list[dict[str, Any]]:
    return pq.read_table(recording / "events" / f"{kind}.parquet").to_pylist()


def mlp_shapes() -> nn.Module:
    """The MLP of the examples (ddp.py, tp.py, pp.py's one stage, mesh2d.py), unsharded."""
    return nn.Sequential(nn.Linear(DIM, 4 * DIM), nn.GELU(), nn.Linear(4 * DIM, DIM))


def adamw_state_bytes(model: nn.Module) -> int:
    """What AdamW holds for ``model`` after a step: the script's own optimizer state, counted here."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.randn(2, DIM)).sum().backward()
    optimizer.step()
    return sum(
        v.numel() * v.element_size()
        for state in optimizer.state.values()
        for v in state.values()
        if isinstance(v, torch.Tensor)
    )


def parameter_bytes(model: nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters())


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str, int], Path]:
    """``recorded(example, ranks)``: the example recorded by ``meshtop record`` (once per module)."""
    done: dict[str, Path] = {}

    def record(example: str, ranks: int) -> Path:
        if example not in done:
            out = tmp_path_factory.mktemp("own") / example
            result = cpu_meshtop("record", str(out), "--", *torchrun(ranks, f"examples/{example}.py"))
            assert result.returncode == 0, result.stdout + result.stderr
            done[example] = out
        return done[example]

    return record


def comm_debug_counts(tmp_path: Path, example: str, ranks: int) -> list[Counter[str]]:
    """Each rank's collectives per op, as CommDebugMode counts them in a plain torchrun run of ``example``."""
    out = tmp_path / "counts"
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            f"--nproc-per-node={ranks}",
            str(REPO / "tests" / "comm_count.py"),
            str(out),
            str(EXAMPLES / f"{example}.py"),
            "--steps",
            str(STEPS),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env=CPU_ONLY,
        cwd=REPO,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    counts = []
    for rank in range(ranks):
        raw = json.loads(Path(f"{out}.{rank}.json").read_text())
        assert set(raw) <= set(COMM_DEBUG_OPS), f"an op this test does not name: {raw}"
        counted: Counter[str] = Counter()
        for op, count in raw.items():
            counted[COMM_DEBUG_OPS[op]] += count
        counts.append(counted)
    return counts


def meshtop_counts(recording: Path, ranks: int) -> list[Counter[str]]:
    """Each rank's collectives per op in meshtop's recording, less barriers (CommDebugMode does not count
    them); the examples' one closing barrier per rank is checked on its own."""
    rows = table(recording, "collective")
    for rank in range(ranks):
        assert len([row for row in rows if row["rank"] == rank and row["op"] == "barrier"]) == 1
    return [
        Counter(row["op"] for row in rows if row["rank"] == rank and row["op"] != "barrier") for rank in range(ranks)
    ]


def groups_by_op(recording: Path) -> dict[str, set[str]]:
    found: dict[str, set[str]] = {}
    for row in table(recording, "collective"):
        found.setdefault(row["op"], set()).add(row["group"])
    return found


# --- the command line: what is refused before anything runs ---------------------------------------------------


@pytest.mark.parametrize(
    ("command", "message"),
    [
        (["torchrun", "--standalone", "missing.py"], "missing.py: no such script"),
        (["torchrun", "--bogus", "examples/ddp.py"], "torchrun option: unrecognized arguments: --bogus"),
        (
            ["torchrun", "--nproc-per-node", "0", "examples/ddp.py"],
            "torchrun option: --nproc-per-node 0: at least 1 process a node",
        ),
        (["torchrun", "--nnodes", "2", "examples/ddp.py"], "--nnodes 2 needs --node-rank I on every node"),
        (
            ["torchrun", "--nnodes", "2", "--node-rank", "1", "examples/ddp.py"],
            "--rdzv-backend static: meshtop follows a job on many nodes through torchrun's c10d",
        ),
        (["torchrun", "--nnodes", "1:2", "examples/ddp.py"], "--nnodes 1:2 needs --node-rank I on every node"),
        (["torchrun", "--no-python", "examples/ddp.py"], "--no-python runs a program that is not Python"),
        (["-m", "no_such_module_here"], "no module named 'no_such_module_here' here"),
        (["README.md"], "README.md is not a Python script: line "),
        ([], "nothing after --: give a script"),
    ],
    ids=[
        "missing",
        "bad-option",
        "no-process",
        "two-nodes",
        "static-rendezvous",
        "elastic",
        "no-python",
        "no-module",
        "not-python",
        "empty",
    ],
)
def test_a_command_that_cannot_run_is_one_line_and_nothing_is_recorded(
    command: list[str],
    message: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.chdir(REPO)
    out = tmp_path / "rec"
    line = one_line_error(["record", str(out), "--", *command], capsys)
    assert message in line
    assert not out.exists()


def test_built_in_options_with_a_script_and_a_script_after_summary_are_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(REPO)
    line = one_line_error(["record", str(tmp_path / "a"), "--tp", "2", "--", "examples/ddp.py"], capsys)
    assert "--tp sets up the built-in model; a script given after -- runs its own" in line
    line = one_line_error(["record", str(tmp_path / "b"), "--tokens-per-step", "64"], capsys)
    assert "--tokens-per-step is for a script given after --" in line
    line = one_line_error(["record", str(tmp_path / "c"), "--activations", "--mode", "infer"], capsys)
    assert "--activations is a training option: leave it out with --mode infer" in line
    line = one_line_error(
        ["record", str(tmp_path / "d"), "--activations", "--no-instrument", "--", "examples/ddp.py"], capsys
    )
    assert "--activations needs the hooks: leave out --no-instrument" in line
    line = one_line_error(["summary", str(tmp_path), "--", "examples/ddp.py"], capsys)
    assert "only run, record and sweep take a command after --" in line
    assert list(tmp_path.iterdir()) == []


def test_every_form_of_the_command_gives_torchrun_the_same_script(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(REPO)
    forms = {
        "torchrun": ["torchrun", "--standalone", "--nproc_per_node=3", "examples/ddp.py", "--steps", "2"],
        "module": [
            "python",
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node",
            "3",
            "examples/ddp.py",
            "--steps",
            "2",
        ],
        "bare": ["examples/ddp.py", "--steps", "2"],
        "python": ["python3", "examples/ddp.py", "--steps", "2"],
    }
    runs = {name: resolve_script(command, gpus_visible=0) for name, command in forms.items()}
    for run in runs.values():
        assert run.script == EXAMPLES / "ddp.py" and run.script_args == ("--steps", "2")
        assert run.launcher_args[-3:] == ("examples/ddp.py", "--steps", "2")
    assert runs["torchrun"].world_size == runs["module"].world_size == 3
    assert runs["bare"].world_size == runs["python"].world_size == 2  # meshtop's pick without GPUs: 2 CPU ranks
    assert runs["bare"].launcher_args[:2] == ("--standalone", "--nproc-per-node=2")
    assert resolve_script(["examples/ddp.py"], gpus_visible=4).world_size == 4  # every GPU
    module = resolve_script(["-m", "examples.ddp", "--steps", "2"], gpus_visible=0)
    assert module.module == "examples.ddp" and module.script is None and module.sha256 is None
    with pytest.raises(PlanError, match="--tokens-per-step must be a positive number"):
        resolve_script(["examples/ddp.py"], gpus_visible=0, tokens_per_step=0)


def test_a_scripts_mfu_is_6n_from_its_optimizers_over_the_gpus_peak(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    script = resolve_script(["examples/pp.py"], gpus_visible=4, tokens_per_step=8192, dtype="bf16")
    run = script_description(script, environment={})
    events: list[Any] = []
    for rank in range(4):  # two pipeline stages of 300 M and 200 M parameters, each on two replicas
        pipeline_rank = rank // 2
        events.append(
            RankStarted(
                rank=rank,
                pid=100 + rank,
                host="h",
                device=f"cuda:{rank}",
                pp_rank=pipeline_rank,
                dp_rank=rank % 2,
                tp_rank=0,
                stages=(pipeline_rank,),
                local_parameters=1,
                model_parameters=(300, 200)[pipeline_rank] * 10**6,
                wall_ns=0,
            )
        )
        for step in range(5):
            events.append(
                StepTiming(rank=rank, step=step, start_ns=step * 10**9, duration_s=0.25, tokens=8192, loss=None)
            )
    events.append(
        gpu_sample(
            gpu=0,
            wall_ns=1,
            name="NVIDIA H100 80GB HBM3",
        )
    )
    path = write_recording(tmp_path / "rec", events, run=run, parquet=True)
    assert main(["summary", "--json", str(path)]) == 0
    mfu = json.loads(capsys.readouterr().out)["mfu"]
    assert mfu["value"] == pytest.approx(8192 / 0.25 * 6 * 500e6 / (989e12 * 4))
    without = script_description(resolve_script(["examples/pp.py"], gpus_visible=4), environment={})
    assert "needs --tokens-per-step and --dtype" in (
        fold_tables(without, [], status="completed").figures().mfu.why_not or ""
    )


def test_the_attachment_does_not_import_pipelining_for_a_script_that_does_not() -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys, meshtop.runner.script.attach; print('torch.distributed.pipelining' in sys.modules)",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"  # about 0.9 s a rank, paid only by scripts that pipeline


def test_the_post_import_hook_survives_a_probe_and_never_breaks_the_import(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("probed_module", "failing_then"):
        (tmp_path / f"{name}.py").write_text("VALUE = 42\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    calls: list[str] = []
    after_import("probed_module", lambda: calls.append("ran"))
    assert importlib.util.find_spec("probed_module") is not None and calls == []  # a probe imports nothing
    module = importlib.import_module("probed_module")
    assert module.VALUE == 42 and calls == ["ran"]
    importlib.reload(module)
    assert calls == ["ran"]  # once

    def fails() -> None:
        raise RuntimeError("a probe's own error")

    after_import("failing_then", fails)
    assert importlib.import_module("failing_then").VALUE == 42  # the user's import still works
    for name in ("probed_module", "failing_then"):
        sys.modules.pop(name, None)


# --- the examples, recorded ----------------------------------------------------------------------------------


@pytest.mark.slow
def test_ddp_script_steps_collectives_and_memory_are_the_scripts_own(
    recorded: Callable[[str, int], Path], tmp_path: Path
) -> None:
    recording = recorded("ddp", 2)
    model = mlp_shapes()
    gradient_bytes = parameter_bytes(model)  # fp32 gradients, one per parameter
    steps = table(recording, "step")
    assert sorted((row["rank"], row["step"]) for row in steps) == [(r, s) for r in range(2) for s in range(STEPS)]
    all_reduces = [row for row in table(recording, "collective") if row["op"] == "all_reduce"]
    for rank in range(2):
        per_step = Counter(row["step"] for row in all_reduces if row["rank"] == rank)
        assert per_step == {step: 1 for step in range(STEPS)}  # one bucket: the model is under DDP's 25 MiB
        assert {row["bytes"] for row in all_reduces if row["rank"] == rank} == {gradient_bytes}
    assert meshtop_counts(recording, 2) == comm_debug_counts(tmp_path, "ddp", 2)
    assert groups_by_op(recording) == {
        "all_reduce": {"world"},
        "all_gather": {"world"},
        "broadcast": {"world"},
        "barrier": {"world"},
    }
    last = {row["rank"]: row for row in table(recording, "memory") if row["step"] == STEPS - 1}
    for rank in range(2):
        assert last[rank]["weights_bytes"] == parameter_bytes(model)
        assert last[rank]["grads_bytes"] == gradient_bytes
        assert last[rank]["optimizer_bytes"] == adamw_state_bytes(model)
        assert last[rank]["rss_bytes"] > 0
        assert last[rank]["activations_bytes"] is None  # CPU, without --activations: not measured
    trained = {row["model_parameters"] for row in table(recording, "rank_started") if row["model_parameters"]}
    assert trained == {sum(p.numel() for p in model.parameters())}
    report = summary_json(recording)
    assert report["run"]["script"]["path"] == str(EXAMPLES / "ddp.py")
    assert report["run"]["script"]["args"] == ["--steps", str(STEPS)]
    assert report["steps"]["count"] == STEPS
    assert [(row["group"], row["op"]) for row in report["collectives"] if row["op"] == "all_reduce"] == [
        ("world", "all_reduce")
    ]
    assert_parts_add_up(report["breakdown"], 2)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("example", "ranks", "groups"),
    [
        ("fsdp2", 2, {"all_gather": {"world"}, "reduce_scatter": {"world"}, "barrier": {"world"}}),
        ("tp", 2, {"all_reduce": {"tp"}, "scatter": {"tp"}, "broadcast": {"tp"}, "barrier": {"tp"}}),  # the mesh is
        # the whole world: c10d gives its dim the default group, which takes the dim's name
        (
            "mesh2d",
            4,
            {
                "all_reduce": {"tp"},
                "scatter": {"tp"},
                "broadcast": {"tp"},
                "all_gather": {"dp"},
                "reduce_scatter": {"dp"},
                "barrier": {"world"},
            },
        ),
    ],
)
def test_sharded_scripts_collectives_match_comm_debug_mode_and_memory_is_the_local_shard(
    example: str, ranks: int, groups: dict[str, set[str]], recorded: Callable[[str, int], Path], tmp_path: Path
) -> None:
    recording = recorded(example, ranks)
    assert meshtop_counts(recording, ranks) == comm_debug_counts(tmp_path, example, ranks)
    assert groups_by_op(recording) == groups  # named by the script's own mesh dims, else world
    shards = {"fsdp2": 2, "tp": 2, "mesh2d": 4}[example]
    layers = 2 if example == "fsdp2" else 1
    full = parameter_bytes(mlp_shapes()) * layers
    last = {row["rank"]: row for row in table(recording, "memory") if row["step"] == STEPS - 1}
    assert sorted(last) == list(range(ranks))
    for row in last.values():
        # Every weight is split evenly over the shards here (each dim divides), so each rank holds 1 / shards;
        # the tp example's second bias is replicated, so allow that one vector.
        assert full / shards <= row["weights_bytes"] <= full / shards + DIM * 4
        assert row["grads_bytes"] == row["weights_bytes"]
        assert row["optimizer_bytes"] >= 2 * row["weights_bytes"]  # AdamW: two moments per weight, plus steps
    assert len([row for row in table(recording, "step") if row["rank"] == 0]) == STEPS
    started = [row for row in table(recording, "rank_started") if row["model_parameters"] is not None]
    assert {row["rank"] for row in started} == set(range(ranks))
    assert {row["model_parameters"] for row in started} == {sum(p.numel() for p in mlp_shapes().parameters()) * layers}
    # ...while each holds its shard: DTensors count at their global size there, at their local size here
    assert all(row["local_parameters"] < row["model_parameters"] for row in started)
    assert_parts_add_up(summary_json(recording)["breakdown"], ranks)  # where each rank's steps went


@pytest.mark.slow
def test_pipelining_script_gets_stage_actions_p2p_and_bubbles(recorded: Callable[[str, int], Path]) -> None:
    recording = recorded("pp", 2)
    actions = table(recording, "stage_action")
    for rank in range(2):
        mine = [a for a in actions if a["rank"] == rank and a["step"] is not None]
        assert {a["stage"] for a in mine} == {rank}
        for step in range(STEPS):
            kinds = Counter(a["action"] for a in mine if a["step"] == step)
            assert kinds["forward"] == MICROBATCHES and kinds["backward"] == MICROBATCHES, (rank, step, kinds)
    p2p = [row for row in table(recording, "collective") if row["op"] in ("send", "recv")]
    for step in range(1, STEPS):  # the first step also exchanges shapes
        for rank, peer in ((0, 1), (1, 0)):
            ops = Counter(row["op"] for row in p2p if row["rank"] == rank and row["step"] == step)
            assert ops == {"send": MICROBATCHES, "recv": MICROBATCHES}, (rank, step, ops)
            assert {row["peer"] for row in p2p if row["rank"] == rank and row["step"] == step} == {peer}
    report = summary_json(recording)
    assert [row["stage"] for row in report["stages"]] == [0, 1]
    assert all(0 < row["bubble_fraction"] < 1 for row in report["stages"])
    assert_parts_add_up(report["breakdown"], 2, pipelined=True)
    started = table(recording, "rank_started")
    assert {(row["rank"], row["pp_rank"]) for row in started if row["stages"]} == {(0, 0), (1, 1)}


@pytest.mark.slow
def test_a_users_sitecustomize_still_runs_and_tokens_per_step_gives_tokens_per_s(tmp_path: Path) -> None:
    site = tmp_path / "site"
    site.mkdir()
    marks = tmp_path / "marks"
    (site / "sitecustomize.py").write_text(
        "import os\nwith open(os.environ['SITE_MARKS'], 'a') as f:\n    f.write(f'{os.getpid()}\\n')\n"
    )
    env = {**CPU_ONLY, "PYTHONPATH": str(site), "SITE_MARKS": str(marks)}
    out = tmp_path / "rec"
    done = cpu_meshtop("record", str(out), "--tokens-per-step", "2048", "--", *torchrun(2, "examples/ddp.py"), env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    rank_pids = {row["pid"] for row in table(out, "rank_started")}
    assert len(rank_pids) == 2 and rank_pids <= {int(line) for line in marks.read_text().split()}
    steps = table(out, "step")
    assert {row["tokens"] for row in steps} == {2048}
    report = summary_json(out)
    # The job's step is its slowest rank's; tokens/s is the median over steps of each step's own rate, which is
    # not 2048 / (the median step time) when the two middle steps of an even count differ
    job_step_s: dict[int, float] = {}
    for row in steps:
        job_step_s[row["step"]] = max(job_step_s.get(row["step"], 0.0), row["duration_s"])
    rates = sorted(2048 / seconds for seconds in job_step_s.values())
    middle = (rates[(len(rates) - 1) // 2] + rates[len(rates) // 2]) / 2
    assert report["steps"]["tokens_per_s"]["p50"] == pytest.approx(middle, rel=1e-9)
    assert report["run"]["script"]["tokens_per_step"] == 2048


@pytest.mark.slow
def test_activations_saved_for_backward_are_measured_when_asked(tmp_path: Path) -> None:
    out = tmp_path / "rec"
    done = cpu_meshtop("record", str(out), "--activations", "--", *torchrun(2, "examples/ddp.py"))
    assert done.returncode == 0, done.stdout + done.stderr
    # ddp.py's step saves, per rank and in fp32: its batch x (32 x 64) for the first linear, that linear's
    # output (32 x 256) for GELU, GELU's output (32 x 256) for the second linear, and out - x (32 x 64) for
    # the square; the weights (and their transposed views) are not activations.
    batch = 32
    expected = 4 * batch * (DIM + 4 * DIM + 4 * DIM + DIM)
    rows = table(out, "memory")
    assert len(rows) == 2 * STEPS
    assert {row["activations_bytes"] for row in rows} == {expected}


@pytest.mark.slow
def test_a_script_without_an_optimizer_has_collectives_memory_and_says_it_has_no_steps(tmp_path: Path) -> None:
    script = tmp_path / "evaluate.py"
    script.write_text(  # seconds of evaluating after its collectives: the process sampler's time to see each rank
        "import time, torch, torch.distributed as dist\n"
        "dist.init_process_group('gloo')\n"
        "with torch.no_grad():\n"
        "    for _ in range(5):\n"
        "        dist.all_reduce(torch.ones(1000))\n"
        "time.sleep(3.0)\n"
        "dist.barrier()\n"
        "dist.destroy_process_group()\n"
    )
    out = tmp_path / "rec"
    done = cpu_meshtop(
        "record",
        str(out),
        "--process-sample-hz",
        "20",
        "--",
        "torchrun",
        "--standalone",
        "--nproc-per-node=2",
        str(script),
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "steps: none (the script stepped no torch.optim optimizer)" in done.stdout
    report = summary_json(out)
    assert report["steps"]["count"] == 0
    counts = Counter(row["op"] for row in table(out, "collective") if row["bytes"] == 4000)
    assert counts == {"all_reduce": 10}  # 5 per rank, on the world group
    assert {row["rank"] for row in report["memory"]} == {0, 1}  # each rank's RSS, from the process samples


@pytest.mark.slow
def test_no_instrument_keeps_a_scripts_steps_and_takes_every_hook_out(tmp_path: Path) -> None:
    out = tmp_path / "rec"
    done = cpu_meshtop("record", str(out), "--no-instrument", "--", *torchrun(2, "examples/ddp.py"))
    assert done.returncode == 0, done.stdout + done.stderr
    steps = table(out, "step")
    assert len(steps) == 2 * STEPS and not any(row["instrumented"] for row in steps)
    assert not (out / "events" / "collective.parquet").exists()
    assert json.loads((out / "manifest.json").read_text())["instrumented"] is False


@pytest.mark.slow
@pytest.mark.parametrize(
    ("body", "error"),
    [
        ("import no_such_module_anywhere\n", "ModuleNotFoundError: No module named 'no_such_module_anywhere'"),
        (
            "import torch, torch.distributed as dist\n"
            "dist.init_process_group('gloo')\n"
            "model = torch.nn.Linear(4, 4)\n"
            "opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
            "for step in range(5):\n"
            "    if step == 3 and dist.get_rank() == 1:\n"
            "        raise RuntimeError(f'boom at step {step}')\n"
            "    model(torch.ones(2, 4)).sum().backward()\n"
            "    opt.step()\n"
            "    dist.barrier()\n",
            "RuntimeError: boom at step 3",
        ),
    ],
    ids=["on-import", "at-step-3"],
)
def test_a_script_that_fails_names_the_rank_and_its_error_and_keeps_the_recording(
    body: str, error: str, tmp_path: Path
) -> None:
    script = tmp_path / "fails.py"
    script.write_text(body)
    out = tmp_path / "rec"
    done = cpu_meshtop(
        "record", str(out), "--hang-timeout", "30", "--", "torchrun", "--standalone", "--nproc-per-node=2", str(script)
    )
    assert done.returncode == 1, done.stdout + done.stderr
    assert "Traceback" not in done.stdout
    named = [line for line in done.stdout.splitlines() if "failed first" in line]
    assert len(named) == 1 and error in named[0], done.stdout
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["status"] == "failed"
    if "step 3" in error:
        assert {row["step"] for row in table(out, "step") if row["rank"] == 1} == {0, 1, 2}


@pytest.mark.slow
def test_compare_of_two_runs_of_a_script_names_what_differs(
    recorded: Callable[[str, int], Path], tmp_path: Path
) -> None:
    before = recorded("ddp", 2)
    after = tmp_path / "after"
    done = cpu_meshtop(
        "record",
        str(after),
        "--",
        "torchrun",
        "--standalone",
        "--nproc-per-node=2",
        "examples/ddp.py",
        "--steps",
        str(STEPS + 2),
    )
    assert done.returncode == 0, done.stdout + done.stderr
    compared = cpu_meshtop("compare", "--json", str(before), str(after))
    assert compared.returncode == 0, compared.stderr
    report = json.loads(compared.stdout)
    names = {row["name"] for row in report["metrics"]}
    assert {"step time (s)", "world/all_reduce busbw (GB/s)"} <= names
    assert any("script arguments" in warning for warning in report["warnings"]), report["warnings"]
