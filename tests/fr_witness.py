"""Run a torchrun script as it is, and keep the flight records torch made of its collectives.

``torchrun ... tests/fr_witness.py OUT_DIR SCRIPT [ARGS]`` with ``TORCH_FR_BUFFER_SIZE`` set: the script
runs as ``__main__`` with its own arguments; when it calls ``destroy_process_group`` (its groups still
alive, so their ranks can be read), each rank writes OUT_DIR/records-N.json, every flight record of the
run in issue order, as :mod:`tests.kit.flight` reads them. It shares no code with meshtop's probes.
"""

from __future__ import annotations

import json
import runpy
import sys
from pathlib import Path
from typing import Any

import torch.distributed as dist
from torch.distributed.distributed_c10d import _resolve_process_group


def records() -> list[list[Any]]:
    from torch._C._distributed_c10d import _dump_fr_trace_json

    entries = sorted(json.loads(_dump_fr_trace_json(True, False)).get("entries", []), key=lambda e: e["record_id"])
    return [
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


def main() -> None:
    out_dir, script = sys.argv[1], sys.argv[2]
    destroy = dist.destroy_process_group

    def kept_then_destroyed(*args: Any, **kwargs: Any) -> Any:
        Path(out_dir, f"records-{dist.get_rank()}.json").write_text(json.dumps(records()))
        return destroy(*args, **kwargs)

    dist.destroy_process_group = kept_then_destroyed  # type: ignore[assignment]
    sys.argv = sys.argv[2:]
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main()
