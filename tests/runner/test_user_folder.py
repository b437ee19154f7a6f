"""A training folder that holds modules named as meshtop's parts: the user's own ``runner.py``,
``probes.py``, ``tui.py`` and ``recordings/`` package beside ``train.py``.

meshtop's import names are its own (``meshtop.runner``, ...), so neither side shadows the other: the
script imports and checks its own modules (each holds a marker, and lives in the script's folder), and
meshtop's launcher, bootstrap and probes load meshtop's. Run from the folder, as a user would, through the
installed ``meshtop`` command, for the three ways of giving the script: ``torchrun ... train.py``,
``python train.py`` and ``torchrun ... -m MODULE``. Each job completes, and the recording holds every
step and collective the script made, counted from what the script does: ``STEPS`` optimizer steps on
each rank, and per step one all-reduce per parameter of its ``nn.Linear`` (weight, bias), then one
closing barrier.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

STEPS = 5
RANKS = 2
PARAMETERS = 2
"""The script's model is one ``nn.Linear``: a weight and a bias, each all-reduced every step."""
OWN = ("runner", "probes", "tui", "recordings")
CHECKED = "own modules checked: runner, probes, tui, recordings"
"""What rank 0 of the script prints once it checked that each import is its own."""
MESHTOP = Path(sys.executable).with_name("meshtop")
"""The installed command, as a user runs it (``python -m`` would put the folder on meshtop's own path)."""

TRAIN = f"""\
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist

import probes
import recordings
import runner
import tui
from recordings.marks import MARK

HERE = Path(__file__).resolve().parent
for module, name in ((runner, "runner"), (probes, "probes"), (tui, "tui"), (recordings, "recordings")):
    assert module.MARKER == f"the user's own {{name}}", (name, module.MARKER)
    assert Path(module.__file__).resolve().is_relative_to(HERE), (name, module.__file__)
assert MARK == "the user's own recordings.marks"
assert "meshtop.runner" in sys.modules or os.environ.get("MESHTOP_ATTACH") != "1"  # meshtop attached: its own

dist.init_process_group("gloo")
if dist.get_rank() == 0:
    print({CHECKED!r}, flush=True)
torch.manual_seed(0)
model = torch.nn.Linear(8, 8)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
for step in range({STEPS}):
    loss = model(torch.randn(4, 8)).pow(2).mean()
    optimizer.zero_grad()
    loss.backward()
    for parameter in model.parameters():
        dist.all_reduce(parameter.grad)
    optimizer.step()
dist.barrier()
dist.destroy_process_group()
"""


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The user's training folder: ``train.py`` and the modules named as meshtop's parts."""
    here = tmp_path_factory.mktemp("training")
    for name in ("runner", "probes", "tui"):
        (here / f"{name}.py").write_text(f'MARKER = "the user\'s own {name}"\n')
    (here / "recordings").mkdir()
    (here / "recordings" / "__init__.py").write_text('MARKER = "the user\'s own recordings"\n')
    (here / "recordings" / "marks.py").write_text('MARK = "the user\'s own recordings.marks"\n')
    (here / "train.py").write_text(TRAIN)
    return here


def record(folder: Path, out: Path, *command: str) -> subprocess.CompletedProcess[str]:
    return meshtop_in(folder, "record", str(out), "--", *command)


def meshtop_in(folder: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    """The installed ``meshtop ARGV``, started in ``folder``, no GPU visible."""
    return subprocess.run(
        [str(MESHTOP), *argv],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=folder,
        env={**os.environ, "CUDA_VISIBLE_DEVICES": ""},
    )


def table(recording: Path, kind: str) -> list[dict[str, Any]]:
    return pq.read_table(recording / "events" / f"{kind}.parquet").to_pylist()


@pytest.mark.slow
@pytest.mark.parametrize(
    "command",
    [
        ("torchrun", "--standalone", "--nproc-per-node", str(RANKS), "train.py"),
        ("python", "train.py"),
        ("torchrun", "--standalone", "--nproc-per-node", str(RANKS), "-m", "train"),
    ],
    ids=["torchrun-script", "python-script", "torchrun-module"],
)
def test_a_folder_with_modules_named_as_meshtops_records_every_step_and_collective(
    folder: Path, tmp_path: Path, command: tuple[str, ...]
) -> None:
    out = tmp_path / "rec"
    done = record(folder, out, *command)
    assert done.returncode == 0, done.stdout + done.stderr
    assert CHECKED in (out / "launcher.log").read_text()  # the script checked its own imports and went on
    summary = subprocess.run(
        [str(MESHTOP), "summary", "--json", str(out)], capture_output=True, text=True, timeout=120, cwd=folder
    )
    assert summary.returncode == 0, summary.stderr
    figures = json.loads(summary.stdout)
    assert figures["run"]["status"] == "completed" and figures["run"]["world_size"] == RANKS, figures["run"]
    assert figures["steps"]["count"] == STEPS, figures["steps"]
    steps = Counter((row["rank"], row["step"]) for row in table(out, "step"))
    assert steps == Counter({(rank, step): 1 for rank in range(RANKS) for step in range(STEPS)})
    collectives = Counter((row["rank"], row["op"]) for row in table(out, "collective"))
    expected = {(rank, "all_reduce"): STEPS * PARAMETERS for rank in range(RANKS)}
    expected |= {(rank, "barrier"): 1 for rank in range(RANKS)}
    assert collectives == Counter(expected)


@pytest.mark.slow
@pytest.mark.skipif(sys.version_info < (3, 11), reason="the launcher leaves its folder off its path from 3.11 (-P)")
def test_a_meshtop_py_beside_the_script_does_not_stop_the_launcher(tmp_path: Path) -> None:
    """The script's folder is the launcher's working folder; a ``meshtop.py`` there (one that fails if it is
    ever imported) is not searched by the launcher. The name itself stays meshtop's in the ranks, as
    ``torch`` stays torch's: meshtop attaches before the script runs."""
    (tmp_path / "meshtop.py").write_text('raise ImportError("the user\'s meshtop.py was imported")\n')
    (tmp_path / "train.py").write_text(
        "import torch.distributed as dist\n"
        "dist.init_process_group('gloo')\n"
        "dist.barrier()\n"
        "dist.destroy_process_group()\n"
    )
    out = tmp_path / "rec"
    done = record(tmp_path, out, "python", "train.py")
    assert done.returncode == 0, done.stdout + done.stderr
    assert Counter((row["rank"], row["op"]) for row in table(out, "collective")) == Counter(
        {(rank, "barrier"): 1 for rank in range(RANKS)}
    )
    # the built-in runner's ranks do not search the folder either (PYTHONSAFEPATH)
    builtin = meshtop_in(tmp_path, "record", str(tmp_path / "builtin"), "--model", "tiny", "--dp", "2", "--steps", "2")
    assert builtin.returncode == 0, builtin.stdout + builtin.stderr
    assert len(table(tmp_path / "builtin", "step")) == 2 * 2  # two steps on each of its 2 ranks
