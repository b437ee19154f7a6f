"""The c10d ops the collective probe hooks, and how to read each one's arguments: the op table both kernels
share (the C++ kernel is told it by :func:`native_table`), and the argument readers of the Python kernel."""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import torch


def nbytes_of(value: Any) -> int:
    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    if isinstance(value, (list, tuple)):
        return sum(nbytes_of(item) for item in value)
    return 0


def storages_of(value: Any) -> tuple[int, ...]:
    """The storage addresses of the tensors in ``value`` (a tensor or a list of them)."""
    if isinstance(value, torch.Tensor):
        return (value.untyped_storage().data_ptr(),)
    if isinstance(value, (list, tuple)):
        return tuple(address for item in value for address in storages_of(item))
    return ()


def first_tensor(value: Any) -> torch.Tensor | None:
    if isinstance(value, torch.Tensor):
        return value
    if isinstance(value, (list, tuple)):
        for item in value:
            if (found := first_tensor(item)) is not None:
                return found
    return None


@dataclass(frozen=True, slots=True)
class OpShape:
    """How to read one c10d op's arguments."""

    op: str
    """The plain op name that events carry."""
    group_arg: int
    buffer_arg: int
    """The argument whose bytes are S (for gathers, the whole output; for scatters, the whole input)."""
    peer_arg: int | None = None
    times_group: bool = False
    """S is ``group_size`` times the buffer's bytes (gather's input, scatter's output)."""


# Op names differ by caller (DTensor uses the coalesced all-gather / reduce-scatter,
# FSDP2 the _base variants); all map to the plain names.
C10D_OPS: dict[str, OpShape] = {
    "allreduce_": OpShape("all_reduce", 1, 0),
    "allreduce_coalesced_": OpShape("all_reduce", 1, 0),
    "allgather_": OpShape("all_gather", 2, 0),
    "_allgather_base_": OpShape("all_gather", 2, 0),
    "allgather_coalesced_": OpShape("all_gather", 2, 0),
    "allgather_into_tensor_coalesced_": OpShape("all_gather", 2, 0),
    "reduce_scatter_": OpShape("reduce_scatter", 2, 1),
    "_reduce_scatter_base_": OpShape("reduce_scatter", 2, 1),
    "reduce_scatter_tensor_coalesced_": OpShape("reduce_scatter", 2, 1),
    "broadcast_": OpShape("broadcast", 1, 0),
    "reduce_": OpShape("reduce", 1, 0),
    "gather_": OpShape("gather", 2, 1, times_group=True),
    "scatter_": OpShape("scatter", 2, 0, times_group=True),
    "alltoall_": OpShape("all_to_all", 2, 1),
    "alltoall_base_": OpShape("all_to_all", 2, 1),
    "barrier": OpShape("barrier", 1, -1),
}
# ProcessGroup methods for P2P: the arguments after ``self`` are (tensors, peer, tag).
# The c10d ops behind those methods, for the C++ kernel: (tensors, group, peer, tag).
P2P_OPS: dict[str, OpShape] = {
    "send": OpShape("send", 1, 0, peer_arg=2),
    "recv_": OpShape("recv", 1, 0, peer_arg=2),
    "recv_any_source_": OpShape("recv", 1, 0),
}
P2P_METHODS: dict[str, OpShape] = {
    "send": OpShape("send", -1, 0, peer_arg=1),
    "recv": OpShape("recv", -1, 0, peer_arg=1),
    "recv_anysource": OpShape("recv", -1, 0),
}

MONITORED_BARRIER = OpShape("barrier", -1, -1)
"""gloo's monitored barrier (``ProcessGroup.monitored_barrier``), which issues no c10d op: a barrier, timed in
Python by both kernels."""


def dtype_names(native: ModuleType) -> dict[int, str]:
    """torch's dtype names (``float32``, ...) by the integer the C++ kernel reports (c10's ScalarType)."""
    names = {}
    with warnings.catch_warnings():  # "experimental" and "deprecated" dtypes: they only need a name here
        warnings.simplefilter("ignore")
        for dtype in {value for value in vars(torch).values() if isinstance(value, torch.dtype)}:
            try:
                code = native.scalar_type(torch.empty(0, dtype=dtype))
            except (RuntimeError, TypeError):  # a dtype no tensor can be made of here
                continue
            names[code] = str(dtype).removeprefix("torch.")
    return names


def native_table() -> tuple[list[OpShape], list[tuple[str, int, int, int, int, bool]]]:
    """The ops the C++ kernel hooks, and its install rows: (name, index, group, buffer, peer or -1, times_group)."""
    shapes: list[OpShape] = []
    rows: list[tuple[str, int, int, int, int, bool]] = []
    for name, shape in {**C10D_OPS, **P2P_OPS}.items():
        if getattr(torch.ops.c10d, name, None) is None:  # an op this torch release does not have
            continue
        rows.append(
            (
                name,
                len(shapes),
                shape.group_arg,
                shape.buffer_arg,
                -1 if shape.peer_arg is None else shape.peer_arg,
                shape.times_group,
            )
        )
        shapes.append(shape)
    return shapes, rows
