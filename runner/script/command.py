"""A user's own script: the command after ``--``, checked before anything is launched.

``meshtop run|record [OUT] -- COMMAND`` accepts, as COMMAND:

- ``torchrun [torchrun options] SCRIPT [ARGS...]`` (or ``-m MODULE``),
- ``python -m torch.distributed.run [torchrun options] ...``, the same,
- ``SCRIPT.py [ARGS...]``, ``python SCRIPT.py [ARGS...]`` or ``-m MODULE [ARGS...]``: meshtop adds
  ``--standalone --nproc-per-node N`` (every GPU, or 2 CPU ranks).

torchrun's options are read with torchrun's own parser, so every option a user
already passes keeps its meaning, and they go to ``torch.distributed.run``
unchanged in meshtop's launcher child (:mod:`meshtop.runner.job.agent`). What cannot run
is refused here, in one line that names the fix: a missing script, a file
that is not Python, an unknown module, an option torchrun does not know,
a multi-node job without c10d rendezvous or without ``--node-rank``
(:mod:`meshtop.runner.multinode.nodes`), ``--no-python`` (meshtop's probes live in Python).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import sys
from dataclasses import dataclass
from importlib.machinery import PathFinder
from pathlib import Path
from typing import NoReturn

from meshtop.runner.errors import PlanError
from meshtop.runner.multinode.nodes import Nodes, nodes_from_options

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
ENVIRONMENT_THAT_MATTERS = re.compile(r"^(.*_NUM_THREADS|NCCL_.*|TORCH_.*|CUDA_VISIBLE_DEVICES|PYTORCH_.*)$")
"""Variables that change how a distributed job runs: recorded in the manifest so it can be run again."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ScriptRun:
    """A user's script, as torchrun will launch it."""

    command: tuple[str, ...]
    """What the user gave after ``--``."""
    launcher_args: tuple[str, ...]
    """torchrun's arguments, script and script arguments included, as meshtop's launcher passes them on."""
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


def split_command(command: list[str]) -> tuple[list[str], bool]:
    """The torchrun arguments of ``command``, and whether they are the user's own (else meshtop picks the
    ranks)."""
    if not command:
        raise PlanError("nothing after --: give a script (`-- torchrun --nproc-per-node 2 train.py`)")
    first = Path(command[0]).name
    if first == "torchrun":
        return command[1:], True
    if re.fullmatch(r"python[\d.]*", first):
        rest = command[1:]
        if rest[:2] == ["-m", TORCHRUN_MODULE]:
            return rest[2:], True
        if not rest:
            raise PlanError(f"{command[0]} with no script: give one (`-- {command[0]} train.py`)")
        return rest, False
    return command, False


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
    args_given, own = split_command(command)
    launcher_args = list(args_given)
    if not own:
        ranks = gpus_visible or DEFAULT_CPU_RANKS
        launcher_args = ["--standalone", f"--nproc-per-node={ranks}", *launcher_args]
    args = torchrun_parser().parse_args(launcher_args)
    if args.no_python:
        raise PlanError("--no-python runs a program that is not Python; meshtop's probes run inside Python ranks")
    rank_given = any(arg.split("=")[0] in ("--node-rank", "--node_rank") for arg in launcher_args)
    nodes = nodes_from_options(
        nnodes=args.nnodes,
        node_rank=args.node_rank if rank_given else None,
        endpoint=args.rdzv_endpoint or None,
        run_id=args.rdzv_id,
        backend=args.rdzv_backend,
        collector_bind=collector_bind,
        head_node=head_node,
        elastic=True,
    )
    # an elastic job's ranks are counted for MAX nodes until they say how many they are
    world_size = _local_world_size(args.nproc_per_node) * (nodes.count if nodes is not None else 1)
    if tokens_per_step is not None and tokens_per_step <= 0:
        raise PlanError(f"--tokens-per-step must be a positive number of tokens, got {tokens_per_step}")
    script, module, sha256 = _check_target(args.training_script, module=args.module)
    return ScriptRun(
        command=tuple(command),
        launcher_args=tuple(launcher_args),
        script=script,
        module=module,
        script_args=tuple(args.training_script_args),
        sha256=sha256,
        world_size=world_size,
        device="cuda" if gpus_visible else "cpu",
        instrument=instrument,
        tokens_per_step=tokens_per_step,
        dtype=dtype,
        activations=activations,
        loss=loss,
        nodes=nodes,
    )


def _local_world_size(nproc_per_node: str) -> int:
    from torch.distributed import run as torchrun

    try:
        return int(torchrun.determine_local_world_size(nproc_per_node))
    except (ValueError, RuntimeError) as error:
        raise PlanError(f"torchrun option: --nproc-per-node {nproc_per_node}: {error}") from None


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
        where = f"line {error.lineno}: " if getattr(error, "lineno", None) else ""
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
