"""The head's live fold of a 1024-rank job's steps, alone: milliseconds a step, and where they go.

``python -m tests.bench.step_fold [--ranks 1024] [--nodes 16] [--steps 20] [--all | --behind] [--profile]``

The fleet benchmark (:mod:`tests.bench.fleet`) measures the head whole, its node processes sharing the two
cores; this one measures the part that sets its lag: :meth:`meshtop.recordings.session_fold.SessionFold.take`
of each step's blocks as the head's collector hands them over (a block a kind and node, every node's
ranks' lines of the fleet's step, :func:`tests.bench.fleet.templates`), one step a take, in one thread.
The kinds folded are a headless ``record``'s (:data:`~meshtop.probes.kinds.PROGRESS_KINDS`),
or with ``--all`` a dashboard's (every kind, nothing left out), or with ``--behind`` a dashboard's that
leaves the bulk kinds out, as a live fold that fell behind does (its steps then torn: not broken down, read
without their phase times). ``--profile`` prints cProfile's top 25.
The first step is folded before the clock starts (imports, the first tables).
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import sys
import time
from itertools import islice

from meshtop.probes.arrivals import Arrivals, EncodedEvents
from meshtop.probes.events import Event
from meshtop.probes.kinds import BULK_KINDS, FOLDED_KINDS, PROGRESS_KINDS
from meshtop.recordings.session_fold import SessionFold
from meshtop.runner.job.allocator import keep_buffer_pages
from tests.bench.fleet import STEP_KINDS, Template, templates
from tests.bench.tui_frames import SyntheticSource

STEP_S = 0.2


def step_batches(ranks: int, nodes: int, steps: int) -> tuple[SyntheticSource, list[Arrivals]]:
    """The fleet's job, and ``steps`` of its steps as the head takes them: per node, a block a kind."""
    per_node = ranks // nodes
    source = SyntheticSource(ranks, warm_events=0, per_node=per_node)
    first: dict[int, list[Event]] = {rank: [] for rank in range(ranks)}
    start = None
    for event in islice(source.job_events(), ranks, None):
        step = getattr(event, "step", None)
        if step == 2:
            break
        if step == 1 and event.kind in STEP_KINDS:
            first[event.rank].append(event)  # type: ignore[attr-defined]
            if event.kind == "step":
                start = event.start_ns  # type: ignore[attr-defined]
    assert start is not None
    kinds: dict[int, list[Template]] = {rank: templates(events, start) for rank, events in first.items()}
    t0 = time.time_ns()
    batches = []
    for step in range(steps):
        now_ns = t0 + int(step * STEP_S * 1e9)
        items = []
        for node in range(nodes):
            lines: dict[str, list[bytes]] = {}
            counts: dict[str, int] = {}
            for rank in range(node * per_node, (node + 1) * per_node):
                for template in kinds[rank]:
                    lines.setdefault(template.kind, []).append(template.fill(step, now_ns, 1.0))
                    counts[template.kind] = counts.get(template.kind, 0) + template.count
            for kind in sorted(lines, key=lambda kind: kind == "step"):  # a step after what it closes
                block = b"".join(lines[kind])
                items.append(EncodedEvents(kind, node * per_node, block, counts[kind], node=node + 1, offset_ns=0))
        batches.append(Arrivals(items))
    return source, batches


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=1024)
    parser.add_argument("--nodes", type=int, default=16)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--all", action="store_true", help="every kind, as a dashboard's fold")
    parser.add_argument("--behind", action="store_true", help="a dashboard's fold leaving the bulk kinds out")
    parser.add_argument("--profile", action="store_true")
    args = parser.parse_args(argv)
    keep_buffer_pages()  # as the head's meshtop does (41 against 24 ms a step without, 2026-12-04)
    source, batches = step_batches(args.ranks, args.nodes, args.steps)
    session = SessionFold(source.description, kinds=FOLDED_KINDS if args.all or args.behind else PROGRESS_KINDS)
    events = batches[1].count  # as sent: with --behind, the fold takes only its steps and samples
    if args.behind:
        batches = [Arrivals(item for item in arrivals.items if item.kind not in BULK_KINDS) for arrivals in batches]
    session.take(batches[0], bulk_left_out=args.behind)
    profile = cProfile.Profile()
    took = []
    for arrivals in batches[1:]:
        began = time.perf_counter()
        if args.profile:
            profile.enable()
        session.take(arrivals, bulk_left_out=args.behind)
        if args.profile:
            profile.disable()
        took.append(time.perf_counter() - began)
    took.sort()
    print(
        f"{args.ranks} ranks, {args.nodes} nodes, "
        f"{'every kind' if args.all else 'bulk left out' if args.behind else 'headless'}: "
        f"{len(took)} steps of {events:,} events, ms a step p50 {took[len(took) // 2] * 1000:.1f}, "
        f"max {took[-1] * 1000:.1f}; {events / took[len(took) // 2] / 1e6:.2f} M events/s; "
        f"steps completed {session.steps_completed}"
    )
    if args.profile:
        pstats.Stats(profile).sort_stats("tottime").print_stats(25)
    return 0


if __name__ == "__main__":
    sys.exit(main())
