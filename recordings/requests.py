"""Request metrics of an inference run, defined once for the summary, compare and the dashboard.

The summary folds a recording's request table with pandas and the dashboard
folds ``RequestDone`` events one at a time; both take every definition from
here, so a replayed dashboard and ``meshtop summary`` agree:

- TTFT (time to first token) = first token - arrival;
- TPOT (time per output token) = (end - first token) / (output tokens - 1),
  for requests with more than one token;
- ITL (inter-token latency) = each gap between consecutive token times;
- e2e = end - arrival;
- a request is *good* when it completed and met every SLO the load set.
  A TPOT SLO does not apply to a one-token answer (it has no decode).

No pandas here: the dashboard imports this on every frame's path.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import pairwise
from typing import Any

INFER_MODE = "infer"
LOAD_KEYS = ("requests", "concurrency", "request_rate_per_s", "prompt_len", "output_len", "max_batch")
"""What makes two loads the same work (the seed and the SLOs do not change the work done)."""
COMPLETED = "completed"
QUANTILES = {"p50": 0.5, "p90": 0.9, "p99": 0.99}
LATENCIES = {"ttft_s": "TTFT", "tpot_s": "TPOT", "itl_s": "ITL", "e2e_s": "e2e"}
"""Each request latency: its key (in the summary, :class:`RequestLatency` and the dashboard) and its name."""


def is_inference(description: dict[str, Any]) -> bool:
    """Whether a manifest (or run description) is of an inference run."""
    return description.get("mode") == INFER_MODE


def load_of(description: dict[str, Any]) -> dict[str, Any]:
    """The manifest's ``load`` section (empty for a training run or a manifest without one)."""
    load = description.get("load") if is_inference(description) else None
    return load if isinstance(load, dict) else {}


def unserved_reason(status: str) -> str:
    """Why a request of the load has no row: the job stopped before serving it."""
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


def request_latency(*, arrival_ns: int, first_token_ns: int | None, end_ns: int, output_tokens: int,
                    token_ns: Sequence[int]) -> RequestLatency:
    """The latencies of one request, by the definitions above.

    The first token's time is taken from ``token_ns`` where it has one (it is the same instant):
    a table column of ``first_token_ns`` that holds a ``None`` is stored as float64, which rounds
    wall-clock nanoseconds to 256 ns, while ``token_ns`` keeps its integers.
    """
    times = [int(t) for t in token_ns]
    first = times[0] if times else first_token_ns
    ttft = None if first is None else (first - arrival_ns) / 1e9
    tpot = None
    if first is not None and output_tokens > 1:
        tpot = (end_ns - first) / 1e9 / (output_tokens - 1)
    gaps = tuple((b - a) / 1e9 for a, b in pairwise(times))
    return RequestLatency(ttft_s=ttft, tpot_s=tpot, e2e_s=(end_ns - arrival_ns) / 1e9, gaps_s=gaps)


@dataclass(frozen=True, slots=True)
class Slo:
    """The load's service-level objectives, in seconds; ``None`` where the load set none."""

    ttft_s: float | None = None
    tpot_s: float | None = None

    @classmethod
    def of(cls, description: dict[str, Any]) -> Slo:
        load = load_of(description)
        ttft, tpot = load.get("slo_ttft_ms"), load.get("slo_tpot_ms")
        return cls(ttft_s=None if ttft is None else float(ttft) / 1e3,
                   tpot_s=None if tpot is None else float(tpot) / 1e3)

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
        parts = [f"{name} <= {value * 1e3:g} ms" for name, value in (("TTFT", self.ttft_s), ("TPOT", self.tpot_s))
                 if value is not None]
        return ", ".join(parts)


def quantile(ordered: Sequence[float], q: float) -> float:
    """The ``q`` quantile of sorted ``ordered`` by linear interpolation, computed as numpy's default does
    (so the dashboard's pure-Python figures equal the summary's numpy ones to the last bit)."""
    position = q * (len(ordered) - 1)
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    weight = position - low
    a, b = ordered[low], ordered[high]
    return b - (b - a) * (1 - weight) if weight >= 0.5 else a + (b - a) * weight
