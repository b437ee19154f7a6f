"""Inference requests folded one ``RequestDone`` at a time, for the dashboard (tui/state.py).

Counts cover the whole run, latencies the recent requests, rates the last
seconds; every definition is ``recordings.requests``', as the summary's.
"""

from __future__ import annotations

from collections import Counter, deque
from dataclasses import dataclass

from probes.events import RequestDone
from recordings.requests import COMPLETED, LATENCIES, Slo, failure_reason, request_latency

REQUESTS_KEPT = 512
"""Recent completed requests whose TTFT, TPOT and e2e latency the percentiles are over."""
GAPS_KEPT = 4096
"""Recent inter-token gaps kept for the ITL percentiles."""
RATE_WINDOW_S = 10.0
"""Requests/s, output tokens/s and goodput are over the requests that ended in the last this many seconds."""
RATE_KEPT = 65_536
"""Ends of completed requests kept for the rates (beyond it the window shrinks to what is kept)."""
FAILURE_REASONS_KEPT = 8
"""Distinct failure reasons counted one by one; the others are counted together."""


@dataclass(frozen=True, slots=True)
class RequestsView:
    """What the requests panel and the header show of an inference run."""

    total: int | None
    completed: int
    failed: int
    """Failed in a worker, plus (once the job ended) the requests of the load it never served."""
    failures: tuple[tuple[str, int], ...]
    """(reason, count), the most frequent first."""
    latencies: dict[str, tuple[float | None, float | None]]
    """(p50, p99) in seconds of ttft_s, tpot_s, itl_s and e2e_s, over the recent requests."""
    history: dict[str, tuple[float, ...]]
    """The recent values themselves, oldest first."""
    requests_per_s: float | None
    output_tokens_per_s: float | None
    goodput_per_s: float | None
    """``None`` unless the load set an SLO."""
    slo_met: float | None
    """Share of the recent completed requests that met every SLO (``None`` without one)."""


class RequestStats:
    """Inference requests folded as they finish: counts over the whole run, latencies over the recent
    requests, rates over the last seconds. The definitions are ``recordings.requests``', as the summary's."""

    def __init__(self, slo: Slo) -> None:
        self.slo = slo
        self.completed = 0
        self.failed = 0
        self.failures: Counter[str] = Counter()
        self.recent: dict[str, deque[float]] = {
            name: deque(maxlen=GAPS_KEPT if name == "itl_s" else REQUESTS_KEPT) for name in LATENCIES}
        self.good: deque[bool] = deque(maxlen=REQUESTS_KEPT)
        self.finished: deque[tuple[int, int, bool]] = deque(maxlen=RATE_KEPT)
        """(end, output tokens, met the SLOs) of the completed requests that ended in the rate window."""
        self.first_arrival_ns: int | None = None
        self.last_end_ns: int | None = None

    def add(self, event: RequestDone) -> None:
        if self.first_arrival_ns is None or event.arrival_ns < self.first_arrival_ns:
            self.first_arrival_ns = event.arrival_ns
        if self.last_end_ns is None or event.end_ns > self.last_end_ns:
            self.last_end_ns = event.end_ns
        if event.status != COMPLETED:
            self.failed += 1
            reason = failure_reason(event.error)
            known = reason in self.failures or len(self.failures) < FAILURE_REASONS_KEPT
            self.failures[reason if known else "other reasons"] += 1
            return
        self.completed += 1
        latency = request_latency(arrival_ns=event.arrival_ns, first_token_ns=event.first_token_ns,
                                  end_ns=event.end_ns, output_tokens=event.output_tokens, token_ns=event.token_ns)
        for name in ("ttft_s", "tpot_s", "e2e_s"):
            if (value := getattr(latency, name)) is not None:
                self.recent[name].append(value)
        self.recent["itl_s"].extend(latency.gaps_s)
        good = self.slo.met(latency)
        self.good.append(good)
        self.finished.append((event.end_ns, event.output_tokens, good))
        while self.finished and self.finished[0][0] <= self.last_end_ns - RATE_WINDOW_S * 1e9:
            self.finished.popleft()

    def rates(self, now_ns: int) -> tuple[float, float, float] | None:
        """Requests, output tokens and good requests per second over the rate window ending ``now_ns``."""
        if self.first_arrival_ns is None:
            return None
        start = max(now_ns - int(RATE_WINDOW_S * 1e9), self.first_arrival_ns)
        if len(self.finished) == self.finished.maxlen:
            start = max(start, self.finished[0][0])
        span_s = (now_ns - start) / 1e9
        if span_s <= 0:
            return None
        recent = [(tokens, good) for end, tokens, good in self.finished if start < end <= now_ns]
        return (len(recent) / span_s, sum(tokens for tokens, _ in recent) / span_s,
                sum(1 for _, good in recent if good) / span_s)
