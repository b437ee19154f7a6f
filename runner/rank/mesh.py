"""One DeviceMesh with named dims (pp, dp, tp) and this rank's place in it."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from meshtop.runner.plan import ResolvedRun

MESH_DIMS = ("pp", "dp", "tp")
"""Outermost first: tp ranks are neighbours, so they share the fastest links."""


@dataclass(frozen=True, kw_only=True, slots=True)
class MeshCoordinates:
    """Where one rank sits in the (pp, dp, tp) mesh."""

    rank: int
    pp: int
    dp: int
    tp: int


def coordinates(run: ResolvedRun, rank: int) -> MeshCoordinates:
    """The mesh position of global ``rank`` (:meth:`ResolvedRun.position`)."""
    pp, dp, tp = run.plan.coordinates(rank)
    return MeshCoordinates(rank=rank, pp=pp, dp=dp, tp=tp)


def build_mesh(*, device_type: str, pp: int, dp: int, tp: int) -> DeviceMesh:
    """The world mesh; every dim exists, even of size 1, so code can always name it."""
    return init_device_mesh(device_type, (pp, dp, tp), mesh_dim_names=MESH_DIMS)


def local_device(device_type: str, local_rank: int) -> torch.device:
    """The device this rank computes on (its own GPU under CUDA)."""
    if device_type == "cuda":
        torch.cuda.set_device(local_rank)
        return torch.device("cuda", local_rank)
    return torch.device("cpu")
