"""What a job is started with: torchrun's arguments, and the environment of the launcher and its ranks.

:class:`Launch` says what :class:`meshtop.runner.job.process.Job` starts; the built-in runner's is
:func:`builtin_launch`, a user's script's is :func:`meshtop.runner.session.session.script_launch`. The
environment is the user's own, with what meshtop's probes need added and what would mislead them left out.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from meshtop.probes.collector import Collector
from meshtop.probes.flight import FLIGHT_BUFFER, FLIGHT_BUFFER_ENV, FLIGHT_ENV
from meshtop.probes.native import NATIVE_ENV
from meshtop.probes.wire import ADDRESS_ENV, NCCL_TIMING_ENV, NODE_ENV, TOKEN_ENV
from meshtop.runner.job.flight import FLIGHT_DIR
from meshtop.runner.load import longest_gap_s
from meshtop.runner.multinode.nodes import Nodes
from meshtop.runner.plan import ResolvedRun
from meshtop.runner.rank.until import STOP_ENV, STOP_NAME
from meshtop.runner.script.command import Launcher

ATTACHED_ENV = "MESHTOP_ATTACHED_PID"
"""Set by the bootstrap in a process it attached to (``runner/script/bootstrap/sitecustomize.py``)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Launch:
    """What :class:`meshtop.runner.job.process.Job` starts: torchrun's arguments and what the ranks'
    environment adds.

    The built-in runner's is :func:`builtin_launch`; a user's script's is
    :func:`meshtop.runner.session.session.script_launch`.
    """

    launcher_args: tuple[str, ...]
    """The ``launcher``'s arguments, the program and its arguments included."""
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
    launcher: Launcher = "torchrun"
    """What the launcher child runs with ``launcher_args``: torchrun, or ``accelerate launch`` (which starts the
    ranks with torchrun's run, in the launcher child: :func:`meshtop.runner.job.agent.accelerate_launch`)."""

    @property
    def local_world_size(self) -> int:
        """The ranks this node runs."""
        return self.world_size // (self.nodes.count if self.nodes is not None else 1)


def builtin_launch(run: ResolvedRun, session_dir: Path, nodes: Nodes | None = None) -> Launch:
    """The built-in runner's launch: ``meshtop.runner.rank.worker`` on every rank, reading the run from
    ``run.json``; on many ``nodes``, this node's share of the ranks, joining torchrun's c10d rendezvous."""
    session_dir.mkdir(parents=True, exist_ok=True)
    run_path = session_dir / "run.json"
    run_path.write_text(json.dumps(run.to_json(), indent=2))
    where = (
        ("--standalone", "--nnodes=1", f"--nproc-per-node={run.plan.world_size}")
        if nodes is None
        else nodes.launcher_args(run.plan.world_size // nodes.count)
    )
    stop_file = session_dir / STOP_NAME if run.steps is None and run.mode == "train" else None
    if stop_file is not None:
        stop_file.unlink(missing_ok=True)
    return Launch(
        launcher_args=(*where, "--max-restarts=0", "-m", "meshtop.runner.rank.worker", str(run_path)),
        world_size=run.plan.world_size,
        native_kernel=run.device == "cpu" and run.instrument,
        quiet_s=longest_gap_s(run.load) if run.load is not None else 0.0,
        nodes=nodes,
        # The folder meshtop starts in is not searched by the ranks (Python 3.11's PYTHONSAFEPATH): they run only
        # meshtop's code, and a user's meshtop.py there would hide meshtop from them.
        env={"PYTHONSAFEPATH": "1", **({STOP_ENV: str(stop_file)} if stop_file is not None else {})},
        stop_file=stop_file,
    )


def rank_environment(launch: Launch) -> dict[str, str]:
    """The environment of the launcher and its ranks, less the collector's address and token.

    Without ``RANK`` (torchrun gives each rank its own: one exported by a cluster's pod would make the
    launcher look like a rank to the bootstrap) and without a parent's attachment mark.
    """
    env = {key: value for key, value in os.environ.items() if key not in ("RANK", ATTACHED_ENV)}
    env.setdefault(NCCL_TIMING_ENV, "1")  # nccl times each operation with CUDA events
    # torch's flight recorder on every rank, for its analyzer at a hang (meshtop.runner.job.flight): the last
    # 2000 collectives; no cost measured on gloo (docs/failures.md)
    env.setdefault(FLIGHT_BUFFER_ENV, str(FLIGHT_BUFFER))
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


def worker_environment(launch: Launch, collector: Collector, session_dir: Path) -> dict[str, str]:
    """The environment of the launcher and its ranks."""
    env = rank_environment(launch)
    env[FLIGHT_ENV] = str(session_dir / FLIGHT_DIR)
    host, port = collector.address
    env[ADDRESS_ENV] = f"{host}:{port}"
    env[TOKEN_ENV] = collector.token
    return env
