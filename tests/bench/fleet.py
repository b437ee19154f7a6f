"""A simulated fleet: 1024 ranks on 16 nodes streaming through real node relays into one head.

``python -m tests.bench.fleet [--ranks 1024] [--nodes 16] [--rate 1030000] [--seconds 20] [--json PATH]``

Each node is a process of its own running meshtop's :class:`meshtop.runner.session.relay.Relay` (the
node's side of a multi-node job: its framing, its clock exchanges and pings, its queue), fed on schedule
with its ranks' steps: every rank sends, each step, the event mix of a dp x tp2 x pp2 1F1B job with 8
microbatches (:class:`tests.bench.tui_frames.SyntheticSource`: 26 collectives, 16 stage actions, a step and
a memory snapshot), written as workers write them (JSON lines), a block a kind and node step, as the node's
collector hands its ranks' blocks on (:class:`NodeTemplate`); the node's own samplers add a process sample
of each rank at 2 Hz and a GPU sample of each GPU at 10 Hz, as the events its meshtop makes. One rank is a
straggler and node 5 is slow (its ranks' steps 1.5x as long), as in the rank grid's tests. The ranks'
lines of the whole run are made before it starts (:func:`node_steps`; about 290 MB a node at a million
events a second for 25 s): making them is the ranks' work, on their own cores on a real node, and on this
machine it took 0.38 us an event of the two cores the measured node relays and head share. The rank ->
node hop (a rank's socket into its node's collector) is left out too: it is the head collector's code,
whose rate the ``ingest`` row measures.

The head is this process: meshtop's head collector and node fleet (:class:`meshtop.runner.multinode.fleet.Fleet`),
a session loop that drains the collector every 0.2 s into a recording on disk and the session's fold, as
``meshtop run`` does, and a screen thread that takes the screen's batches at 8 Hz into a
:class:`meshtop.tui.state.DashboardState` (no terminal: the ``tui`` row measures drawing).

Measured over ``--seconds`` after a warm-up: the events per second the head took in; the dashboard's lag
(each screen tick: the time since the newest step it shows was produced, less a step), p99 and max; and,
once the nodes have sent everything and the recording is closed, the events in it against the events the
nodes sent (nothing lost: equal). The node processes share the machine's cores with the head.
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing
import os
import statistics
import sys
import tempfile
import threading
import time
from collections import deque
from dataclasses import dataclass
from itertools import islice
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from meshtop.probes.arrivals import Arrivals, EncodedEvents, encode_lines
from meshtop.probes.events import DURATION_FIELDS, EVENT_TYPES, Event, ProcessSample, clock_fields
from meshtop.probes.kinds import PROGRESS_KINDS
from meshtop.recordings.folding import FoldThread
from meshtop.recordings.manifest import start_manifest, write_manifest
from meshtop.recordings.reader import open_recording
from meshtop.recordings.recorder import Ending, SessionRecorder
from meshtop.recordings.replay import in_kind_order
from meshtop.recordings.session_fold import Folded, SessionFold
from meshtop.runner.job.allocator import keep_buffer_pages
from meshtop.runner.job.control import JobControl
from meshtop.runner.multinode.fleet import Fleet
from meshtop.runner.multinode.nodes import HeadAddress, Nodes
from meshtop.runner.session.relay import Relay
from meshtop.tui.app import GC_EVERY_S, WHOLE_GC_EVERY_S
from meshtop.tui.gc_pacing import GcPacer
from meshtop.tui.sources import ScreenBacklog, screen_batches
from meshtop.tui.state import DashboardState
from tests.bench.figures import Row, Spread, Target, quantile
from tests.bench.tui_frames import SyntheticSource
from tests.kit.events import gpu_sample

RANKS, NODES = 1024, 16
RATE = 1_030_000.0
"""Offered: the goal (:data:`TARGET`) and 3 %. A head that keeps up takes what it is offered, measured within
about 1 % (its lag's jitter at the window's ends: 0.2-0.3 s of 20 s), so offering the goal itself would meet
it by a coin's toss (994,280 and 1,002,978 a second in two runs that kept up, lag p99 0.65 and 0.47 s)."""
SECONDS = 20.0
WARMUP_S = 5.0
POLL_S = 0.2
"""The session loop's drain interval (:data:`meshtop.runner.job.launch.POLL_S`)."""
SCREEN_HZ = 8.0
STEP_KINDS = ("stage_action", "collective", "step", "memory")
PER_RANK_STEP = 44
DRAIN_S = 300
"""How long after the run the head may take to take in what the nodes sent, before what is still on its way
counts as lost (a head far behind, under a profiler, takes minutes)."""
PROCESS_HZ, GPU_HZ = 2.0, 10.0
SLOW_NODE, SLOW = 5, 1.5
MAKE_S_A_MILLION = 1.0
"""Seconds the nodes have before the run to make their ranks' lines (:func:`node_steps`), a second of run a
million events a second: about twice what 16 nodes took on the 2-core VM (25 s of CPU for a 25 s run)."""
LAG_TARGET_S = 1.0
TARGET = Target(low=1_000_000.0)


@dataclass(frozen=True, slots=True)
class Template:
    """One kind's lines of one rank's step, with ``%d`` where the step and each time go."""

    kind: str
    format: bytes
    count: int
    deltas: tuple[int | None, ...]
    """Per ``%d``: ``None`` for the step number, else the time's distance from the step's start (ns)."""

    def fill(self, step: int, start_ns: int, stretch: float) -> bytes:
        return self.format % tuple(step if d is None else start_ns + int(d * stretch) for d in self.deltas)


def templates(events: list[Event], start_ns: int) -> list[Template]:
    """``events`` (one rank's step) as a template a kind."""
    by_kind: dict[str, list[Event]] = {}
    for event in events:
        by_kind.setdefault(event.kind, []).append(event)
    out = []
    for kind, group in by_kind.items():
        times, tuples, _ = clock_fields(EVENT_TYPES[kind])
        deltas: list[int | None] = []
        lines = []
        for line in encode_lines(group).decode().splitlines():
            record = json.loads(line)
            for name in record:
                if name == "step" and record[name] is not None:
                    deltas.append(None)
                    record[name] = "\x00"
                elif name in times and name not in DURATION_FIELDS and record[name] is not None:
                    deltas.append(record[name] - start_ns)
                    record[name] = "\x00"
                elif name in tuples:  # a step's phase windows
                    deltas.extend(value - start_ns for value in record[name])
                    record[name] = ["\x00"] * len(record[name])
            text = json.dumps(record, separators=(",", ":")).replace("%", "%%").replace('"\\u0000"', "%d")
            lines.append(text + "\n")
        out.append(Template(kind, "".join(lines).encode(), len(group), tuple(deltas)))
    return out


@dataclass(frozen=True, slots=True)
class NodeTemplate:
    """One kind's lines of every rank of a node for one step: the ranks' :class:`Template` joined, filled in one
    formatting (the step number and times as one array: the simulation's cost per event, which shares the
    machine's cores with the head, is about half of filling each rank's apart: 0.55 against 0.96 us)."""

    kind: str
    format: bytes
    count: int
    is_step: npt.NDArray[np.bool_]
    deltas: npt.NDArray[np.float64]

    @classmethod
    def of(cls, templates: list[Template]) -> NodeTemplate:
        deltas = [delta for template in templates for delta in template.deltas]
        return cls(
            templates[0].kind,
            b"".join(template.format for template in templates),
            sum(template.count for template in templates),
            np.array([delta is None for delta in deltas], dtype=bool),
            np.array([0 if delta is None else delta for delta in deltas], dtype=np.float64),
        )

    def fill(self, step: int, start_ns: int, stretch: float) -> bytes:
        values = start_ns + (self.deltas * stretch).astype(np.int64)
        values[self.is_step] = step
        return self.format % tuple(values.tolist())


def node_templates(rank_templates: dict[int, list[Template]]) -> list[NodeTemplate]:
    """The node's ranks' templates as one a kind, kinds in the order the ranks' came (a step after its work)."""
    by_kind: dict[str, list[Template]] = {}
    for kinds in rank_templates.values():
        for template in kinds:
            by_kind.setdefault(template.kind, []).append(template)
    return [NodeTemplate.of(listed) for listed in by_kind.values()]


def node_kinds(node: int, ranks: int, per_node: int) -> list[NodeTemplate]:
    """Node ``node``'s (1-based) templates of a fleet of ``ranks`` ranks, ``per_node`` a node: its ranks' step
    1 of the synthetic job."""
    mine = set(range((node - 1) * per_node, node * per_node))
    source = SyntheticSource(ranks, warm_events=0, per_node=per_node)
    first_step: dict[int, list[Event]] = {rank: [] for rank in sorted(mine)}
    start = None
    for event in islice(source.job_events(), ranks, None):
        step = getattr(event, "step", None)
        if step == 2:
            break
        rank = getattr(event, "rank", None)
        if step == 1 and event.kind in STEP_KINDS and rank in mine:
            first_step[rank].append(event)
            if event.kind == "step":
                start = event.start_ns  # type: ignore[attr-defined]
    assert start is not None
    return node_templates({rank: templates(events, start) for rank, events in first_step.items()})


def node_main(
    node: int, ranks: int, per_node: int, head: tuple[str, int, str], step_s: float, go: Any, report: Any
) -> None:
    """Node ``node`` (1-based) of a fleet of ``ranks`` ranks: once its relay is up, says so and waits for ``go``
    (t0 and the end, wall seconds); makes every step's lines of its ranks before t0 (:func:`node_steps`) and
    says so; then feeds its relay the steps on schedule and puts (node, events sent, steps sent, events its
    relay dropped, its CPU and kernel seconds over the run, why it lost the head or ``None``)."""
    keep_buffer_pages()  # as the node's meshtop does
    mine = list(range((node - 1) * per_node, node * per_node))
    kinds = node_kinds(node, ranks, per_node)
    address = HeadAddress(address=(head[0], head[1]), token=head[2], host=f"node{node}")
    relay = Relay(
        Nodes(count=NODES + 1, rank=node, endpoint="127.0.0.1:1", run_id="bench"),
        JobControl(),
        find=lambda nodes, going: address,
    ).start()
    report.put(("ready", node))
    t0, until = go.get()
    made = time.process_time()
    steps = node_steps(kinds, mine, t0, until, step_s, stretch=SLOW if node == SLOW_NODE else 1.0)
    report.put(("made", node, time.process_time() - made))
    ready_user, ready_sys = os.times()[:2]
    sent = step = 0
    for items, count in steps:
        if (wait := t0 + step * step_s - time.time()) > 0:
            time.sleep(wait)
        if time.time() >= until:
            break
        relay.forward(Arrivals(items))
        sent += count
        step += 1
    relay.finish(None)
    user, system = os.times()[:2]
    report.put(
        (node, sent, step, relay.dropped, user - ready_user + system - ready_sys, system - ready_sys, relay.head_lost)
    )


def node_steps(
    kinds: list[NodeTemplate], mine: list[int], t0: float, until: float, step_s: float, *, stretch: float
) -> list[tuple[list[Any], int]]:
    """Each step's items from ``t0`` to ``until`` (a block a kind of all the node's ranks, as its collector hands
    them on, and the node's own samples) and their events, made before the run: making them is the ranks'
    work (0.38 us an event, on the ranks' own cores on a real node), which on this machine would share its two
    cores with the node's meshtop and the head that the benchmark measures."""
    per_node = len(mine)
    steps: list[tuple[list[Any], int]] = []
    process_due = gpu_due = 0.0
    next_process = next_gpu = 0
    for step in range(math.ceil((until - t0) / step_s)):
        start_ns = int((t0 + step * step_s) * 1e9)
        items: list[Any] = [
            EncodedEvents(template.kind, mine[0], template.fill(step, start_ns, stretch), template.count)
            for template in kinds
        ]
        count = sum(template.count for template in kinds)
        process_due += per_node * PROCESS_HZ * step_s
        gpu_due += per_node * GPU_HZ * step_s
        while process_due >= 1:  # the node's samplers: its meshtop's own events
            process_due -= 1
            rank = mine[next_process % per_node]
            next_process += 1
            items.append(
                ProcessSample(
                    rank=rank, pid=10_000 + rank, wall_ns=start_ns, cpu_pct=99.0, rss_bytes=8 << 30, threads=40
                )
            )
            count += 1
        while gpu_due >= 1:
            gpu_due -= 1
            items.append(gpu_sample(gpu=next_gpu % per_node, wall_ns=start_ns, utilization_pct=90.0))
            next_gpu += 1
            count += 1
        steps.append((items, count))
    return steps


def measure(
    *, ranks: int = RANKS, nodes: int = NODES, rate: float = RATE, seconds: float = SECONDS, headless: bool = False
) -> dict[str, Any]:
    """One run; ``headless``: as ``meshtop record`` (the session folds the progress kinds, no screen)."""
    keep_buffer_pages()  # as the head's meshtop does
    per_node = ranks // nodes
    samples_per_s = ranks * (PROCESS_HZ + GPU_HZ)
    step_s = ranks * PER_RANK_STEP / max(1.0, rate - samples_per_s)
    description = SyntheticSource(ranks, warm_events=0, per_node=per_node).description
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp) / "fleet"
        directory.mkdir()
        manifest = start_manifest(description, command_line=["bench", "fleet"])
        write_manifest(directory, manifest)
        fleet = Fleet(Nodes(count=nodes + 1, rank=0, endpoint="127.0.0.1:1", run_id="bench"))
        collector = fleet.collector().start()
        session = (  # as meshtop record and run make theirs
            SessionFold(description, kinds=PROGRESS_KINDS) if headless else SessionFold(description)
        )
        recorder = SessionRecorder(session, directory, manifest)
        backlog = ScreenBacklog()
        state = DashboardState(description, session=session)
        stop = threading.Event()
        taken: deque[tuple[float, int]] = deque()
        lags: list[float] = []
        lag_times: list[float] = []
        busy: list[tuple[float, int, int]] = []
        t0 = until = math.inf  # known once the nodes are up

        def to_screen(arrivals: Arrivals, folded: Folded) -> None:
            if not headless:
                backlog.put(screen_batches(arrivals, folded.tables, left_out=folded.left_out), folded.steps)

        folding = FoldThread(recorder, to_screen)  # as run_session: the fold on its own thread

        def session_loop() -> None:
            while not stop.is_set() or collector.queued:
                items = collector.drain()
                arrivals = Arrivals(items)
                arrivals.add(fleet.take_events())
                began = time.perf_counter()
                recorder.write(arrivals)
                folding.put(arrivals)
                busy.append((time.perf_counter() - began, arrivals.count, len(items)))
                taken.append((time.time(), arrivals.count))
                stop.wait(POLL_S)

        def screen_loop() -> None:
            while not stop.is_set():
                if headless:  # the console's progress line: the session's fold
                    now = time.time()
                    if t0 + WARMUP_S <= now <= until and session.steps_completed:
                        lags.append(now - (t0 + session.steps_completed * step_s))
                        lag_times.append(now)
                    stop.wait(1 / SCREEN_HZ)
                    continue
                began = time.perf_counter()
                batches, steps = backlog.take_with_steps()
                for kind, table in in_kind_order(batches):
                    state.apply(kind, table)
                state.take_steps(steps)
                if pacer.frame_drawn():  # the dashboard's collections, after its frames
                    pacer.collect(time.perf_counter() - began)
                now = time.time()
                if t0 + WARMUP_S <= now <= until and state.steps_done:
                    lags.append(now - (t0 + state.steps_done * step_s))  # its end was produced a step later
                    lag_times.append(now)
                stop.wait(1 / SCREEN_HZ)

        # As `meshtop run`'s app: what exists now frozen, full collections only after frames (a full collection
        # of a thousand ranks' live objects at an allocation's whim took 30 % of the fold's time holding the lock)
        pacer = GcPacer(
            every_frames=max(1, round(SCREEN_HZ * GC_EVERY_S)), reclaim_every=round(WHOLE_GC_EVERY_S / GC_EVERY_S)
        )
        if not headless:
            pacer.start()
        threads = [
            threading.Thread(target=session_loop, daemon=True),
            threading.Thread(target=screen_loop, daemon=True),
        ]
        for thread in threads:
            thread.start()
        context = multiprocessing.get_context("spawn")
        report, start = context.Queue(), context.Queue()
        head = (*collector.address, collector.token)
        workers = [
            context.Process(target=node_main, args=(node, ranks, per_node, head, step_s, start, report))
            for node in range(1, nodes + 1)
        ]
        for worker in workers:
            worker.start()
        for _ in workers:
            report.get(timeout=300)
        make_s = 5.0 + MAKE_S_A_MILLION * (WARMUP_S + seconds) * rate / 1e6
        t0 = time.time() + make_s
        until = t0 + WARMUP_S + seconds
        for _ in workers:
            start.put((t0, until))
        made = [report.get(timeout=make_s + 60) for _ in workers]
        if (late := time.time() - t0) > 0:
            raise RuntimeError(f"the nodes made their lines {late:.1f} s after the start: raise MAKE_S_A_MILLION")
        time.sleep(max(0.0, t0 - time.time()))
        head_cpu_at_start = sum(os.times()[:2])
        head_sys_at_start = os.times()[1]
        results = [report.get(timeout=seconds + WARMUP_S + 120) for _ in workers]
        head_cpu_live = sum(os.times()[:2]) - head_cpu_at_start  # the run's, before its recording is closed
        head_sys_live = os.times()[1] - head_sys_at_start
        sent = sum(result[1] for result in results)
        deadline = time.monotonic() + DRAIN_S  # what the relays sent is on its way: the head takes it all first
        while collector.counts.events < sent and time.monotonic() < deadline:
            time.sleep(POLL_S)
        undrained = max(0, sent - collector.counts.events)
        for worker in workers:
            worker.join(30)
        time.sleep(2 * POLL_S)
        stop.set()
        for thread in threads:
            thread.join(60)
        pacer.stop()
        collector.stop()
        folding.close()
        recorder.close(Ending(status="completed", duration_s=until - t0))
        recording = open_recording(directory)
        recorded = sum(len(recording.arrow(kind)) for kind in (*STEP_KINDS, "process", "gpu"))
        window = [(t, n) for t, n in taken if t0 + WARMUP_S <= t <= until]
        dropped = sum(result[3] for result in results)
        steps = min(result[2] for result in results)
        node_cpu = sum(result[4] for result in results)
        node_sys = sum(result[5] for result in results)
        head_lost = sum(result[6] is not None for result in results)
        head_cpu = sum(os.times()[:2]) - head_cpu_at_start
    span = (window[-1][0] - window[0][0]) if len(window) > 1 else seconds
    return {
        "ranks": ranks,
        "nodes": nodes,
        "offered_per_s": rate,
        "head_per_s": sum(n for _, n in window[1:]) / span if span > 0 else 0.0,
        "sent": sent,
        "recorded": recorded,
        "not_taken_in_drain": undrained,
        "dropped_at_nodes": dropped,
        "nodes_that_lost_the_head": head_lost,
        "lag_p50_s": statistics.median(lags) if lags else None,
        "lag_p99_s": quantile(lags, 0.99) if lags else None,
        "lag_max_s": max(lags) if lags else None,
        "lag_max_by_5_s": [  # where in the run the lag grew
            round(
                max((lag for lag, at in zip(lags, lag_times, strict=True) if start <= at - t0 < start + 5), default=0),
                2,
            )
            for start in range(int(WARMUP_S), int(WARMUP_S + seconds), 5)
        ],
        "steps_sent": steps,
        "steps_shown": session.steps_completed if headless else state.steps_done,
        "skipped_for_screen": backlog.skipped,
        "left_out_of_live_fold": session.left_out.total(),
        "refused_queue_full": collector.counts.queue_full,
        "node_cpu_s": node_cpu,
        "node_make_cpu_s": sum(result[2] for result in made),
        "node_sys_s": node_sys,
        "head_cpu_s": head_cpu,
        "head_cpu_live_s": head_cpu_live,
        "head_sys_live_s": head_sys_live,
        "wall_s": WARMUP_S + seconds,
        "take_s": sum(b for b, _, _ in busy),
        "take_max_s": max((b for b, _, _ in busy), default=0.0),
        "take_max_events": max(busy, default=(0.0, 0, 0))[1],
        "take_events": sum(n for _, n, _ in busy),
        "take_items": sum(i for _, _, i in busy),
        "takes": len(busy),
    }


def rows(
    *, ranks: int = RANKS, nodes: int = NODES, rate: float = RATE, seconds: float = SECONDS, headless: bool = False
) -> list[Row]:
    got = measure(ranks=ranks, nodes=nodes, rate=rate, seconds=seconds, headless=headless)
    lost = got["sent"] - got["recorded"]
    current = got["lag_p99_s"] is not None and got["lag_p99_s"] <= LAG_TARGET_S
    value = got["head_per_s"] if lost == 0 and current else 0.0
    note = (
        f"offered {rate:,.0f}/s; recorded {got['recorded']:,} of {got['sent']:,} sent ({lost:,} lost"
        + (f", {got['not_taken_in_drain']:,} of them still on their way {DRAIN_S} s after" if lost else "")
        + (f", {got['nodes_that_lost_the_head']} nodes lost the head" if got["nodes_that_lost_the_head"] else "")
        + "); dashboard "
        f"lag p99 {got['lag_p99_s'] or float('nan'):.2f} s (max {got['lag_max_s'] or float('nan'):.2f}); "
        f"{got['skipped_for_screen']:,} skipped for the screen"
    )
    return [
        Row(
            "fleet",
            f"{ranks} ranks, {nodes} nodes" + (", headless" if headless else ""),
            value,
            "events/s",
            Spread(1, got["head_per_s"], got["head_per_s"]),
            TARGET,
            note=note,
            details=got,
        )
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=RANKS)
    parser.add_argument("--nodes", type=int, default=NODES)
    parser.add_argument("--rate", type=float, default=RATE)
    parser.add_argument("--seconds", type=float, default=SECONDS)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--headless", action="store_true", help="the head as `meshtop record`: no dashboard")
    args = parser.parse_args(argv)
    got = rows(ranks=args.ranks, nodes=args.nodes, rate=args.rate, seconds=args.seconds, headless=args.headless)
    for row in got:
        print(json.dumps(row.to_json()))
    if args.json is not None:
        args.json.write_text(json.dumps([row.to_json() for row in got], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
