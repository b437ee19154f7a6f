"""The load generator (``runner/serving/client.py``) against bodies, counts and texts worked out by hand: what it
posts for each API and prompt shape, what each streamed event counts for, what a request's event and the load's
status file say when a request completes, fails each way, is refused or is stopped, when the server is taken for
gone, and when an open loop sends each request.

The server is real (asyncio, on the test's own event loop), each answer scripted by the prompt it answers; the
load runs as the load generator's process runs it (:func:`main_async`: the load's file in, events and the status
file out)."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import socket
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import pytest

from meshtop.probes.events import Event, RequestDone
from meshtop.probes.sink import EventSink
from meshtop.runner.load import PlannedRequest
from meshtop.runner.serving.client import ClientSpec, chunk_text, main_async, request_body
from meshtop.runner.serving.load import LoadRequest, Prompt, request_to_json

MS = 1_000_000
GONE = "5 requests in a row were refused"
TLS_CERT = """-----BEGIN CERTIFICATE-----
MIIBXTCCAQKgAwIBAgIBATAKBggqhkjOPQQDAjAUMRIwEAYDVQQDDAkxMjcuMC4w
LjEwIBcNMjAwMTAxMDAwMDAwWhgPMjEyMDAxMDEwMDAwMDBaMBQxEjAQBgNVBAMM
CTEyNy4wLjAuMTBZMBMGByqGSM49AgEGCCqGSM49AwEHA0IABLpKI+hWHPDo9vH9
4VMWz+GLkVLW9JTyH9JaZvNmkHb/S0Dvf99Eigy5SXazR6rBdcqNO5IAgHjGOjoU
srljMEWjQzBBMA8GA1UdEwEB/wQFMAMBAf8wHQYDVR0OBBYEFEo4iDVSCe2crv5+
maHHN1Q0LOhRMA8GA1UdEQQIMAaHBH8AAAEwCgYIKoZIzj0EAwIDSQAwRgIhAK/k
6VikRdne90M5SzAWtWM4fziYvsK8ttxRg5AaS3I3AiEAk85L8QxZYLinK748ULGS
NFkqlbutWpgGvMdAh7G4vOk=
-----END CERTIFICATE-----
"""
"""A throwaway self-signed certificate for 127.0.0.1, valid 2020 to 2120 (``openssl ca -selfsign``, P-256)."""
TLS_KEY = """-----BEGIN PRIVATE KEY-----
MIGHAgEAMBMGByqGSM49AgEGCCqGSM49AwEHBG0wawIBAQQgTyDEu703bnf/KJKS
d3KlKohcv6lx7JaEzV2/2WpwgwOhRANCAAS6SiPoVhzw6Pbx/eFTFs/hi5FS1vSU
8h/SWmbzZpB2/0tA73/fRIoMuUl2s0eqwXXKjTuSAIB4xjo6FLK5YzBF
-----END PRIVATE KEY-----
"""

Step = str | float | Callable[[], None]


def text(token: str) -> str:
    """A completions chunk of one token's text."""
    return json.dumps({"choices": [{"index": 0, "text": token}]})


@dataclass(frozen=True)
class Answer:
    """What the server answers one prompt."""

    steps: tuple[Step, ...] = ()
    """In order: a streamed ``data:`` event (str), a pause in seconds (float), an action (called); ``[DONE]``
    follows."""
    status: int = 200
    """Not 200: this status and an OpenAI-style error body, then the connection closed."""
    cut: bool = False
    """The status line only, then the connection closed: a server that died as it began its answer."""
    bare: bytes = b""
    """Written on the connection under its TLS, as they are (no TLS record): the client's TLS fails."""


class ScriptedServer:
    """An OpenAI-style streaming server whose answer to each POST is the one scripted for its prompt (the
    completions ``prompt`` or the last chat message), and which can stop and start listening on its port."""

    def __init__(self, answers: dict[str, Answer] | None = None, *, tls: ssl.SSLContext | None = None) -> None:
        self.answers = answers or {}
        self.tls = tls
        self.posts: list[tuple[str, dict[str, object]]] = []
        """Each POST's path and JSON body, as they came."""
        with socket.socket() as probe:  # a port of our own, nothing listening on it until listen()
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        self._socket: socket.socket | None = None
        self._server: asyncio.AbstractServer | None = None
        self._starting: asyncio.Task[None] | None = None
        self._handlers: set[asyncio.Task[None]] = set()

    @property
    def url(self) -> str:
        return f"{'https' if self.tls else 'http'}://127.0.0.1:{self.port}"

    def listen(self) -> None:
        """Take connections from now on: listening at once (the kernel holds a connection until the loop
        accepts it), so a request sent right after is not refused."""
        self._socket = socket.socket()
        self._socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._socket.bind(("127.0.0.1", self.port))
        self._socket.listen(64)

        async def serve(listening: socket.socket) -> None:
            self._server = await asyncio.start_server(self.handle, sock=listening, ssl=self.tls)

        self._starting = asyncio.get_running_loop().create_task(serve(self._socket))  # kept: a task is held weakly

    def stop_listening(self) -> None:
        """Refuse new connections from now on; those open go on."""
        if self._server is not None:
            self._server.close()
        elif self._socket is not None:
            self._socket.close()
        self._server = self._socket = None

    async def close(self) -> None:
        self.stop_listening()
        for task in list(self._handlers):
            task.cancel()
        await asyncio.gather(*self._handlers, return_exceptions=True)

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._handlers.add(task)
        try:
            while True:
                head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1")
                length = re.search(r"Content-Length: (\d+)", head)
                assert length is not None
                body = json.loads(await reader.readexactly(int(length[1])))
                self.posts.append((head.split(" ")[1], body))
                prompt = body["prompt"] if "prompt" in body else body["messages"][-1]["content"]
                answer = self.answers.get(prompt, Answer(status=404))
                if answer.bare:
                    os.write(writer.get_extra_info("socket").fileno(), answer.bare)
                    await reader.read()  # until the client closes
                    return
                if answer.cut:
                    writer.write(b"HTTP/1.1 200 OK\r\n")
                    await writer.drain()
                    return
                if answer.status != 200:
                    error = json.dumps({"error": {"message": f"no answer to {prompt!r}"}}).encode()
                    writer.write(f"HTTP/1.1 {answer.status} X\r\nContent-Length: {len(error)}\r\n\r\n".encode() + error)
                    await writer.drain()
                    return
                writer.write(
                    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
                )
                for step in (*answer.steps, "[DONE]"):
                    if isinstance(step, float):
                        await asyncio.sleep(step)
                    elif isinstance(step, str):
                        data = f"data: {step}\n\n".encode()
                        writer.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
                        await writer.drain()
                    else:
                        step()
                writer.write(b"0\r\n\r\n")
                await writer.drain()
        except (asyncio.IncompleteReadError, OSError, asyncio.CancelledError):
            pass
        finally:
            writer.close()
            self._handlers.discard(task)


class Collected(EventSink):
    """The load generator's events in the order it emitted them; ``after_each`` sees them after each."""

    def __init__(self, after_each: Callable[[list[RequestDone]], None] | None = None) -> None:
        self.events: list[RequestDone] = []
        self.after_each = after_each

    def emit(self, event: Event) -> None:
        assert isinstance(event, RequestDone)
        self.events.append(event)
        if self.after_each is not None:
            self.after_each(self.events)


@dataclass
class Ran:
    finished: bool
    events: list[RequestDone]
    status: dict[str, object]

    def by_id(self) -> dict[int, RequestDone]:
        return {event.request: event for event in self.events}


def run_load(
    tmp_path: Path,
    server: ScriptedServer,
    requests: list[LoadRequest],
    *,
    listening: bool = True,
    after_each: Callable[[list[RequestDone]], None] | None = None,
    **spec_changes: object,
) -> Ran:
    """``requests`` written to the load's file and run by :func:`main_async` against ``server`` (listening from
    the start, or not), one client unless ``spec_changes`` say otherwise."""
    load_file, status_file = tmp_path / "load.jsonl", tmp_path / "status.json"
    load_file.write_text("".join(json.dumps(request_to_json(request)) + "\n" for request in requests))
    fields: dict[str, object] = {
        "urls": (server.url,), "api": "completions", "model": "m", "concurrency": 1, "timeout_s": 5.0,
        "ignore_eos": False, "requests_path": str(load_file), "status_path": str(status_file),
    }  # fmt: skip
    spec = ClientSpec(**{**fields, **spec_changes})  # type: ignore[arg-type]
    sink = Collected(after_each)

    async def whole_load() -> bool:
        if listening:
            server.listen()
        try:
            return await main_async(spec, sink)
        finally:
            await server.close()

    finished = asyncio.run(whole_load())
    status = json.loads(status_file.read_text())
    assert (status.pop("failed_by_replica"), status.pop("gone_replicas")) == ({}, [])  # one server: no replicas
    return Ran(finished, sink.events, status)


def asked(request_id: int, prompt: str, *, offset_s: float | None = None, warmup: bool = False) -> LoadRequest:
    return PlannedRequest(id=request_id, prompt=Prompt(text=prompt), output_len=4, offset_s=offset_s, warmup=warmup)


def assert_well_formed(event: RequestDone) -> None:
    """What every event of the load generator holds, whatever came of its request: rank 0 (the load generator),
    replica 0, no token ids, sent after it was scheduled, its tokens in order between its send and its end."""
    assert (event.rank, event.replica, event.output_ids) == (0, 0, ())
    assert isinstance(event.scheduled_ns, int) and isinstance(event.arrival_ns, int)
    assert event.scheduled_ns <= event.arrival_ns <= event.end_ns
    assert event.first_token_ns == (event.token_ns[0] if event.token_ns else None)
    assert list(event.token_ns) == sorted(event.token_ns)
    assert all(event.arrival_ns <= at_ns <= event.end_ns for at_ns in event.token_ns)


# -- the bodies ------------------------------------------------------------------------------------------------


def test_each_api_gets_a_streamed_greedy_body_with_the_prompt_in_its_own_shape() -> None:
    spec = ClientSpec(
        urls=("http://h:8000",), api="completions", model="m", concurrency=1, timeout_s=5.0, ignore_eos=False,
        requests_path="", status_path="",
    )  # fmt: skip
    common = {"model": "m", "max_tokens": 16, "stream": True, "stream_options": {"include_usage": True}}
    chat = (("system", "Be brief."), ("user", "Say hi"))

    def body(prompt: Prompt, **changes: object) -> tuple[str, dict[str, object]]:
        return request_body(
            replace(spec, **changes),  # type: ignore[arg-type]
            PlannedRequest(id=0, prompt=prompt, output_len=16, offset_s=None),
        )

    assert body(Prompt(text="Say hi")) == ("/completions", {**common, "temperature": 0.0, "prompt": "Say hi"})
    # chat messages sent to completions: their contents, a line each
    assert body(Prompt(messages=chat)) == (
        "/completions",
        {**common, "temperature": 0.0, "prompt": "Be brief.\nSay hi"},
    )
    assert body(Prompt(messages=chat), api="chat", ignore_eos=True) == (
        "/chat/completions",
        {
            **common,
            "temperature": 0.0,
            "ignore_eos": True,
            "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Say hi"}],
        },
    )
    # a text sent to chat is the user's message, an empty one too (a load.jsonl line may hold {"prompt": ""})
    assert body(Prompt(text=""), api="chat")[1]["messages"] == [{"role": "user", "content": ""}]


def test_a_chunk_of_reasoning_is_text_and_one_of_a_finish_reason_is_none() -> None:
    assert chunk_text({"choices": [{"index": 0, "delta": {"reasoning": "hm"}}]}) == "hm"
    assert chunk_text({"choices": [{"index": 0, "finish_reason": "stop"}]}) == ""


# -- what a request comes to ------------------------------------------------------------------------------------


def test_each_request_comes_to_the_event_and_the_count_its_answer_makes(tmp_path: Path) -> None:
    """One client, in order: a warmup (recorded, not counted), then one request for each way an answer can go.
    The server's usage counts win over the chunks unless they are not counts (negative, true, 2.5)."""
    usage = '{"choices": [], "usage": {"prompt_tokens": %s, "completion_tokens": %s}}'
    answers = {
        "warm": Answer((text("w"),)),
        "usage": Answer((text("a"), text("b"), '{"usage": {"prompt_tokens": 7, "completion_tokens": 5}}')),
        # a non-object event is skipped, an error beside choices is no error, a finish reason is no token
        "odd": Answer(("42", '{"choices": [{"text": "c"}], "error": null}', '{"choices": [{"finish_reason": "x"}]}')),
        "error object": Answer((text("d"), '{"error": {"message": "out of memory"}}', text("never"))),
        "error text": Answer(('{"error": "overloaded"}',)),
        "not json": Answer(("x" * 100,)),
        "zero": Answer((text("e"), usage % (4, 0))),
        "not counts": Answer((text("f"), text("g"), usage % (-1, "true"))),
        "not whole": Answer((text("h"), usage % (2.5, 3.0))),
    }
    server = ScriptedServer(answers)
    requests = [asked(0, "warm", warmup=True)] + [asked(i, prompt) for i, prompt in enumerate(list(answers)[1:], 1)]
    ran = run_load(tmp_path, server, requests)

    assert ran.finished
    assert [path for path, _ in server.posts] == ["/v1/completions"] * 9
    assert [body["prompt"] for _, body in server.posts] == list(answers)
    assert server.posts[1][1] == {
        "model": "m", "max_tokens": 4, "stream": True, "stream_options": {"include_usage": True}, "temperature": 0.0,
        "prompt": "usage",
    }  # fmt: skip
    assert [event.request for event in ran.events] == list(range(9))
    for event in ran.events:
        assert_well_formed(event)
    outcomes = [
        (e.status, e.error_kind, e.error, e.prompt_tokens, e.output_tokens, e.tokens_from, len(e.token_ns), e.warmup)
        for e in ran.events
    ]
    assert outcomes == [
        ("completed", None, None, 0, 1, "chunks", 1, True),
        ("completed", None, None, 7, 5, "usage", 2, False),  # 5 by the server's count, 2 chunks with text
        ("completed", None, None, 0, 1, "chunks", 1, False),
        ("failed", "http", "the server's stream ended in an error: out of memory", 0, 1, "chunks", 1, False),
        ("failed", "http", "the server's stream ended in an error: overloaded", 0, 0, "chunks", 0, False),
        ("failed", "protocol", "a streamed event that is not JSON: b'" + "x" * 80 + "'", 0, 0, "chunks", 0, False),
        ("completed", None, None, 4, 0, "usage", 1, False),  # 0 is a count
        ("completed", None, None, 0, 2, "chunks", 2, False),  # -1 and true are not
        ("completed", None, None, 0, 1, "chunks", 1, False),  # nor 2.5 and 3.0
    ]
    # 8 of the load's own (the warmup left out): 5 completed, 2 http, 1 protocol
    assert ran.status == {
        "sent": 8, "by_kind": {"completed": 5, "http": 2, "protocol": 1}, "stopped": False, "gone": None,
        "not_sent": 0,
    }  # fmt: skip


def test_a_chat_request_goes_to_chat_completions_and_its_reasoning_chunks_are_tokens(tmp_path: Path) -> None:
    role = '{"choices": [{"delta": {"role": "assistant"}}]}'
    reasoning = '{"choices": [{"delta": {"reasoning": "hm"}}]}'
    content = '{"choices": [{"delta": {"content": "because"}}]}'
    server = ScriptedServer({"Why?": Answer((role, reasoning, content))})
    chat = Prompt(messages=(("system", "Be brief."), ("user", "Why?")))
    ran = run_load(tmp_path, server, [PlannedRequest(id=0, prompt=chat, output_len=4, offset_s=None)], api="chat")
    [(path, body)] = server.posts
    assert path == "/v1/chat/completions"
    assert body["messages"] == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Why?"}]
    [event] = ran.events
    assert (event.status, event.output_tokens, event.tokens_from, len(event.token_ns)) == ("completed", 2, "chunks", 2)


# -- a server that is gone --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Refusals:
    """``requests`` requests, one at a time, to a port that listens only while the ``between``-th request (from 1)
    is sent, answered with ``answer``."""

    requests: int
    between: int | None
    answer: Answer
    status: dict[str, object]
    between_error: str | None = None


REFUSALS = {
    # the 5th refusal in a row is the last request sent: 5 sent, 1 not
    "five in a row": Refusals(6, None, Answer(), {"sent": 5, "by_kind": {"refused": 5}, "gone": GONE, "not_sent": 1}),
    "four in a row": Refusals(4, None, Answer(), {"sent": 4, "by_kind": {"refused": 4}, "gone": None, "not_sent": 0}),
    # a connection cut is no answer: the refusals before it and after it make 3 + 2 = 5 in a row
    "a reset between": Refusals(
        7,
        4,
        Answer(cut=True),
        {"sent": 6, "by_kind": {"refused": 5, "reset": 1}, "gone": GONE, "not_sent": 1},
        "the server closed the connection mid-answer",
    ),
    # an error is an answer: 4, then 4 more in a row, never 5
    "an error between": Refusals(
        9,
        5,
        Answer(status=503),
        {"sent": 9, "by_kind": {"refused": 8, "http": 1}, "gone": None, "not_sent": 0},
        "HTTP 503: no answer to 'between'",
    ),
}


@pytest.mark.parametrize("case", REFUSALS.values(), ids=REFUSALS.keys())
def test_the_server_is_gone_after_5_refusals_in_a_row_that_no_answer_broke(tmp_path: Path, case: Refusals) -> None:
    server = ScriptedServer({"between": case.answer})

    def port_open_for_the_one_between(events: list[RequestDone]) -> None:
        if case.between is not None and len(events) == case.between - 1:
            server.listen()
        elif case.between is not None and len(events) == case.between:
            server.stop_listening()

    requests = [asked(i, "between" if i + 1 == case.between else "q") for i in range(case.requests)]
    before_ns = time.time_ns()
    ran = run_load(tmp_path, server, requests, listening=False, after_each=port_open_for_the_one_between)
    assert ran.status == {**case.status, "stopped": False}
    for event in ran.events:
        assert_well_formed(event)
        assert before_ns <= event.arrival_ns
    refused = [event for event in ran.events if event.error_kind == "refused"]
    assert {(e.status, e.error, e.token_ns, e.output_tokens) for e in refused} == {
        ("failed", "connection refused", (), 0)
    }
    if case.between is not None:
        assert ran.events[case.between - 1].error == case.between_error


def test_a_stopped_load_reports_its_request_in_flight_as_interrupted(tmp_path: Path) -> None:
    """SIGTERM while the first of two requests streams: it is reported interrupted, the second is not sent."""
    stop = Answer((text("a"), 0.02, lambda: os.kill(os.getpid(), signal.SIGTERM), 5.0))
    server = ScriptedServer({"stopped": stop, "after": Answer((text("b"),))})
    ran = run_load(tmp_path, server, [asked(0, "stopped"), asked(1, "after")])
    assert not ran.finished
    assert ran.status == {"sent": 1, "by_kind": {"interrupted": 1}, "stopped": True, "gone": None, "not_sent": 1}
    [event] = ran.events
    assert_well_formed(event)
    assert (event.request, event.status, event.error_kind) == (0, "failed", "interrupted")
    assert (event.error, len(event.token_ns)) == ("interrupted: the load was stopped", 1)


# -- the open loop ----------------------------------------------------------------------------------------------


def test_an_open_loop_sends_each_request_at_its_offset_up_to_the_duration(tmp_path: Path) -> None:
    """Two warmups (one at a time, each answered in 20 ms), then the load's own at 0 s, 1 s overdue, 30 ms (the
    duration: still sent) and 31 ms (past it). The schedule is the start plus the offset, to the nanosecond."""
    server = ScriptedServer({"warm": Answer((0.02, text("w"))), "own": Answer((text("o"),))})
    requests = [
        asked(0, "warm", warmup=True),
        asked(1, "warm", warmup=True),
        asked(2, "own", offset_s=0.0),
        asked(3, "own", offset_s=-1.0),
        asked(4, "own", offset_s=0.03),
        asked(5, "own", offset_s=0.031),
    ]
    ran = run_load(tmp_path, server, requests, concurrency=None, duration_s=0.03)
    sent = ran.by_id()
    assert sorted(sent) == [0, 1, 2, 3, 4]
    for event in ran.events:
        assert_well_formed(event)
    assert sent[1].arrival_ns >= sent[0].end_ns  # the warmup one at a time
    start_ns = sent[2].scheduled_ns
    assert start_ns is not None
    assert (sent[3].scheduled_ns, sent[4].scheduled_ns) == (start_ns - 1_000_000_000, start_ns + 30 * MS)
    assert sent[4].arrival_ns >= sent[4].scheduled_ns - MS // 10  # slept until its offset (0.1 ms: two clocks)
    assert ran.status == {"sent": 3, "by_kind": {"completed": 3}, "stopped": False, "gone": None, "not_sent": 0}


def test_an_open_loop_stops_sending_when_the_server_is_gone_and_waits_for_the_request_in_flight(
    tmp_path: Path,
) -> None:
    """The warmup leaves a kept-alive connection and the server stops listening: the first request is answered
    on it (in 150 ms), the next five are refused (in a few ms), and the last (due at 100 ms) is not sent."""
    server = ScriptedServer({"warm": Answer((text("w"),)), "slow": Answer((0.15, text("s")))})
    requests = [asked(0, "warm", warmup=True), asked(1, "slow", offset_s=0.0)]
    requests += [asked(i, "q", offset_s=0.0) for i in range(2, 7)] + [asked(7, "q", offset_s=0.1)]

    def no_new_connections_after_the_warmup(events: list[RequestDone]) -> None:
        if len(events) == 1:
            server.stop_listening()

    ran = run_load(tmp_path, server, requests, concurrency=None, after_each=no_new_connections_after_the_warmup)
    assert ran.status == {
        "sent": 6, "by_kind": {"completed": 1, "refused": 5}, "stopped": False, "gone": GONE, "not_sent": 1,
    }  # fmt: skip
    assert ran.events[-1].request == 1 and ran.events[-1].status == "completed"


def test_a_tls_failure_mid_answer_is_a_lost_connection_in_tls_words(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An https server whose answer is bytes that are no TLS record: the client's TLS fails as it reads (an
    ``OSError`` of its own, neither a reset nor a refusal): the request failed, the connection lost."""
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    cert.write_text(TLS_CERT)
    key.write_text(TLS_KEY)
    monkeypatch.setenv("SSL_CERT_FILE", str(cert))  # the client's default certificates: this one
    tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    tls.load_cert_chain(cert, key)
    server = ScriptedServer({"q": Answer(bare=b"HTTP/1.1 200 OK\r\n\r\n")}, tls=tls)
    ran = run_load(tmp_path, server, [asked(0, "q")])
    [event] = ran.events
    assert_well_formed(event)
    assert (event.status, event.error_kind, event.token_ns) == ("failed", "reset", ())
    # OpenSSL's words: "[SSL: WRONG_VERSION_NUMBER] wrong version number (_ssl.c:2580)" in OpenSSL 3.0
    assert event.error is not None and re.fullmatch(r"connection lost: \[SSL: [A-Z_]+\] \w.*", event.error)
    assert ran.status == {"sent": 1, "by_kind": {"reset": 1}, "stopped": False, "gone": None, "not_sent": 0}


def test_an_open_loop_stopped_between_two_sends_reports_its_request_in_flight_as_interrupted(tmp_path: Path) -> None:
    """SIGTERM 20 ms into request 0's answer, while the open loop waits to send request 1 at 0.5 s: request 0
    is reported interrupted before the load's status is written (sent 1, not sent 1)."""
    stop = Answer((text("a"), 0.02, lambda: os.kill(os.getpid(), signal.SIGTERM), 5.0))
    server = ScriptedServer({"stopped": stop, "later": Answer((text("b"),))})
    load = [asked(0, "stopped", offset_s=0.0), asked(1, "later", offset_s=0.5)]
    ran = run_load(tmp_path, server, load, concurrency=None)
    assert not ran.finished
    assert ran.status == {"sent": 1, "by_kind": {"interrupted": 1}, "stopped": True, "gone": None, "not_sent": 1}
    [event] = ran.events
    assert (event.request, event.error_kind) == (0, "interrupted")
