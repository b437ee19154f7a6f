"""What a clean close costs a thousand ranks' recording: the node parts merged into each kind's Parquet table.

``python -m tests.bench.close_parts [--steps 200] [--json PATH]``

Writes the node parts of the fleet's 1024 ranks on 16 nodes (:mod:`tests.bench.fleet`: each node's blocks of
each step, as its relay forwards them, through the head's :class:`meshtop.recordings.events_log.EventWriter`),
then closes the recording (:func:`meshtop.recordings.tables.compact`) in a process of its own: its CPU and
wall time, and its peak resident memory (the process's, Python and Arrow included). 200 steps are 9.0 M
events.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from meshtop.probes.arrivals import EncodedEvents
from meshtop.recordings.events_log import EVENTS_DIR, EventWriter
from meshtop.recordings.manifest import start_manifest, write_manifest
from tests.bench.fleet import NODES, RANKS, node_kinds
from tests.bench.tui_frames import SyntheticSource

STEPS = 200
STEP_NS = 45_000_000


def write_parts(directory: Path, steps: int) -> int:
    """A recording of ``steps`` steps of the fleet, every node's events in its part; the events written."""
    per_node = RANKS // NODES
    write_manifest(directory, start_manifest(SyntheticSource(RANKS, warm_events=0).description, command_line=[]))
    kinds = {node: node_kinds(node, RANKS, per_node) for node in range(1, NODES + 1)}
    writer, t0, written = EventWriter(directory), time.time_ns(), 0
    for step in range(steps):
        items = [
            EncodedEvents(
                template.kind,
                (node - 1) * per_node,
                template.fill(step, t0 + step * STEP_NS, 1.0),
                template.count,
                node=node,
                offset_ns=1_000 * node,
            )
            for node, templates in kinds.items()
            for template in templates
        ]
        writer.write(items)
        written += sum(item.count for item in items)
    writer.close()
    return written


def close(directory: str) -> dict[str, Any]:
    """This process closes the recording at ``directory``: what it cost."""
    from meshtop.recordings.tables import compact

    cpu, wall = time.process_time(), time.perf_counter()
    compact(Path(directory))
    tables = (Path(directory) / EVENTS_DIR).glob("*.parquet")
    return {
        "cpu_s": time.process_time() - cpu,
        "wall_s": time.perf_counter() - wall,
        "peak_rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6,  # KB on Linux
        "rows": sum(pq.ParquetFile(path).metadata.num_rows for path in tables),
    }


def measure(steps: int = STEPS) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp) / "fleet"
        directory.mkdir()
        written = write_parts(directory, steps)
        parts_mb = sum(path.stat().st_size for path in (directory / EVENTS_DIR).glob("node*.frames")) / 1e6
        code = f"import json, tests.bench.close_parts as b; print(json.dumps(b.close({str(directory)!r})))"
        out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout
        return {"events": written, "parts_mb": round(parts_mb, 1), **json.loads(out)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=STEPS)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    got = measure(args.steps)
    print(json.dumps(got))
    if args.json is not None:
        args.json.write_text(json.dumps(got, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
