"""The telemetry wire: length-prefixed messages from workers to the collector.

A frame is a 4-byte big-endian length and that many bytes of payload. The
payload is a header, one line of JSON,
``{"token": str, "rank": int, "dropped": int, "sections": [[kind, count, nbytes], ...]}``
(and ``"node": int`` from another node of a multi-node job, :mod:`meshtop.runner.session.relay`, with
``"offset_ns": int`` when its events are on that node's clock, the offset saying how far behind the head's),
then the sections' bytes back to back: each is ``count`` events of ``kind``
as JSON lines (``nbytes`` in all), exactly the lines the recording keeps, so
the collector checks a frame's shape without reading its events.
``dropped`` counts the events the worker's buffer refused since its last message.

Grouping by kind loses the order between kinds inside a message, so the
sections go in an order that keeps what consumers rely on: rank starts
first, and a rank's steps and requests after the collectives, stage actions
and memory reports they close (the dashboard folds a step's collectives and
stage actions when the last rank's step arrives).
"""

from __future__ import annotations

import json
import os
import socket
import struct
from collections.abc import Iterable
from itertools import accumulate
from typing import Any, TypeGuard

import numpy as np

from meshtop.probes.arrivals import EncodedEvents, encode_lines
from meshtop.probes.events import EVENT_TYPES, Event
from meshtop.probes.kinds import KINDS

HEADER = struct.Struct(">I")
MAX_FRAME_BYTES = 8 * 1024 * 1024
TOKEN_ENV = "MESHTOP_TOKEN"
NCCL_TIMING_ENV = "TORCH_NCCL_ENABLE_TIMING"
"""Set to 1 by the launcher: nccl then times each operation with CUDA events, which the probes read."""
ADDRESS_ENV = "MESHTOP_COLLECTOR"
NODE_ENV = "MESHTOP_NODE"
"""The rank's node in a multi-node job (its meshtop's ``--node-rank``), for
:class:`meshtop.probes.events.RankStarted`."""


def node_of_this_rank() -> int:
    """The node the launcher said this rank runs on (0 on one machine)."""
    value = os.environ.get(NODE_ENV, "0")
    return int(value) if value.isdigit() else 0


def start_of_this_rank() -> tuple[int, int]:
    """``(world size, restart count)`` as torchrun set them for this rank (``(0, 0)`` outside torchrun)."""
    world, restart = os.environ.get("WORLD_SIZE", "0"), os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    return int(world) if world.isdigit() else 0, int(restart) if restart.isdigit() else 0


class FrameError(Exception):
    """A frame that is too large or not a message."""


def pack(header: dict[str, Any], body: bytes = b"") -> bytes:
    """One frame: ``header`` as a JSON line, then ``body``."""
    payload = json.dumps(header, separators=(",", ":")).encode() + b"\n" + body
    return HEADER.pack(len(payload)) + payload


def _section(kind: str) -> int:
    """Where ``kind`` goes in a rank's message (a kind meshtop does not know: between)."""
    role = KINDS.get(kind)
    return 1 if role is None else role.section


def event_sections(events: Iterable[Event], encoded: Iterable[EncodedEvents] = ()) -> tuple[list[list[Any]], bytes]:
    """The ``sections`` of a message holding ``events`` and the ``encoded`` blocks, and its body: grouped by
    kind, each kind in the order it was emitted (the events before the blocks), the kinds in
    :attr:`~meshtop.probes.kinds.KindRole.section` order (then in the order they first came)."""
    by_kind: dict[str, list[Event]] = {}
    for event in events:
        by_kind.setdefault(event.kind, []).append(event)
    lines_of: dict[str, list[bytes]] = {kind: [encode_lines(listed)] for kind, listed in by_kind.items()}
    counts = {kind: len(listed) for kind, listed in by_kind.items()}
    for block in encoded:
        lines_of.setdefault(block.kind, []).append(block.lines)
        counts[block.kind] = counts.get(block.kind, 0) + block.count
    kinds = sorted(lines_of, key=_section)  # stable: first come first among equals
    bodies = [b"".join(lines_of[kind]) for kind in kinds]
    return [[kind, counts[kind], len(body)] for kind, body in zip(kinds, bodies, strict=True)], b"".join(bodies)


def read_exactly(sock: socket.socket, count: int) -> bytes | None:
    """``count`` bytes, or ``None`` if the peer closed first."""
    chunks, remaining = [], count
    while remaining:
        chunk = sock.recv(min(remaining, 1 << 20))
        if not chunk:
            return None
        chunks.append(chunk)
        remaining -= len(chunk)
    return b"".join(chunks)


def read_frame(sock: socket.socket, *, max_bytes: int = MAX_FRAME_BYTES) -> tuple[dict[str, Any], memoryview] | None:
    """The next message's header and body, ``None`` at a clean end; :class:`FrameError` for an oversized
    frame or one whose header is not a JSON object."""
    prefix = read_exactly(sock, HEADER.size)
    if prefix is None:
        return None
    payload = read_exactly(sock, frame_length(prefix, max_bytes=max_bytes))
    if payload is None:
        raise FrameError("connection closed inside a frame")
    return split_payload(payload)


def frame_length(prefix: bytes | bytearray | memoryview, *, max_bytes: int = MAX_FRAME_BYTES) -> int:
    """The payload's length that a frame's :data:`HEADER` ``prefix`` says; :class:`FrameError` past ``max_bytes``."""
    (length,) = HEADER.unpack_from(prefix)
    if length > max_bytes:
        raise FrameError(f"frame of {length} bytes is over the {max_bytes}-byte limit")
    return int(length)


def split_payload(data: bytes, start: int = 0, end: int | None = None) -> tuple[dict[str, Any], memoryview]:
    """A frame's payload (``data[start:end]``) as its header (a JSON object, one line) and its body, a view of
    ``data`` (no copy: :func:`sections` copies each block out of it once); :class:`FrameError` if it is not."""
    end = len(data) if end is None else end
    newline = data.find(b"\n", start, end)
    try:
        header = json.loads(data[start : end if newline < 0 else newline])
    except (ValueError, RecursionError) as error:  # not JSON, not UTF-8, too deep, a huge integer
        raise FrameError(f"header not JSON: {type(error).__name__}") from None
    if newline < 0 or not isinstance(header, dict):
        raise FrameError("a message must start with a JSON object and a newline")
    return header, memoryview(data)[newline + 1 : end]


def sections(header: dict[str, Any], body: bytes | memoryview) -> list[EncodedEvents]:
    """The blocks of events that ``body`` holds as ``header`` describes them; a :class:`FrameError` when the
    two disagree (an unknown kind, sizes that do not add up, a block without ``count`` whole lines)."""
    rank, listed = header.get("rank"), header.get("sections")
    if not is_count(rank) or not isinstance(listed, list):
        raise FrameError("a message needs a rank and a list of sections")
    node, clock = header.get("node"), header.get("offset_ns")
    streamed = clock is not None  # a node's blocks, on its clock (meshtop.runner.session.relay)
    if streamed and not (is_count(node) and is_offset(clock)):
        raise FrameError("a node's message needs its node and its clock's offset, in ns")
    for section in listed:
        if not (
            isinstance(section, list)
            and len(section) == 3
            and isinstance(section[0], str)
            and section[0] in EVENT_TYPES
            and is_count(section[1])
            and section[1] > 0
            and is_count(section[2])
        ):
            raise FrameError(f"not a section: {section!r:.80}")
    ends = list(accumulate(nbytes for _, _, nbytes in listed))
    if (said := ends[-1] if ends else 0) != len(body):
        raise FrameError(f"sections of {said} bytes in a body of {len(body)}")
    blocks, offset = [], 0
    for (kind, count, nbytes), end, lines_in in zip(listed, ends, lines_between(body, ends), strict=True):
        if lines_in != count or not nbytes or body[end - 1] != NEWLINE:
            raise FrameError(f"section {kind} does not hold {count} lines in {nbytes} bytes")
        block = bytes(body[offset:end])  # the one copy of a block, a bytes of its own to keep
        blocks.append(
            EncodedEvents(
                kind, rank, block, count, node=node if streamed else None, offset_ns=clock if clock is not None else 0
            )
        )
        offset = end
    return blocks


NEWLINE = ord("\n")
COUNT_WITH_NUMPY_FROM = 64 * 1024
"""Bytes of a body from which its lines are counted by numpy: its compare runs 6 times as fast as
``bytes.count`` (0.12 against 0.76 ms a 1.2 MB node message of 5,000 events; the count was half of the head's
collector's time on a thousand ranks' messages) and lets the interpreter's other threads run meanwhile; below,
its fixed cost (16 us) is more than what it saves."""


def lines_between(body: bytes | memoryview, ends: list[int]) -> list[int]:
    """The newlines in each of ``body[0:ends[0]]``, ``body[ends[0]:ends[1]]``, ... (``ends`` ascending)."""
    if len(body) < COUNT_WITH_NUMPY_FROM:
        small = bytes(body)
        return [small.count(b"\n", start, end) for start, end in zip([0, *ends], ends, strict=False)]
    newlines = np.flatnonzero(np.frombuffer(body, dtype=np.uint8) == NEWLINE)
    return np.diff(np.searchsorted(newlines, ends), prepend=0).tolist()


def is_count(value: object) -> TypeGuard[int]:
    """A non-negative integer (not a bool), as a header's numbers must be."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


MAX_OFFSET_NS = 10**15
"""Clocks further apart than this (11 days) are not two clocks of one job: a node that says so is refused."""


def is_offset(value: object) -> TypeGuard[int]:
    """A clock offset a node may send: an integer of at most :data:`MAX_OFFSET_NS` either way."""
    return isinstance(value, int) and not isinstance(value, bool) and abs(value) <= MAX_OFFSET_NS


def parse_address(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    return host, int(port)
