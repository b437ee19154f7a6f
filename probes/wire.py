"""The telemetry wire: length-prefixed messages from workers to the collector.

A frame is a 4-byte big-endian length and that many bytes of payload. The
payload is a header, one line of JSON,
``{"token": str, "rank": int, "dropped": int, "sections": [[kind, count, nbytes], ...]}``,
then the sections' bytes back to back: each is ``count`` events of ``kind``
as JSON lines (``nbytes`` in all), exactly the lines the recording keeps, so
the collector checks a frame's shape without reading its events.
``dropped`` counts the events the worker's buffer refused since its last message.
"""

from __future__ import annotations

import json
import socket
import struct
from collections.abc import Iterable
from typing import Any

from probes.arrivals import EncodedEvents, encode_lines
from probes.events import EVENT_TYPES, Event

HEADER = struct.Struct(">I")
MAX_FRAME_BYTES = 8 * 1024 * 1024
TOKEN_ENV = "MESHTOP_TOKEN"
NCCL_TIMING_ENV = "TORCH_NCCL_ENABLE_TIMING"
"""Set to 1 by the launcher: nccl then times each operation with CUDA events, which the probes read."""
ADDRESS_ENV = "MESHTOP_COLLECTOR"


class FrameError(Exception):
    """A frame that is too large or not a message."""


def pack(header: dict[str, Any], body: bytes = b"") -> bytes:
    """One frame: ``header`` as a JSON line, then ``body``."""
    payload = json.dumps(header, separators=(",", ":")).encode() + b"\n" + body
    return HEADER.pack(len(payload)) + payload


def encode_events(*, token: str, rank: int, dropped: int, events: Iterable[Event]) -> bytes:
    """A worker's message: ``events`` grouped by kind (each kind in the order it was emitted)."""
    by_kind: dict[str, list[Event]] = {}
    for event in events:
        by_kind.setdefault(event.kind, []).append(event)
    blocks = [(kind, len(kind_events), encode_lines(kind_events)) for kind, kind_events in by_kind.items()]
    header = {"token": token, "rank": rank, "dropped": dropped,
              "sections": [[kind, count, len(lines)] for kind, count, lines in blocks]}
    return pack(header, b"".join(lines for _, _, lines in blocks))


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


def read_frame(sock: socket.socket, *, max_bytes: int = MAX_FRAME_BYTES) -> tuple[dict[str, Any], bytes] | None:
    """The next message's header and body, ``None`` at a clean end; :class:`FrameError` for an oversized
    frame or one whose header is not a JSON object."""
    prefix = read_exactly(sock, HEADER.size)
    if prefix is None:
        return None
    (length,) = HEADER.unpack(prefix)
    if length > max_bytes:
        raise FrameError(f"frame of {length} bytes is over the {max_bytes}-byte limit")
    payload = read_exactly(sock, length)
    if payload is None:
        raise FrameError("connection closed inside a frame")
    head, newline, body = payload.partition(b"\n")
    try:
        header = json.loads(head)
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise FrameError(f"header not JSON: {error}") from None
    if not newline or not isinstance(header, dict):
        raise FrameError("a message must start with a JSON object and a newline")
    return header, body


def sections(header: dict[str, Any], body: bytes) -> list[EncodedEvents]:
    """The blocks of events that ``body`` holds as ``header`` describes them; a :class:`FrameError` when the
    two disagree (an unknown kind, sizes that do not add up, a block without ``count`` whole lines)."""
    rank, listed = header.get("rank"), header.get("sections")
    if not isinstance(rank, int) or not isinstance(listed, list):
        raise FrameError("a message needs an integer rank and a list of sections")
    blocks, offset = [], 0
    for section in listed:
        if not (isinstance(section, list) and len(section) == 3 and isinstance(section[0], str)
                and section[0] in EVENT_TYPES
                and all(isinstance(n, int) and n >= 0 for n in section[1:])):
            raise FrameError(f"not a section: {section!r:.80}")
        kind, count, nbytes = section
        lines = body[offset:offset + nbytes]
        offset += nbytes
        if len(lines) != nbytes or lines.count(b"\n") != count or (count and not lines.endswith(b"\n")):
            raise FrameError(f"section {kind} does not hold {count} lines in {nbytes} bytes")
        blocks.append(EncodedEvents(kind, rank, lines, count))
    if offset != len(body):
        raise FrameError(f"{len(body) - offset} bytes after the last section")
    return blocks


def parse_address(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    return host, int(port)
