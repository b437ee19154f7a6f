"""The framework corpus: a framework's own training, recorded by ``meshtop record OUT -- LAUNCHER ...``, checked
against what the framework itself said of it.

Each script under ``ranks/`` trains the same tiny Llama (hidden 32, 2 layers, vocabulary 128, random weights) on
random tokens, 2 CPU ranks with gloo, ``STEPS`` optimizer steps, and writes down (``ranks/witness.py``) the
framework's own account: its optimizer steps and the loss it logged for each, each rank's scalars given to
``backward`` and what its optimizer holds, and torch's flight records of the collectives. The expected figures
come from there, or from the model's shapes counted by hand (:data:`PARAMETERS`), never from meshtop's tables.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import sys
from collections import defaultdict
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from statistics import fmean
from typing import Any

import pyarrow.parquet as pq
import pytest

from tests.kit.commands import run_meshtop, summary_json
from tests.kit.flight import hooked, totals, witnessed
from tests.kit.jobs import assert_parts_add_up

RANKS_DIR = Path(__file__).resolve().with_name("ranks")
RANKS = 2
STEPS = 6
PARAMETERS = 2 * 128 * 32 + 32 + 2 * (2 * 32 * 32 + 2 * 32 * 16 + 3 * 32 * 64 + 2 * 32)
"""The tiny Llama's parameters, 26,784: embedding and output (128 x 32 each, untied), the final norm (32), and
per layer the query and output projections (32 x 32), key and value (32 x 16: 2 key/value heads of 8), the
gated MLP's three matrices (32 x 64) and two norms (32)."""
PARAMETER_BYTES = 4 * PARAMETERS
"""float32."""
LOSS_RTOL = 1e-6
"""A rank's loss is the float32 scalars it differentiated, summed by meshtop and here; the job's, the ranks' mean,
which the frameworks take in float32 (about 1e-7 relative apart)."""
ENVIRONMENT = {
    "CUDA_VISIBLE_DEVICES": "",
    # The run's every collective stays in torch's flight ring (meshtop's default keeps 2,000).
    "TORCH_FR_BUFFER_SIZE": "20000",
    # Nothing is downloaded: the model and data are made in the script.
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "HF_DATASETS_OFFLINE": "1",
    "WANDB_MODE": "disabled",
}


def require(module: str, why: str, *, install: str = "pip install -e '.[frameworks]'") -> None:
    """Skip the calling test module unless ``module`` can be imported (found, not imported: some are slow)."""
    if importlib.util.find_spec(module) is None:
        pytest.skip(f"{module} is not installed ({why}): {install}", allow_module_level=True)


def torchrun(script: str, *args: str) -> list[str]:
    return ["torchrun", "--standalone", f"--nproc-per-node={RANKS}", str(RANKS_DIR / script), *args]


@dataclass
class FrameworkRun:
    """A framework's training recorded by meshtop (``recording``), and what its script wrote (``written``)."""

    recording: Path
    written: Path
    accum: int
    """The micro-batches (gradient accumulation) of an optimizer step."""

    @cached_property
    def summary(self) -> dict[str, Any]:
        return summary_json(self.recording)

    def table(self, kind: str) -> list[dict[str, Any]]:
        return pq.read_table(self.recording / "events" / f"{kind}.parquet").to_pylist()

    @cached_property
    def steps(self) -> dict[tuple[int, int], dict[str, Any]]:
        """meshtop's step rows by (rank, step)."""
        return {(row["rank"], row["step"]): row for row in self.table("step")}

    @cached_property
    def account(self) -> dict[str, Any]:
        """Rank 0's account in the framework's terms: ``optimizer_steps``, ``logged_loss`` (one a step)."""
        return json.loads((self.written / "account.json").read_text())

    def rank(self, rank: int) -> dict[str, Any]:
        """``backpropagated`` (per step, the scalars the rank differentiated), ``weights_bytes``,
        ``optimizer_bytes``."""
        return json.loads((self.written / f"rank-{rank}.json").read_text())

    def flight_records(self, rank: int) -> list[list[Any]]:
        path = self.written / f"records-{rank}.json"
        records = json.loads(path.read_text()) if path.exists() else []
        if not records:
            pytest.skip("this torch keeps no flight records of gloo's collectives: nothing to compare with")
        return records


def record(out: Path, launcher: list[str], *, accum: int, env: dict[str, str] | None = None) -> FrameworkRun:
    """``meshtop record OUT/rec -- LAUNCHER --out OUT/written --steps STEPS --accum ACCUM``, run from ``out``;
    checked to complete."""
    recording, written = out / "rec", out / "written"
    command = [*launcher, "--out", str(written), "--steps", str(STEPS), "--accum", str(accum)]
    done = run_meshtop("record", recording, "--", *command, env={**ENVIRONMENT, **(env or {})}, cwd=out)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return FrameworkRun(recording=recording, written=written, accum=accum)


def on_path() -> dict[str, str]:
    """An environment whose ``PATH`` finds this Python's console scripts (``accelerate``) first."""
    return {"PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])}


def assert_steps_are_the_frameworks(run: FrameworkRun, *, backpropagated: bool = True) -> None:
    """meshtop's steps are the framework's optimizer steps, on every rank: a micro-batch the framework only
    accumulates is no step; each step holds the losses of its ``accum`` micro-batches."""
    assert run.account["optimizer_steps"] == STEPS
    assert sorted(run.steps) == [(rank, step) for rank in range(RANKS) for step in range(STEPS)]
    assert run.summary["steps"]["count"] == STEPS
    assert {row["losses"] for row in run.steps.values()} == {run.accum}
    if backpropagated:
        for rank in range(RANKS):
            micro_batches = run.rank(rank)["backpropagated"]
            assert [len(step) for step in micro_batches] == [run.accum] * STEPS, rank


def assert_each_ranks_loss_is_what_it_backpropagated(run: FrameworkRun) -> None:
    """A rank's step loss is the sum of the scalars the framework gave ``backward`` in the step (the loss whose
    gradient the optimizer applies)."""
    for rank in range(RANKS):
        for step, scalars in enumerate(run.rank(rank)["backpropagated"]):
            recorded = run.steps[(rank, step)]["loss"]
            assert math.isclose(recorded, math.fsum(scalars), rel_tol=LOSS_RTOL), (rank, step, recorded, scalars)


def job_losses(run: FrameworkRun) -> list[float]:
    """The job's loss a step, as meshtop's steps give it: the mean over the ranks of each rank's."""
    return [fmean(run.steps[(rank, step)]["loss"] for rank in range(RANKS)) for step in range(STEPS)]


def assert_the_jobs_loss_is_the_logged_loss(run: FrameworkRun) -> None:
    """Each step's job loss (the ranks' mean) is the loss the framework logged for that step; ``summary``'s
    first and last are its first and last."""
    logged = run.account["logged_loss"]
    assert len(logged) == STEPS
    for step, (recorded, expected) in enumerate(zip(job_losses(run), logged, strict=True)):
        assert math.isclose(recorded, expected, rel_tol=LOSS_RTOL), (step, recorded, expected)
    loss = run.summary["steps"]["loss"]
    assert math.isclose(loss["first"], logged[0], rel_tol=LOSS_RTOL), (loss, logged)
    assert math.isclose(loss["last"], logged[-1], rel_tol=LOSS_RTOL), (loss, logged)


def assert_collectives_are_torchs(run: FrameworkRun) -> None:
    """Per rank, the bytes of each (op family, group, dtype) over the whole run equal torch's flight records."""
    rows = run.table("collective")
    for rank in range(RANKS):
        records = run.flight_records(rank)
        mine = [row for row in rows if row["rank"] == rank]
        assert {row["group_size"] for row in mine} == {RANKS}, "every group spans both ranks"
        recorded = totals([hooked(row["op"], tuple(range(RANKS)), row["dtype"], row["bytes"]) for row in mine])
        assert recorded == totals([witnessed(record) for record in records]), f"rank {rank}"


def assert_gradients_reduced(run: FrameworkRun, op: str, *, times: int = 1) -> None:
    """In each step, every rank's float32 ``op`` operations of more than one element (a framework's logged
    scalar is one) move the model's gradients ``times`` times: ``times * PARAMETER_BYTES`` (DDP's all-reduce;
    FSDP2's reduce-scatter, whose size is the whole gradient's)."""
    moved: dict[tuple[int, int], int] = defaultdict(int)
    for row in run.table("collective"):
        if row["op"] == op and row["dtype"] == "float32" and row["bytes"] > 4 and row["step"] is not None:
            moved[(row["rank"], row["step"])] += row["bytes"]
    expected = times * PARAMETER_BYTES
    assert moved == {(rank, step): expected for rank in range(RANKS) for step in range(STEPS)}


def assert_breakdown_adds_up(run: FrameworkRun) -> None:
    """``summary --json``'s breakdown: each rank measured, its parts add up to its step, forward and backward
    seen, no pipeline bubble."""
    assert_parts_add_up(run.summary["breakdown"], RANKS)


def assert_memory_is_the_optimizers(run: FrameworkRun, *, sharded: bool) -> None:
    """At the last step each rank's weights and optimizer state are what its optimizer holds (the script's
    count), its gradients as many bytes as its weights (float32, one each); the model's parameters whole on
    each rank, or, ``sharded``, split between them."""
    memory = {row["rank"]: row for row in run.summary["memory"]}
    assert sorted(memory) == list(range(RANKS))
    for rank in range(RANKS):
        held = run.rank(rank)
        assert memory[rank]["weights_bytes"] == held["weights_bytes"], rank
        assert memory[rank]["grads_bytes"] == held["weights_bytes"], rank
        assert memory[rank]["optimizer_bytes"] == held["optimizer_bytes"], rank
    weights = [run.rank(rank)["weights_bytes"] for rank in range(RANKS)]
    assert (sum(weights) if sharded else weights) == (PARAMETER_BYTES if sharded else [PARAMETER_BYTES] * RANKS)
