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
    """Scrapes ``url`` every :data:`SCRAPE_INTERVAL_S` on a thread of its own, emitting a list of events a
    scrape (the series that changed), until :meth:`stop`."""

    def __init__(self, url: str, *, emit: Callable[[list[Event]], None]) -> None:
        self.url = url
        self.emit = emit
        self._last: dict[tuple[str, str], float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="meshtop-server-metrics", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(TIMEOUT_S + 1)

    def scrape_once(self) -> list[Event]:
        """One scrape's events; ``OSError``, ``ValueError`` or ``http.client.HTTPException`` (an answer that is not
        HTTP) when the server does not answer with metrics."""
        try:
            with urllib.request.urlopen(self.url, timeout=TIMEOUT_S) as response:
                body = response.read(MAX_BYTES + 1)
        except urllib.error.HTTPError as error:
            raise ValueError(f"GET {self.url} answered HTTP {error.code}") from None
        at_ns = time.time_ns()
        if len(body) > MAX_BYTES:
            body = body[:MAX_BYTES].rsplit(b"\n", 1)[0]
        events: list[Event] = []
        for name, labels, value in parse_exposition(body.decode("utf-8", "replace"))[:MAX_SERIES]:
            key = (name, labels)
            if self._last.get(key) == value:
                continue
            self._last[key] = value
            events.append(ServerMetric(wall_ns=at_ns, name=name, labels=labels, value=value, common=COMMON.get(name)))
        return events

    def _run(self) -> None:
        failures = 0
        while not self._stop.is_set():
            try:
                events = self.scrape_once()
                failures = 0
                if events:
                    self.emit(events)
            except (OSError, ValueError, http.client.HTTPException) as error:  # refused, an HTTP error, not HTTP
                failures += 1
                first_answer = not self._last
                if failures >= FAILURES_BEFORE_OFF or (first_answer and isinstance(error, ValueError)):
                    said = one_line(error)
                    reason = f"{said}: the server publishes no Prometheus metrics there" if first_answer else (
                        f"{failures} scrapes in a row failed ({said}); not asked again"
                    )  # fmt: skip
                    self.emit([ProbeOff(rank=CLIENT_RANK, wall_ns=time.time_ns(), probe=PROBE, reason=reason)])
                    return
            self._stop.wait(SCRAPE_INTERVAL_S)
