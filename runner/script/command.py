"""A user's own script: the command after ``--``, checked before anything is launched.

``meshtop run|record [OUT] -- COMMAND`` accepts, as COMMAND:

- ``torchrun [torchrun options] SCRIPT [ARGS...]`` (or ``-m MODULE``),
- ``python -m torch.distributed.run [torchrun options] ...``, the same,
- ``SCRIPT.py [ARGS...]``, ``python SCRIPT.py [ARGS...]`` or ``-m MODULE [ARGS...]``: meshtop adds
  ``--standalone --nproc-per-node N`` (every GPU, or 2 CPU ranks; ``$PET_NPROC_PER_NODE`` where a pod sets it,
  and the scheduler's nodes instead of ``--standalone`` where it places the job on many),
- ``accelerate launch [accelerate's options] SCRIPT [ARGS...]`` (or ``accelerate-launch``, or
  ``python -m accelerate.commands.launch``), where accelerate would start the ranks with torchrun.

torchrun's options are read with torchrun's own parser, so every option a user
already passes keeps its meaning, and they go to ``torch.distributed.run``
unchanged in meshtop's launcher child (:mod:`meshtop.runner.job.agent`), after the node options a scheduler's
environment gave (:mod:`meshtop.runner.multinode.scheduler`). accelerate's are read with
accelerate's own parser and checks (its config file included), and the launcher child runs accelerate's
launch, which prepares the ranks' environment and calls torchrun in-process. What cannot run
is refused here, in one line that names the fix: a missing script, a file
that is not Python, an unknown module, an option torchrun does not know,
a multi-node job without c10d rendezvous or without ``--node-rank``
(:mod:`meshtop.runner.multinode.nodes`), ``--no-python`` (meshtop's probes live in Python), and an accelerate
launch that would not go through torchrun or would span machines (:func:`accelerate_launch`).
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import logging
import os
import re
import sys
from dataclasses import dataclass
from importlib.machinery import PathFinder
from pathlib import Path
from typing import Any, Literal, NoReturn

from meshtop.probes.errors import one_line
from meshtop.runner.errors import PlanError
from meshtop.runner.multinode.nodes import Nodes
from meshtop.runner.multinode.scheduler import NodeValues, node_values, scheduled_nodes

ATTACH_ENV = "MESHTOP_ATTACH"
"""Set (to ``1``) in a script's ranks: meshtop's bootstrap attaches its probes (:mod:`meshtop.runner.script.attach`)."""
DEVICE_ENV = "MESHTOP_DEVICE"
"""``cuda`` or ``cpu``: what the ranks are expected to run on (which collective kernel to use)."""
TOKENS_ENV = "MESHTOP_TOKENS_PER_STEP"
ACTIVATIONS_ENV = "MESHTOP_ACTIVATIONS"
"""``1`` with ``--activations``: measure the tensors saved for backward (:mod:`meshtop.probes.activations`)."""
LOSS_ENV = "MESHTOP_LOSS"
"""``0`` with ``--no-loss``: the script's losses are not read (:mod:`meshtop.probes.losses`)."""
INSTRUMENT_ENV = "MESHTOP_INSTRUMENT"
"""``0`` with ``--no-instrument``: the ranks report their steps and heartbeats, with no collective or stage hooks."""
BOOTSTRAP_DIR = Path(__file__).resolve().parent / "bootstrap"
"""Put first on a script's ``PYTHONPATH``: its ``sitecustomize`` attaches meshtop to each rank."""
DEFAULT_CPU_RANKS = 2
TORCHRUN_MODULE = "torch.distributed.run"
ACCELERATE_LAUNCH_MODULE = "accelerate.commands.launch"
Launcher = Literal["torchrun", "accelerate"]
"""What meshtop's launcher child runs with a job's arguments: torchrun's ``torch.distributed.run``, or
``accelerate launch`` (which runs torchrun's in-process)."""
NO_PYTHON = "--no-python runs a program that is not Python; meshtop's probes run inside Python ranks"
ENVIRONMENT_THAT_MATTERS = re.compile(
    r"^(.*_NUM_THREADS|NCCL_.*|TORCH_.*|CUDA_VISIBLE_DEVICES|PYTORCH_.*|PET_.*|MASTER_ADDR|MASTER_PORT"
    r"|SLURM_NNODES|SLURM_NODEID|SLURM_STEP_NODELIST|SLURM_JOB_NODELIST)$"
)
"""Variables that change how a distributed job runs: recorded in the manifest so it can be run again (a
scheduler's among them: where the job's nodes came from, :mod:`meshtop.runner.multinode.scheduler`)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ScriptRun:
    """A user's script, as torchrun will launch it."""

    command: tuple[str, ...]
    """What the user gave after ``--``."""
    launcher_args: tuple[str, ...]
    """The ``launcher``'s arguments, script and script arguments included, as meshtop's launcher passes them on."""
    script: Path | None
    """The script's absolute path (``None`` for ``-m MODULE``)."""
    module: str | None
    script_args: tuple[str, ...]
    sha256: str | None
    """Of the script file (``None`` for a module)."""
    world_size: int
    """Ranks of the whole job, every node's (an elastic job's: at MAX nodes, until its ranks say)."""
    device: str
    """``cuda`` where GPUs are visible (the script is expected to use nccl), else ``cpu`` (gloo)."""
    instrument: bool = True
    tokens_per_step: int | None = None
    dtype: str | None = None
    """The compute dtype the user names (``--dtype``), for MFU's peak FLOP/s."""
    activations: bool = False
    """Measure activations saved for backward (``--activations``)."""
    loss: bool = True
    """Read the loss of each step (``--no-loss`` turns it off)."""
    nodes: Nodes | None = None
    """The job's nodes, from torchrun's options, when it runs on many."""
    launcher: Launcher = "torchrun"
    """``accelerate`` for ``accelerate launch``: ``launcher_args`` are then accelerate's."""

    @property
    def name(self) -> str:
        """``train.py`` or ``-m pkg.train``."""
        return self.script.name if self.script is not None else f"-m {self.module}"


class _TorchrunParser(argparse.ArgumentParser):
    """torchrun's parser, with errors as :class:`PlanError` instead of a usage text and exit."""

    def error(self, message: str) -> NoReturn:
        raise PlanError(f"torchrun option: {message}")


def torchrun_parser() -> argparse.ArgumentParser:
    from torch.distributed import run as torchrun

    parser = torchrun.get_args_parser()
    parser.__class__ = _TorchrunParser  # the same parser, its errors one line
    return parser


@dataclass(frozen=True, slots=True, kw_only=True)
class _Launched:
    """What a launcher's arguments say of the job: enough for a :class:`ScriptRun`."""

    launcher_args: tuple[str, ...]
    target: str
    """The script's path as given, or the module's name."""
    module: bool
    script_args: tuple[str, ...]
    world_size: int
    nodes: Nodes | None = None


def split_command(command: list[str]) -> tuple[Launcher, list[str], bool]:
    """The launcher ``command`` names, its arguments, and whether they are the user's own (else meshtop picks the
    ranks)."""
    if not command:
        raise PlanError("nothing after --: give a script (`-- torchrun --nproc-per-node 2 train.py`)")
    first = Path(command[0]).name
    if first == "torchrun":
        return "torchrun", command[1:], True
    if first == "accelerate-launch":
        return "accelerate", command[1:], True
    if first == "accelerate":
        if command[1:2] != ["launch"]:
            given = f"accelerate {command[1]}" if len(command) > 1 else "accelerate"
            raise PlanError(f"{given}: meshtop runs `accelerate launch [options] SCRIPT`; give that after --")
        return "accelerate", command[2:], True
    if re.fullmatch(r"python[\d.]*", first):
        rest = command[1:]
        if rest[:2] == ["-m", TORCHRUN_MODULE]:
            return "torchrun", rest[2:], True
        if rest[:2] == ["-m", ACCELERATE_LAUNCH_MODULE]:
            return "accelerate", rest[2:], True
        if not rest:
            raise PlanError(f"{command[0]} with no script: give one (`-- {command[0]} train.py`)")
        return "torchrun", rest, False
    return "torchrun", command, False


def resolve_script(
    command: list[str],
    *,
    gpus_visible: int,
    instrument: bool = True,
    tokens_per_step: int | None = None,
    dtype: str | None = None,
    activations: bool = False,
    loss: bool = True,
    collector_bind: str | None = None,
    head_node: int | None = None,
) -> ScriptRun:
    """The :class:`ScriptRun` of ``command``, or a :class:`PlanError` that says what to fix."""
    launcher, args_given, own = split_command(command)
    if launcher == "accelerate":
        launched = accelerate_launch(args_given)
    else:
        launched = torchrun_launch(
            args_given, own=own, gpus_visible=gpus_visible, collector_bind=collector_bind, head_node=head_node
        )
    if tokens_per_step is not None and tokens_per_step <= 0:
        raise PlanError(f"--tokens-per-step must be a positive number of tokens, got {tokens_per_step}")
    script, module, sha256 = _check_target(launched.target, module=launched.module)
    return ScriptRun(
        command=tuple(command),
        launcher_args=launched.launcher_args,
        script=script,
        module=module,
        script_args=launched.script_args,
        sha256=sha256,
        world_size=launched.world_size,
        device="cuda" if gpus_visible else "cpu",
        instrument=instrument,
        tokens_per_step=tokens_per_step,
        dtype=dtype,
        activations=activations,
        loss=loss,
        nodes=launched.nodes,
        launcher=launcher,
    )


def torchrun_launch(
    args_given: list[str], *, own: bool, gpus_visible: int, collector_bind: str | None, head_node: int | None
) -> _Launched:
    """torchrun's arguments read with torchrun's parser; meshtop's ranks added where they are not ``own``, and
    the job's nodes where the command leaves them to a scheduler's environment
    (:mod:`meshtop.runner.multinode.scheduler`): written out for torchrun, so the manifest's ``launcher_args``
    say them. A head found there is a c10d endpoint (``--rdzv-backend=c10d`` where none is given: meshtop
    follows many nodes through c10d); a rendezvous the command names stays as it is (a static one is refused)."""
    launcher_args = list(args_given)
    if not own and not os.environ.get("PET_NPROC_PER_NODE"):  # else torchrun's own variable says (a pod's)
        launcher_args = [f"--nproc-per-node={gpus_visible or DEFAULT_CPU_RANKS}", *launcher_args]
    args = torchrun_parser().parse_args(launcher_args)
    if args.no_python:
        raise PlanError(NO_PYTHON)
    given = _given_options(launcher_args)
    values = NodeValues()
    if not args.standalone:  # torchrun's --standalone is one node, whatever the environment says
        values = node_values(
            nnodes=given.nnodes,
            node_rank=given.node_rank,
            endpoint=given.rdzv_endpoint,
            env=os.environ,
        )
    backend = args.rdzv_backend
    added: list[str] = []
    if values.count > 1:
        from_environment = given.rdzv_endpoint is None and given.master_addr is None and values.endpoint is not None
        if from_environment and given.rdzv_backend is None and not os.environ.get("PET_RDZV_BACKEND"):
            backend = "c10d"
            added.append("--rdzv-backend=c10d")
        found = {"--nnodes": values.nnodes, "--node-rank": values.node_rank, "--rdzv-endpoint": values.endpoint}
        written = {"--nnodes": given.nnodes, "--node-rank": given.node_rank, "--rdzv-endpoint": given.rdzv_endpoint}
        added += [f"{flag}={value}" for flag, value in found.items() if value is not None and written[flag] is None]
    elif not own:
        added.append("--standalone")
    launcher_args = [*added, *launcher_args]
    nodes = scheduled_nodes(
        values, run_id=args.rdzv_id, backend=backend, collector_bind=collector_bind, head_node=head_node, elastic=True
    )
    # an elastic job's ranks are counted for MAX nodes until they say how many they are
    world_size = _local_world_size(args.nproc_per_node) * (nodes.count if nodes is not None else 1)
    return _Launched(
        launcher_args=tuple(launcher_args),
        target=args.training_script,
        module=args.module,
        script_args=tuple(args.training_script_args),
        world_size=world_size,
        nodes=nodes,
    )


def _given_options(launcher_args: list[str]) -> argparse.Namespace:
    """torchrun's node options as the command line gives them: ``None`` where it does not (torchrun's parser
    would fill in its default, or its ``PET_*`` variable's value)."""
    parser = torchrun_parser()
    parser.set_defaults(nnodes=None, node_rank=None, rdzv_endpoint=None, rdzv_backend=None, master_addr=None)
    return parser.parse_args(launcher_args)


def accelerate_launch(args_given: list[str]) -> _Launched:
    """``accelerate launch``'s arguments, read as accelerate reads them: its parser, then its own checks, which
    also fill in what its config file (``accelerate config``) or the machine decides (the number of processes,
    the kind of launch).

    meshtop records the ranks torchrun starts, so only the launches accelerate runs through torchrun, on one
    machine, are accepted: ``--multi_gpu`` (also where no GPU is visible: its ranks then run on the CPU),
    ``--use_fsdp``, ``--use_megatron_lm`` and ``--use_deepspeed``. The rest are refused, as accelerate would run
    them: ``--cpu`` and a single process without ``--multi_gpu`` (the script itself, or mpirun's ranks), TPUs
    (torch_xla), SageMaker (AWS), and several machines (meshtop follows a job on many nodes through torchrun's
    own options, :mod:`meshtop.runner.multinode.nodes`).
    """
    if importlib.util.find_spec("accelerate") is None:
        raise PlanError("accelerate is not installed here: `pip install accelerate`, or give `-- torchrun ...`")
    try:
        from accelerate.commands import launch
        from accelerate.utils import ComputeEnvironment, is_deepspeed_available
    except ImportError as error:
        raise PlanError(f"accelerate cannot be imported here: {one_line(error)}") from None

    parser = launch.launch_command_parser()
    parser.error = _accelerate_option_error  # one line, not its usage and exit
    args = parser.parse_args(args_given)
    if args.no_python:
        raise PlanError(NO_PYTHON)
    # accelerate's notes on the defaults it used belong in the launcher log, where its launch writes them again
    notes = logging.getLogger(launch.__name__)
    level, notes.level = notes.level, logging.ERROR
    try:
        args, config, _ = launch._validate_launch_command(args)
    except Exception as error:  # its checks raise ValueError; reading its config file, whatever YAML and I/O raise
        raise PlanError(f"accelerate launch: {one_line(error)}") from None
    finally:
        notes.level = level
    sagemaker = config is not None and config.compute_environment == ComputeEnvironment.AMAZON_SAGEMAKER
    refusal = _why_not_torchrun(args, sagemaker=sagemaker)
    if refusal is not None:
        raise PlanError(refusal)
    if args.num_machines > 1:
        raise PlanError(
            f"accelerate launch on {args.num_machines} machines: meshtop records accelerate on one; on many, give "
            "torchrun's command on each (`-- torchrun --nnodes N --rdzv-backend c10d --rdzv-endpoint HOST:PORT ...`)"
        )
    if args.use_deepspeed and not is_deepspeed_available():
        raise PlanError("accelerate launch --use_deepspeed: DeepSpeed is not installed here (`pip install deepspeed`)")
    if args.num_processes < 1:
        raise PlanError(f"accelerate launch --num_processes {args.num_processes}: give 1 or more")
    return _Launched(
        launcher_args=tuple(args_given),
        target=args.training_script,
        module=bool(args.module),
        script_args=tuple(args.training_script_args),
        world_size=int(args.num_processes),
    )


def _why_not_torchrun(args: Any, *, sagemaker: bool) -> str | None:
    """``None`` where accelerate's ``launch_command`` would start the ranks with torchrun, else why meshtop cannot
    record the launch it would make instead (the branches are ``launch_command``'s, in its order)."""
    if not args.cpu and (args.use_deepspeed or args.use_fsdp or args.use_megatron_lm or args.multi_gpu):
        return None
    if not args.cpu and args.tpu:
        return "accelerate launch --tpu runs its processes with torch_xla, not torchrun: meshtop cannot record them"
    if sagemaker:
        return "the accelerate config's SageMaker environment launches on AWS, not here: meshtop cannot record it"
    how = "mpirun's processes" if args.mpirun_hostfile else f"{args.training_script} as one process"
    return (
        f"accelerate launch would run {how}, not torchrun's ranks: give --multi_gpu --num_processes N (where no "
        "GPU is visible the ranks run on the CPU), or `-- SCRIPT` (meshtop starts the ranks with torchrun)"
    )


def _accelerate_option_error(message: str) -> NoReturn:
    raise PlanError(f"accelerate launch option: {message}")


def _local_world_size(nproc_per_node: str) -> int:
    from torch.distributed import run as torchrun

    try:
        count = int(torchrun.determine_local_world_size(nproc_per_node))
    except (ValueError, RuntimeError) as error:
        raise PlanError(f"torchrun option: --nproc-per-node {nproc_per_node}: {error}") from None
    if count < 1:
        raise PlanError(f"torchrun option: --nproc-per-node {nproc_per_node}: at least 1 process a node")
    return count


def _check_target(target: str, *, module: bool) -> tuple[Path | None, str | None, str | None]:
    """(script path, module, script hash), once the script is found and compiles, or the module is found."""
    if module:
        if not _module_exists(target):
            raise PlanError(f"no module named {target!r} here (the ranks run from {os.getcwd()})")
        return None, target, None
    path = Path(target)
    if not path.is_file():
        raise PlanError(f"{target}: no such script" if not path.exists() else f"{target} is not a file")
    source = path.read_bytes()
    try:
        compile(source, str(path), "exec", dont_inherit=True)
    except (SyntaxError, ValueError) as error:  # ValueError: null bytes, on older Pythons
        where = f"line {line}: " if (line := getattr(error, "lineno", None)) else ""
        raise PlanError(f"{target} is not a Python script: {where}{getattr(error, 'msg', error)}") from None
    return path.resolve(), None, hashlib.sha256(source).hexdigest()


def _module_exists(name: str) -> bool:
    """Whether ``python -m name`` would find it from the current directory, without running any of its code
    (packages are searched on disk, not imported)."""
    locations = [os.getcwd(), *sys.path[1:]]
    parts = name.split(".")
    for depth in range(1, len(parts) + 1):
        spec = PathFinder.find_spec(".".join(parts[:depth]), locations)
        if spec is None:
            return False
        locations = list(spec.submodule_search_locations or [])
    return True


def environment_that_matters(env: dict[str, str]) -> dict[str, str]:
    return {key: value for key, value in sorted(env.items()) if ENVIRONMENT_THAT_MATTERS.match(key)}
