"""A small asyncio HTTP/1.1 client for the load generator: one pool of keep-alive connections, a streamed
POST whose Server-Sent Events arrive one ``data:`` payload at a time, each with the moment it was read.

Written for the load generator's needs rather than taken from a general client: it adds nothing between a
byte's arrival and its timestamp, it never buffers a stream, and everything it reads is bounded (a status
line, the headers, an event, an error body), so a misbehaving server costs one request, not the client.
Plain HTTP and HTTPS (the system's default certificates). A connection is not reused past
:data:`IDLE_LIMIT_S` idle, before a server closes it on its side.
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
HEX_DIGITS = b"0123456789abcdefABCDEF"
ERROR_MESSAGE_CHARS = 200
IDLE_LIMIT_S = 4.0
"""A kept-alive connection idle longer than this is closed, not reused. uvicorn (which ``transformers serve``,
vLLM and SGLang run on) closes a connection idle for 5 s (its ``timeout_keep_alive``); a request written as
the server closes it is lost on the way (the server never read it). Closing ours a second earlier leaves the
event loop's and the scheduler's slack on our side of that race."""


class RequestFailed(Exception):
    """A request that ended without its answer: ``kind`` is ``http``, ``timeout``, ``refused``, ``reset`` or
    ``protocol``; the message is the line a user reads."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


class _Unanswered(RequestFailed):
    """Refused, or reset before any byte of the answer came back: the server did not take the request."""


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

    @property
    def root(self) -> str:
        """The endpoint as ``--endpoint`` takes it: the base and any path before ``/v1`` (``http://h:8000/v2``),
        what a message names."""
        return f"{self.base}{self.prefix.removesuffix('/v1')}"

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


@dataclass(slots=True)
class _Connection:
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    idle_since: float = 0.0
    """When its last answer ended (``time.monotonic()``)."""

    def close(self) -> None:
        self.writer.close()


class Pool:
    """Keep-alive connections to one origin, reused by the requests that follow (the one idle the shortest
    first), none idle past :data:`IDLE_LIMIT_S`."""

    def __init__(self, origin: Origin) -> None:
        self.origin = origin
        self._idle: list[_Connection] = []
        """Oldest first: a connection goes idle at the end and is taken from there."""
        self._ssl = ssl.create_default_context() if origin.scheme == "https" else None

    async def _connect(self, *, fresh: bool = False) -> _Connection:
        """An idle connection the server has not closed and that has not idled past the limit, else a new one
        (``fresh``: a new one whatever is idle)."""
        now = time.monotonic()
        while self._idle and not fresh:
            connection = self._idle.pop()
            if now - connection.idle_since > IDLE_LIMIT_S:  # and those under it, idle longer still
                for stale in (connection, *self._idle):
                    stale.close()
                self._idle.clear()
            elif connection.reader.at_eof():  # the server closed it already
                connection.close()
            else:
                return connection
        try:
            reader, writer = await asyncio.open_connection(
                self.origin.host, self.origin.port, ssl=self._ssl, limit=MAX_EVENT_BYTES
            )
        except OSError as error:  # asyncio says a refusal of every address as an OSError of ECONNREFUSED
            if isinstance(error, ConnectionRefusedError) or error.errno == errno.ECONNREFUSED:
                raise _Unanswered("refused", "connection refused") from None
            raise _Unanswered("refused", f"cannot connect: {error.strerror or error}") from None
        return _Connection(reader, writer)

    def close(self) -> None:
        for connection in self._idle:
            connection.close()
        self._idle.clear()

    async def stream(self, path: str, body: dict[str, object]) -> AsyncIterator[tuple[int, bytes]]:
        """POST ``body`` as JSON to ``path`` (under the prefix) and yield each SSE ``data:`` payload with
        ``time.time_ns()`` as it was read, up to ``[DONE]`` or the stream's end.

        The request is written when the first item is asked for; the caller times its send right before.
        One the server did not take (refused, or reset before any byte of its answer) is sent once more on a
        fresh connection. A status other than 2xx raises :class:`RequestFailed` with the server's message.
        """
        payload = json.dumps(body).encode()
        head = (
            f"POST {self.origin.prefix}{path} HTTP/1.1\r\nHost: {self.origin.host}:{self.origin.port}\r\n"
            f"Content-Type: application/json\r\nAccept: text/event-stream\r\nContent-Length: {len(payload)}\r\n\r\n"
        ).encode()
        connection, status, headers = await self._exchange(head + payload)
        reusable = False
        try:
            chunked = "chunked" in headers.get("transfer-encoding", "").lower()
            length = _content_length(headers) if not chunked else None
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
                # SSE ends a line at CRLF, LF or a lone CR: a CRLF reads as a line end and a blank line, and blank
                # lines are skipped below
                *lines, pending = pending.replace(b"\r", b"\n").split(b"\n")
                if len(pending) > MAX_EVENT_BYTES:
                    raise RequestFailed("protocol", f"an event of more than {MAX_EVENT_BYTES:,} bytes")
                for line in lines:
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
                connection.idle_since = time.monotonic()
                self._idle.append(connection)
            else:
                connection.close()

    async def _exchange(self, request: bytes) -> tuple[_Connection, int, dict[str, str]]:
        """Write ``request`` and read its answer's status line and headers: the connection, the status, the
        headers.

        A request refused, or reset before any byte of its answer came back, is sent once more on a fresh
        connection: a kept-alive connection the server closed as we wrote to it ends so (a server closes idle
        connections on its own clock, and never read the request), while a server that is gone refuses the
        second too.
        """
        try:
            return await self._send_once(request, fresh=False)
        except _Unanswered:
            return await self._send_once(request, fresh=True)

    async def _send_once(self, request: bytes, *, fresh: bool) -> tuple[_Connection, int, dict[str, str]]:
        connection = await self._connect(fresh=fresh)
        try:
            connection.writer.write(request)
            await connection.writer.drain()
            status, headers = await _read_head(connection.reader)
        except (ConnectionResetError, BrokenPipeError):
            connection.close()
            raise _Unanswered("reset", "connection reset by the server") from None
        except asyncio.IncompleteReadError as error:
            connection.close()
            kind = RequestFailed if error.partial else _Unanswered
            raise kind("reset", "the server closed the connection mid-answer") from None
        except asyncio.LimitOverrunError:
            connection.close()
            raise RequestFailed("protocol", "a line longer than the client's limit") from None
        except BaseException:  # a malformed head, a timeout, a stop (cancelled): not sent again
            connection.close()
            raise
        return connection, status, headers


async def _read_head(reader: asyncio.StreamReader) -> tuple[int, dict[str, str]]:
    raw = await reader.readuntil(b"\r\n\r\n")
    if len(raw) > MAX_HEADER_BYTES:
        raise RequestFailed("protocol", "response headers too large")
    lines = raw.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ", 2)
    if len(parts) < 2 or not parts[0].startswith("HTTP/") or not _is_decimal(parts[1]):
        raise RequestFailed("protocol", f"not an HTTP response: {lines[0][:80]!r}")
    headers = {}
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if sep:
            headers[name.strip().lower()] = value.strip()
    return int(parts[1]), headers


def _is_decimal(text: str) -> bool:
    """Whether ``text`` is a number as HTTP writes one: ASCII digits only (``str.isdigit`` also takes '²',
    which ``int`` refuses)."""
    return text.isascii() and text.isdigit()


def _content_length(headers: dict[str, str]) -> int | None:
    """The body's length as its head gives it, or None where it runs to the connection's end."""
    if "content-length" not in headers:
        return None
    value = headers["content-length"]
    if not _is_decimal(value):
        raise RequestFailed("protocol", f"a malformed Content-Length: {value[:40]!r}")
    return int(value)


async def _body(reader: asyncio.StreamReader, *, chunked: bool, length: int | None) -> AsyncIterator[tuple[bytes, int]]:
    """The body's bytes as they arrive, each part with its arrival time."""
    if chunked:
        while True:
            size_line = await reader.readuntil(b"\r\n")
            digits = size_line.split(b";")[0].strip()
            if not digits or digits.strip(HEX_DIGITS):  # int() would also take a sign and underscores
                raise RequestFailed("protocol", "a malformed chunk size")
            size = int(digits, 16)
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
