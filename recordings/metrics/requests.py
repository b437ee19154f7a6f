"""Request metrics of an inference run: each figure once, folded a request at a time.

- TTFT (time to first token) = first token - arrival;
- TPOT (time per output token) = (last token - first token) / (output
  tokens - 1), for requests with more than one token; the last token is the
  last token time where they are known, else the end (an endpoint's stream
  ends a moment after its last token, with the usage chunk and ``[DONE]``:
  that moment is in e2e, not in the decode; guidellm's ITL is this figure);
- ITL (inter-token latency) = each gap between consecutive token times;
- e2e = end - arrival;
- each latency's mean, p50, p90 and p99 over the completed requests (ITL over
  every gap);
- a request is *good* when it completed and met every SLO the load set (a
  TPOT SLO does not apply to a one-token answer: it has no decode);
- the rates (requests/s, output tokens/s, goodput) are over the window from
  the first arrival to the last end of the completed requests;
- SLO met = good requests / all requests of the load (a failed request did
  not meet it); the SLO met of the completed = good requests / completed
  requests, how the answers kept to the SLO whatever else failed or is still
  to come (the dashboard's, read while the load runs: over the load's requests
  it would rise with the progress);
- a request reported twice counts by its first report (a replica reports each
  once; a second is counted as a duplicate and left out); the load's requests
  that have none count as failed once the job ended ("not served"), except an
  endpoint's: its load generator reports every request it sends (those in
  flight at a stop as interrupted), so one without a report was not sent (the
  load was stopped first: by the user, or because the server was gone), is
  counted as such, and is not part of the load's requests nor failed;
- a warmup request (an endpoint's ``--warmup``) is counted as such and left
  out of every figure;
- a load sent for a duration (``--duration``) is the requests sent: those
  planned but due after it are not part of it (nor failed);
- the thirds: TTFT and TPOT p50 over the first third of the completed
  requests by arrival (of equal arrivals, the lower request id first) and
  over the last third (``n // 3`` requests each, from 3 on; a latency where
  each third has a value), how the answers went as the load went on (what
  blocks the run, :mod:`~meshtop.recordings.metrics.blocker`).

An endpoint's load (``--endpoint``) adds the client's own figures, so a result
the load generator limited is told from one the server did:

- send lag = when a request was written to its connection - when the load
  meant to send it; p50 and p99 over the load's requests;
- achieved rate = (requests sent - 1) / (last send - first send), beside the
  rate asked for (open loop);
- the client's CPU = its process's CPU use (100 % = one core; the process
  samples of the load generator, rank 0) over the load's window, from its
  first send to its last end: mean and max;
- the client limited the result when the send lag's p99 is above
  :data:`CLIENT_LAG_LIMIT_S` (10 ms: a request meant for one moment went out
  later, so its server saw a different load than asked), or when its CPU
  mean is at least :data:`CLIENT_CPU_LIMIT_PCT` (90 % of a core: the load
  generator is one event loop, so a busy one reads each answer late and its
  timings hold its own queueing).

Token counts of an endpoint's requests are the server's (``usage``) where it
reported them, else the streamed chunks that carried text (a chunk may hold
several tokens): ``tokens_from`` counts the requests of each.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from itertools import pairwise

import numpy as np

from meshtop.probes.events import RequestDone
from meshtop.recordings.manifest import Load
from meshtop.recordings.metrics.stats import Distribution

COMPLETED = "completed"
LATENCIES = {"ttft_s": "TTFT", "tpot_s": "TPOT", "itl_s": "ITL", "e2e_s": "e2e"}
"""Each request latency: its key (in the summary, :class:`RequestLatency` and the dashboard) and its name."""
RECENT = 512
"""Recent values of each latency kept for the dashboard's sparklines."""
CLIENT_LAG_LIMIT_S = 0.010
"""Above this send-lag p99 the load generator, not the server, limited the result."""


def unserved_reason(status: str) -> str:
    """Why a request of the load has no report: the job stopped before serving it."""
    return f"not served: the job ended {status} first"


def failure_reason(error: str | None) -> str:
    return error or "failed (no reason given)"


@dataclass(frozen=True, slots=True)
class RequestLatency:
    """One request's latencies in seconds (``None`` where a figure does not apply to it)."""

    ttft_s: float | None
    tpot_s: float | None
    e2e_s: float
    gaps_s: tuple[float, ...]
    """The inter-token latencies."""


def request_latency(
    *, arrival_ns: int, first_token_ns: int | None, end_ns: int, output_tokens: int, token_ns: Sequence[int]
) -> RequestLatency:
    """The latencies of one request, by the definitions above (the first token's time is ``token_ns[0]``
    where there is one: the same instant)."""
    first = token_ns[0] if token_ns else first_token_ns
    last = token_ns[-1] if token_ns else end_ns
    ttft = None if first is None else (first - arrival_ns) / 1e9
    tpot = None
    if first is not None and output_tokens > 1:
        tpot = (last - first) / 1e9 / (output_tokens - 1)
    gaps = tuple((b - a) / 1e9 for a, b in pairwise(token_ns))
    return RequestLatency(ttft_s=ttft, tpot_s=tpot, e2e_s=(end_ns - arrival_ns) / 1e9, gaps_s=gaps)


@dataclass(frozen=True, slots=True)
class Slo:
    """The load's service-level objectives, in seconds; ``None`` where the load set none."""

    ttft_s: float | None = None
    tpot_s: float | None = None

    @classmethod
    def of(cls, load: Load | None) -> Slo:
        if load is None:
            return cls()
        return cls(
            ttft_s=None if load.slo_ttft_ms is None else load.slo_ttft_ms / 1e3,
            tpot_s=None if load.slo_tpot_ms is None else load.slo_tpot_ms / 1e3,
        )

    @property
    def given(self) -> bool:
        return self.ttft_s is not None or self.tpot_s is not None

    def met(self, latency: RequestLatency) -> bool:
        """Whether a completed request met every objective given."""
        if self.ttft_s is not None and (latency.ttft_s is None or latency.ttft_s > self.ttft_s):
            return False
        return self.tpot_s is None or latency.tpot_s is None or latency.tpot_s <= self.tpot_s

    def describe(self) -> str:
        """``TTFT <= 50 ms, TPOT <= 20 ms`` (the objectives given)."""
        parts = [
            f"{name} <= {value * 1e3:g} ms"
            for name, value in (("TTFT", self.ttft_s), ("TPOT", self.tpot_s))
            if value is not None
        ]
        return ", ".join(parts)


@dataclass(frozen=True, slots=True, kw_only=True)
class ReplicaRow:
    replica: int
    completed: int
    output_tokens_per_s: float | None
    """Over the job's window, so the replicas add up to the total."""
    ttft_p50_s: float | None

    def to_json(self) -> dict[str, object]:
        return {
            "replica": self.replica,
            "completed": self.completed,
            "output_tokens_per_s": self.output_tokens_per_s,
            "ttft_s": {"p50": self.ttft_p50_s},
        }


CLIENT_CPU_LIMIT_PCT = 90.0
"""The load generator's mean CPU over the load (% of one core) at which it is CPU-bound."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ClientFigures:
    """How well an endpoint's load generator kept to the load (see the module's rules)."""

    send_lag_p50_s: float | None
    send_lag_p99_s: float | None
    achieved_rate_per_s: float | None
    asked_rate_per_s: float | None
    limited: str | None
    """Why the client limited the result, in one line; ``None`` when it did not."""
    cpu_mean_pct: float | None = None
    """The load generator's CPU over the load's window (100 = one core); ``None`` without samples in it."""
    cpu_max_pct: float | None = None

    def to_json(self) -> dict[str, object]:
        return {
            "send_lag_s": {"p50": self.send_lag_p50_s, "p99": self.send_lag_p99_s},
            "achieved_rate_per_s": self.achieved_rate_per_s,
            "asked_rate_per_s": self.asked_rate_per_s,
            "cpu_pct": {"mean": self.cpu_mean_pct, "max": self.cpu_max_pct},
            "limited": self.limited,
        }


def client_figures(
    lags_s: Distribution,
    sends_ns: tuple[int, int, int] | None,
    load: Load | None,
    cpu_pct: Sequence[float] = (),
) -> ClientFigures:
    """The client's figures from its requests' send lags, (first send, last send, count) and its process's
    CPU samples over the load's window."""
    p50, p99 = lags_s.quantile(0.5), lags_s.quantile(0.99)
    achieved = None
    if sends_ns is not None and sends_ns[2] > 1 and sends_ns[1] > sends_ns[0]:
        achieved = (sends_ns[2] - 1) / ((sends_ns[1] - sends_ns[0]) / 1e9)
    cpu_mean = sum(cpu_pct) / len(cpu_pct) if cpu_pct else None
    limited = None
    if p99 is not None and p99 > CLIENT_LAG_LIMIT_S:
        limited = (
            f"client-limited: the load generator sent requests {p99 * 1e3:.1f} ms late at p99 "
            f"(more than {CLIENT_LAG_LIMIT_S * 1e3:g} ms): the server saw a lighter load than asked"
        )
    elif cpu_mean is not None and cpu_mean >= CLIENT_CPU_LIMIT_PCT:
        limited = (
            f"client-limited: the load generator was CPU-bound ({cpu_mean:.0f} % of a core on average, "
            f"at least {CLIENT_CPU_LIMIT_PCT:g} %): its latencies include its own queueing"
        )
    return ClientFigures(
        send_lag_p50_s=p50,
        send_lag_p99_s=p99,
        achieved_rate_per_s=achieved,
        asked_rate_per_s=load.request_rate_per_s if load is not None else None,
        limited=limited,
        cpu_mean_pct=cpu_mean,
        cpu_max_pct=max(cpu_pct) if cpu_pct else None,
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class RequestFigures:
    count: int
    """The load's requests (or the reports, where more came or no load is described)."""
    completed: int
    failed: int
    failures: tuple[tuple[str, int], ...]
    """(reason, count), the most frequent first."""
    latencies: dict[str, dict[str, float | None]]
    """For each of :data:`LATENCIES`: mean, p50, p90, p99 in seconds."""
    window_s: float | None
    request_throughput_per_s: float | None
    output_tokens_per_s: float | None
    slo: Slo
    goodput_per_s: float | None
    """``None`` unless the load set an SLO."""
    slo_met: float | None
    """Good requests / the load's requests (``None`` unless the load set an SLO)."""
    per_replica: tuple[ReplicaRow, ...]
    warmup: int = 0
    """Warmup requests reported (left out of every figure)."""
    tokens_from: tuple[tuple[str, int], ...] = ()
    """An endpoint's: (``usage`` or ``chunks``, requests counted so)."""
    client: ClientFigures | None = None
    """An endpoint's load generator: ``None`` for the built-in model's load."""
    slo_met_of_completed: float | None = None
    """Good requests / completed requests (``None`` unless the load set an SLO and one completed)."""
    not_sent: int = 0
    """An endpoint's requests the load generator never sent (its load was stopped first): not in ``count``."""
    thirds: dict[str, tuple[float, float]] = field(default_factory=dict)
    """``ttft_s`` and ``tpot_s``: p50 over the first third of the completed requests by arrival, and over the
    last third (the module's rule)."""

    def to_json(self) -> dict[str, object]:
        return {
            "count": self.count,
            "completed": self.completed,
            "failed": self.failed,
            "failures": [{"reason": reason, "count": n} for reason, n in self.failures],
            **self.latencies,
            "window_s": self.window_s,
            "request_throughput_per_s": self.request_throughput_per_s,
            "output_tokens_per_s": self.output_tokens_per_s,
            "slo": {"ttft_s": self.slo.ttft_s, "tpot_s": self.slo.tpot_s} if self.slo.given else None,
            "goodput_per_s": self.goodput_per_s,
            "slo_met": self.slo_met,
            "slo_met_of_completed": self.slo_met_of_completed,
            "not_sent": self.not_sent,
            "per_replica": [row.to_json() for row in self.per_replica],
            "warmup": self.warmup,
            "tokens_from": dict(self.tokens_from),
            "client": self.client.to_json() if self.client is not None else None,
        }


class RequestFold:
    """An inference load's requests, folded as their reports arrive (a request id's first report counts)."""

    def __init__(self, load: Load | None, *, replicas: int, sent_by_client: bool = False) -> None:
        self.load = load
        self.sent_by_client = sent_by_client
        """An endpoint's load: a request without a report once the run ended was not sent (not failed)."""
        self.slo = Slo.of(load)
        self.replicas = replicas
        self._seen: set[int] = set()
        self.duplicates = 0
        """Reports of a request already reported: left out."""
        self.ended_status: str | None = None
        """How the job ended, once it did (the load's requests without a report then count as failed)."""
        self.recent: dict[str, deque[float]] = {
            name: deque(maxlen=RECENT * (8 if name == "itl_s" else 1)) for name in LATENCIES
        }
        self.latencies = {name: Distribution() for name in LATENCIES}
        self.failures: Counter[str] = Counter()
        self.completed = 0
        self.good = 0
        self.output_tokens = 0
        self.first_arrival_ns: int | None = None
        self.last_end_ns: int | None = None
        self._by_replica: dict[int, tuple[int, int, Distribution]] = {}
        self.warmup = 0
        self.tokens_from: Counter[str] = Counter()
        self.send_lags = Distribution()
        self._sends: tuple[int, int, int] | None = None
        """(first send, last send, sends) of the load's requests that had a planned moment (an endpoint's)."""
        self._client_cpu: list[tuple[int, float]] = []
        """(wall ns, CPU %) of the load generator's process samples (an endpoint's)."""
        self._arrivals: list[tuple[int, int, float | None, float | None]] = []
        """(arrival ns, request, TTFT, TPOT) of each completed request."""

    def add_client_cpu(self, wall_ns: int, cpu_pct: float | None) -> None:
        """A process sample of the load generator (an endpoint's rank 0)."""
        if cpu_pct is not None:
            self._client_cpu.append((wall_ns, cpu_pct))

    def _client_cpu_in_window(self) -> list[float]:
        if self._sends is None:
            return []
        start, end = self._sends[0], max(self._sends[1], self.last_end_ns or 0)
        return [pct for wall_ns, pct in self._client_cpu if start <= wall_ns <= end]

    def add(self, event: RequestDone) -> None:
        if event.warmup:
            self.warmup += 1
            return
        if event.request in self._seen:
            self.duplicates += 1
            return
        self._seen.add(event.request)
        if event.scheduled_ns is not None:
            self.send_lags.add(max(0, event.arrival_ns - event.scheduled_ns) / 1e9)
            first, last, count = self._sends or (event.arrival_ns, event.arrival_ns, 0)
            self._sends = (min(first, event.arrival_ns), max(last, event.arrival_ns), count + 1)
        if event.tokens_from is not None and event.status == COMPLETED:
            self.tokens_from[event.tokens_from] += 1
        if event.status != COMPLETED:
            self.failures[failure_reason(event.error)] += 1
            return
        latency = request_latency(
            arrival_ns=event.arrival_ns,
            first_token_ns=event.first_token_ns,
            end_ns=event.end_ns,
            output_tokens=event.output_tokens,
            token_ns=event.token_ns,
        )
        self.completed += 1
        self._arrivals.append((event.arrival_ns, event.request, latency.ttft_s, latency.tpot_s))
        self.good += self.slo.met(latency)
        self.output_tokens += event.output_tokens
        for name in ("ttft_s", "tpot_s", "e2e_s"):
            if (value := getattr(latency, name)) is not None:
                self.latencies[name].add(value)
                self.recent[name].append(value)
        self.latencies["itl_s"].extend(np.asarray(latency.gaps_s, dtype=float))
        self.recent["itl_s"].extend(latency.gaps_s)
        if self.first_arrival_ns is None or event.arrival_ns < self.first_arrival_ns:
            self.first_arrival_ns = event.arrival_ns
        if self.last_end_ns is None or event.end_ns > self.last_end_ns:
            self.last_end_ns = event.end_ns
        done, tokens, ttft = self._by_replica.get(event.replica, (0, 0, Distribution()))
        if latency.ttft_s is not None:
            ttft.add(latency.ttft_s)
        self._by_replica[event.replica] = (done + 1, tokens + event.output_tokens, ttft)

    @property
    def sending_ns(self) -> tuple[int, int] | None:
        """From the first send of the load's requests to the last (an endpoint's; ``None`` before a send)."""
        return self._sends[:2] if self._sends is not None else None

    @property
    def reported(self) -> int:
        """Requests with a report (completed or failed)."""
        return len(self._seen)

    @property
    def total(self) -> int:
        """The load's requests (or the reports, where more came or no load is described; a load sent for a
        duration: the requests sent, each reported)."""
        if self.load is not None and self.load.duration_s is not None:
            return len(self._seen)
        return max(self.load.requests if self.load is not None else 0, len(self._seen))

    def figures(self) -> RequestFigures:
        reports, count = len(self._seen), self.total
        failures = Counter(self.failures)
        not_sent = 0
        if self.ended_status is not None and count > reports and self.sent_by_client:
            not_sent, count = count - reports, reports
        elif self.ended_status is not None and count > reports:
            failures[unserved_reason(self.ended_status)] += count - reports
        failed = sum(failures.values())
        window = None
        if self.first_arrival_ns is not None and self.last_end_ns is not None:
            window = (self.last_end_ns - self.first_arrival_ns) / 1e9 or None

        def per_s(amount: int) -> float | None:
            return amount / window if window else None

        replicas = sorted(set(range(self.replicas)) | set(self._by_replica))
        return RequestFigures(
            count=count,
            completed=self.completed,
            failed=failed,
            failures=tuple(failures.most_common()),
            latencies={
                name: {"mean": d.mean(), **d.quantiles("p50", "p90", "p99")} for name, d in self.latencies.items()
            },
            window_s=window,
            request_throughput_per_s=per_s(self.completed),
            output_tokens_per_s=per_s(self.output_tokens),
            slo=self.slo,
            goodput_per_s=per_s(self.good) if self.slo.given else None,
            slo_met=self.good / count if self.slo.given and count else None,
            slo_met_of_completed=self.good / self.completed if self.slo.given and self.completed else None,
            not_sent=not_sent,
            per_replica=tuple(self._replica_row(r, per_s) for r in replicas),
            warmup=self.warmup,
            tokens_from=tuple(sorted(self.tokens_from.items())),
            client=(
                client_figures(self.send_lags, self._sends, self.load, self._client_cpu_in_window())
                if self._sends is not None
                else None
            ),
            thirds=self._thirds(),
        )

    def _thirds(self) -> dict[str, tuple[float, float]]:
        """TTFT and TPOT p50 of the first and the last third of the completed requests by arrival."""
        ordered = sorted(self._arrivals)
        third = len(ordered) // 3
        thirds = {}
        for name, values in (("ttft_s", [row[2] for row in ordered]), ("tpot_s", [row[3] for row in ordered])):
            first = [value for value in values[:third] if value is not None]
            last = [value for value in values[len(values) - third :] if value is not None]
            if first and last:
                thirds[name] = (float(np.median(first)), float(np.median(last)))
        return thirds

    def _replica_row(self, replica: int, per_s: Callable[[int], float | None]) -> ReplicaRow:
        done, tokens, ttft = self._by_replica.get(replica, (0, 0, Distribution()))
        return ReplicaRow(
            replica=replica, completed=done, output_tokens_per_s=per_s(tokens), ttft_p50_s=ttft.quantile(0.5)
        )
