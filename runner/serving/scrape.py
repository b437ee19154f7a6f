"""The server's own view: its Prometheus ``/metrics``, scraped about twice a second into the recording.

Every numeric series the server publishes is kept as it is named (a series that did not change since the
last scrape is left out of that scrape); the series of the engines meshtop knows also get a common name,
so a vLLM, SGLang and TGI run read alike (the names are the engines' documented ones):

============================  ===========================================  ==========================
common name                   vLLM / SGLang                                TGI
============================  ===========================================  ==========================
``requests_running``          ``vllm:num_requests_running``,               ``tgi_batch_current_size``
                              ``sglang:num_running_reqs``
``requests_waiting``          ``vllm:num_requests_waiting``,               ``tgi_queue_size``
                              ``sglang:num_queue_reqs``
``kv_cache_usage`` (0-1)      ``vllm:kv_cache_usage_perc``,                -
                              ``vllm:gpu_cache_usage_perc`` (before V1),
                              ``sglang:token_usage``
``preemptions`` (a counter)   ``vllm:num_preemptions_total``               -
``prompt_tokens`` (counter)   ``vllm:prompt_tokens_total``,                ``tgi_request_input_length_sum``
                              ``sglang:prompt_tokens_total``
``generation_tokens``         ``vllm:generation_tokens_total``,            ``tgi_request_generated_tokens_sum``
(a counter)                   ``sglang:generation_tokens_total``
============================  ===========================================  ==========================

A server with no ``/metrics`` (``transformers serve``), or one that stops answering, is said once as a
``probe_off`` event and not asked again; the load goes on.

Replicas (``--endpoint URL1,URL2``): each replica's ``/metrics`` is scraped in the same round, and every series
of one round carries the round's time and its replica's index, so that the server's figures add the replicas
up at each scrape (:mod:`~meshtop.recordings.metrics.server`). A replica that stops answering is said and left
out; the others are still asked.
"""

from __future__ import annotations

import http.client
import math
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable

from meshtop.probes.errors import one_line
from meshtop.probes.events import Event, ProbeOff, ServerMetric
from meshtop.runner.serving.client import CLIENT_RANK

SCRAPE_INTERVAL_S = 0.5
TIMEOUT_S = 2.0
MAX_BYTES = 16 << 20
"""A ``/metrics`` answer larger than this is cut (and its last, partial line dropped)."""
MAX_SERIES = 20_000
"""Series kept a scrape, at most (the first in the answer's order)."""
FAILURES_BEFORE_OFF = 3
"""Scrapes in a row that fail before meshtop stops asking (a server busy with its first load may be slow)."""
COMMON = {
    "vllm:num_requests_running": "requests_running",
    "sglang:num_running_reqs": "requests_running",
    "tgi_batch_current_size": "requests_running",
    "vllm:num_requests_waiting": "requests_waiting",
    "sglang:num_queue_reqs": "requests_waiting",
    "tgi_queue_size": "requests_waiting",
    "vllm:kv_cache_usage_perc": "kv_cache_usage",
    "vllm:gpu_cache_usage_perc": "kv_cache_usage",
    "sglang:token_usage": "kv_cache_usage",
    "vllm:num_preemptions_total": "preemptions",
    "vllm:prompt_tokens_total": "prompt_tokens",
    "sglang:prompt_tokens_total": "prompt_tokens",
    "tgi_request_input_length_sum": "prompt_tokens",
    "vllm:generation_tokens_total": "generation_tokens",
    "sglang:generation_tokens_total": "generation_tokens",
    "tgi_request_generated_tokens_sum": "generation_tokens",
}
PROBE = "server metrics"


def parse_exposition(text: str) -> list[tuple[str, str, float]]:
    """The (name, labels, value) of each sample line of Prometheus' text format; comments, blank and
    malformed lines, and values that are not finite numbers, skipped. Labels are kept as written."""
    samples = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        labels = ""
        if "{" in line:
            name, _, rest = line.partition("{")
            labels, closed, rest = rest.rpartition("}")
            if not closed:
                continue
        else:
            name, _, rest = line.partition(" ")
        parts = rest.split()
        if not name or not parts:
            continue
        try:
            value = float(parts[0])
        except ValueError:
            continue
        if math.isfinite(value):
            samples.append((name.strip(), labels, value))
    return samples


class Scraper:
    """Scrapes each of ``urls`` (a replica's each) every :data:`SCRAPE_INTERVAL_S` on a thread of its own,
    emitting a list of events a round (the series that changed), until :meth:`stop`."""

    def __init__(self, urls: tuple[str, ...], *, emit: Callable[[list[Event]], None]) -> None:
        self.urls = urls
        self.emit = emit
        self._last: dict[tuple[int, str, str], float] = {}
        self._answered: set[int] = set()
        """The replicas that answered with a series once."""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="meshtop-server-metrics", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(len(self.urls) * TIMEOUT_S + 1)

    def fetch(self, replica: int) -> bytes:
        """Replica ``replica``'s ``/metrics`` answer; ``OSError``, ``ValueError`` or ``http.client.HTTPException``
        (an answer that is not HTTP) when it does not answer with metrics."""
        url = self.urls[replica]
        try:
            with urllib.request.urlopen(url, timeout=TIMEOUT_S) as response:
                body: bytes = response.read(MAX_BYTES + 1)
        except urllib.error.HTTPError as error:
            raise ValueError(f"GET {url} answered HTTP {error.code}") from None
        return body[:MAX_BYTES].rsplit(b"\n", 1)[0] if len(body) > MAX_BYTES else body

    def series(self, replica: int, body: bytes, at_ns: int) -> list[Event]:
        """The series of one answer that changed since the replica's last, as events at ``at_ns``."""
        events: list[Event] = []
        samples = parse_exposition(body.decode("utf-8", "replace"))[:MAX_SERIES]
        if samples:
            self._answered.add(replica)
        for name, labels, value in samples:
            key = (replica, name, labels)
            if self._last.get(key) == value:
                continue
            self._last[key] = value
            events.append(
                ServerMetric(
                    wall_ns=at_ns, name=name, labels=labels, value=value, common=COMMON.get(name), replica=replica
                )
            )
        return events

    def scrape_once(self) -> list[Event]:
        """One scrape of the first replica (a single server's): its events, or the error it raised."""
        body = self.fetch(0)
        return self.series(0, body, time.time_ns())

    def _run(self) -> None:
        failures = [0] * len(self.urls)
        asked = set(range(len(self.urls)))
        while asked and not self._stop.is_set():
            bodies: dict[int, bytes] = {}
            off: list[Event] = []
            for replica in sorted(asked):
                try:
                    bodies[replica] = self.fetch(replica)
                    failures[replica] = 0
                except (OSError, ValueError, http.client.HTTPException) as error:  # refused, HTTP error, not HTTP
                    failures[replica] += 1
                    first_answer = replica not in self._answered
                    if failures[replica] >= FAILURES_BEFORE_OFF or (first_answer and isinstance(error, ValueError)):
                        said = one_line(error)
                        reason = f"{said}: the server publishes no Prometheus metrics there" if first_answer else (
                            f"{failures[replica]} scrapes in a row failed ({said}); not asked again"
                        )  # fmt: skip
                        if len(self.urls) > 1:
                            reason = f"replica {replica} ({self.urls[replica]}): {reason}"
                        off.append(ProbeOff(rank=CLIENT_RANK, wall_ns=time.time_ns(), probe=PROBE, reason=reason))
                        asked.discard(replica)
            at_ns = time.time_ns()  # one time for the round: the replicas' series add up at it
            events = [event for replica, body in bodies.items() for event in self.series(replica, body, at_ns)]
            if events or off:
                self.emit(events + off)
            self._stop.wait(SCRAPE_INTERVAL_S)
