"""Collectives called through the APIs the built-in runner does not use, recorded by both kernels: functional
collectives (DTensor and sequence parallelism wait on them in C++, through ``wait_tensor``) and collectives
under ``torch.inference_mode`` (where neither autograd nor the ADInplaceOrView key runs).

The expected operations and bytes are written out here from the script's own tensors, never read from
meshtop's op table.
"""

from __future__ import annotations

import textwrap
from collections import Counter
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from meshtop.probes.native import NATIVE_ENV
from tests.kit.commands import run_meshtop

pytestmark = pytest.mark.slow
RANKS = 2
ITERATIONS = 3
FLOATS = 8
"""Each tensor the script sends holds 8 float32 values: 32 bytes."""
SCRIPT = f"""
import warnings

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as functional

warnings.simplefilter("ignore", FutureWarning)  # reduce_scatter_tensor's new name (torch 2.13) is not in 2.11
dist.init_process_group("gloo")
world = dist.group.WORLD
model = torch.nn.Linear({FLOATS}, {FLOATS})
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range({ITERATIONS}):
    x = torch.ones({FLOATS})
    scattered = functional.reduce_scatter_tensor(x, "sum", 0, world) * 1  # waited on use
    assert scattered.tolist() == [2.0] * {FLOATS // RANKS}
    pair = functional.reduce_scatter_tensor_coalesced([x, x], "sum", [0, 0], world)
    assert [t.sum().item() for t in pair] == [{FLOATS}.0, {FLOATS}.0]
    gathered = functional.all_gather_tensor(x, 0, world) * 1
    reduced = functional.all_reduce(x, "sum", world) * 1
    with torch.inference_mode():
        inferred = torch.ones({FLOATS})
        dist.all_reduce(inferred)
    model(x).sum().backward()
    optimizer.step()
    optimizer.zero_grad()
dist.destroy_process_group()
"""
PER_ITERATION = {
    ("reduce_scatter", 4 * FLOATS): 1,  # reduce_scatter_tensor: S is the whole input
    ("reduce_scatter", 2 * 4 * FLOATS): 1,  # the coalesced pair: one operation of both inputs
    ("all_gather", RANKS * 4 * FLOATS): 1,  # S is the whole output
    ("all_reduce", 4 * FLOATS): 2,  # the functional one and the one under inference mode
}


@pytest.mark.parametrize("native", ["on", "off"], ids=["cpp-kernel", "python-kernel"])
def test_functional_collectives_and_inference_mode_are_recorded(tmp_path: Path, native: str) -> None:
    (tmp_path / "apis.py").write_text(textwrap.dedent(SCRIPT))
    out = tmp_path / "rec"
    done = run_meshtop(
        "record",
        out,
        "--",
        "torchrun",
        "--standalone",
        f"--nproc-per-node={RANKS}",
        "apis.py",
        cwd=tmp_path,
        env={NATIVE_ENV: native, "CUDA_VISIBLE_DEVICES": ""},
    )
    assert done.returncode == 0, done.stdout + done.stderr
    rows = pq.read_table(out / "events" / "collective.parquet").to_pylist()
    for rank in range(RANKS):
        seen = Counter((row["op"], row["bytes"]) for row in rows if row["rank"] == rank)
        assert seen == Counter({key: count * ITERATIONS for key, count in PER_ITERATION.items()}), rank
        assert {row["dtype"] for row in rows if row["rank"] == rank} == {"float32"}
