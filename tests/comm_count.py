"""Test harness: run a script under torch's own CommDebugMode and write, per rank, the collectives it counted.

``torchrun ... tests/comm_count.py OUT SCRIPT [ARGS...]`` (plain torchrun, no
meshtop) runs SCRIPT as ``__main__`` inside the mode and writes
``OUT.RANK.json``: ``{op: count}`` in CommDebugMode's op names. The examples'
tests compare meshtop's recording of the same script with it.
"""

from __future__ import annotations

import json
import os
import runpy
import sys
from pathlib import Path
from typing import Any

from torch.distributed.tensor.debug import CommDebugMode


def tolerate_unbalanced_modules(mode: CommDebugMode) -> None:
    """CommDebugMode's per-module tracker pops one parent too many on nested modules in torch 2.13 (an
    IndexError that stops the script at its first forward); its counts do not depend on that tracking, so
    the pop is skipped when only the root is left."""
    tracker = mode.advanced_module_tracker
    pop_module = tracker._fw_set_module_hook

    def tolerant(module: Any, inputs: Any, output: Any) -> None:
        if len(tracker.parent_list) > 1:
            pop_module(module, inputs, output)

    tracker._fw_set_module_hook = tolerant


def main() -> None:
    out, script, *args = sys.argv[1:]
    sys.argv = [script, *args]
    mode = CommDebugMode()
    tolerate_unbalanced_modules(mode)
    try:
        with mode:
            runpy.run_path(script, run_name="__main__")
    finally:
        counts = {str(op): count for op, count in mode.get_comm_counts().items()}
        Path(f"{out}.{os.environ['RANK']}.json").write_text(json.dumps(counts))


if __name__ == "__main__":
    main()
