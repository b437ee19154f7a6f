"""A recording's node parts: what another node streamed, kept as it came (big blocks compressed), on its clock.

A node's meshtop forwards its ranks' blocks of JSON lines unread, each message
with the offset of its clock behind the head's (docs/multinode.md). The head
appends them to ``events/node<N>.frames``, a frame a block: one header line,
``{"kind": str, "count": int, "bytes": int, "offset_ns": int}``, then the
block's ``bytes`` bytes (``count`` lines). A block of :data:`COMPRESS_FROM_BYTES`
or more is kept compressed (LZ4's frame format), its header saying so:
``"codec": "lz4", "raw_bytes": int`` (the lines' size; ``bytes`` is what is
stored). At a thousand ranks the head writes a million events a second, 233 MB
of JSON lines, and on this project's VM the disk's kernel time for them
starved the fold of its core (docs/multinode.md); LZ4 keeps a real
recording's lines in 17-28 % of their size at 900 MB/s a core, with the
interpreter's lock let go meanwhile. Like the JSON-lines tables, a part
is appended and flushed with each batch, so a crash loses at most the frame
being written, which reads as torn (its header or its bytes cut short) and is
counted, not read. Readers decode each kind's blocks a clock offset at a
time and move them onto the head's clock (:mod:`meshtop.recordings.clock`); a
clean close merges them into each kind's Parquet table and removes the parts
(:func:`meshtop.recordings.tables.compact`).
"""

from __future__ import annotations

import json
import mmap
import os
from collections.abc import Collection, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeGuard

import pyarrow as pa

PART_PREFIX, PART_SUFFIX = "node", ".frames"
CODEC = "lz4"
COMPRESS_FROM_BYTES = 16 << 10
"""Blocks at least this big are kept compressed (a node's collectives of a step are hundreds of KB; a few
lines gain little)."""
_LZ4 = pa.Codec(CODEC)
MAX_RAW_BYTES = 1 << 30
"""The most a frame may say its lines take (a damaged header must not make the reader allocate more)."""


def part_name(node: int) -> str:
    return f"{PART_PREFIX}{node}{PART_SUFFIX}"


def node_of_part(path: Path) -> int | None:
    """The node of a part's file name (``node3.frames``: 3); ``None`` for another file."""
    stem = path.name.removesuffix(PART_SUFFIX)
    if path.name == stem or not stem.startswith(PART_PREFIX) or not stem[len(PART_PREFIX) :].isdigit():
        return None
    return int(stem[len(PART_PREFIX) :])


def frame(kind: str, count: int, offset_ns: int, lines: bytes) -> tuple[bytes, bytes]:
    """A block of ``count`` lines as its part keeps it: its header line, and the bytes after it (the lines as
    they came, or compressed from :data:`COMPRESS_FROM_BYTES`)."""
    header: dict[str, object] = {"kind": kind, "count": count, "bytes": len(lines), "offset_ns": offset_ns}
    stored = lines
    if len(lines) >= COMPRESS_FROM_BYTES:
        stored = _LZ4.compress(lines, asbytes=True)
        header.update(bytes=len(stored), codec=CODEC, raw_bytes=len(lines))
    return json.dumps(header, separators=(",", ":")).encode() + b"\n", stored


@dataclass
class NodePart:
    """A node part read back: each kind's blocks by clock offset, in the order they came."""

    node: int
    blocks: dict[str, dict[int, list[bytes]]] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=dict)
    """Events of each kind, as the frames' headers say."""
    lost: int = 0
    """Events of a torn or damaged frame (at the end of a part cut short by a crash, or whose compressed bytes
    do not decompress to its lines); 1 where its header did not say how many."""


@dataclass(frozen=True, slots=True)
class PartFrame:
    """One frame of a part: ``lines`` its block (``None``: not read, of a kind not asked for, or damaged), and
    ``lost`` the events a frame cut short or damaged holds (then the frames after a cut are not read); ``end``
    where the next frame begins."""

    kind: str
    count: int
    offset_ns: int
    lines: bytes | None
    lost: int = 0
    end: int = 0


def part_frames(path: Path, kinds: Collection[str] | None = None) -> Iterator[PartFrame]:
    """The frames of the part at ``path`` in the order written, the lines of ``kinds`` only (every kind's where
    ``None``) read and decompressed: a clean close merges a kind at a time, and a thousand ranks' parts hold
    tens of GB of lines. The file is mapped, not read whole. Reading stops at the first frame not whole."""
    with path.open("rb") as file:
        if os.fstat(file.fileno()).st_size == 0:
            return
        with mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as data:
            yield from frames_in(data, kinds)


def frames_in(data: bytes | mmap.mmap, kinds: Collection[str] | None = None, start: int = 0) -> Iterator[PartFrame]:
    """The frames of a part's bytes ``data`` from ``start`` (a frame's beginning), as :func:`part_frames` reads
    them: the last one yielded is cut short (``lost``) where ``data`` ends within a frame."""
    position = start
    while position < len(data):
        end = data.find(b"\n", position)
        header = _header(data[position:end]) if end >= 0 else None
        if header is None:
            yield PartFrame("", 0, 0, None, lost=1, end=position)
            return
        kind, count, size, offset, raw = header
        if end + 1 + size > len(data):
            yield PartFrame(kind, count, offset, None, lost=count, end=position)
            return
        body_at, position = end + 1, end + 1 + size
        if kinds is not None and kind not in kinds:
            yield PartFrame(kind, count, offset, None, end=position)
            continue
        body = data[body_at:position]
        lines = body if raw is None else _decompressed(body, raw)
        # a whole frame whose bytes are not what it says: counted, and the frames after it are read
        yield PartFrame(kind, count, offset, lines, lost=count if lines is None else 0, end=position)


def read_part(path: Path, node: int) -> NodePart:
    """The frames of the part at ``path``; reading stops at the first frame that is not whole."""
    part = NodePart(node)
    for got in part_frames(path):
        part.lost += got.lost
        if got.lines is None:
            continue
        part.blocks.setdefault(got.kind, {}).setdefault(got.offset_ns, []).append(got.lines)
        part.counts[got.kind] = part.counts.get(got.kind, 0) + got.count
    return part


def _decompressed(stored: bytes, size: int) -> bytes | None:
    """A compressed block's lines, ``None`` if it does not decompress to ``size`` bytes."""
    try:
        lines = _LZ4.decompress(stored, decompressed_size=size, asbytes=True)
    except (pa.ArrowException, OSError, ValueError):
        return None
    return lines if isinstance(lines, bytes) and len(lines) == size else None


def _header(line: bytes) -> tuple[str, int, int, int, int | None] | None:
    """A frame's kind, count, stored size, offset and, when compressed, its lines' size; ``None`` if the line
    is not a frame's header (a codec other than :data:`CODEC` included)."""
    try:
        header = json.loads(line)
    except (ValueError, RecursionError):
        return None
    if not isinstance(header, dict):
        return None
    kind, count, size, offset = (header.get(name) for name in ("kind", "count", "bytes", "offset_ns"))
    codec, raw = header.get("codec"), header.get("raw_bytes")
    if not isinstance(kind, str):
        return None
    if not (_whole(count) and _whole(size) and _whole(offset, negative=True)):
        return None
    if codec is None:
        return kind, count, size, offset, None
    if codec != CODEC or not _whole(raw) or raw > MAX_RAW_BYTES:
        return None
    return kind, count, size, offset, raw


def _whole(value: object, *, negative: bool = False) -> TypeGuard[int]:
    """An integer (not a bool), not below 0 unless ``negative``."""
    return isinstance(value, int) and not isinstance(value, bool) and (negative or value >= 0)


def read_parts(directory: Path) -> list[NodePart]:
    """Every node part in a recording's events folder, by node."""
    return [read_part(path, node) for node, path in part_paths(directory)]


def part_paths(directory: Path) -> list[tuple[int, Path]]:
    """(node, path) of every node part in a recording's events folder, by node."""
    found = ((node_of_part(path), path) for path in directory.glob(f"{PART_PREFIX}*{PART_SUFFIX}"))
    return sorted((node, path) for node, path in found if node is not None)
