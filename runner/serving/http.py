"""A small asyncio HTTP/1.1 client for the load generator: one pool of keep-alive connections, a streamed
POST whose Server-Sent Events arrive one ``data:`` payload at a time, each with the moment it was read.

Written for the load generator's needs rather than taken from a general client: it adds nothing between a
byte's arrival and its timestamp, it never buffers a stream, and everything it reads is bounded (a status
line, the headers, an event, an error body), so a misbehaving server costs one request, not the client.
Plain HTTP and HTTPS (the system's default certificates).
"""

from __future__ import annotations

import asyncio
import errno
import json
import ssl
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from urllib.parse import urlsplit

MAX_HEADER_BYTES = 64 << 10
MAX_EVENT_BYTES = 4 << 20
"""One SSE line (a token's chunk is a few hundred bytes; a final one with logprobs can be large)."""
MAX_ERROR_BODY = 64 << 10
ERROR_MESSAGE_CHARS = 200


class RequestFailed(Exception):
    """A request that ended without its answer: ``kind`` is ``http``, ``timeout``, ``refused``, ``reset`` or
    ``protocol``; the message is the line a user reads."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


@dataclass(frozen=True, slots=True)
class Origin:
    """Where the server is: scheme, host, port, and the API's path prefix (``/v1``)."""

    scheme: str
    host: str
    port: int
    prefix: str

    @classmethod
    def parse(cls, url: str) -> Origin:
        """``http://host:port`` or ``http://host:port/v1`` (``/v1`` is added when absent); ``ValueError``."""
        parts = urlsplit(url if "://" in url else f"http://{url}")
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"{url!r} is not an http:// or https:// URL with a host")
        try:
            port = parts.port or (443 if parts.scheme == "https" else 80)
        except ValueError:
            raise ValueError(f"{url!r} has no valid port") from None
        path = parts.path.rstrip("/")
        prefix = path if path.endswith("/v1") else f"{path}/v1"
        return cls(parts.scheme, parts.hostname, port, prefix)

    @property
    def base(self) -> str:
        """``http://host:port`` (no prefix)."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.scheme}://{host}:{self.port}"

    def url(self, path: str) -> str:
        return f"{self.base}{self.prefix}{path}"


def error_message(body: bytes) -> str:
    """The server's own words in an error body: OpenAI's ``error.message``, FastAPI's ``detail``, a
    ``message``, else the body's first line."""
    text = body.decode("utf-8", "replace").strip()
    try:
        parsed = json.loads(text)
    except ValueError:
        parsed = None
    if isinstance(parsed, dict):
        inner = parsed.get("error")
        for found in (
            inner.get("message") if isinstance(inner, dict) else inner,
            parsed.get("detail"),
            parsed.get("message"),
        ):
            if isinstance(found, str) and found:
                text = found
                break
            if found:
                text = json.dumps(found)
                break
    line = text.splitlines()[0] if text else ""
    return line[:ERROR_MESSAGE_CHARS] + ("..." if len(line) > ERROR_MESSAGE_CHARS else "")


class _Connection:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    def close(self) -> None:
        self.writer.close()


class Pool:
    """Keep-alive connections to one origin, reused by the requests that follow."""

    def __init__(self, origin: Origin) -> None:
        self.origin = origin
        self._idle: list[_Connection] = []
        self._ssl = ssl.create_default_context() if origin.scheme == "https" else None

    async def _connect(self) -> _Connection:
        if self._idle:
            return self._idle.pop()
        try:
            reader, writer = await asyncio.open_connection(
                self.origin.host, self.origin.port, ssl=self._ssl, limit=MAX_EVENT_BYTES
            )
        except OSError as error:  # asyncio says a refusal of every address as an OSError of ECONNREFUSED
            if isinstance(error, ConnectionRefusedError) or error.errno == errno.ECONNREFUSED:
                raise RequestFailed("refused", "connection refused") from None
            raise RequestFailed("refused", f"cannot connect: {error.strerror or error}") from None
        return _Connection(reader, writer)

    def close(self) -> None:
        for connection in self._idle:
            connection.close()
        self._idle.clear()

    async def stream(self, path: str, body: dict[str, object]) -> AsyncIterator[tuple[int, bytes]]:
        """POST ``body`` as JSON to ``path`` (under the prefix) and yield each SSE ``data:`` payload with
        ``time.time_ns()`` as it was read, up to ``[DONE]`` or the stream's end.

        The request is written when the first item is asked for; the caller times its send right before.
        A status other than 2xx raises :class:`RequestFailed` with the server's message.
        """
        payload = json.dumps(body).encode()
        head = (
            f"POST {self.origin.prefix}{path} HTTP/1.1\r\nHost: {self.origin.host}:{self.origin.port}\r\n"
            f"Content-Type: application/json\r\nAccept: text/event-stream\r\nContent-Length: {len(payload)}\r\n\r\n"
        ).encode()
        connection = await self._connect()
        reusable = False
        try:
            connection.writer.write(head + payload)
            await connection.writer.drain()
            status, headers = await _read_head(connection.reader)
            chunked = "chunked" in headers.get("transfer-encoding", "").lower()
            length = int(headers["content-length"]) if "content-length" in headers and not chunked else None
            body_bytes = _body(connection.reader, chunked=chunked, length=length)
            if not 200 <= status < 300:
                received = bytearray()
                async for part, _ in body_bytes:
                    received += part[: MAX_ERROR_BODY - len(received)]
                raise RequestFailed("http", f"HTTP {status}: {error_message(bytes(received)) or 'no message'}")
            pending = b""
            done = False
            async for part, at_ns in body_bytes:
                if done:
                    continue  # read the rest of the body, so the connection can be reused
                pending += part
                *lines, pending = pending.split(b"\n")
                if len(pending) > MAX_EVENT_BYTES:
                    raise RequestFailed("protocol", f"an event of more than {MAX_EVENT_BYTES:,} bytes")
                for line in lines:
                    line = line.rstrip(b"\r")
                    if not line.startswith(b"data:"):
                        continue  # comments, event names, blank separators
                    data = line[5:].strip()
                    if data == b"[DONE]":
                        done = True
                        break
                    yield at_ns, data
            reusable = headers.get("connection", "").lower() != "close" and (chunked or length is not None)
        except (ConnectionResetError, BrokenPipeError):
            raise RequestFailed("reset", "connection reset by the server") from None
        except asyncio.IncompleteReadError:
            raise RequestFailed("reset", "the server closed the connection mid-answer") from None
        except asyncio.LimitOverrunError:
            raise RequestFailed("protocol", "a line longer than the client's limit") from None
        finally:
            if reusable:
                self._idle.append(connection)
            else:
                connection.close()


async def _read_head(reader: asyncio.StreamReader) -> tuple[int, dict[str, str]]:
    raw = await reader.readuntil(b"\r\n\r\n")
    if len(raw) > MAX_HEADER_BYTES:
        raise RequestFailed("protocol", "response headers too large")
    lines = raw.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ", 2)
    if len(parts) < 2 or not parts[0].startswith("HTTP/") or not parts[1].isdigit():
        raise RequestFailed("protocol", f"not an HTTP response: {lines[0][:80]!r}")
    headers = {}
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if sep:
            headers[name.strip().lower()] = value.strip()
    return int(parts[1]), headers


async def _body(reader: asyncio.StreamReader, *, chunked: bool, length: int | None) -> AsyncIterator[tuple[bytes, int]]:
    """The body's bytes as they arrive, each part with its arrival time."""
    if chunked:
        while True:
            size_line = await reader.readuntil(b"\r\n")
            try:
                size = int(size_line.split(b";")[0].strip(), 16)
            except ValueError:
                raise RequestFailed("protocol", "a malformed chunk size") from None
            if size > MAX_EVENT_BYTES:
                raise RequestFailed("protocol", f"a chunk of {size:,} bytes, more than {MAX_EVENT_BYTES:,}")
            if size == 0:
                while (await reader.readuntil(b"\r\n")) != b"\r\n":  # trailers
                    pass
                return
            data = await reader.readexactly(size)
            yield data, time.time_ns()
            await reader.readexactly(2)
    elif length is not None:
        left = length
        while left:
            data = await reader.read(min(left, 1 << 16))
            if not data:
                raise asyncio.IncompleteReadError(b"", left)
            left -= len(data)
            yield data, time.time_ns()
    else:
        while data := await reader.read(1 << 16):
            yield data, time.time_ns()
