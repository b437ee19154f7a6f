"""Run a job to its end: start its launcher, pass on what its ranks and this node's samplers report, watch
for hangs, answer the user's requests, and say how it ended.

The parts live beside this module: what is started and with which environment
(:mod:`meshtop.runner.job.environment`), the launcher's process and how it ended
(:mod:`meshtop.runner.job.process`), the user's requests (:mod:`meshtop.runner.job.control`), the
result types (:mod:`meshtop.runner.results`), and on the head of a job on many nodes, the other
nodes (:class:`meshtop.runner.multinode.fleet.Fleet`; a job on one node has a fleet of no other nodes, which
does nothing).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from meshtop.probes.arrivals import Arrivals
from meshtop.probes.events import RankStarted
from meshtop.probes.stacks import dump_stacks
from meshtop.runner.job.control import JobControl
from meshtop.runner.job.environment import Launch
from meshtop.runner.job.flight import FLIGHT_DIR, FlightTriage
from meshtop.runner.job.hangs import HangWatch
from meshtop.runner.job.process import Job
from meshtop.runner.job.rounds import Rounds
from meshtop.runner.job.supervise import POLL_S, NodeProbes, Supervisor
from meshtop.runner.multinode.fleet import Fleet
from meshtop.runner.rank.until import FinishRequest
from meshtop.runner.results import JobResult

REMOTE_STACKS_S = 15.0
"""On a hang, how long the head waits for the other nodes' stack dumps before it stops the job."""


def run_job(
    launch: Launch,
    *,
    session_dir: Path,
    on_events: Callable[[Arrivals], None] = lambda arrivals: None,
    node_probes: NodeProbes = NodeProbes(),
    control: JobControl | None = None,
    hang_timeout_s: float | None = None,
    fleet: Fleet | None = None,
) -> JobResult:
    """Start ``launch``, pass its events (and the node samplers') to ``on_events``, and wait for the end.

    ``control`` carries requests from another thread: py-spy dumps of ranks,
    delivered as events, and a stop. A ``KeyboardInterrupt`` (Ctrl-C, or
    SIGTERM turned into one by the CLI) or ``control.stop`` stops every rank;
    the result then says ``interrupted``. When no rank makes progress for
    ``hang_timeout_s`` (default: :func:`meshtop.runner.job.hangs.default_timeout_s`;
    ``math.inf``: never), a :class:`HangDetected` report and a stack dump of
    every rank are delivered; then the job is stopped (``failed``) if
    ``control.stop_on_hang``.

    On the head of a job on many nodes, ``fleet`` holds the other nodes: the
    collector listens where they reach it, its address goes into the
    rendezvous store, a node lost stops the job, and the result is the whole
    job's, once every node said how it ended (:mod:`meshtop.runner.multinode.fleet`).
    """
    control = control if control is not None else JobControl()
    fleet = fleet if fleet is not None else Fleet()
    hangs = HangWatch(launch.world_size, timeout_s=hang_timeout_s, quiet_s=launch.quiet_s)
    flight = FlightTriage(session_dir / FLIGHT_DIR, on_one_node=launch.nodes is None)
    job = Job(launch, session_dir, fleet.collector())
    pids: dict[int, int] = {}
    lost: list[int] = []
    rounds = Rounds() if launch.nodes is None or launch.nodes.head else None  # the head numbers the steps
    finishing = FinishRequest(launch.stop_file)

    def watch_ranks(arrivals: Arrivals) -> None:
        if rounds is not None:
            for start in rounds.admit(arrivals):  # the ranks started: an elastic job's say how many they are
                hangs.ranks_started(start.world_size or launch.world_size, restart=start.restart)
                if start.restart:  # torchrun started every rank again: other processes, maybe other nodes
                    pids.clear()
                    fleet.restarted()
        for event in arrivals.events(("rank_started",)):
            assert isinstance(event, RankStarted)
            if fleet.is_other(event.node):  # another node's: its own meshtop samples and dumps it
                fleet.note_ranks(event.node, event.rank)
                continue
            pids[event.rank] = event.pid
            supervisor.processes.watch(event.rank, event.pid)
        arrivals.add(fleet.take_events())
        for dump in arrivals.events(("stack_dump",)):
            fleet.note_stack(dump.rank)  # type: ignore[attr-defined]
        if not lost and (gone := fleet.lost()) is not None:
            lost.append(gone.node)
            control.stop.set()
        elif fleet.failed() is not None:  # its ranks failed: the head's would wait on them
            control.stop.set()
        hangs.observe(arrivals)
        finishing.observe(arrivals)
        if not hangs.reported and not control.stop.is_set():
            # progress again: an earlier report no longer holds, unless the job is being stopped for it (py-spy's
            # failed attach to a SIGSTOPped rank can let it run on: the job still hung)
            control.hang = None
        if (hang := hangs.check()) is not None:
            stacks = dump_stacks(pids)
            fleet.ask_stacks()
            verdict = flight.triage(pids)
            hang = replace(hang, report="\n".join([hang.report, *verdict.lines()]))  # beside meshtop's own
            control.hang = hang
            arrivals.add([hang, *stacks, verdict])
            if control.stop_on_hang:
                control.stop.set()
        elif (wanted := control.take_stack_request(pids)) is not None:
            arrivals.add(dump_stacks(wanted))
            fleet.ask_stacks()  # the other nodes dump their own ranks (every one of them)
            arrivals.add([flight.triage(pids, hung=control.hang is not None)])

    def finish_asked() -> bool:
        if control.finish.is_set() and finishing.stop_now():
            control.stop.set()
        return True

    here = launch.nodes.rank if launch.nodes is not None else 0
    supervisor = Supervisor(job.collector, node_probes, on_events=on_events, examine=watch_ranks, node=here)
    supervisor.start_sampling()
    job.start()
    fleet.publish(job.collector, going=job.poll)
    interrupted = False
    try:
        supervisor.follow(job.poll, control.stop, go_on=finish_asked)
        interrupted = control.stop.is_set() and job.poll()  # a job that ended by itself is not interrupted
        if control.stacks_asked and job.poll():  # asked with the stop: dump the ranks before they are stopped
            supervisor.send_batch()
        if control.hang is not None and not lost:  # the other nodes' dumps, first
            deadline = time.monotonic() + REMOTE_STACKS_S
            while not fleet.stacks_in() and time.monotonic() < deadline:
                control.stop.wait(POLL_S)
                supervisor.send_batch()
    except KeyboardInterrupt:
        interrupted = True
    finally:
        if interrupted or control.stop.is_set():  # the other nodes stop theirs too
            failed_elsewhere = lost or control.hang is not None or fleet.failed() is not None
            fleet.stop("failed" if failed_elsewhere else "interrupted")
        job.stop()
        supervisor.stop_sampling()
    if job.result(interrupted=False).status == "failed":
        fleet.stop("failed")
    fleet.settle()
    supervisor.last_batch()
    hung = control.hang if interrupted and control.hang is not None else None
    local_ranks = set(pids) if launch.nodes is not None else None
    interrupted_here = interrupted and hung is None and not lost and fleet.failed() is None
    result = job.result(interrupted=interrupted_here, hang=hung, ranks=local_ranks)
    result = fleet.merge(result, {rank.rank for rank in result.ranks}, hangs.world_size)
    supervisor.say_ended(result)
    return result
