"""``meshtop run|record ... -- accelerate launch [options] SCRIPT [ARGS]``: read with accelerate's own parser and
checks, refused in one line where accelerate would not start torchrun's ranks on this machine, and run by the
launcher child through accelerate's own launch (the steps and losses of a real accelerate loop recorded that way
are checked in ``tests/frameworks/test_accelerate.py``)."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import sys
from pathlib import Path

import pytest

from meshtop.runner.errors import PlanError
from meshtop.runner.script.command import BOOTSTRAP_DIR, resolve_script
from meshtop.runner.session.session import script_launch
from tests.kit.commands import one_line_error, run_meshtop, summary_json

REPO = Path(__file__).resolve().parents[2]
DDP = REPO / "examples" / "ddp.py"
needs_accelerate = pytest.mark.skipif(importlib.util.find_spec("accelerate") is None, reason="accelerate is optional")


@pytest.fixture(autouse=True)
def _in_the_repository(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(REPO)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # accelerate counts GPUs where --num_processes is not given


@needs_accelerate
@pytest.mark.parametrize(
    "launcher",
    [["accelerate", "launch"], ["/usr/local/bin/accelerate-launch"], ["python3", "-m", "accelerate.commands.launch"]],
    ids=["accelerate launch", "accelerate-launch", "python -m"],
)
def test_the_world_size_is_num_processes_and_the_script_is_checked(launcher: list[str]) -> None:
    given = ["--multi_gpu", "--num_processes", "3", "examples/ddp.py", "--steps", "2", "--num_processes", "9"]
    run = resolve_script([*launcher, *given], gpus_visible=0)
    assert run.launcher == "accelerate"
    assert run.command == (*launcher, *given)  # kept as given, for the manifest
    assert run.launcher_args == tuple(given)  # accelerate reads them again in the launcher child
    assert run.world_size == 3 and run.nodes is None
    assert run.script == DDP and run.sha256 == hashlib.sha256(DDP.read_bytes()).hexdigest()
    assert run.script_args == ("--steps", "2", "--num_processes", "9")  # the script's own, after its path
    assert run.device == "cpu"


@needs_accelerate
def test_accelerates_config_file_decides_what_the_command_does_not(tmp_path: Path) -> None:
    config = tmp_path / "accelerate.yaml"
    config.write_text("compute_environment: LOCAL_MACHINE\ndistributed_type: MULTI_GPU\nnum_processes: 3\n")
    from_config = resolve_script(
        ["accelerate", "launch", "--config_file", str(config), "examples/ddp.py"], gpus_visible=0
    )
    assert from_config.world_size == 3
    command = ["accelerate", "launch", f"--config_file={config}", "--num_processes=4", "examples/ddp.py"]
    assert resolve_script(command, gpus_visible=0).world_size == 4  # the command's option over the file's


@needs_accelerate
def test_a_module_is_found_without_running_it() -> None:
    run = resolve_script(
        ["accelerate", "launch", "--multi_gpu", "--num_processes=2", "-m", "examples.ddp"], gpus_visible=0
    )
    assert run.module == "examples.ddp" and run.script is None and run.world_size == 2


@needs_accelerate
def test_the_launcher_child_runs_accelerate_with_meshtops_bootstrap() -> None:
    given = ("--multi_gpu", "--num_processes", "2", "examples/ddp.py")
    launch = script_launch(resolve_script(["accelerate", "launch", *given], gpus_visible=0))
    assert launch.launcher == "accelerate" and launch.launcher_args == given
    assert launch.world_size == 2 and launch.pythonpath == (str(BOOTSTRAP_DIR),)


@needs_accelerate
@pytest.mark.parametrize(
    ("options", "refusal"),
    [
        (["--num_processes", "2"], r"would run examples/ddp.py as one process, not torchrun's ranks: give --multi_gpu"),
        (["--cpu", "--num_processes", "2"], r"as one process, not torchrun's ranks"),
        (["--num_processes", "2", "--mpirun_hostfile", "hosts"], r"would run mpirun's processes"),
        (["--multi_gpu", "--num_processes", "1"], r"accelerate launch: You need to use at least 2 processes"),
        (["--tpu"], r"--tpu runs its processes with torch_xla, not torchrun"),
        (
            ["--multi_gpu", "--num_processes=4", "--num_machines=2", "--machine_rank=0", "--main_process_ip=h"],
            r"on 2 machines: meshtop records accelerate on one; on many, give torchrun's command",
        ),
        (["--multi_gpu", "--num_processes=2", "--no_python"], r"--no-python runs a program that is not Python"),
        (["--multi_gpu", "--num_processes=2", "--bogus"], r"accelerate launch option: unrecognized arguments: --bogus"),
        (["--multi_gpu", "--config_file=/nonexistent.yaml"], r"accelerate launch: The passed configuration file"),
    ],
    ids=["one process", "cpu", "mpirun", "multi_gpu of 1", "tpu", "two machines", "no python", "unknown", "config"],
)
def test_what_accelerate_would_not_start_with_torchrun_here_is_refused(options: list[str], refusal: str) -> None:
    with pytest.raises(PlanError, match=refusal):
        resolve_script(["accelerate", "launch", *options, "examples/ddp.py"], gpus_visible=0)


@needs_accelerate
def test_a_missing_script_or_another_accelerate_command_is_refused() -> None:
    with pytest.raises(PlanError, match=r"^nothere.py: no such script$"):
        resolve_script(["accelerate", "launch", "--multi_gpu", "--num_processes=2", "nothere.py"], gpus_visible=0)
    with pytest.raises(PlanError, match=r"required: training_script"):
        resolve_script(["accelerate", "launch", "--multi_gpu"], gpus_visible=0)
    with pytest.raises(PlanError, match=r"^accelerate config: meshtop runs `accelerate launch \[options\] SCRIPT`"):
        resolve_script(["accelerate", "config"], gpus_visible=0)


@needs_accelerate
@pytest.mark.skipif(importlib.util.find_spec("deepspeed") is not None, reason="DeepSpeed is installed here")
def test_deepspeed_without_deepspeed_is_refused() -> None:
    with pytest.raises(
        PlanError, match=r"--use_deepspeed: DeepSpeed is not installed here \(`pip install deepspeed`\)"
    ):
        resolve_script(
            ["accelerate", "launch", "--use_deepspeed", "--num_processes=2", "examples/ddp.py"], gpus_visible=0
        )


def test_without_accelerate_the_command_is_one_line_exit_2(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "accelerate", None)  # Python's own mark of a module that cannot be imported
    command = ["accelerate", "launch", "--multi_gpu", "--num_processes=2", "examples/ddp.py"]
    line = one_line_error(["record", str(tmp_path / "rec"), "--", *command], capsys)
    assert (
        line == "meshtop: error: accelerate is not installed here: `pip install accelerate`, or give `-- torchrun ...`"
    )


@needs_accelerate
def test_a_refused_accelerate_launch_is_one_line_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    command = ["accelerate", "launch", "--num_processes", "2", "examples/ddp.py"]
    line = one_line_error(["record", str(tmp_path / "rec"), "--", *command], capsys)
    assert "as one process, not torchrun's ranks" in line
    assert not (tmp_path / "rec").exists()


FAILING = """
import json, os, sys
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
names = ("ACCELERATE_MIXED_PRECISION", "ACCELERATE_DYNAMO_BACKEND", "MESHTOP_ATTACHED_PID")
with open(f"env-{rank}.json", "w") as out:
    json.dump({name: os.environ.get(name) for name in names} | {"pid": os.getpid(), "argv": sys.argv[1:]}, out)
model = torch.nn.Linear(4, 4)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(4):
    model(torch.ones(2, 4)).square().mean().backward()
    optimizer.step()
    optimizer.zero_grad()
    if step == 2 and rank == 1:
        raise RuntimeError("diverged at step 2")
    dist.barrier()
dist.destroy_process_group()
"""


@pytest.fixture(scope="module")
def failed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, int]:
    """``meshtop record`` of ``accelerate launch --multi_gpu --num_processes 2 --mixed_precision fp16`` on a script
    whose rank 1 raises after its third optimizer step: (its folder, the recording, meshtop's exit code)."""
    if importlib.util.find_spec("accelerate") is None:
        pytest.skip("accelerate is optional")
    folder = tmp_path_factory.mktemp("accelerate-fails")
    (folder / "fails.py").write_text(FAILING)
    launcher = ["accelerate", "launch", "--multi_gpu", "--num_processes=2", "--num_machines=1"]
    launcher += ["--mixed_precision=fp16", "--dynamo_backend=no", "--main_process_port=0", "fails.py", "--seed", "3"]
    bin_dir = str(Path(sys.executable).parent)  # this Python's `accelerate` first
    env = {"CUDA_VISIBLE_DEVICES": "", "PATH": os.pathsep.join([bin_dir, os.environ.get("PATH", "")])}
    done = run_meshtop("record", folder / "rec", "--", *launcher, env=env, cwd=folder)
    return folder, folder / "rec", done.returncode


@pytest.mark.slow
def test_a_failed_rank_under_accelerate_is_named_with_its_error_exit_1(failed: tuple[Path, Path, int]) -> None:
    _, recording, code = failed
    assert code == 1
    manifest = json.loads((recording / "manifest.json").read_text())
    assert manifest["status"] == "failed" and manifest["root_cause_rank"] == 1
    ranks = {rank["rank"]: rank for rank in manifest["ranks"]}
    assert ranks[1]["exit_code"] == 1 and ranks[1]["error"] == "RuntimeError: diverged at step 2"
    assert manifest["script"]["command"][:2] == ["accelerate", "launch"]  # as given after --
    assert manifest["script"]["launcher"] == "accelerate"
    assert manifest["plan"]["label"].startswith("accelerate ") and manifest["plan"]["label"].endswith(" (2 ranks)")
    assert summary_json(recording)["steps"]["count"] >= 2  # rank 1's first steps were recorded before it failed


@pytest.mark.slow
def test_the_ranks_get_accelerates_environment_and_meshtops_probes(failed: tuple[Path, Path, int]) -> None:
    folder, _, _ = failed
    for rank in range(2):
        seen = json.loads((folder / f"env-{rank}.json").read_text())
        assert seen["ACCELERATE_MIXED_PRECISION"] == "fp16" and seen["ACCELERATE_DYNAMO_BACKEND"] == "NO"
        assert seen["MESHTOP_ATTACHED_PID"] == str(seen["pid"])  # the bootstrap attached to this rank
        assert seen["argv"] == ["--seed", "3"]
