"""The load generator: ``python -m meshtop.runner.serving.client SPEC``, a process of its own beside meshtop.

It sends the planned requests of the load (``load.jsonl``, written by meshtop) to the endpoint, streamed,
and ships one :class:`~meshtop.probes.events.RequestDone` per request to meshtop's collector, as a rank's
shipper does (rank 0 is the load generator). It runs apart from the dashboard's event loop and from the
recording's writes, so neither delays a send, and its own lag (when a request was sent against when it
was meant to be) is measured on every request.

Replicas (several URLs): request ``id`` goes to replica ``id % replicas``, so the same load sends the same
request to the same replica, each replica with its own pool of connections, and each report names its
replica. A replica that is gone (refusals, as below) keeps its share of the requests: each is sent, refused and
counted as a failure of that replica, as a round-robin balancer in front of the replicas would fail them, and
the load goes on to the live ones; the load stops for a gone server only once every replica is gone.

It ends with exit code 0 when the load ran to its end (whatever the server answered) or stopped because the
server is gone (:data:`GONE_AFTER_REFUSALS`; every replica), 130 when it was stopped (SIGINT or SIGTERM: the
requests in flight are reported as interrupted), and writes what happened to ``SPEC``'s ``status`` file: requests sent,
completed, failed by kind, not sent, and why the server is gone where it is.
"""

from __future__ import annotations

import asyncio
import json
import signal
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from meshtop.probes.events import CLIENT_RANK, RequestDone
from meshtop.probes.shipper import open_sink
from meshtop.probes.sink import EventSink
from meshtop.recordings.typed_json import dump, load
from meshtop.runner.serving.http import Origin, Pool, RequestFailed
from meshtop.runner.serving.load import LoadRequest, request_from_json

INTERRUPTED = 130
GONE_AFTER_REFUSALS = 5
"""Requests refused in a row (each tried twice: :class:`~meshtop.runner.serving.http.Pool`) after which the
server is gone: nothing listens on its port any more, and the rest of the load is not sent to it. A live
server under load does not refuse (a full backlog drops a connection, it does not refuse it); a request the
server answered in between, even with an error, starts the count again (a connection reset does not: a
server that dies resets the requests it had)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ClientSpec:
    """What the load generator is told: where, which API and model, and the load's file."""

    urls: tuple[str, ...]
    """Each replica's base URL with its API prefix; one for a single server."""
    api: str
    model: str
    concurrency: int | None
    timeout_s: float
    ignore_eos: bool
    requests_path: str
    status_path: str
    duration_s: float | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class LoadStatus:
    """The spec's ``status_path``: how the load ended, written as the load generator ends."""

    sent: int
    """The load's own requests sent (the warmup left out)."""
    by_kind: dict[str, int]
    """Those by how they ended: ``completed``, or the failure's kind."""
    stopped: bool
    gone: str | None
    """Why the server is taken for gone, where it is."""
    not_sent: int
    """The load's own requests never sent (none where the load is sent for a duration: it is those sent)."""
    failed_by_replica: dict[str, int] = field(default_factory=dict)
    """The load's own requests that failed, by replica index (replicas only)."""
    gone_replicas: tuple[int, ...] = ()
    """The replicas taken for gone, while others still answered (replicas only)."""


def request_body(spec: ClientSpec, request: LoadRequest) -> tuple[str, dict[str, object]]:
    """The path and JSON body of ``request`` for the spec's API: streamed, greedy, usage asked for."""
    body: dict[str, object] = {
        "model": spec.model,
        "max_tokens": request.output_len,
        "stream": True,
        "stream_options": {"include_usage": True},
        "temperature": 0.0,
    }
    if spec.ignore_eos:
        body["ignore_eos"] = True
    prompt = request.prompt
    if spec.api == "chat":
        messages = prompt.messages if prompt.messages is not None else (("user", prompt.text or ""),)
        body["messages"] = [{"role": role, "content": content} for role, content in messages]
        return "/chat/completions", body
    body["prompt"] = (
        prompt.text if prompt.text is not None else "\n".join(content for _, content in prompt.messages or ())
    )
    return "/completions", body


def chunk_text(payload: dict[str, object]) -> str:
    """The generated text a streamed chunk carries (completions' ``text``, chat's ``delta`` content or
    reasoning); empty for a chunk of role, finish reason or usage only."""
    choices = payload.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        return ""
    choice = choices[0]
    if isinstance(choice.get("text"), str):
        return choice["text"]
    delta = choice.get("delta")
    if isinstance(delta, dict):
        return "".join(
            delta[key] for key in ("content", "reasoning_content", "reasoning") if isinstance(delta.get(key), str)
        )
    return ""


@dataclass(slots=True)
class Outcome:
    """What one request came to, as the client saw it."""

    sent_ns: int = 0
    token_ns: list[int] = field(default_factory=list)
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    end_ns: int = 0


class LoadGenerator:
    def __init__(self, spec: ClientSpec, sink: EventSink) -> None:
        self.spec = spec
        self.sink = sink
        self.pools = [Pool(Origin.parse(url)) for url in spec.urls]
        self.counts: Counter[str] = Counter()
        self.failed_by_replica: Counter[int] = Counter()
        self.refused_in_a_row = [0] * len(self.pools)
        self.gone: str | None = None
        """Why the server (every replica) is taken for gone (then no more requests are sent), once it is."""

    def replica(self, request: LoadRequest) -> int:
        """The replica ``request`` goes to: round-robin by its id (the same load, the same replica)."""
        return request.id % len(self.pools)

    @property
    def gone_replicas(self) -> tuple[int, ...]:
        """The replicas whose last :data:`GONE_AFTER_REFUSALS` requests or more were refused."""
        return tuple(i for i, refused in enumerate(self.refused_in_a_row) if refused >= GONE_AFTER_REFUSALS)

    def close(self) -> None:
        for pool in self.pools:
            pool.close()

    async def send(self, request: LoadRequest, scheduled_ns: int) -> None:
        """Send ``request`` to its replica, time it, and ship its event (completed or failed)."""
        path, body = request_body(self.spec, request)
        pool = self.pools[self.replica(request)]
        outcome = Outcome()
        error: RequestFailed | None = None
        try:
            if sys.version_info >= (3, 11):  # in place: wait_for's own task would cost the send a loop turn
                async with asyncio.timeout(self.spec.timeout_s):
                    await self._stream(pool, path, body, outcome)
            else:
                await asyncio.wait_for(self._stream(pool, path, body, outcome), self.spec.timeout_s)
        except RequestFailed as failure:
            error = failure
        except asyncio.TimeoutError:
            error = RequestFailed("timeout", f"timeout: no full answer in {self.spec.timeout_s:g} s")
        except asyncio.CancelledError:
            self._report(
                request, scheduled_ns, outcome, RequestFailed("interrupted", "interrupted: the load was stopped")
            )
            raise
        except OSError as failure:
            error = RequestFailed("reset", f"connection lost: {failure.strerror or failure}")
        self._report(request, scheduled_ns, outcome, error)

    async def _stream(self, pool: Pool, path: str, body: dict[str, object], outcome: Outcome) -> None:
        outcome.sent_ns = time.time_ns()
        async for at_ns, data in pool.stream(path, body):
            try:
                payload = json.loads(data)
            except ValueError:
                raise RequestFailed("protocol", f"a streamed event that is not JSON: {data[:80]!r}") from None
            if not isinstance(payload, dict):
                continue
            if "error" in payload and "choices" not in payload:
                inner = payload["error"]
                message = inner.get("message") if isinstance(inner, dict) else inner
                raise RequestFailed("http", f"the server's stream ended in an error: {message}")
            if chunk_text(payload):
                outcome.token_ns.append(at_ns)
            usage = payload.get("usage")
            if isinstance(usage, dict):
                outcome.prompt_tokens = _count(usage.get("prompt_tokens"))
                outcome.completion_tokens = _count(usage.get("completion_tokens"))
        outcome.end_ns = time.time_ns()

    def _report(self, request: LoadRequest, scheduled_ns: int, outcome: Outcome, error: RequestFailed | None) -> None:
        if not outcome.sent_ns:  # stopped before _stream began (wait_for's task on Python 3.10 not yet run)
            outcome.sent_ns = time.time_ns()
        end = outcome.end_ns or time.time_ns()
        counted = outcome.completion_tokens
        from_usage = counted is not None
        replica = self.replica(request)
        self.counts["completed" if error is None else error.kind] += 0 if request.warmup else 1
        if error is not None and not request.warmup:
            self.failed_by_replica[replica] += 1
        if error is not None and error.kind == "refused":
            self.refused_in_a_row[replica] += 1
            if min(self.refused_in_a_row) >= GONE_AFTER_REFUSALS and self.gone is None:
                self.gone = f"{self.refused_in_a_row[replica]} requests in a row were refused" + (
                    " by every replica" if len(self.pools) > 1 else ""
                )
        elif error is None or error.kind not in ("reset", "interrupted"):  # the server answered, so it is there
            self.refused_in_a_row[replica] = 0
        self.sink.emit(
            RequestDone(
                rank=CLIENT_RANK,
                replica=replica,
                request=request.id,
                arrival_ns=outcome.sent_ns,
                first_token_ns=outcome.token_ns[0] if outcome.token_ns else None,
                end_ns=end,
                prompt_tokens=outcome.prompt_tokens or 0,
                output_tokens=counted if counted is not None else len(outcome.token_ns),
                token_ns=tuple(outcome.token_ns),
                output_ids=(),
                status="completed" if error is None else "failed",
                error=None if error is None else str(error),
                error_kind=None if error is None else error.kind,
                scheduled_ns=scheduled_ns,
                warmup=request.warmup,
                tokens_from="usage" if from_usage else "chunks",
            )
        )

    async def closed_loop(self, requests: list[LoadRequest], clients: int, *, until: float | None = None) -> None:
        """``clients`` clients, each sending its next request as soon as its last is answered (none after
        ``until``, a monotonic time)."""
        queue = iter(requests)

        async def client() -> None:
            for request in queue:  # one iterator shared: each client takes the next request
                if self.gone is not None or (until is not None and time.monotonic() >= until):
                    return
                await self.send(request, time.time_ns())

        await asyncio.gather(*(client() for _ in range(min(clients, len(requests)))))

    async def open_loop(self, requests: list[LoadRequest]) -> None:
        """Each request sent at its offset, whatever is in flight."""
        start_ns, start = time.time_ns(), time.monotonic()
        tasks: list[asyncio.Task[None]] = []
        try:
            for request in requests:
                offset = request.offset_s or 0.0
                if self.spec.duration_s is not None and offset > self.spec.duration_s:
                    break  # due after the load's duration: not part of it
                delay = start + offset - time.monotonic()
                if delay > 0:
                    await asyncio.sleep(delay)
                if self.gone is not None:
                    break
                tasks.append(asyncio.create_task(self.send(request, start_ns + round(offset * 1e9))))
        except asyncio.CancelledError:  # stopped between two sends: those in flight end interrupted, reported
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            raise
        await asyncio.gather(*tasks)

    async def run(self, requests: list[LoadRequest]) -> None:
        warmup = [request for request in requests if request.warmup]
        own = [request for request in requests if not request.warmup]
        if warmup:
            await self.closed_loop(warmup, self.spec.concurrency or 1)
        if self.gone is not None:
            return
        if self.spec.concurrency is not None:
            until = time.monotonic() + self.spec.duration_s if self.spec.duration_s is not None else None
            await self.closed_loop(own, self.spec.concurrency, until=until)
        else:
            await self.open_loop(own)


def _count(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def read_requests(path: Path) -> list[LoadRequest]:
    return [request_from_json(json.loads(line)) for line in path.read_text().splitlines() if line.strip()]


async def main_async(spec: ClientSpec, sink: EventSink) -> bool:
    """Run the load; ``False`` when it was stopped."""
    generator = LoadGenerator(spec, sink)
    requests = read_requests(Path(spec.requests_path))
    task = asyncio.ensure_future(generator.run(requests))
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, task.cancel)
    stopped = False
    try:
        await task
    except asyncio.CancelledError:
        stopped = True
    finally:
        generator.close()
        sent = sum(generator.counts.values())
        own = sum(not request.warmup for request in requests)
        status = LoadStatus(
            sent=sent,
            by_kind=dict(generator.counts),
            stopped=stopped,
            gone=generator.gone,
            not_sent=own - sent if spec.duration_s is None else 0,
            failed_by_replica={str(i): n for i, n in sorted(generator.failed_by_replica.items())}
            if len(generator.pools) > 1
            else {},
            gone_replicas=generator.gone_replicas if len(generator.pools) > 1 else (),
        )
        Path(spec.status_path).write_text(json.dumps(dump(status)))
    return not stopped


def main(argv: list[str]) -> int:
    spec = load(ClientSpec, json.loads(Path(argv[0]).read_text()), whole="the load generator's spec")
    sink = open_sink(CLIENT_RANK)
    try:
        finished = asyncio.run(main_async(spec, sink))
    finally:
        sink.close()
    return 0 if finished else INTERRUPTED


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
