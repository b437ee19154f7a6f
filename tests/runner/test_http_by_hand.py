"""The load generator's HTTP client against real sockets, each case's answer written out: the server's words
in an error body, HTTPS spoken from the first byte, a head longer than the header limit, an address that no
connection can reach, and the idle limit at its boundary (a connection idle exactly :data:`IDLE_LIMIT_S` is
still reused: only one idle longer is closed)."""

from __future__ import annotations

import asyncio
import socket
import struct
import time
from types import SimpleNamespace

import pytest

from meshtop.runner.serving import http
from meshtop.runner.serving.http import Origin, Pool, RequestFailed, error_message
from tests.kit.raw_http import Outcome, answered, kept_alive, read_request
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


def test_a_head_of_exactly_the_header_limit_is_taken() -> None:
    """A head of 65,536 bytes, the limit itself (17 of status line, 19 of Content-Length, 7 + 65,489 + 2 of
    padding header, 2 of blank line): read, and its one event with it; only a longer head is refused."""
    head = b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\nX-Pad: " + b"p" * 65_489 + b"\r\n\r\n"
    assert answered(head + b"data: a\n\n") == [b"a"]


@pytest.mark.parametrize(
    ("status_line", "body", "outcome"),
    [
        (b"HTTP/1.1 200", b"data: a\n\n", [b"a"]),  # no reason phrase: two parts are enough
        (b"HTTP/1.1 404 Not Found", b'{"detail": "gone"}', ("http", "HTTP 404: gone")),  # a reason of two words
        (b"ICY 200 OK", b"data: a\n\n", ("protocol", "not an HTTP response: 'ICY 200 OK'")),  # no HTTP version
        (b"HTTP/1.1  200 OK", b"data: a\n\n", ("protocol", "not an HTTP response: 'HTTP/1.1  200 OK'")),
        (b"x" * 100, b"", ("protocol", "not an HTTP response: '" + "x" * 80 + "'")),  # its first 80 chars
    ],
    ids=["no-reason", "two-word-reason", "icy", "two-spaces", "100-chars"],
)
def test_a_status_line_is_split_at_its_first_two_spaces(status_line: bytes, body: bytes, outcome: Outcome) -> None:
    """The status line is the version, one space, the status's digits, then anything: a 2xx streams its event,
    another status raises with the server's words, and a line that is not so (no ``HTTP/``, two spaces before
    the status) is named in the failure, cut at 80 characters."""
    answer = status_line + b"\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body
    assert answered(answer) == outcome


def test_a_header_is_named_up_to_its_first_colon() -> None:
    """``Transfer-Encoding: chunked; note="a:b"`` (a quoted parameter may hold a colon) is still chunked: the
    event split over two chunks (``data: hel``, ``lo``) comes back whole, not with the chunks' framing."""
    head = b'HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked; note="a:b"\r\n\r\n'
    assert answered(head + b"9\r\ndata: hel\r\n4\r\nlo\n\n\r\n0\r\n\r\n") == [b"hello"]


CHUNKED_HEAD = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"


@pytest.mark.parametrize(
    ("chunks", "outcome"),
    [
        (b"9;name=value\r\ndata: a\n\n\r\n0\r\n\r\n", [b"a"]),  # a chunk extension: the size is before the ";"
        (b"zz\r\n", ("protocol", "a malformed chunk size")),
        (b"400001\r\n", ("protocol", "a chunk of 4,194,305 bytes, more than 4,194,304")),  # 4 MiB + 1
    ],
    ids=["extension", "not-hex", "over-4-MiB"],
)
def test_a_chunk_size_line(chunks: bytes, outcome: Outcome) -> None:
    """A chunk's size is the hex before any ``;`` extension; one that is no hex, or over 4 MiB, is a protocol
    failure that says so (the size written with thousands separators)."""
    assert answered(CHUNKED_HEAD + chunks) == outcome


def test_a_chunk_of_exactly_4_MiB_is_taken() -> None:
    """A chunk of 0x400000 = 4,194,304 bytes, the limit itself: ``data: a`` and its blank line (9 bytes), then
    a comment line of ``:``, 4,194,293 bytes of padding and its newline: read whole, the event in it kept."""
    chunk = b"data: a\n\n:" + b"p" * 4_194_293 + b"\n"
    assert answered(CHUNKED_HEAD + b"400000\r\n" + chunk + b"\r\n0\r\n\r\n") == [b"a"]


def test_a_body_shorter_than_its_content_length_is_a_reset() -> None:
    """``Content-Length: 50`` and 9 bytes, then the server hangs up: the answer was cut, said as a reset."""
    answer = b"HTTP/1.1 200 OK\r\nContent-Length: 50\r\n\r\ndata: a\n\n"
    assert answered(answer) == ("reset", "the server closed the connection mid-answer")


def test_a_body_with_no_length_runs_to_the_connections_end() -> None:
    """Neither ``Content-Length`` nor chunked: the body is what comes until the server hangs up, both events."""
    assert answered(b"HTTP/1.1 200 OK\r\n\r\ndata: a\n\ndata: b\n\n") == [b"a", b"b"]


@pytest.mark.parametrize(
    "length_header",
    [b"Content-Length: 70029\r\n", b""],  # 9 bytes of "data: a" then the 70,020 below; or until the hang-up
    ids=["content-length", "until-closed"],
)
def test_a_body_is_read_64_KiB_at_a_time(monkeypatch: pytest.MonkeyPatch, length_header: bytes) -> None:
    """Each read of the body takes at most 64 KiB, and each read's events carry its own arrival time (a clock
    that ticks once per read). The server sends ``data: a``, and once it is read, 70,020 bytes: ``data: b`` at
    their start and ``data: c`` ending 70,011 bytes further, all waiting in the client's buffer when the next
    read comes: ``b`` and ``c`` cannot arrive in one read, so their times differ."""
    ticks = iter(range(1, 1000))
    monkeypatch.setattr(http, "time", SimpleNamespace(monotonic=time.monotonic, time_ns=lambda: next(ticks)))
    rest = b"data: b\n\n:" + b"p" * 70_000 + b"\ndata: c\n\n"

    async def main() -> list[tuple[int, bytes]]:
        asked, sent = asyncio.Event(), asyncio.Event()

        async def reply(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await read_request(reader)
            writer.write(b"HTTP/1.1 200 OK\r\n" + length_header + b"\r\ndata: a\n\n")
            await writer.drain()
            await asked.wait()
            writer.transport.set_write_buffer_limits(0)  # drained: every byte handed to the kernel
            writer.write(rest)
            await writer.drain()
            sent.set()
            writer.close()

        listener = await asyncio.start_server(reply, "127.0.0.1", 0)
        async with listener:
            pool = Pool(Origin.parse(f"http://127.0.0.1:{listener.sockets[0].getsockname()[1]}"))
            events = []
            async for at_ns, data in pool.stream("/completions", {"prompt": "x"}):
                events.append((at_ns, data))
                if data == b"a":
                    asked.set()
                    await sent.wait()
                    await asyncio.sleep(0.1)  # the loopback's bytes into the client's buffer, before it reads on
            pool.close()
            return events

    events = asyncio.run(main())
    assert [data for _, data in events] == [b"a", b"b", b"c"]
    assert events[1][0] != events[2][0]


@pytest.mark.parametrize(
    ("head", "message"),
    [
        (b"HTTP/1.1 200 OK\r\nContent-Length: abc\r\n\r\n", "a malformed Content-Length: 'abc'"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: -5\r\n\r\n", "a malformed Content-Length: '-5'"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 1_0\r\n\r\n", "a malformed Content-Length: '1_0'"),
        (
            b"HTTP/1.1 200 OK\r\nContent-Length: " + b"9" * 50 + b"x\r\n\r\n",
            f"a malformed Content-Length: '{'9' * 40}'",
        ),
        (b"HTTP/1.1 \xb200 OK\r\n\r\n", "not an HTTP response: 'HTTP/1.1 \xb200 OK'"),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n-5\r\n", "a malformed chunk size"),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n+5\r\n", "a malformed chunk size"),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n1_0\r\n", "a malformed chunk size"),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n\r\n", "a malformed chunk size"),
    ],
    ids=[
        "length-not-a-number",
        "length-negative",
        "length-underscore",
        "length-quoted-to-40-chars",
        "status-superscript-two",
        "chunk-negative",
        "chunk-plus",
        "chunk-underscore",
        "chunk-empty",
    ],
)
def test_a_number_python_reads_but_http_does_not_is_a_protocol_failure(head: bytes, message: str) -> None:
    """Numbers in an answer's head and chunk sizes are ASCII digits (hex ones for a chunk), where ``int`` also
    takes a sign, underscores and '²' (byte 0xB2 read as latin-1) and ``isdigit`` takes '²'. Read with those
    alone, each would escape the request as a bare ValueError, which ends the whole load (or, for a negative
    length, read to the connection's end): each is the request's own protocol failure."""
    assert answered(head) == ("protocol", message)


def test_chunked_wins_over_any_content_length() -> None:
    """A head with ``Transfer-Encoding: chunked`` and a ``Content-Length: abc`` as well: the chunks are the
    body (RFC 9112 6.3: Transfer-Encoding overrides Content-Length), so the length is never read and its not
    being a number fails nothing; the event comes back."""
    head = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Length: abc\r\n\r\n"
    assert answered(head + b"9\r\ndata: a\n\n\r\n0\r\n\r\n") == [b"a"]


@pytest.mark.parametrize(
    ("status_line", "outcome"),
    [
        (b"HTTP/1.1 299 X", [b"a"]),  # the last 2xx: a success
        (b"HTTP/1.1 300 Multiple Choices", ("http", "HTTP 300: data: a")),  # the first past it: the body's words
    ],
    ids=["299", "300"],
)
def test_a_status_is_a_success_up_to_299(status_line: bytes, outcome: Outcome) -> None:
    """2xx streams its events; 300 is no success, so its body (``data: a`` and a blank line, no JSON) is the
    failure's message, its first line stripped."""
    assert answered(status_line + b"\r\nContent-Length: 9\r\n\r\ndata: a\n\n") == outcome


def test_an_error_with_an_empty_body_says_no_message() -> None:
    """A 503 with ``Content-Length: 0``: the server said nothing, and the failure says so in those words."""
    answer = b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\n\r\n"
    assert answered(answer) == ("http", "HTTP 503: no message")


@pytest.mark.parametrize(
    ("chunks", "message"),
    [
        # '{"detail": ' (11 bytes, 0xb) then '"gone"}' (7): the JSON whole only once both parts are joined
        (b'b\r\n{"detail": \r\n7\r\n"gone"}\r\n', "HTTP 500: gone"),
        # '{"detail": "gone", "pad": "' (27 bytes, 0x1b), then 65,536 p's and '"}' (65,538, 0x10002): only 65,509
        # bytes of the second part fit under the 64 KiB kept, so the JSON is cut and its first 200 chars are said
        (
            b'1b\r\n{"detail": "gone", "pad": "\r\n10002\r\n' + b"p" * 65_536 + b'"}\r\n',
            'HTTP 500: {"detail": "gone", "pad": "' + "p" * 173 + "...",
        ),
    ],
    ids=["two-parts", "past-64-KiB"],
)
def test_an_error_body_is_kept_across_its_parts_up_to_64_KiB(chunks: bytes, message: str) -> None:
    """An error body in two chunks (each chunk one part of the body): the parts are joined, the first 64 KiB
    kept: JSON split over them is read whole, and JSON that runs past 64 KiB is cut there, no longer JSON."""
    head = b"HTTP/1.1 500 Internal Server Error\r\nTransfer-Encoding: chunked\r\n\r\n"
    assert answered(head + chunks + b"0\r\n\r\n") == ("http", message)


@pytest.mark.parametrize(
    ("after", "outcome"),
    [
        (b"\ndata: a\n\n", [b"a"]),  # 4 MiB pending at most: the line ends in the next chunk, its event follows
        (b"p", ("protocol", "an event of more than 4,194,304 bytes")),  # 4 MiB + 1 pending: refused
    ],
    ids=["4-MiB", "4-MiB-and-1"],
)
def test_an_unfinished_line_of_4_MiB_is_waited_on_and_one_longer_is_not(after: bytes, outcome: Outcome) -> None:
    """A first chunk of 0x400000 = 4,194,304 bytes with no newline (``:`` then 4,194,303 of padding): a line
    of exactly 4 MiB not yet ended, the limit itself, kept while the next chunk comes; one byte more without
    a newline is an event past the limit, a protocol failure that says so."""
    first = b"400000\r\n:" + b"p" * 4_194_303 + b"\r\n"
    then = f"{len(after):x}".encode() + b"\r\n" + after + b"\r\n0\r\n\r\n"
    assert answered(CHUNKED_HEAD + first + then) == outcome


@pytest.mark.parametrize(
    ("chunk", "events"),
    [
        (b"data:a\n\n", [b"a"]),  # no space after the colon: the payload starts right after it
        (b"data: MAX\n\n", [b"MAX"]),  # a payload ending in X: only a CR is cut from a line's end
        (b": ping\ndata: a\n\n", [b"a"]),  # a comment first, in the same chunk: skipped, the line after it read
    ],
    ids=["no-space", "ends-in-X", "comment-first"],
)
def test_an_events_lines(chunk: bytes, events: list[bytes]) -> None:
    """One chunk of SSE lines, each case's payloads written out: ``data:`` then the payload, with or without
    a space; any other line (a comment) is skipped and the lines after it in the same part still read."""
    size = f"{len(chunk):x}".encode()
    assert answered(CHUNKED_HEAD + size + b"\r\n" + chunk + b"\r\n0\r\n\r\n") == events


def test_events_after_done_are_read_but_not_yielded_and_the_connection_is_reused() -> None:
    """A first answer whose first chunk holds ``data: a`` and ``data: [DONE]`` (23 bytes, 0x17) and whose second
    chunk holds ``data: b``: ``b`` comes after the end and is not an event, but the rest of the body is read to
    its last chunk, so the connection is clean and the second request (``data: c``, by Content-Length) goes on
    it: one connection in all."""
    first = CHUNKED_HEAD + b"17\r\ndata: a\n\ndata: [DONE]\n\n\r\n9\r\ndata: b\n\n\r\n0\r\n\r\n"
    second = b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\ndata: c\n\n"
    assert kept_alive(first, second) == ([[b"a"], [b"c"]], 1)


@pytest.mark.parametrize(
    ("connection", "connections"),
    [(b"", 1), (b"Connection: Close\r\n", 2)],  # the header's value in any case
    ids=["kept-alive", "close"],
)
def test_a_connection_is_reused_after_a_content_length_unless_the_server_says_close(
    connection: bytes, connections: int
) -> None:
    """Two answers of ``Content-Length: 9`` from a server that keeps its connections open whatever it says:
    a body whose end its length gives leaves the connection ready for the next request (one connection); a
    ``Connection: Close`` is taken at its word (a new connection for the second)."""
    first = b"HTTP/1.1 200 OK\r\n" + connection + b"Content-Length: 9\r\n\r\ndata: a\n\n"
    second = b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\ndata: b\n\n"
    assert kept_alive(first, second) == ([[b"a"], [b"b"]], connections)


def test_a_reset_mid_body_is_said_so() -> None:
    """The server writes its head and a chunk ``data: a``, and once the client has yielded that event closes
    with SO_LINGER 0: a TCP reset (RST), not a FIN, so the client's next read fails with ECONNRESET. The event
    before it came back, and the failure is a reset in those words."""

    async def main() -> tuple[list[bytes], tuple[str, str] | None]:
        yielded = asyncio.Event()

        async def reply(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await read_request(reader)
            writer.write(CHUNKED_HEAD + b"9\r\ndata: a\n\n\r\n")
            await writer.drain()
            await yielded.wait()
            linger = struct.pack("ii", 1, 0)  # on, 0 s: close with a reset
            writer.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, linger)
            writer.transport.abort()

        listener = await asyncio.start_server(reply, "127.0.0.1", 0)
        async with listener:
            pool = Pool(Origin.parse(f"http://127.0.0.1:{listener.sockets[0].getsockname()[1]}"))
            events: list[bytes] = []
            try:
                async for _, data in pool.stream("/completions", {"prompt": "x"}):
                    events.append(data)
                    yielded.set()
            except RequestFailed as error:
                return events, (error.kind, str(error))
            finally:
                pool.close()
            return events, None

    assert asyncio.run(main()) == ([b"a"], ("reset", "connection reset by the server"))


def test_a_chunk_size_line_past_the_readers_limit_is_said_so() -> None:
    """A chunk-size line of ``1;`` then a 4,194,304-byte extension before its CRLF: longer than the 4 MiB the
    reader takes in one line, refused as a line past the client's limit (a protocol failure), not read."""
    assert answered(CHUNKED_HEAD + b"1;" + b"x" * 4_194_304 + b"\r\n") == (
        "protocol",
        "a line longer than the client's limit",
    )


@pytest.mark.parametrize(
    "body",
    [b"data: a\r\rdata: b\r\r", b"data: a\n\rdata: b\r\r\n", b"data: a\r\n\r\ndata: b\n\n"],
    ids=["lone-cr", "mixed", "crlf-and-lf"],
)
def test_an_event_line_ends_at_crlf_lf_or_a_lone_cr(body: bytes) -> None:
    """The SSE format ends a line at CRLF, LF or a lone CR, so each of these bodies holds the events a and b."""
    assert answered(b"HTTP/1.1 200 OK\r\n\r\n" + body) == [b"a", b"b"]


def test_a_crlf_cut_between_two_reads_ends_one_line() -> None:
    """A CR at the end of one chunk and its LF at the start of the next end one line (the blank line it seems
    to leave is skipped): the two events a and b come out whole from a body cut inside each CRLF."""
    parts = [b"data: a\r", b"\n\r", b"\ndata: b\r", b"\n\r\n"]  # "data: a\r\n\r\ndata: b\r\n\r\n", cut in each CRLF
    body = b"".join(b"%x\r\n%s\r\n" % (len(part), part) for part in parts) + b"0\r\n\r\n"
    assert answered(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + body) == [b"a", b"b"]
