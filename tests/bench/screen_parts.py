"""What the dashboard's frame asks of its state at many ranks, part by part, alone: milliseconds a call.

``python -m tests.bench.screen_parts [--ranks 1024] [--per-node 8] [--calls 15]``

The state is :mod:`tests.bench.tui_frames`'s synthetic job after its warm history, its session's fold fed
as a live job's; before each call a batch of 2,000 of the job's next events is folded in (what a fold
thread does between two frames), so what a part keeps between calls is kept only as long as it would be
live. The parts: the run's figures (the header, the alerts and the panels read them), the node labels the
Grid draws (one a node), the Grid's attention and its text. Prints each part's p50 and worst.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from itertools import islice

from meshtop.tui.rank_grid import grid_text
from meshtop.tui.state import DashboardState
from tests.bench.tui_frames import SyntheticSource, encoded

BATCH = 2_000
WIDTH = 186
"""The Grid's cells at 200 columns (the panel less its label)."""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=1024)
    parser.add_argument("--per-node", type=int, default=8)
    parser.add_argument("--calls", type=int, default=15)
    options = parser.parse_args()
    source = SyntheticSource(options.ranks, per_node=options.per_node)
    state = DashboardState(source.description, session=source.session)
    source.warm_up(state)

    def timed(name: str, call: Callable[[], object]) -> None:
        took = []
        for _ in range(options.calls):
            source.session.take(encoded(list(islice(source.job_events(), BATCH))))
            begun = time.perf_counter()
            call()
            took.append((time.perf_counter() - begun) * 1e3)
        print(f"{name:<22} p50 {statistics.median(took):7.2f} ms   worst {max(took):7.2f} ms")

    def figures() -> None:
        with source.session.reading() as fold:
            fold.figures()

    nodes: dict[int, list[int]] = {}
    for view in sorted(state.ranks.values(), key=lambda view: view.rank):
        nodes.setdefault(view.node, []).append(view.rank)
    print(f"{options.ranks} ranks on {len(nodes)} nodes, a batch of {BATCH:,} events folded before each call")
    timed("the run's figures", figures)
    timed("node labels", lambda: [state.host_label(node) for node in nodes])
    timed("attention (step)", lambda: state.attention("step"))
    timed("the Grid's text", lambda: grid_text(state.attention("step"), nodes, state.host_label, WIDTH))


if __name__ == "__main__":
    main()
