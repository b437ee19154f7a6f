"""The telemetry wire: length-prefixed JSON messages from workers to the collector.

A frame is a 4-byte big-endian length and that many bytes of UTF-8 JSON:
``{"token": str, "rank": int, "dropped": int, "events": [record, ...]}``,
``dropped`` counting the events the worker's buffer refused since its last message.
"""

from __future__ import annotations

import json
import socket
import struct
from typing import Any

HEADER = struct.Struct(">I")
MAX_FRAME_BYTES = 8 * 1024 * 1024
TOKEN_ENV = "MESHTOP_TOKEN"
NCCL_TIMING_ENV = "TORCH_NCCL_ENABLE_TIMING"
"""Set to 1 by the launcher: nccl then times each operation with CUDA events, which the probes read."""
ADDRESS_ENV = "MESHTOP_COLLECTOR"


def encode(message: dict[str, Any]) -> bytes:
    payload = json.dumps(message, separators=(",", ":")).encode()
    return HEADER.pack(len(payload)) + payload


class FrameError(Exception):
    """A frame that is too large or not a message."""


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


def read_frame(sock: socket.socket, *, max_bytes: int = MAX_FRAME_BYTES) -> dict[str, Any] | None:
    """The next message, ``None`` at a clean end; :class:`FrameError` for an oversized or malformed one."""
    header = read_exactly(sock, HEADER.size)
    if header is None:
        return None
    (length,) = HEADER.unpack(header)
    if length > max_bytes:
        raise FrameError(f"frame of {length} bytes is over the {max_bytes}-byte limit")
    payload = read_exactly(sock, length)
    if payload is None:
        raise FrameError("connection closed inside a frame")
    try:
        message = json.loads(payload)
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise FrameError(f"not JSON: {error}") from None
    if not isinstance(message, dict):
        raise FrameError("a message must be a JSON object")
    return message


def parse_address(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    return host, int(port)
