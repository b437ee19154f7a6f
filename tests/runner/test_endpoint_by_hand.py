"""What ``--endpoint`` asks a server before any load, and each line it says when the answer will not do,
against a real local HTTP server that answers as it is scripted to and keeps what it was sent: the models
listed, the probe request's path, header and body, the messages of a server that cannot be reached, answers
no list or refuses the probe, and the run that ``plan_endpoint`` makes of the options (each field written out)."""

from __future__ import annotations

import json
import socket
import threading
import urllib.request
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field, replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from meshtop.recordings.manifest import Load
from meshtop.runner.errors import PlanError
from meshtop.runner.load import PlannedRequest
from meshtop.runner.serving import endpoint
from meshtop.runner.serving.endpoint import EndpointRun, check_server, plan_endpoint, resolve_endpoint, served_models
from meshtop.runner.serving.http import Origin
from meshtop.runner.serving.load import Prompt
from meshtop.runner.serving.server import ServerCommand
from tests.kit.commands import run_meshtop
from tests.kit.ports import free_port

MODELS = ("GET", "/v1/models")
COMPLETIONS = ("POST", "/v1/completions")
CHAT = ("POST", "/v1/chat/completions")
STREAM = (200, b"data: [DONE]\n\n")
"""A probe's answer: the stream's end at once."""
HANG_UP = None
"""An answer: the connection closed with none."""
LOAD = Load(requests=3, concurrency=1, request_rate_per_s=None)


def listing(*models: str) -> tuple[int, bytes]:
    return 200, json.dumps({"object": "list", "data": [{"id": model, "object": "model"} for model in models]}).encode()


@dataclass(frozen=True)
class Seen:
    """One request as the server read it."""

    method: str
    path: str
    content_type: str | None
    body: bytes


@dataclass
class Scripted:
    answers: dict[tuple[str, str], tuple[int, bytes] | None]
    """``(method, path)``: the status and body, or :data:`HANG_UP` (anything else: 404)."""
    url: str = ""
    seen: list[Seen] = field(default_factory=list)


@contextmanager
def scripted_server(answers: dict[tuple[str, str], tuple[int, bytes] | None]) -> Iterator[Scripted]:
    script = Scripted(answers)

    class Handler(BaseHTTPRequestHandler):
        def answer(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            script.seen.append(Seen(self.command, self.path, self.headers.get("Content-Type"), body))
            found = script.answers.get((self.command, self.path), (404, b'{"detail": "Not Found"}'))
            if found is HANG_UP:
                return
            status, payload = found
            self.send_response(status)
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        do_GET = do_POST = answer

        def log_message(self, format: str, *args: object) -> None:
            pass

    class Server(ThreadingHTTPServer):
        daemon_threads = True

        def handle_error(self, request: object, client_address: object) -> None:
            pass  # a client that stopped reading a long body

    server = Server(("127.0.0.1", 0), Handler)
    script.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, args=(0.01,), daemon=True)
    thread.start()
    try:
        yield script
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


def said(call: object, *args: object, **options: object) -> str:
    """The one line ``call(*args, **options)`` raises as a :class:`PlanError`."""
    with pytest.raises(PlanError) as caught:
        call(*args, **options)  # type: ignore[operator]
    return str(caught.value)


# -- GET /v1/models ----------------------------------------------------------------------------------------


def test_the_models_listed_are_the_ids_of_the_entries_that_have_one() -> None:
    data = [{"id": "a"}, {"object": "model"}, "idle", {"id": 7}]  # no id, no object, an id that is a number
    with scripted_server({MODELS: (200, json.dumps({"object": "list", "data": data}).encode())}) as server:
        assert served_models(Origin.parse(server.url)) == ("a", "7")
    assert server.seen == [Seen("GET", "/v1/models", None, b"")]  # a GET says no Content-Type


PAD = b"x" * (4 << 20)
"""With what is around it, a body past the 4 MiB read of an answer."""
BIG_ERROR_LINE = '{"message": "too big", "pad": "' + "x" * 169 + "..."
"""The first 4 MiB of a 500's body are no JSON: its first line, cut at 200 characters (31 before the pad)."""


@pytest.mark.parametrize(
    ("answer", "message"),
    [
        (
            (404, b'{"detail": "Not Found"}'),
            "--endpoint URL: GET URL/v1/models answered HTTP 404 (Not Found): not an OpenAI-compatible server?",
        ),
        ((200, b"hello"), "--endpoint URL: GET URL/v1/models gave no list of models: not an OpenAI-compatible server?"),
        (
            (200, b'{"data": {"id": "a"}}'),
            "--endpoint URL: GET URL/v1/models gave no list of models: not an OpenAI-compatible server?",
        ),
        (  # a listing of more than 4 MiB is cut where it is read: no JSON
            (200, b'{"data": [{"id": "a"}], "pad": "' + PAD + b'"}'),
            "--endpoint URL: GET URL/v1/models gave no list of models: not an OpenAI-compatible server?",
        ),
        (
            (500, b'{"message": "too big", "pad": "' + PAD + b'"}'),
            f"--endpoint URL: the server failed to answer GET URL/v1/models: HTTP 500 ({BIG_ERROR_LINE}): "
            "its own log says why",
        ),
        (HANG_UP, "--endpoint URL: no answer from URL/v1/models (Remote end closed connection without response)"),
    ],
    ids=["404", "no-json", "no-list", "listing-past-4-MiB", "error-past-4-MiB", "hang-up"],
)
def test_a_models_answer_that_is_not_a_list_of_models_is_one_line(
    answer: tuple[int, bytes] | None, message: str
) -> None:
    with scripted_server({MODELS: answer}) as server:
        assert said(served_models, Origin.parse(server.url)) == message.replace("URL", server.url)


def test_a_server_that_cannot_be_reached_is_said_in_the_systems_words() -> None:
    port = free_port()
    assert said(served_models, Origin.parse(f"127.0.0.1:{port}")) == (
        f"--endpoint http://127.0.0.1:{port}: cannot reach the server (Connection refused): is it running?"
    )


def test_a_proxy_urllib_cannot_speak_is_said_in_urllibs_words(monkeypatch: pytest.MonkeyPatch) -> None:
    """``http_proxy`` set to a SOCKS proxy: urllib has no handler for it, and its error's reason is a string
    (no ``strerror``). The opener urllib keeps reads the proxies once: a fresh one for this test."""
    monkeypatch.setenv("http_proxy", "socks5://127.0.0.1:1080")
    for name in ("no_proxy", "NO_PROXY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(urllib.request, "_opener", None)
    port = free_port()
    assert said(served_models, Origin.parse(f"127.0.0.1:{port}")) == (
        f"--endpoint http://127.0.0.1:{port}: cannot reach the server (unknown url type: socks5): is it running?"
    )


def test_a_server_that_takes_no_connection_in_time_is_said_to_time_out(monkeypatch: pytest.MonkeyPatch) -> None:
    """A listener whose queue of connections is full (it never accepts) drops the next one's SYN: the connect
    times out, an error with no ``strerror`` (its words are ``timed out``)."""
    monkeypatch.setattr(endpoint, "PROBE_TIMEOUT_S", 0.2)
    with ExitStack() as stack:
        listener = stack.enter_context(socket.socket())
        listener.bind(("127.0.0.1", 0))
        listener.listen(0)
        port = listener.getsockname()[1]
        for _ in range(8):  # fill its queue: until a connect is not taken
            waiting = stack.enter_context(socket.socket())
            waiting.settimeout(0.05)
            try:
                waiting.connect(("127.0.0.1", port))
            except TimeoutError:
                break
        assert said(served_models, Origin.parse(f"127.0.0.1:{port}")) == (
            f"--endpoint http://127.0.0.1:{port}: cannot reach the server (timed out): is it running?"
        )


# -- check_server: the model, then one request of the load's shape -----------------------------------------


def test_the_probe_is_one_token_of_hello_to_the_named_model_in_the_loads_api() -> None:
    load = Load(requests=3, concurrency=1, request_rate_per_s=None, ignore_eos=True)
    with scripted_server({MODELS: listing("a", "b"), CHAT: STREAM}) as server:
        run = check_server(plan_endpoint(server.url, api="chat", model="b", load=load))
    assert (run.model, run.models) == ("b", ("a", "b"))
    [models, probe] = server.seen
    assert models == Seen("GET", "/v1/models", None, b"")
    assert (probe.method, probe.path, probe.content_type) == ("POST", "/v1/chat/completions", "application/json")
    assert json.loads(probe.body) == {
        "model": "b",
        "max_tokens": 1,
        "stream": True,
        "stream_options": {"include_usage": True},
        "temperature": 0.0,
        "ignore_eos": True,
        "messages": [{"role": "user", "content": "hello"}],
    }


def test_without_model_the_only_one_listed_is_loaded_and_its_probe_is_a_completion() -> None:
    with scripted_server({MODELS: listing("a"), COMPLETIONS: STREAM}) as server:
        run = check_server(plan_endpoint(server.url, api="completions", model=None, load=LOAD))
    assert (run.model, run.models) == ("a", ("a",))
    assert server.seen[1].path == "/v1/completions"
    assert json.loads(server.seen[1].body) == {
        "model": "a",
        "max_tokens": 1,
        "stream": True,
        "stream_options": {"include_usage": True},
        "temperature": 0.0,
        "prompt": "hello",
    }


def test_the_probes_answer_is_not_read_as_json() -> None:
    """A stream is not JSON; an answer nested deeper than Python's recursion limit passes as any other."""
    with scripted_server({MODELS: listing("a"), COMPLETIONS: (200, b"[" * 100_000)}) as server:
        assert check_server(plan_endpoint(server.url, api="completions", model=None, load=LOAD)).model == "a"


@pytest.mark.parametrize(
    ("models", "model", "message"),
    [
        ((), None, "--endpoint URL: the server lists no models: name the one to load with --model"),
        (("a", "b"), None, "--endpoint URL serves 2 models: pick one with --model (a, b)"),
        (("a", "b"), "c", "--model 'c': URL serves a, b"),
    ],
)
def test_a_model_that_cannot_be_told_or_is_not_served_is_one_line_before_any_probe(
    models: tuple[str, ...], model: str | None, message: str
) -> None:
    with scripted_server({MODELS: listing(*models), COMPLETIONS: STREAM}) as server:
        run = plan_endpoint(server.url, api="completions", model=model, load=LOAD)
        assert said(check_server, run) == message.replace("URL", server.url)
    assert [seen.method for seen in server.seen] == ["GET"]


@pytest.mark.parametrize(
    ("ignore_eos", "answer", "words"),
    [
        (
            True,
            (400, b'{"error": {"message": "unknown field ignore_eos"}}'),
            "HTTP 400: unknown field ignore_eos (drop --ignore-eos: this server does not take it?)",
        ),
        (False, (422, b""), "HTTP 422: no message"),
    ],
)
def test_a_refused_probe_says_the_servers_words_and_the_ignore_eos_hint_only_with_it(
    ignore_eos: bool, answer: tuple[int, bytes], words: str
) -> None:
    load = Load(requests=3, concurrency=1, request_rate_per_s=None, ignore_eos=ignore_eos)
    with scripted_server({MODELS: listing("a"), COMPLETIONS: answer}) as server:
        run = plan_endpoint(server.url, api="completions", model=None, load=load)
        assert (
            said(check_server, run)
            == f"--endpoint {server.url}: the server refused a completions request for 'a': {words}"
        )


def test_a_probe_the_server_hangs_up_on_names_the_url_it_was_posted_to() -> None:
    with scripted_server({MODELS: listing("a"), COMPLETIONS: HANG_UP}) as server:
        run = plan_endpoint(server.url, api="completions", model=None, load=LOAD)
        assert said(check_server, run) == (
            f"--endpoint {server.url}: POST {server.url}/v1/completions failed "
            "(Remote end closed connection without response)"
        )


# -- plan_endpoint: the options checked, the load planned ----------------------------------------------------


@pytest.mark.parametrize(
    ("url", "server_metrics", "message"),
    [
        ("ftp://h", None, "--endpoint: 'ftp://h' is not an http:// or https:// URL with a host"),
        ("http://h:8000", "ftp://m", "--server-metrics: 'ftp://m' is not an http:// or https:// URL with a host"),
        ("http://h:port", "http://m:9090/metrics", "--endpoint: 'http://h:port' has no valid port"),
    ],
)
def test_a_bad_url_names_the_option_that_gave_it(url: str, server_metrics: str | None, message: str) -> None:
    assert said(plan_endpoint, url, api="completions", model=None, load=LOAD, server_metrics=server_metrics) == message


def test_every_option_is_in_the_planned_run_and_given_requests_replace_the_load(tmp_path: Path) -> None:
    """``--same-load``'s requests are the load: the prompts file is not read (here it does not exist)."""
    load = Load(requests=3, concurrency=1, request_rate_per_s=None, prompts=str(tmp_path / "missing.jsonl"))
    again = PlannedRequest(id=0, prompt=Prompt(text="again"), output_len=5, offset_s=None)
    server = ServerCommand(command=("vllm", "serve", "m"))
    run = plan_endpoint(
        "http://h:8000",
        api="chat",
        model=None,
        load=load,
        requests=[again],
        same_load="runs/first",
        server_metrics="http://h:9090/metrics",
        server=server,
    )
    assert run == EndpointRun(
        url="http://h:8000",
        origins=(Origin("http", "h", 8000, "/v1"),),
        api="chat",
        model="",
        models=(),
        load=replace(load, max_batch=1, timeout_s=120.0),  # an endpoint's own: its concurrency, the default timeout
        requests=(again,),
        same_load="runs/first",
        server_metrics="http://h:9090/metrics",
        server=server,
    )
    assert plan_endpoint("http://h:8000", api="chat", model="org/m", load=LOAD).model == "org/m"


def test_the_load_is_planned_from_the_prompts_file_and_chat_prompts_need_the_chat_api(tmp_path: Path) -> None:
    texts, chats = tmp_path / "texts.jsonl", tmp_path / "chats.jsonl"
    texts.write_text('{"prompt": "only"}\n')
    chats.write_text('{"messages": [{"role": "user", "content": "hi"}]}\n')

    def planned(prompts: Path, api: str) -> list[Prompt]:
        load = Load(requests=3, concurrency=1, request_rate_per_s=None, prompts=str(prompts))
        return [request.prompt for request in plan_endpoint("http://h", api=api, model=None, load=load).requests]

    assert planned(texts, "completions") == [Prompt(text="only")] * 3  # one prompt in the file: each request's
    assert planned(texts, "chat") == [Prompt(text="only")] * 3
    assert planned(chats, "chat") == [Prompt(messages=(("user", "hi"),))] * 3
    assert said(planned, chats, "completions") == f"--prompts {chats} holds chat messages: add --api chat"


# -- resolve_endpoint ---------------------------------------------------------------------------------------


def test_resolving_asks_the_server_with_every_option_but_not_a_server_meshtop_starts() -> None:
    with scripted_server({MODELS: listing("a", "b"), CHAT: STREAM}) as server:
        run = resolve_endpoint(server.url, api="chat", model="b", load=LOAD, same_load="runs/first")
    assert (run.api, run.model, run.models, run.same_load) == ("chat", "b", ("a", "b"), "runs/first")
    assert [(seen.method, seen.path) for seen in server.seen] == [MODELS, CHAT]
    started = ServerCommand(command=("vllm", "serve", "m"))
    nobody = f"http://127.0.0.1:{free_port()}"  # asked now, it would be a refusal
    run = resolve_endpoint(nobody, api="chat", model=None, load=LOAD, server=started)
    assert (run.server, run.model, run.models) == (started, "", ())


@contextmanager
def another_service() -> Iterator[str]:
    """A port whose service greets in something other than HTTP (an SSH server's banner), to each connection."""
    listener = socket.create_server(("127.0.0.1", 0))
    done = threading.Event()

    def serve() -> None:
        listener.settimeout(0.02)
        while not done.is_set():
            try:
                connection, _ = listener.accept()
            except TimeoutError:
                continue
            with connection:
                connection.sendall(b"SSH-2.0-OpenSSH_9.6\r\n")

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    finally:
        done.set()
        thread.join()
        listener.close()


def test_a_port_that_does_not_answer_in_http_is_one_line_and_exit_code_2(tmp_path: Path) -> None:
    with another_service() as url:
        assert said(served_models, Origin.parse(url)) == (
            f"--endpoint {url}: {url}/v1/models did not answer in HTTP (SSH-2.0-OpenSSH_9.6): is it the server's port?"
        )
        done = run_meshtop("record", tmp_path / "out", "--endpoint", url, "--requests", "1", timeout_s=60)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.strip().endswith("did not answer in HTTP (SSH-2.0-OpenSSH_9.6): is it the server's port?")
