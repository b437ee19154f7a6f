"""``/metrics`` of a 1024-rank job: the size of one scrape and the time to render it, per node and per rank.

``python -m tests.bench.prometheus_scale [--ranks 1024] [--nodes 16] [--steps 10]``

A simulated job (``tests.kit.recordings.fleet_recording``'s layout: ``--nodes`` nodes of equal ranks) whose
ranks each run, every step, an all-reduce on dp, two on tp and a send and a receive on pp, with every GPU
sampled: the collectives' histograms are the series that grow with the ranks. Its events are counted by a
:class:`meshtop.recordings.prometheus.RunMetrics` as a replay counts them, and the figures read from the fold as
a scrape reads them; the render is timed over 5 scrapes (median).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from meshtop.probes.events import Event
from meshtop.recordings.prometheus import RunMetrics
from meshtop.recordings.reader import open_recording
from meshtop.recordings.replay import in_kind_order
from meshtop.recordings.session_fold import SessionFold
from meshtop.recordings.tables import compact
from tests.kit.events import collective, gpu_sample, rank_started, step
from tests.kit.recordings import fleet_description, write_recording

OPS = (("all_reduce", "dp", None), ("all_reduce", "tp", None), ("send", "pp", 1), ("recv", "pp", 1))


def job_events(ranks: int, nodes: int, steps: int) -> list[Event]:
    per_node = ranks // nodes
    events: list[Event] = [
        rank_started(rank, node=rank // per_node, host=f"node{rank // per_node}") for rank in range(ranks)
    ]
    for number in range(steps):
        for rank in range(ranks):
            for index, (op, group, peer) in enumerate(OPS):
                seconds = 0.001 * (1 + index + rank % 7)
                events.append(collective(rank, number, seconds, op, group=group, group_size=8, peer=peer))
            events.append(step(rank, number, 0.5))
        for node in range(nodes):
            for gpu in range(min(8, per_node)):
                events.append(gpu_sample(gpu=gpu, node=node, wall_ns=number * 10**9, uuid=f"GPU-{node}-{gpu}"))
    return events


def scrape(recording: Path, *, per_rank: bool) -> tuple[int, float]:
    """(bytes of one scrape, median seconds to render it)."""
    opened = open_recording(recording)
    session = SessionFold(opened.manifest.run)
    metrics = RunMetrics(opened.manifest.run, per_rank=per_rank)
    metrics.follow(session)
    tables = list(in_kind_order((kind, opened.arrow(kind)) for kind in opened.kinds()))
    with session.reading() as fold:
        for kind, table in tables:
            fold.apply(kind, table)
        fold.finish("completed")
    metrics.count(tables)
    times, size = [], 0
    for _ in range(5):
        started = time.perf_counter()
        size = len(metrics.exposition())
        times.append(time.perf_counter() - started)
    return size, statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=1024)
    parser.add_argument("--nodes", type=int, default=16)
    parser.add_argument("--steps", type=int, default=10)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        recording = write_recording(
            Path(scratch) / "rec",
            job_events(args.ranks, args.nodes, args.steps),
            run=fleet_description(args.ranks, args.nodes),
        )
        compact(recording)
        print(f"{args.ranks} ranks on {args.nodes} nodes, {args.steps} steps")
        for per_rank in (False, True):
            size, seconds = scrape(recording, per_rank=per_rank)
            mode = "per rank" if per_rank else "per node"
            print(f"  {mode:<9} scrape {size / 1e6:8.2f} MB   render {seconds * 1e3:8.1f} ms")


if __name__ == "__main__":
    main()
