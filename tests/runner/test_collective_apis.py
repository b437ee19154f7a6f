"""Every public collective API, recorded by both kernels as torch's flight recorder saw it issued.

``tests/api_matrix.py`` calls each API once (``torch.distributed``'s list and tensor forms, point-to-point,
the ``*_object`` helpers, the coalescing manager, functional collectives waited and never waited, DTensor
redistributions, ``async_op=True`` works waited late or never) under ``meshtop record``, and keeps the
flight records gloo made for each call. Per rank and per call:

- the ops meshtop recorded, in order, are the ones written out below (:data:`OPS`), never read from
  meshtop's op table: a c10d op missing from the table, or one recorded twice, fails here;
- their group ranks, bytes (nccl-tests' S, from the witness' own sizes) and dtypes add up to the flight
  records'. gloo carries a reduce-scatter out as all-reduces (one per input of the list form) and records
  it under that name, so the two are compared by op family, their bytes summed.

gloo's flight recorder has no point-to-point operation (torch 2.11-2.15), nor the monitored barrier (gloo
carries it out with its own sends and receives): those are checked against the script's own tensors
(:data:`BY_HAND`). gloo completes a work without a future only in a wait on it, so the script leaves no
reduce-scatter, send or receive unwaited (``NEVER_COMPLETE`` in the script).
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import torch

from meshtop.probes.native import NATIVE_ENV
from tests.kit.commands import run_meshtop
from tests.kit.flight import hooked, totals, witnessed

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]
RANKS = 2
FLOATS = 8
"""The script's tensors hold 8 float32 values (32 bytes) a rank unless a case says otherwise."""
S = 4 * FLOATS

OPS: dict[str, list[str] | tuple[list[str], list[str]]] = {
    "all_reduce": ["all_reduce"],
    "all_reduce_bfloat16": ["all_reduce"],
    "all_reduce_waited_late": ["all_reduce"],
    "all_reduce_never_waited": ["all_reduce"],
    "all_reduce_in_inference_mode": ["all_reduce"],
    "all_gather_list": ["all_gather"],
    "all_gather_into_tensor": ["all_gather"],
    "reduce_scatter_list": ["reduce_scatter"],
    "reduce_scatter_tensor": ["reduce_scatter"],
    "reduce_scatter_tensor_waited_late": ["reduce_scatter"],
    "all_to_all_list": ["all_to_all"],
    "all_to_all_single": ["all_to_all"],
    "broadcast": ["broadcast"],
    "reduce": ["reduce"],
    "gather": ["gather"],
    "scatter": ["scatter"],
    "barrier": ["barrier"],
    "monitored_barrier": ["barrier"],
    "send_recv": (["send"], ["recv"]),
    "isend_irecv": (["send"], ["recv"]),
    "batch_isend_irecv": (["send", "recv"], ["recv", "send"]),
    # the object helpers move each object's size (an int64), then its pickled bytes (uint8)
    "all_gather_object": ["all_gather", "all_gather"],
    "broadcast_object_list": ["broadcast", "broadcast"],
    "gather_object": ["all_gather", "gather"],
    "scatter_object_list": ["broadcast", "scatter", "scatter"],
    "send_recv_object_list": (["send", "send"], ["recv", "recv"]),
    # the coalescing manager issues one coalesced c10d op for its calls
    "coalescing_manager_all_reduce": ["all_reduce"],
    "coalescing_manager_all_gather": ["all_gather"],
    "coalescing_manager_reduce_scatter": ["reduce_scatter"],
    "functional_all_reduce": ["all_reduce"],
    "functional_all_reduce_never_waited": ["all_reduce"],
    "functional_all_gather_tensor": ["all_gather"],
    "functional_all_gather_tensor_never_waited": ["all_gather"],
    "functional_reduce_scatter_tensor": ["reduce_scatter"],
    "functional_all_to_all_single": ["all_to_all"],
    "functional_all_to_all_single_never_waited": ["all_to_all"],
    "functional_broadcast": ["broadcast"],
    "functional_broadcast_never_waited": ["broadcast"],
    "functional_all_reduce_coalesced": ["all_reduce"],
    "functional_all_reduce_coalesced_never_waited": ["all_reduce"],
    "functional_all_gather_into_tensor_coalesced": ["all_gather"],
    "functional_all_gather_into_tensor_coalesced_never_waited": ["all_gather"],
    "functional_reduce_scatter_tensor_coalesced": ["reduce_scatter"],
    "dtensor_shard_to_replicate": ["all_gather"],
    "dtensor_partial_to_replicate": ["all_reduce"],
    "dtensor_partial_to_shard": ["reduce_scatter"],
    # torch 2.11-2.13 redistribute Shard(0) -> Shard(1) of a 2-rank mesh by an all-gather (then a local chunk)
    "dtensor_shard0_to_shard1": ["all_gather"],
}
"""Each case's ops as this rank issues them: one list for both ranks, or rank 0's and rank 1's."""

Row = tuple[str, int, int, str | None, int | None]
"""(op, group size, bytes, dtype, peer)."""
BY_HAND: dict[str, tuple[list[Row], list[Row]]] = {
    "monitored_barrier": ([("barrier", 2, 0, None, None)], [("barrier", 2, 0, None, None)]),
    "send_recv": ([("send", 2, S, "float32", 1)], [("recv", 2, S, "float32", 0)]),
    "isend_irecv": ([("send", 2, S, "float32", 1)], [("recv", 2, S, "float32", 0)]),
    "batch_isend_irecv": (
        [("send", 2, S, "float32", 1), ("recv", 2, S, "float32", 1)],
        [("recv", 2, S, "float32", 0), ("send", 2, S, "float32", 0)],
    ),
}
"""What the flight recorder cannot see, from the script's tensors. ``send_recv_object_list``'s sizes depend
on pickle's output: its ops are checked by :data:`OPS`, its bytes by the total sent equalling that received."""


TORCH_RELEASE = tuple(int(part) for part in torch.__version__.split("+")[0].split(".")[:2])
BACKEND_GAPS = {"all_to_all_list"} if TORCH_RELEASE < (2, 13) else set()
"""Cases this torch's gloo refuses ("Backend gloo does not support alltoall": the list form, on torch 2.11;
2.13 has it). Any other case refused fails the test."""


@pytest.mark.parametrize("native", ["on", "off"], ids=["cpp-kernel", "python-kernel"])
def test_every_collective_api_is_recorded_as_torch_saw_it(tmp_path: Path, native: str) -> None:
    out, cases_dir = tmp_path / "rec", tmp_path / "cases"
    cases_dir.mkdir()
    done = run_meshtop(
        "record",
        out,
        "--",
        "torchrun",
        "--standalone",
        f"--nproc-per-node={RANKS}",
        str(ROOT / "tests" / "api_matrix.py"),
        str(cases_dir),
        cwd=tmp_path,
        env={NATIVE_ENV: native, "CUDA_VISIBLE_DEVICES": "", "TORCH_FR_BUFFER_SIZE": "2000"},
    )
    assert done.returncode == 0, done.stdout + done.stderr
    rows = pq.read_table(out / "events" / "collective.parquet").to_pylist()
    sent: Counter[int] = Counter()
    for rank in range(RANKS):
        cases = json.loads((cases_dir / f"cases-{rank}.json").read_text())
        assert [case["case"] for case in cases] == list(OPS), "the script's cases and this test's table"
        mine = [row for row in rows if row["rank"] == rank]
        for case in cases:
            name = case["case"]
            hooks = sorted(
                (row for row in mine if case["start_ns"] <= row["start_ns"] <= case["end_ns"]),
                key=lambda row: row["start_ns"],
            )
            if case["unsupported"] is not None:  # the backend refused it before sending: nothing to record
                assert name in BACKEND_GAPS, f"rank {rank}, {name}: {case['unsupported']}"
                assert hooks == [] and case["records"] == [], f"rank {rank}, {name}: recorded, though never run"
                continue
            ops = OPS[name] if isinstance(OPS[name], list) else OPS[name][rank]
            assert [row["op"] for row in hooks] == ops, f"rank {rank}, {name}: the ops recorded"
            recorded = [(row["op"], row["group_size"], row["bytes"], row["dtype"], row["peer"]) for row in hooks]
            if name in BY_HAND:
                assert case["records"] == [], f"{name}: the flight recorder now sees it: compare with it"
                assert recorded == BY_HAND[name][rank], f"rank {rank}, {name}"
                continue
            if name == "send_recv_object_list":
                sent[rank] += sum(row["bytes"] for row in hooks)
                continue
            assert case["records"], f"rank {rank}, {name}: no flight record (is TORCH_FR_BUFFER_SIZE set?)"
            ranks = tuple(range(RANKS))  # every case's group spans both ranks (the world, or the 1-D mesh)
            assert {row["group_size"] for row in hooks} == {len(ranks)}, f"rank {rank}, {name}"
            recorded_bytes = totals([hooked(row["op"], ranks, row["dtype"], row["bytes"]) for row in hooks])
            assert recorded_bytes == totals([witnessed(record) for record in case["records"]]), f"rank {rank}, {name}"
    assert sent[0] == sent[1] > 0, "send_recv_object_list: what rank 0 sent is what rank 1 received"
