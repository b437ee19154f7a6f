"""The load generator's HTTP client against real sockets, each case's answer written out: the server's words
in an error body, HTTPS spoken from the first byte, a head longer than the header limit, an address that no
connection can reach, and the idle limit at its boundary (a connection idle exactly :data:`IDLE_LIMIT_S` is
still reused: only one idle longer is closed)."""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace

import pytest

from meshtop.runner.serving import http
from meshtop.runner.serving.http import Origin, Pool, RequestFailed, error_message
from tests.kit.sse_server import stub_server


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"\xff bad gateway", "\ufffd bad gateway"),  # a byte that is no UTF-8 is replaced, not an error
        (b'{"message": "overloaded"}', "overloaded"),
        (b"", ""),
        (b" \n ", ""),
        (b"y" * 200, "y" * 200),  # the limit itself: whole
        (b"y" * 201, "y" * 200 + "..."),
    ],
    ids=["not-utf-8", "message", "empty", "blank", "200-chars", "201-chars"],
)
def test_the_servers_words_in_an_error_body(body: bytes, message: str) -> None:
    assert error_message(body) == message


async def failure(url: str) -> RequestFailed:
    """The failure of one streamed POST to ``url``."""
    pool = Pool(Origin.parse(url))
    try:
        async for _ in pool.stream("/completions", {"prompt": "x"}):
            pass
    except RequestFailed as error:
        return error
    finally:
        pool.close()
    raise AssertionError("the request was answered")


def test_an_https_origin_speaks_tls_from_its_first_byte() -> None:
    """A listener that reads the first bytes and hangs up: a TLS record of the handshake (type 22, version 3.x)
    came, not the request's ``POST``; the handshake cut short is a connection not made."""
    first: list[bytes] = []

    async def hang_up(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        first.append(await reader.read(2))
        writer.close()

    async def main() -> RequestFailed:
        listener = await asyncio.start_server(hang_up, "127.0.0.1", 0)
        async with listener:
            return await failure(f"https://127.0.0.1:{listener.sockets[0].getsockname()[1]}")

    error = asyncio.run(main())
    assert first == [b"\x16\x03", b"\x16\x03"]  # sent twice: once more on a fresh connection
    assert error.kind == "refused" and str(error).startswith("cannot connect: ")


def test_a_head_past_the_header_limit_is_said_so() -> None:
    """100 kB of one header: under the reader's 4 MiB line limit, over the 64 KiB a head may take."""

    async def long_head(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\nX-Pad: " + b"p" * 100_000 + b"\r\n\r\n")
        await writer.drain()
        writer.close()

    async def main() -> RequestFailed:
        listener = await asyncio.start_server(long_head, "127.0.0.1", 0)
        async with listener:
            return await failure(f"http://127.0.0.1:{listener.sockets[0].getsockname()[1]}")

    error = asyncio.run(main())
    assert (error.kind, str(error)) == ("protocol", "response headers too large")


def test_an_address_no_connection_reaches_is_a_connection_not_made_in_the_systems_words() -> None:
    """A TCP connect to a multicast address fails at once (Linux: ENETUNREACH): not a refusal, and said so."""
    error = asyncio.run(failure("http://224.0.0.1:9"))
    assert (error.kind, str(error)) == ("refused", "cannot connect: Network is unreachable")


def test_a_connection_idle_exactly_the_limit_is_reused_and_one_idle_longer_is_not(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The pool's monotonic clock set by hand: answers end at 100 s, then 104 s (idle 4.0 s, the limit:
    reused), then 108.5 s (idle 4.5 s: closed, a new one)."""
    now = [100.0]
    monkeypatch.setattr(http, "time", SimpleNamespace(monotonic=lambda: now[0], time_ns=time.time_ns))

    async def spaced() -> list[int]:
        pool = Pool(Origin.parse(server.url))
        connections = []
        for at_s in (100.0, 104.0, 108.5):
            now[0] = at_s
            assert len([data async for _, data in pool.stream("/completions", {"prompt": "x"})]) == 2
            connections.append(server.connections)
        pool.close()
        return connections

    with stub_server(chunks=1) as server:
        assert asyncio.run(spaced()) == [1, 1, 2]
