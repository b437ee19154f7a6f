"""A recording's node parts: what another node streamed, kept as it came, on that node's clock.

A node's meshtop forwards its ranks' blocks of JSON lines unread, each message
with the offset of its clock behind the head's (docs/multinode.md). The head
appends them to ``events/node<N>.frames``, a frame a block: one header line,
``{"kind": str, "count": int, "bytes": int, "offset_ns": int}``, then the
block's ``bytes`` bytes (``count`` lines). Like the JSON-lines tables, a part
is appended and flushed with each batch, so a crash loses at most the frame
being written, which reads as torn (its header or its bytes cut short) and is
counted, not read. Readers decode each kind's blocks a clock offset at a
time and move them onto the head's clock (:mod:`meshtop.recordings.clock`); a
clean close merges them into each kind's Parquet table and removes the parts
(:func:`meshtop.recordings.tables.compact`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeGuard

PART_PREFIX, PART_SUFFIX = "node", ".frames"


def part_name(node: int) -> str:
    return f"{PART_PREFIX}{node}{PART_SUFFIX}"


def node_of_part(path: Path) -> int | None:
    """The node of a part's file name (``node3.frames``: 3); ``None`` for another file."""
    stem = path.name.removesuffix(PART_SUFFIX)
    if path.name == stem or not stem.startswith(PART_PREFIX) or not stem[len(PART_PREFIX) :].isdigit():
        return None
    return int(stem[len(PART_PREFIX) :])


def frame_header(kind: str, count: int, offset_ns: int, size: int) -> bytes:
    """The line that goes before a block of ``size`` bytes in its part (the block follows it unchanged)."""
    header = {"kind": kind, "count": count, "bytes": size, "offset_ns": offset_ns}
    return json.dumps(header, separators=(",", ":")).encode() + b"\n"


@dataclass
class NodePart:
    """A node part read back: each kind's blocks by clock offset, in the order they came."""

    node: int
    blocks: dict[str, dict[int, list[bytes]]] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=dict)
    """Events of each kind, as the frames' headers say."""
    lost: int = 0
    """Events of a torn or damaged frame (at the end of a part cut short by a crash); 1 where its header did
    not say how many."""


def read_part(path: Path, node: int) -> NodePart:
    """The frames of the part at ``path``; reading stops at the first frame that is not whole."""
    data = path.read_bytes()
    part = NodePart(node)
    position = 0
    while position < len(data):
        end = data.find(b"\n", position)
        header = _header(data[position:end]) if end >= 0 else None
        if header is None:
            part.lost += 1
            break
        kind, count, size, offset = header
        body = data[end + 1 : end + 1 + size]
        if len(body) != size:
            part.lost += count
            break
        part.blocks.setdefault(kind, {}).setdefault(offset, []).append(body)
        part.counts[kind] = part.counts.get(kind, 0) + count
        position = end + 1 + size
    return part


def _header(line: bytes) -> tuple[str, int, int, int] | None:
    try:
        header = json.loads(line)
    except (ValueError, RecursionError):
        return None
    if not isinstance(header, dict):
        return None
    kind, count, size, offset = (header.get(name) for name in ("kind", "count", "bytes", "offset_ns"))
    if not isinstance(kind, str):
        return None
    if not (_whole(count) and _whole(size) and _whole(offset, negative=True)):
        return None
    return kind, count, size, offset


def _whole(value: object, *, negative: bool = False) -> TypeGuard[int]:
    """An integer (not a bool), not below 0 unless ``negative``."""
    return isinstance(value, int) and not isinstance(value, bool) and (negative or value >= 0)


def read_parts(directory: Path) -> list[NodePart]:
    """Every node part in a recording's events folder, by node."""
    parts = []
    for path in sorted(directory.glob(f"{PART_PREFIX}*{PART_SUFFIX}")):
        node = node_of_part(path)
        if node is not None:
            parts.append(read_part(path, node))
    return sorted(parts, key=lambda part: part.node)
