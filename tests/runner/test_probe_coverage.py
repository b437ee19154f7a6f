"""The collective hooks see every operation a job issues, as it was issued: checked against torch's own records.

The witness (``tests/witness_worker.py``) shares no code with the probes: the flight recorder that the
process group's backend fills, and torch's profiler. Per rank and per operation, in issue order, the op,
the global ranks of its process group, its bytes, its dtype and, for a send or a receive, the peer must be
what the hooks recorded.
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

from meshtop.probes.native import NATIVE_ENV
from meshtop.runner.plan import RunSpec, resolve
from tests.kit.commands import run_meshtop
from tests.kit.flight import hooked, totals, witnessed

pytestmark = pytest.mark.slow
POINT_TO_POINT = {"send", "recv"}

PLANS = {
    "ddp": dict(dp=2),
    "fsdp": dict(dp=2, fsdp=True),
    "tp": dict(tp=2),
    "pp-1f1b": dict(pp=2, schedule="1f1b", microbatches=4),
    "pp-gpipe": dict(pp=2, schedule="gpipe", microbatches=2),
    "3d": dict(dp=2, tp=2, pp=2, microbatches=2),
}
KERNEL_PLANS = [(plan, "cpp") for plan in PLANS] + [(plan, "python") for plan in ("ddp", "fsdp", "tp", "pp-1f1b")]
"""The C++ kernel (the default) on every plan; the Python one (the fallback, which reports each operation as
the C++ one does: tests/probes/test_collective_kernels.py) on a plan of each kind of operation, for the suite's
time (each 3d job costs the 2-core CI machine 40 s)."""


def watch_one_step(tmp_path: Path, native_env: str, **spec: object) -> tuple[Any, list[dict[str, Any]]]:
    """Each rank's operations of one step, by the hooks of the kernel ``native_env`` selects and by the witness."""
    if not has_flight_recorder():
        pytest.skip("this torch has no flight recorder (torch._C._distributed_c10d._dump_fr_trace_json)")
    run = resolve(RunSpec(device="cpu", batch_size=8, **spec), gpus_visible=0)  # type: ignore[arg-type]
    run_path, out = tmp_path / "run.json", tmp_path / "ops"
    run_path.write_text(json.dumps(run.to_json()))
    out.mkdir()
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            f"--nproc-per-node={run.plan.world_size}",
            "-m",
            "tests.witness_worker",
            str(run_path),
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "OMP_NUM_THREADS": "1", NATIVE_ENV: native_env, "TORCH_FR_BUFFER_SIZE": "20000"},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    ranks = [json.loads((out / f"rank-{r}.json").read_text()) for r in range(run.plan.world_size)]
    if not all(rank["witness_available"] for rank in ranks):
        pytest.skip("this torch's gloo keeps no flight record: the witness saw nothing")
    return run, ranks


def has_flight_recorder() -> bool:
    try:
        from torch._C._distributed_c10d import _dump_fr_trace_json  # noqa: F401
    except ImportError:
        return False
    return True


def split(ops: list[list[Any]]) -> tuple[list[list[Any]], list[list[Any]]]:
    """Collectives and point-to-point operations, each in issue order (the witness reads them apart)."""
    return ([op for op in ops if op[0] not in POINT_TO_POINT], [op for op in ops if op[0] in POINT_TO_POINT])


@pytest.mark.parametrize(("plan", "kernel"), KERNEL_PLANS, ids=[f"{kernel}-{plan}" for plan, kernel in KERNEL_PLANS])
def test_hooks_record_each_operation_as_torch_records_it(
    plan: str, kernel: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    native_env = str(request.getfixturevalue("native_probe")) if kernel == "cpp" else "off"
    run, ranks = watch_one_step(tmp_path, native_env, **PLANS[plan])
    for rank, seen in enumerate(ranks):
        assert seen["kernel"] == kernel
        hooks, witness = split(seen["hooks"]), split(seen["witness"])
        assert hooks[0] == witness[0], f"rank {rank}: collectives [op, ranks, bytes, dtype, peer]"
        assert hooks[1] == witness[1], f"rank {rank}: sends and receives [op, ranks, bytes, dtype, peer]"
        sizes = {"dp": run.plan.dp, "tp": run.plan.tp, "pp": run.plan.pp}
        expected_ops = sum(size > 1 for size in sizes.values())
        assert len({tuple(op[1]) for op in witness[0] + witness[1]}) == expected_ops, (
            f"rank {rank}: an operation on each group the plan has, and on no other"
        )
        if run.plan.pp > 1:
            # Each pipeline boundary moves one activation forward and one gradient back per microbatch.
            assert [op[0] for op in witness[1]].count("send") == run.microbatches, f"rank {rank}"
        else:
            assert witness[1] == []


EXAMPLES = {
    # script: (the op counted, how many a step a rank): see each example's docstring
    "sp.py": ("reduce_scatter", 2),  # sequence parallelism: DTensor's functional reduce-scatters
    "ep.py": ("all_to_all", 5),  # expert parallelism: token counts, tokens there and back, twice over
}
EXAMPLE_STEPS = 3


@pytest.mark.parametrize("example", EXAMPLES)
def test_examples_record_each_operation_torch_records(
    example: str, collective_kernel: tuple[str, str], tmp_path: Path
) -> None:
    """A user's script, run by ``meshtop record`` as it is: per rank, the bytes of each (op family, group,
    dtype) over the whole run equal the flight recorder's (``tests/fr_witness.py`` keeps its records), and
    the example's own collective comes as often as its docstring says."""
    if not has_flight_recorder():
        pytest.skip("this torch has no flight recorder (torch._C._distributed_c10d._dump_fr_trace_json)")
    _, native_env = collective_kernel
    out, witness = tmp_path / "rec", tmp_path / "witness"
    witness.mkdir()
    root = Path(__file__).resolve().parents[2]
    done = run_meshtop(
        "record",
        out,
        "--",
        "torchrun",
        "--standalone",
        "--nproc-per-node=2",
        str(root / "tests" / "fr_witness.py"),
        str(witness),
        str(root / "examples" / example),
        "--steps",
        str(EXAMPLE_STEPS),
        cwd=tmp_path,
        env={NATIVE_ENV: native_env, "CUDA_VISIBLE_DEVICES": "", "TORCH_FR_BUFFER_SIZE": "2000"},
    )
    assert done.returncode == 0, done.stdout + done.stderr
    rows = pq.read_table(out / "events" / "collective.parquet").to_pylist()
    op, per_step = EXAMPLES[example]
    for rank in range(2):
        records = json.loads((witness / f"records-{rank}.json").read_text())
        assert records, f"rank {rank}: no flight record (is TORCH_FR_BUFFER_SIZE set?)"
        mine = [row for row in rows if row["rank"] == rank]
        assert {row["group_size"] for row in mine} == {2}, "every group of the example spans both ranks"
        recorded = totals([hooked(row["op"], (0, 1), row["dtype"], row["bytes"]) for row in mine])
        assert recorded == totals([witnessed(record) for record in records]), f"rank {rank}"
        counted = Counter(row["step"] for row in mine if row["op"] == op)
        assert counted == {step: per_step for step in range(EXAMPLE_STEPS)}, f"rank {rank}: {op}s a step"
