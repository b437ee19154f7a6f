"""The collective hooks see every collective the job issues, checked against PyTorch's CommDebugMode."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from probes.native import NATIVE_ENV
from runner.plan import RunSpec, resolve

pytestmark = pytest.mark.slow
P2P = {"send", "recv"}

PLANS = {
    "ddp": (dict(dp=2), {"dp"}),
    "fsdp": (dict(dp=2, fsdp=True), {"dp"}),
    "tp": (dict(tp=2), {"tp"}),
    "pp-1f1b": (dict(pp=2, schedule="1f1b", microbatches=4), {"pp"}),
    "pp-gpipe": (dict(pp=2, schedule="gpipe", microbatches=2), {"pp"}),
    "3d": (dict(dp=2, tp=2, pp=2, microbatches=2), {"dp", "tp", "pp"}),
}


def count_both_ways(tmp_path: Path, native_env: str, **spec: object) -> tuple[object, list[dict[str, Counter]]]:
    """Each rank's counts (``hooks``, ``comm_debug_mode``), with the kernel ``native_env`` selects."""
    run = resolve(RunSpec(device="cpu", batch_size=8, **spec), gpus_visible=0)  # type: ignore[arg-type]
    run_path, out = tmp_path / "run.json", tmp_path / "counts"
    run_path.write_text(json.dumps(run.to_json()))
    out.mkdir()
    done = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={run.world_size}",
         "-m", "tests.coverage_worker", str(run_path), str(out)],
        capture_output=True, text=True, timeout=300,
        env={**os.environ, "OMP_NUM_THREADS": "1", NATIVE_ENV: native_env},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    ranks = [json.loads((out / f"rank-{r}.json").read_text()) for r in range(run.world_size)]
    return run, [{name: Counter(counts) if isinstance(counts, dict) else counts for name, counts in rank.items()}
                 for rank in ranks]


@pytest.mark.parametrize("plan", PLANS, ids=PLANS.keys())
def test_hooks_count_what_comm_debug_mode_counts(plan: str, collective_kernel: tuple[str, str],
                                                 tmp_path: Path) -> None:
    spec, groups = PLANS[plan]
    kernel, native_env = collective_kernel
    run, ranks = count_both_ways(tmp_path, native_env, **spec)
    for rank, counts in enumerate(ranks):
        assert counts["kernel"] == kernel
        hooks = counts["hooks"]
        by_op = Counter()
        for key, count in hooks.items():
            op, group = key.split("/")
            assert group in groups, f"rank {rank}: {key} on an unexpected group"
            if op not in P2P:
                by_op[op] += count
        assert by_op == counts["comm_debug_mode"], f"rank {rank}"
        if run.pp > 1:
            # CommDebugMode does not count P2P; each pipeline boundary moves one
            # activation forward and one gradient back per microbatch.
            assert hooks["send/pp"] == hooks["recv/pp"] == run.microbatches, f"rank {rank}"
        else:
            assert sum(hooks.values()) > 0
