"""torch's flight records as the collective witness reads them: bytes by nccl-tests' S, by op family.

A record here is ``[profiling name, group ranks, input sizes, input dtypes, output sizes, output dtypes]``,
as ``tests/api_matrix.py`` and ``tests/fr_witness.py`` keep it from ``_dump_fr_trace_json``.
"""

from __future__ import annotations

import math
from typing import Any

FAMILY = {"reduce_scatter": "all_reduce"}
"""gloo carries a reduce-scatter out as all-reduces of its input, and records it under that name (torch
2.11-2.15): a reduce-scatter meshtop recorded is compared with the all-reduces gloo recorded."""
ITEMSIZE = {"Float": 4, "BFloat16": 2, "Half": 2, "Double": 8, "Long": 8, "Int": 4, "Byte": 1}
DTYPES = {"Float": "float32", "BFloat16": "bfloat16", "Half": "float16", "Double": "float64", "Long": "int64"}
DTYPES |= {"Int": "int32", "Byte": "uint8"}
Key = tuple[str, tuple[int, ...], str | None]
"""(op family, global ranks of the group, dtype)."""


def numel(sizes: list[list[int]]) -> int:
    """The elements of tensors of these shapes, all together."""
    return sum(math.prod(shape) for shape in sizes)


def witnessed(record: list[Any]) -> tuple[Key, int]:
    """A flight record as its key and its bytes by nccl-tests' S: an all-gather's or a gather's is the group
    times the rank's input, a scatter's the group times the rank's output (a scatter's non-root ranks record
    no input), any other's the input."""
    name, ranks, input_sizes, input_dtypes, output_sizes, output_dtypes = record
    op = name.split(":", 1)[1]
    if op == "scatter":
        dtype, count = (output_dtypes or [None])[0], len(ranks) * numel(output_sizes)
    else:
        times = len(ranks) if op in ("all_gather", "gather") else 1
        dtype, count = (input_dtypes or [None])[0], numel(input_sizes) * times
    nbytes = count * ITEMSIZE[dtype] if dtype is not None else 0
    return (op, tuple(ranks), DTYPES[dtype] if dtype is not None else None), nbytes


def hooked(op: str, ranks: tuple[int, ...], dtype: str | None, nbytes: int) -> tuple[Key, int]:
    """An operation meshtop recorded, keyed as :func:`witnessed` keys a record."""
    return (FAMILY.get(op, op), ranks, dtype), nbytes


def totals(pairs: list[tuple[Key, int]]) -> dict[Key, int]:
    """Bytes by key: a dict, not a Counter, so a key of 0 bytes (a barrier) still has to be on both sides."""
    summed: dict[Key, int] = {}
    for key, nbytes in pairs:
        summed[key] = summed.get(key, 0) + nbytes
    return summed
