"""The HTTP client's sending of a request and reading of its head against real sockets on 127.0.0.1, each
case's answer written out by hand: which failures before the answer's first byte are sent once more (and on a
fresh connection), which are not, and the words each failure is said in; a chunk framed by its hex size; and
the default ports and path prefix an endpoint's URL gives."""

from __future__ import annotations

import asyncio

from meshtop.runner.serving.http import Origin, Pool
from tests.kit.raw_http import RESET, Outcome, read_request, served, stream_once, through_pool

ANSWER_A = b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\ndata: a\n\n"


def test_a_request_reset_before_its_answer_is_sent_twice_then_said_a_reset() -> None:
    """The server resets the connection once it has read the request, twice: the request was not taken, so it
    is sent once more on a new connection (2 connections), and the second reset is the request's failure,
    ``reset`` in the words a user reads."""
    assert served([RESET, RESET]) == (("reset", "connection reset by the server"), 2)


def test_a_head_cut_after_its_first_byte_is_not_sent_again() -> None:
    """The server writes 26 bytes of a head (the status line and half a header) and hangs up: it took the
    request and began its answer, so the request is not sent again (1 connection; a second would have been
    answered ``data: a``) and the cut answer is the request's ``reset``."""
    outcome = served([b"HTTP/1.1 200 OK\r\nContent-Len", ANSWER_A])
    assert outcome == (("reset", "the server closed the connection mid-answer"), 1)


def test_a_head_past_the_readers_line_limit_is_a_protocol_failure_not_sent_again() -> None:
    """A head of 24 bytes and 4 MiB (4,194,304 bytes) of one header, no blank line: over the reader's 4 MiB
    limit on a line, a protocol failure that says so, and not sent again (1 connection; a second would have
    been answered ``data: a``)."""
    head = b"HTTP/1.1 200 OK\r\nX-Pad: " + b"p" * 4_194_304
    assert served([head, ANSWER_A]) == (("protocol", "a line longer than the client's limit"), 1)


def test_a_request_unanswered_on_a_kept_alive_connection_is_sent_again_on_a_new_one() -> None:
    """Two requests at once open two connections, both kept alive after their answer; the server then hangs
    up on any second request on a connection, unanswered (as a server that closed its idle connections at
    the moment they were written to). The third request, on the last connection kept, is not answered and is
    sent once more on a new connection (the third), answered: not on the other kept one, which the server
    hangs up on too."""
    connections = 0

    async def one_answer_each(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal connections
        connections += 1
        try:
            await read_request(reader)
            writer.write(ANSWER_A)
            await writer.drain()
            await read_request(reader)  # a second request: hung up on, unanswered
        except (ConnectionError, asyncio.IncompleteReadError):
            pass  # the client closed it, idle
        finally:
            writer.close()

    async def two_at_once_then_one(pool: Pool) -> list[Outcome]:
        return [*await asyncio.gather(stream_once(pool), stream_once(pool)), await stream_once(pool)]

    assert asyncio.run(through_pool(one_answer_each, two_at_once_then_one)) == [[b"a"], [b"a"], [b"a"]]
    assert connections == 3


def test_a_chunk_is_as_long_as_its_hex_size_says() -> None:
    """A chunk of size ``1a`` (26 bytes: ``data: `` 6, ``abcdefghijklmnopqr`` 18, two newlines 2), then the
    last chunk: the event comes back whole, its 26 bytes read as one chunk, and the chunk after it read as the
    last one (size 0, no trailers)."""
    chunks = b"1a\r\ndata: abcdefghijklmnopqr\n\n\r\n0\r\n\r\n"
    head = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
    assert served([head + chunks]) == ([b"abcdefghijklmnopqr"], 1)


def test_a_url_without_a_port_takes_its_schemes_port() -> None:
    """No port written: 80 for ``http``, 443 for ``https``."""
    assert Origin.parse("http://example.com") == Origin("http", "example.com", 80, "/v1")
    assert Origin.parse("https://example.com") == Origin("https", "example.com", 443, "/v1")


def test_only_slashes_are_stripped_from_the_end_of_a_urls_path() -> None:
    """``/proxy/X/``: its trailing slash goes, the ``X`` before it stays (``/proxy/X``), then ``/v1`` is
    added."""
    assert Origin.parse("http://h:8000/proxy/X/") == Origin("http", "h", 8000, "/proxy/X/v1")
