"""A minimal OpenAI-style streaming server on asyncio (no model): ``/v1/models`` lists one model and
``/v1/completions`` or ``/v1/chat/completions`` stream ``chunks`` chunks of one token each, the first
``first_s`` after the request (a prefill), the others ``gap_s`` apart, then at once a usage chunk and
``[DONE]``, chunked and kept alive (closed once idle ``keep_alive_s``, as uvicorn closes them). For the HTTP
client's tests and the load generator's benchmarks, where the server must cost next to nothing and its timing
be known; the serving tests use a real ``transformers serve``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

MODEL = "stub-model"


@dataclass
class StubServer:
    chunks: int = 8
    gap_s: float = 0.0
    first_s: float = 0.0
    status: int = 200
    """Answer every POST with this status (an error body when not 200)."""
    close_after: int | None = None
    """Close the connection after this many chunks of each stream (a crash mid-answer)."""
    metrics: Callable[[], bytes] | None = None
    """What ``GET /metrics`` answers (404 without)."""
    models: tuple[str, ...] = (MODEL,)
    """What ``GET /v1/models`` lists (any model is served)."""
    models_status: int = 200
    """``GET /v1/models``'s status (a plain-text error body when not 200)."""
    keep_alive_s: float | None = None
    """Close a connection that waits this long for its next request (uvicorn's ``timeout_keep_alive``, 5 s by
    default; ``None``: never)."""
    usage: bool = True
    """End each stream with a usage chunk (``False``: a server that reports no token counts)."""
    unanswered: frozenset[int] = frozenset()
    """The POSTs (numbered from 1 as they come) whose connection is closed as they arrive, unanswered: a
    request written to a connection as its server closed it."""
    serial: bool = False
    """Answer one POST at a time, the others waiting their turn (an engine of one slot: its queue grows while the
    load asks more than it answers); :attr:`waiting` counts them."""
    waiting: int = 0
    lock: asyncio.Lock | None = None
    port: int = 0
    connections: int = 0
    requests: int = 0
    posts: int = 0
    closed_idle: int = 0
    """Connections closed for waiting past ``keep_alive_s``."""
    bodies: list[dict[str, object]] = field(default_factory=list)
    handlers: set[asyncio.Task[None]] = field(default_factory=set)

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        task = asyncio.current_task()
        assert task is not None
        self.handlers.add(task)
        try:
            while True:
                try:
                    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), self.keep_alive_s)
                except asyncio.TimeoutError:
                    self.closed_idle += 1
                    return
                lines = head.decode("latin-1").split("\r\n")
                method, path = lines[0].split(" ")[:2]
                headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
                body = await reader.readexactly(int(headers.get("content-length", "0")))
                self.requests += 1
                if method == "GET":
                    if path == "/metrics":
                        status, payload = (200, self.metrics()) if self.metrics is not None else (404, b"not found")
                    elif self.models_status != 200:
                        status, payload = self.models_status, b"Internal Server Error"
                    else:
                        status = 200
                        data = [{"id": model, "object": "model"} for model in self.models]
                        payload = json.dumps({"object": "list", "data": data}).encode()
                    writer.write(
                        f"HTTP/1.1 {status} X\r\nContent-Type: text/plain\r\n".encode()
                        + f"Content-Length: {len(payload)}\r\n\r\n".encode()
                        + payload
                    )
                    await writer.drain()
                    continue
                request = json.loads(body)
                self.bodies.append(request)
                self.posts += 1
                if self.posts in self.unanswered:
                    return
                if self.status != 200:
                    payload = json.dumps({"error": {"message": "stub refuses", "code": self.status}}).encode()
                    writer.write(
                        f"HTTP/1.1 {self.status} Nope\r\nContent-Length: {len(payload)}\r\n\r\n".encode() + payload
                    )
                    await writer.drain()
                    continue
                async with self._turn():  # one at a time where serial
                    writer.write(
                        b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
                    )
                    chat = "messages" in request
                    await writer.drain()
                    for index in range(self.chunks):
                        if self.close_after is not None and index == self.close_after:
                            writer.close()
                            return
                        wait_s = self.first_s if index == 0 else self.gap_s
                        if wait_s:
                            await asyncio.sleep(wait_s)
                        choice = {"delta": {"content": f"t{index}"}} if chat else {"text": f"t{index}"}
                        self._event(writer, {"choices": [{"index": 0, **choice}]})
                        await writer.drain()
                    if self.usage:
                        usage = {"prompt_tokens": 3, "completion_tokens": self.chunks, "total_tokens": 3 + self.chunks}
                        self._event(writer, {"choices": [], "usage": usage})
                    data = b"data: [DONE]\n\n"
                    writer.write(f"{len(data):x}\r\n".encode() + data + b"\r\n0\r\n\r\n")
                    await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.CancelledError):
            pass
        finally:
            writer.close()
            self.handlers.discard(task)

    @contextlib.asynccontextmanager
    async def _turn(self) -> AsyncIterator[None]:
        """A serial stub's turn to answer (waited for, counted in :attr:`waiting`); at once otherwise."""
        if not self.serial:
            yield
            return
        self.lock = self.lock or asyncio.Lock()
        self.waiting += 1
        try:
            await self.lock.acquire()
        finally:
            self.waiting -= 1
        try:
            yield
        finally:
            self.lock.release()

    @staticmethod
    def _event(writer: asyncio.StreamWriter, payload: dict[str, object]) -> None:
        data = b"data: " + json.dumps(payload).encode() + b"\n\n"
        writer.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


@contextmanager
def stub_server(*, listen_port: int = 0, **options: object) -> Iterator[StubServer]:
    """A :class:`StubServer` on a thread of its own, on ``listen_port`` (0: a free port), until the block ends."""
    server = StubServer(**options)  # type: ignore[arg-type]
    loop = asyncio.new_event_loop()
    started = threading.Event()
    holder: list[asyncio.Server] = []

    async def start() -> None:
        listening = await asyncio.start_server(server.handle, "127.0.0.1", listen_port)
        server.port = listening.sockets[0].getsockname()[1]
        holder.append(listening)
        started.set()

    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    asyncio.run_coroutine_threadsafe(start(), loop)
    started.wait(10)
    try:
        yield server
    finally:

        async def stop() -> None:
            holder[0].close()
            for task in list(server.handlers):  # the connections still open: closed while the loop runs
                task.cancel()
            await asyncio.gather(*server.handlers, return_exceptions=True)

        asyncio.run_coroutine_threadsafe(stop(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()


def main(argv: list[str]) -> None:
    """``python -m tests.kit.sse_server [CHUNKS [GAP_MS [FIRST_MS]]] [--serial] [--port PORT]``: serve on PORT (else
    a free port, printed first) until killed, in a process of its own (the benchmarks: the server must not share
    the measuring process's GIL; the serving tests: a server that can be killed, or one meshtop starts).
    ``--serial``: one request at a time (a capacity of 1 / (FIRST + (CHUNKS - 1) x GAP) requests a second), its
    waiting requests at ``/metrics`` as vLLM's ``vllm:num_requests_waiting`` gauge."""
    port = 0
    if "--port" in argv:
        at = argv.index("--port")
        port, argv = int(argv[at + 1]), argv[:at] + argv[at + 2 :]
    serial = "--serial" in argv
    argv = [arg for arg in argv if arg != "--serial"]
    chunks, gap_ms, first_ms = [*(float(value) for value in argv[:3]), *(8.0, 0.0, 0.0)[len(argv[:3]) :]]
    options = {"chunks": int(chunks), "gap_s": gap_ms / 1e3, "first_s": first_ms / 1e3, "serial": serial}
    with stub_server(listen_port=port, **options) as server:
        if serial:
            server.metrics = lambda: waiting_gauge(server)
        print(server.port, flush=True)
        threading.Event().wait()


def waiting_gauge(server: StubServer) -> bytes:
    """A serial stub's queue as vLLM publishes it (Prometheus text)."""
    running = 1 if server.lock is not None and server.lock.locked() else 0
    return (
        "# TYPE vllm:num_requests_waiting gauge\n"
        f'vllm:num_requests_waiting{{model_name="{MODEL}"}} {server.waiting}\n'
        "# TYPE vllm:num_requests_running gauge\n"
        f'vllm:num_requests_running{{model_name="{MODEL}"}} {running}\n'
    ).encode()


if __name__ == "__main__":
    import sys

    main(sys.argv[1:])
