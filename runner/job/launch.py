"""Start a run under torchrun in a child process, follow it, and stop it cleanly.

The child (:mod:`meshtop.runner.job.agent`) runs in its own session, so a Ctrl-C in the
terminal reaches meshtop alone, which then stops the whole job: SIGTERM to the
launcher (torchrun forwards it to every rank), and after a grace period
SIGKILL to every process of the job that meshtop has seen, so none is left
behind even if the launcher itself is gone.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import queue
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import psutil

from meshtop.probes.arrivals import Arrivals
from meshtop.probes.collector import Collector
from meshtop.probes.events import (
    Event,
    EventsDropped,
    HangDetected,
    JobEnded,
    RankExited,
    RankStarted,
    on_node,
)
from meshtop.probes.native import NATIVE_ENV
from meshtop.probes.samplers import (
    DEFAULT_GPU_HZ,
    DEFAULT_PROCESS_HZ,
    GpuSampler,
    ProcessSampler,
)
from meshtop.probes.stacks import dump_stacks
from meshtop.probes.wire import ADDRESS_ENV, NCCL_TIMING_ENV, NODE_ENV, TOKEN_ENV
from meshtop.runner.job.hangs import HangWatch
from meshtop.runner.job.rounds import Rounds
from meshtop.runner.load import longest_gap_s
from meshtop.runner.plan import ResolvedRun
from meshtop.runner.rank.until import STOP_ENV, STOP_NAME, FinishRequest

if TYPE_CHECKING:
    from meshtop.runner.multinode.fleet import Fleet
    from meshtop.runner.multinode.nodes import Nodes

STOP_GRACE_S = 15.0
REMOTE_STACKS_S = 15.0
"""On a hang, how long the head waits for the other nodes' stack dumps before it stops the job."""
POLL_S = 0.2


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeProbes:
    """The samplers meshtop runs beside the job, and their rates."""

    gpu_hz: float = DEFAULT_GPU_HZ
    process_hz: float = DEFAULT_PROCESS_HZ


@dataclass(frozen=True, slots=True, kw_only=True)
class RankExit:
    """How one rank ended."""

    rank: int
    exit_code: int | None
    """The process's exit code (negative for a signal); ``None`` if it was stopped by the launcher."""
    signal: str | None
    error: str | None
    """The rank's last error line, or why it was stopped."""


@dataclass(frozen=True, slots=True, kw_only=True)
class JobResult:
    """How the whole job ended."""

    status: str
    """``completed``, ``failed`` or ``interrupted``."""
    ranks: tuple[RankExit, ...]
    duration_s: float
    log_path: Path

    root_cause: int | None = None
    """The rank whose failure brought the job down, when one did."""
    hang: str | None = None
    """The hang report, when meshtop stopped the job because no rank made progress."""
    node_lost: str | None = None
    """Which node of a multi-node job was lost, its ranks and why, when that ended the job."""
    failure_times: dict[int, float] = field(default_factory=dict)
    """When each failed rank failed (torchrun's timestamp, seconds), to find the first across nodes."""

    @property
    def failed(self) -> tuple[RankExit, ...]:
        """Ranks that did not exit 0 by themselves (the root cause first)."""
        failed = [r for r in self.ranks if r.exit_code not in (0, None)]
        return tuple(sorted(failed, key=lambda r: (r.rank != self.root_cause, r.rank)))


@dataclass(frozen=True, slots=True, kw_only=True)
class Launch:
    """What :class:`Job` starts: torchrun's arguments and what the ranks' environment adds.

    The built-in runner's is :func:`builtin_launch`; a user's script's is
    :func:`meshtop.runner.script.command.script_launch`.
    """

    launcher_args: tuple[str, ...]
    """torchrun's arguments, the program and its arguments included."""
    world_size: int
    native_kernel: bool
    """Time gloo's collectives with the C++ kernel (the launcher builds it); off for nccl and unhooked runs."""
    quiet_s: float = 0.0
    """The longest quiet time the work allows (an inference load's longest gap): hang detection waits longer."""
    env: dict[str, str] = field(default_factory=dict)
    """Set in the ranks' environment (over the user's)."""
    pythonpath: tuple[str, ...] = ()
    """Put first on the ranks' ``PYTHONPATH``."""
    nodes: Nodes | None = None
    """The job's nodes, when it runs on many; ``world_size`` counts the ranks of all of them."""
    stop_file: Path | None = None
    """A run until stopped (:mod:`meshtop.runner.rank.until`): the file that asks its ranks to end it."""

    @property
    def local_world_size(self) -> int:
        """The ranks this node runs."""
        return self.world_size // (self.nodes.count if self.nodes is not None else 1)


def builtin_launch(run: ResolvedRun, session_dir: Path, nodes: Nodes | None = None) -> Launch:
    """The built-in runner's launch: ``meshtop.runner.rank.worker`` on every rank, reading the run from ``run.json``; on
    many ``nodes``, this node's share of the ranks, joining torchrun's c10d rendezvous."""
    session_dir.mkdir(parents=True, exist_ok=True)
    run_path = session_dir / "run.json"
    run_path.write_text(json.dumps(run.to_json(), indent=2))
    where = (
        ("--standalone", "--nnodes=1", f"--nproc-per-node={run.world_size}")
        if nodes is None
        else nodes.launcher_args(run.world_size // nodes.count)
    )
    stop_file = session_dir / STOP_NAME if run.steps is None and run.mode == "train" else None
    if stop_file is not None:
        stop_file.unlink(missing_ok=True)
    return Launch(
        launcher_args=(*where, "--max-restarts=0", "-m", "meshtop.runner.rank.worker", str(run_path)),
        world_size=run.world_size,
        native_kernel=run.device == "cpu" and run.instrument,
        quiet_s=longest_gap_s(run.load) if run.load is not None else 0.0,
        nodes=nodes,
        env={STOP_ENV: str(stop_file)} if stop_file is not None else {},
        stop_file=stop_file,
    )


PHASE_NAME = "phase.txt"
"""In the session folder, beside ``status.json``: what the launcher (:mod:`meshtop.runner.job.agent`) does before the
ranks report, in words (the dashboard shows it while it waits)."""
ATTACHED_ENV = "MESHTOP_ATTACHED_PID"
"""Set by the bootstrap in a process it attached to (``runner/script/bootstrap/sitecustomize.py``)."""


def rank_environment(launch: Launch) -> dict[str, str]:
    """The environment of the launcher and its ranks, less the collector's address and token.

    Without ``RANK`` (torchrun gives each rank its own: one exported by a cluster's pod would make the
    launcher look like a rank to the bootstrap) and without a parent's attachment mark.
    """
    env = {key: value for key, value in os.environ.items() if key not in ("RANK", ATTACHED_ENV)}
    env.setdefault(NCCL_TIMING_ENV, "1")  # nccl times each operation with CUDA events
    if not launch.native_kernel:
        env[NATIVE_ENV] = "off"  # the C++ collective probe times gloo only; the agent builds it otherwise
    env["PYTHONUNBUFFERED"] = "1"
    if launch.nodes is not None:
        env[NODE_ENV] = str(launch.nodes.rank)
    # meshtop itself is found where it is installed, never through a folder on the path: a project root there
    # would lend a user's script meshtop's folders under generic names (runner, probes, tui).
    env["PYTHONPATH"] = os.pathsep.join(filter(None, (*launch.pythonpath, env.get("PYTHONPATH"))))
    if "OMP_NUM_THREADS" not in env:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
        env["OMP_NUM_THREADS"] = str(max(1, cores // launch.local_world_size))
    env.update(launch.env)
    return env


def worker_environment(launch: Launch, collector: Collector) -> dict[str, str]:
    """The environment of the launcher and its ranks."""
    env = rank_environment(launch)
    host, port = collector.address
    env[ADDRESS_ENV] = f"{host}:{port}"
    env[TOKEN_ENV] = collector.token
    return env


class Job:
    """One launched job: its launcher process, the ranks it spawned, their event files."""

    def __init__(self, launch: Launch, session_dir: Path, collector: Collector | None = None) -> None:
        self.launch = launch
        self.session_dir = session_dir
        self.log_path = session_dir / "launcher.log"
        self._status_path = session_dir / "status.json"
        self.collector = collector or Collector()
        self._collector_drops = 0
        self._seen: dict[int, psutil.Process] = {}
        self._process: subprocess.Popen[bytes] | None = None
        self._started = 0.0

    def start(self) -> None:
        self.session_dir.mkdir(parents=True, exist_ok=True)
        self.collector.start()
        command = [sys.executable, "-m", "meshtop.runner.job.agent", str(self._status_path), *self.launch.launcher_args]
        with self.log_path.open("ab") as log:
            self._process = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=worker_environment(self.launch, self.collector),
                start_new_session=True,
            )
        self._started = time.monotonic()

    def poll(self) -> bool:
        """Whether the launcher still runs; also notes every process of the job seen so far."""
        assert self._process is not None, "start() first"
        try:
            for child in psutil.Process(self._process.pid).children(recursive=True):
                self._seen.setdefault(child.pid, child)
        except psutil.NoSuchProcess:
            pass
        return self._process.poll() is None

    def read_events(self) -> Arrivals:
        """What the ranks sent since the last call, and a count of any events the collector had to drop."""
        arrivals = Arrivals(self.collector.drain())
        full = self.collector.counts.queue_full
        if full != self._collector_drops:
            arrivals.add(
                [
                    EventsDropped(
                        wall_ns=time.time_ns(), rank=None, where="collector", count=full - self._collector_drops
                    )
                ]
            )
            self._collector_drops = full
        return arrivals

    def stop(self, grace_s: float = STOP_GRACE_S) -> None:
        """SIGTERM the launcher (which stops the ranks), then SIGKILL whatever is left."""
        assert self._process is not None, "start() first"
        self.poll()
        if self._process.poll() is None:
            self._process.send_signal(signal.SIGTERM)
            try:
                self._process.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
        self.reap()

    def reap(self) -> None:
        """Kill any process of the job that outlived the launcher."""
        alive = [p for p in self._seen.values() if _is_running(p)]
        for process in alive:
            _signal(process, signal.SIGTERM)
        _, alive = psutil.wait_procs(alive, timeout=3.0)
        for process in alive:
            _signal(process, signal.SIGKILL)
        psutil.wait_procs(alive, timeout=3.0)

    def result(
        self, *, interrupted: bool, hang: HangDetected | None = None, ranks: Iterable[int] | None = None
    ) -> JobResult:
        """How the job ended, for ``ranks`` (default: every rank; on many nodes, this node's)."""
        assert self._process is not None, "start() first"
        duration = time.monotonic() - self._started
        try:
            status = json.loads(self._status_path.read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            status = None
        failures = status["ranks"] if status is not None else {}
        # on many nodes: the ranks that reported, and those that failed before they could (torchrun names them)
        world = (
            sorted(set(ranks) | {int(rank) for rank in failures})
            if ranks is not None
            else range(self.launch.world_size)
        )
        if hang is not None:
            why = f"stopped: no rank made progress for {hang.silent_s:.0f} s (hang)"
            exits = tuple(RankExit(rank=r, exit_code=None, signal=None, error=why) for r in world)
            return JobResult(
                status="failed", ranks=exits, duration_s=duration, log_path=self.log_path, hang=hang.report
            )
        if interrupted or (status is not None and status["status"] == "interrupted"):
            exits = tuple(RankExit(rank=r, exit_code=None, signal=None, error="stopped on request") for r in world)
            return JobResult(status="interrupted", ranks=exits, duration_s=duration, log_path=self.log_path)
        if status is not None and status["status"] == "completed":
            exits = tuple(RankExit(rank=r, exit_code=0, signal=None, error=None) for r in world)
            return JobResult(status="completed", ranks=exits, duration_s=duration, log_path=self.log_path)
        first = root_cause(failures)
        why = (
            f"stopped after rank {first} failed"
            if first is not None
            else (f"launcher exited with code {self._process.returncode} before reporting")
        )
        exits = tuple(
            RankExit(
                rank=r,
                exit_code=failures[str(r)]["exit_code"],
                signal=failures[str(r)]["signal"],
                error=failures[str(r)]["error"],
            )
            if str(r) in failures
            else RankExit(rank=r, exit_code=None, signal=None, error=why)
            for r in world
        )
        return JobResult(
            status="failed",
            ranks=exits,
            duration_s=duration,
            log_path=self.log_path,
            root_cause=first,
            failure_times={int(rank): float(failure.get("timestamp") or 0) for rank, failure in failures.items()},
        )


OWN_DEATHS = frozenset({"SIGKILL", "SIGSEGV", "SIGBUS", "SIGILL", "SIGFPE"})
"""Signals that end a rank from outside or for its own fault, never because a peer failed (SIGABRT can: an
uncaught error of a communication thread aborts the process)."""
PEER_GONE = re.compile(
    r"(closed|reset) by peer|broken pipe|remote process exited|communicator was aborted|"
    r"caused by a remote worker",
    re.IGNORECASE,
)
"""What gloo and nccl raise in a rank whose peer went away: the effect of another rank's failure (gloo's
transport errors end in "This is typically caused by a remote worker crashing", or "hanging")."""


def root_cause(failures: dict[str, dict[str, object]]) -> int | None:
    """The first rank to fail by itself; ranks the launcher then stopped with SIGTERM come last.

    torchrun's timestamps are whole seconds (compared as such: another node's carry a fraction, its clock
    offset), and each launcher notices a death in its own time, so within one job's failure the effects are
    told from the cause first: a rank killed from outside or by its own fault (:data:`OWN_DEATHS`) comes
    first, and a rank whose error says a peer went away (:data:`PEER_GONE`) comes after every other."""

    def order(rank: str) -> tuple[bool, bool, bool, float, int]:
        failure = failures[rank]
        stopped = failure.get("signal") == "SIGTERM"
        died = failure.get("signal") in OWN_DEATHS
        peer_gone = PEER_GONE.search(str(failure.get("error") or "")) is not None
        seconds = math.floor(float(failure.get("timestamp") or 0))  # type: ignore[arg-type]
        return stopped, not died, peer_gone, seconds, int(rank)

    return int(min(failures, key=order)) if failures else None


def _is_running(process: psutil.Process) -> bool:
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _signal(process: psutil.Process, signum: int) -> None:
    with contextlib.suppress(psutil.NoSuchProcess):
        process.send_signal(signum)


class JobControl:
    """Requests from the user's side to a running job, safe to make from any thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._stacks: set[int] | None = None
        self._stacks_asked = False
        self.stop = threading.Event()
        """Set to stop every rank; the job then ends ``interrupted`` (``failed`` after a hang report)."""
        self.finish = threading.Event()
        """Set to end a run until stopped after a step, as one with a fixed number of steps ends (it then
        completes; stopped as by ``stop`` where the ranks do not end it in time, or before its first step:
        :class:`meshtop.runner.rank.until.FinishRequest`). Other jobs are stopped."""
        self.stop_on_hang = True
        """Stop the job when a hang is detected (headless); else report it and keep waiting (the dashboard asks)."""
        self.hang: HangDetected | None = None
        """The last hang reported, if any."""

    def ask_stacks(self, ranks: Iterable[int] | None = None) -> None:
        """A py-spy dump of ``ranks`` (every rank when ``None``) at the next delivery."""
        with self._lock:
            if ranks is None or (self._stacks_asked and self._stacks is None):
                self._stacks = None
            else:
                self._stacks = (self._stacks or set()) | set(ranks)
            self._stacks_asked = True

    @property
    def stacks_asked(self) -> bool:
        """A stack dump is asked for and not yet taken."""
        with self._lock:
            return self._stacks_asked

    def take_stack_request(self, pids: dict[int, int]) -> dict[int, int] | None:
        """The ``{rank: pid}`` to dump now, of those in ``pids`` (this node's); ``None`` when nothing was asked."""
        with self._lock:
            asked, ranks = self._stacks_asked, self._stacks
            self._stacks_asked, self._stacks = False, None
        if not asked:
            return None
        return dict(pids) if ranks is None else {rank: pid for rank, pid in pids.items() if rank in ranks}


def lifecycle_events(result: JobResult) -> list[Event]:
    """How each rank and the job ended, as events for the recording."""
    now = time.time_ns()
    events: list[Event] = [
        RankExited(rank=r.rank, wall_ns=now, exit_code=r.exit_code, signal=r.signal, error=r.error)
        for r in result.ranks
    ]
    events.append(
        JobEnded(wall_ns=now, status=result.status, duration_s=result.duration_s, root_cause_rank=result.root_cause)
    )
    return events


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
    hangs = HangWatch(launch.world_size, timeout_s=hang_timeout_s, quiet_s=launch.quiet_s)
    collector = None
    if fleet is not None and launch.nodes is not None:
        host, port = launch.nodes.bind_address()
        collector = Collector(host=host, port=port, nodes=launch.nodes.others, on_control=fleet.on_control)
    job = Job(launch, session_dir, collector)
    node_events: queue.SimpleQueue[list[Event]] = queue.SimpleQueue()
    processes = ProcessSampler(rate_hz=node_probes.process_hz, emit=node_events.put)
    samplers = (GpuSampler(rate_hz=node_probes.gpu_hz, emit=node_events.put), processes)
    pids: dict[int, int] = {}
    lost: list[int] = []
    rounds = Rounds() if launch.nodes is None or fleet is not None else None  # the head numbers the steps
    finishing = FinishRequest(launch.stop_file)

    here = launch.nodes.rank if launch.nodes is not None else 0

    def deliver() -> None:
        arrivals = job.read_events()
        while not node_events.empty():  # this node's samplers: their events name this node
            arrivals.add([on_node(e, offset_ns=0, node=here) if here else e for e in node_events.get()])
        if rounds is not None:
            for start in rounds.admit(arrivals):  # the ranks started: an elastic job's say how many they are
                hangs.ranks_started(start.world_size or launch.world_size, restart=start.restart)
                if start.restart:  # torchrun started every rank again: other processes, maybe other nodes
                    pids.clear()
                    if fleet is not None:
                        fleet.restarted()
        for event in arrivals.events(("rank_started",)):
            assert isinstance(event, RankStarted)
            if event.node != here and fleet is not None:  # another node's: its own meshtop samples and dumps it
                fleet.note_ranks(event.node, event.rank)
                continue
            pids[event.rank] = event.pid
            processes.watch(event.rank, event.pid)
        if fleet is not None:
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
        if not hangs.reported:
            control.hang = None  # progress again: an earlier report no longer holds
        if (hang := hangs.check()) is not None:
            control.hang = hang
            arrivals.add([hang])
            arrivals.add(dump_stacks(pids))
            if fleet is not None:
                fleet.ask_stacks()
            if control.stop_on_hang:
                control.stop.set()
        elif (wanted := control.take_stack_request(pids)) is not None:
            arrivals.add(dump_stacks(wanted))
            if fleet is not None:  # the other nodes dump their own ranks (every one of them)
                fleet.ask_stacks()
        on_events(arrivals)

    for sampler in samplers:
        sampler.start()
    job.start()
    if fleet is not None and launch.nodes is not None:
        publish(launch.nodes, job.collector, going=job.poll)
    interrupted = False
    try:
        while job.poll() and not control.stop.is_set():
            deliver()
            if control.finish.is_set() and finishing.stop_now():
                control.stop.set()
            control.stop.wait(POLL_S)
        interrupted = control.stop.is_set() and job.poll()  # a job that ended by itself is not interrupted
        if control.stacks_asked and job.poll():  # asked with the stop: dump the ranks before they are stopped
            deliver()
        if fleet is not None and control.hang is not None and not lost:  # the other nodes' dumps, first
            deadline = time.monotonic() + REMOTE_STACKS_S
            while not fleet.stacks_in() and time.monotonic() < deadline:
                control.stop.wait(POLL_S)
                deliver()
    except KeyboardInterrupt:
        interrupted = True
    finally:
        if fleet is not None and (interrupted or control.stop.is_set()):  # the other nodes stop theirs too
            failed_elsewhere = lost or control.hang is not None or fleet.failed() is not None
            fleet.stop("failed" if failed_elsewhere else "interrupted")
        job.stop()
        for sampler in samplers:
            sampler.stop()
    if fleet is not None:
        if job.result(interrupted=False).status == "failed":
            fleet.stop("failed")
        fleet.settle()
    deliver()
    job.collector.stop()
    hung = control.hang if interrupted and control.hang is not None else None
    local_ranks = set(pids) if launch.nodes is not None else None
    interrupted_here = interrupted and hung is None and not lost and (fleet is None or fleet.failed() is None)
    result = job.result(interrupted=interrupted_here, hang=hung, ranks=local_ranks)
    if fleet is not None:
        result = fleet.merge(result, {rank.rank for rank in result.ranks}, hangs.world_size)
    on_events(Arrivals(lifecycle_events(result)))
    return result


def publish(nodes: Nodes, collector: Collector, *, going: Callable[[], bool]) -> None:
    """Put the head's collector address and token into the rendezvous store, from a thread (the store is up
    once a launcher joined the rendezvous)."""
    from meshtop.runner.multinode.nodes import HeadAddress, publish_head

    head = HeadAddress(address=nodes.advertised(collector.address), token=collector.token, host=socket.gethostname())
    threading.Thread(
        target=publish_head, args=(nodes, head), kwargs={"going": going}, name="meshtop-publish-head", daemon=True
    ).start()
