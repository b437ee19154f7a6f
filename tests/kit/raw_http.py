"""Servers for the HTTP client's tests whose answers are bytes written by hand, on 127.0.0.1: each request the
client streams comes back as its events' payloads, or its failure's kind and message."""

from __future__ import annotations

import asyncio
import socket
import struct
from collections.abc import Awaitable, Callable
from typing import TypeVar

from meshtop.runner.serving.http import Origin, Pool, RequestFailed

Outcome = list[bytes] | tuple[str, str]
"""A streamed request's events (their ``data:`` payloads), or its failure's kind and message."""
RESET = None
"""In :func:`served`'s answers: the connection is reset (TCP RST) once the request is read, no byte written."""
Reply = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]
T = TypeVar("T")


async def read_request(reader: asyncio.StreamReader) -> None:
    """Read one request whole: its head, then the body its ``Content-Length`` gives."""
    head = await reader.readuntil(b"\r\n\r\n")
    for line in head.split(b"\r\n"):
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            await reader.readexactly(int(value))


async def through_pool(reply: Reply, streams: Callable[[Pool], Awaitable[T]]) -> T:
    """What ``streams`` makes of a pool whose server answers each connection with ``reply``."""
    listener = await asyncio.start_server(reply, "127.0.0.1", 0)
    async with listener:
        pool = Pool(Origin.parse(f"http://127.0.0.1:{listener.sockets[0].getsockname()[1]}"))
        try:
            return await streams(pool)
        finally:
            pool.close()


async def stream_once(pool: Pool) -> Outcome:
    """One streamed POST through ``pool``: its outcome."""
    try:
        return [data async for _, data in pool.stream("/completions", {"prompt": "x"})]
    except RequestFailed as error:
        return (error.kind, str(error))


def served(answers: list[bytes | None]) -> tuple[Outcome, int]:
    """One streamed POST to a server whose ``n``-th connection reads the request, writes ``answers[n]`` as it
    is and hangs up (``RESET``: resets it instead; past the list, hangs up at once): the request's outcome, and
    how many connections the server took."""
    connections = 0

    async def reply(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal connections
        connections += 1
        try:
            if connections > len(answers):  # a request sent once too often
                return
            answer = answers[connections - 1]
            await read_request(reader)
            if answer is RESET:  # a linger of 0 s: close() sends RST, not FIN
                writer.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            else:
                writer.write(answer)
                await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            pass  # the client hung up first
        finally:
            writer.close()

    return asyncio.run(through_pool(reply, stream_once)), connections


def answered(answer: bytes) -> Outcome:
    """One streamed POST to a server that reads the request, writes ``answer`` as it is and hangs up."""
    return served([answer])[0]


def kept_alive(*answers: bytes) -> tuple[list[Outcome], int]:
    """Streamed POSTs one after another through one pool, to a server that keeps its connections open and
    writes the next of ``answers`` to each request it reads (whatever the answer's head says), and hangs up once
    the last is written: each request's outcome, and how many connections the server took."""
    left = list(answers)
    connections = 0

    async def reply(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal connections
        connections += 1
        try:
            while left:
                await read_request(reader)
                writer.write(left.pop(0))
                await writer.drain()
        except asyncio.IncompleteReadError:  # the client closed this one
            pass
        finally:
            writer.close()

    async def one_after_another(pool: Pool) -> list[Outcome]:
        return [await stream_once(pool) for _ in answers]

    outcomes = asyncio.run(through_pool(reply, one_after_another))
    return outcomes, connections
