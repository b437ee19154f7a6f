"""What a framework script writes down beside meshtop, from torch and from the framework itself. It imports
nothing of meshtop's.

- ``flight_records(out)``: ``out/records-RANK.json``, every flight record torch made of the run's collectives, in
  issue order, ``[profiling name, group ranks, input sizes, input dtypes, output sizes, output dtypes]`` as
  ``tests/kit/flight.py`` reads them (the records ``tests/fr_witness.py`` keeps). Called after the training's last
  collective and before ``destroy_process_group`` (the groups' ranks are read from c10d).
- ``write_rank(out, backpropagated=..., optimizer=...)``: ``out/rank-RANK.json``, per optimizer step the scalars
  the framework differentiated on this rank (one a micro-batch), and what the rank's optimizer holds: its
  parameters' and its state's bytes, a sharded tensor by its local shard.
- ``write_account(out, account)``: ``out/account.json``, rank 0's account of the run in the framework's own
  terms (its optimizer steps, the losses it logged).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor


def flight_records(out: Path) -> None:
    try:
        from torch._C._distributed_c10d import _dump_fr_trace_json
    except ImportError:  # a torch without the flight recorder: no records, and the test comparing them skips
        return
    from torch.distributed.distributed_c10d import _resolve_process_group

    entries = sorted(json.loads(_dump_fr_trace_json(True, False)).get("entries", []), key=lambda e: e["record_id"])
    records = [
        [
            entry["profiling_name"],
            sorted(dist.get_process_group_ranks(_resolve_process_group(entry["process_group"][0]))),
            entry["input_sizes"],
            entry["input_dtypes"],
            entry["output_sizes"],
            entry["output_dtypes"],
        ]
        for entry in entries
    ]
    out.mkdir(parents=True, exist_ok=True)
    (out / f"records-{dist.get_rank()}.json").write_text(json.dumps(records))


def local_bytes(tensor: torch.Tensor) -> int:
    local = tensor.to_local() if isinstance(tensor, DTensor) else tensor
    return local.numel() * local.element_size()


def optimizer_bytes(optimizer: torch.optim.Optimizer) -> dict[str, int]:
    """The bytes of ``optimizer``'s parameters and of its state (AdamW: both moments and each step count)."""
    parameters = [p for group in optimizer.param_groups for p in group["params"]]
    state = [v for s in optimizer.state.values() for v in s.values() if isinstance(v, torch.Tensor)]
    return {"weights_bytes": sum(map(local_bytes, parameters)), "optimizer_bytes": sum(map(local_bytes, state))}


def write_rank(out: Path, *, backpropagated: list[list[float]], optimizer: torch.optim.Optimizer) -> None:
    out.mkdir(parents=True, exist_ok=True)
    line = {"backpropagated": backpropagated, **optimizer_bytes(optimizer)}
    (out / f"rank-{dist.get_rank()}.json").write_text(json.dumps(line))


def write_account(out: Path, account: dict[str, Any]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "account.json").write_text(json.dumps(account))
