"""The load of an inference run: which requests, how long, and when each arrives.

Everything here is a function of the load's options and its seed, and
imports no torch: every rank computes the same requests on its own, and the
plan checks the options before anything is launched.

Arrivals are closed loop (``concurrency``: C clients, each sends its next
request when the previous one is answered) or open loop (``request_rate_per_s``:
Poisson arrivals, exponential gaps). DP replicas share the load round-robin:
request i goes to replica i mod dp, and in closed loop replica r holds its
share of the C clients (C // dp, the first C mod dp replicas one more), the
steady state of a round-robin balancer in front of equal replicas.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

DEFAULT_REQUESTS = 64
DEFAULT_CONCURRENCY = 8
DEFAULT_MAX_BATCH = 16
DEFAULT_PROMPT_LEN = (32, 32)
DEFAULT_OUTPUT_LEN = (32, 32)
MAX_REQUESTS = 100_000
MAX_SEQUENCE = 32_768
"""Prompt plus output, per request: the KV cache holds this many positions per slot."""


@dataclass(frozen=True, kw_only=True, slots=True)
class InferenceLoad:
    """The requests of an inference run and how they arrive."""

    requests: int
    concurrency: int | None
    """Closed loop: requests in flight at once over all replicas (``None`` in open loop)."""
    request_rate_per_s: float | None
    """Open loop: mean Poisson arrival rate (``None`` in closed loop)."""
    prompt_len: tuple[int, int]
    """Lowest and highest prompt length in tokens (equal for a fixed length)."""
    output_len: tuple[int, int]
    max_batch: int
    """Requests decoded together by one replica, at most."""
    seed: int
    slo_ttft_ms: float | None = None
    slo_tpot_ms: float | None = None

    @property
    def max_sequence(self) -> int:
        return self.prompt_len[1] + self.output_len[1]

    def describe(self) -> dict[str, object]:
        """The manifest's ``load`` section."""
        return {
            "requests": self.requests,
            "concurrency": self.concurrency,
            "request_rate_per_s": self.request_rate_per_s,
            "prompt_len": list(self.prompt_len),
            "output_len": list(self.output_len),
            "max_batch": self.max_batch,
            "seed": self.seed,
            "slo_ttft_ms": self.slo_ttft_ms,
            "slo_tpot_ms": self.slo_tpot_ms,
        }

    @classmethod
    def from_json(cls, fields: dict[str, object]) -> InferenceLoad:
        values = dict(fields)
        values["prompt_len"] = tuple(values["prompt_len"])  # type: ignore[arg-type]
        values["output_len"] = tuple(values["output_len"])  # type: ignore[arg-type]
        return cls(**values)  # type: ignore[arg-type]


@dataclass(frozen=True, slots=True, kw_only=True)
class PlannedRequest:
    """One request of the load: its prompt, how many tokens it wants, and (open loop) when it arrives."""

    id: int
    prompt: tuple[int, ...]
    output_len: int
    arrival_s: float | None
    """Seconds after the load starts (open loop); ``None`` in closed loop, where answers pace arrivals."""


def arrival_times_s(load: InferenceLoad) -> list[float] | None:
    """Open loop: each request's arrival, in seconds after the load starts (Poisson); ``None`` in closed loop.

    Drawn from their own random stream, so they do not depend on the lengths.
    """
    if load.request_rate_per_s is None:
        return None
    rng, clock, times = random.Random(2 * load.seed + 1), 0.0, []
    for _ in range(load.requests):
        clock += rng.expovariate(load.request_rate_per_s)
        times.append(clock)
    return times


def plan_requests(load: InferenceLoad, *, vocab_size: int) -> list[PlannedRequest]:
    """Every request of the load, in id order (the same list on every rank)."""
    rng = random.Random(2 * load.seed)
    arrivals = arrival_times_s(load)
    requests = []
    for index in range(load.requests):
        prompt = tuple(rng.randrange(vocab_size) for _ in range(rng.randint(*load.prompt_len)))
        requests.append(
            PlannedRequest(
                id=index,
                prompt=prompt,
                output_len=rng.randint(*load.output_len),
                arrival_s=arrivals[index] if arrivals is not None else None,
            )
        )
    return requests


def replica_share(requests: list[PlannedRequest], *, replica: int, replicas: int) -> list[PlannedRequest]:
    """The requests replica ``replica`` serves: every ``replicas``-th, round-robin."""
    return requests[replica::replicas]


def replica_concurrency(load: InferenceLoad, *, replica: int, replicas: int) -> int | None:
    """Closed loop: the clients of ``replica`` (its share of ``concurrency``); ``None`` in open loop."""
    if load.concurrency is None:
        return None
    base, extra = divmod(load.concurrency, replicas)
    return base + (1 if replica < extra else 0)


def longest_gap_s(load: InferenceLoad) -> float:
    """The longest quiet time between arrivals (open loop); 0 in closed loop. The hang watch allows for it."""
    arrivals = arrival_times_s(load) or []
    return max((b - a for a, b in zip([0.0, *arrivals], arrivals, strict=False)), default=0.0)
