"""The load of an inference run: which requests, how long, and when each arrives.

Everything here is a function of the load's options and its seed, and
imports no torch: every rank computes the same requests on its own, and the
plan checks the options before anything is launched.

Arrivals are closed loop (``concurrency``: C clients, each sends its next
request when the previous one is answered) or open loop (``request_rate_per_s``:
gamma gaps, :func:`arrival_offsets_s`, which the load sent to an endpoint draws
too). DP replicas share the load round-robin:
request i goes to replica i mod dp, and in closed loop replica r holds its
share of the C clients (C // dp, the first C mod dp replicas one more), the
steady state of a round-robin balancer in front of equal replicas.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from meshtop.recordings.manifest import Load

DEFAULT_REQUESTS = 64
DEFAULT_CONCURRENCY = 8
DEFAULT_MAX_BATCH = 16
MAX_REQUESTS = 100_000
MAX_SEQUENCE = 32_768
"""Prompt plus output, per request: the KV cache holds this many positions per slot."""


@dataclass(frozen=True, slots=True, kw_only=True)
class PlannedRequest:
    """One request of the load: its prompt, how many tokens it wants, and (open loop) when it arrives."""

    id: int
    prompt: tuple[int, ...]
    output_len: int
    arrival_s: float | None
    """Seconds after the load starts (open loop); ``None`` in closed loop, where answers pace arrivals."""


def arrival_offsets_s(load: Load) -> list[float] | None:
    """Open loop: each of the load's own requests' arrival, in seconds after the load starts; ``None`` in closed
    loop. The gaps are drawn from a gamma distribution of mean 1/rate and shape ``burstiness`` (1, Poisson:
    exponential gaps, where none is given), as vLLM's benchmark draws them.

    Drawn from their own random stream (seeded 2 x seed + 1), so they do not depend on the lengths or prompts.
    """
    if load.request_rate_per_s is None:
        return None
    shape = 1.0 if load.burstiness is None else load.burstiness
    scale = 1.0 / (load.request_rate_per_s * shape)
    rng, clock, offsets = random.Random(2 * load.seed + 1), 0.0, []
    for _ in range(load.requests):
        clock += rng.gammavariate(shape, scale)
        offsets.append(clock)
    return offsets


def plan_requests(load: Load, *, vocab_size: int) -> list[PlannedRequest]:
    """Every request of the load, in id order (the same list on every rank)."""
    rng = random.Random(2 * load.seed)
    arrivals = arrival_offsets_s(load)
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


def replica_concurrency(load: Load, *, replica: int, replicas: int) -> int | None:
    """Closed loop: the clients of ``replica`` (its share of ``concurrency``); ``None`` in open loop."""
    if load.concurrency is None:
        return None
    base, extra = divmod(load.concurrency, replicas)
    return base + (1 if replica < extra else 0)


def longest_gap_s(load: Load) -> float:
    """The longest quiet time between arrivals (open loop); 0 in closed loop. The hang watch allows for it."""
    arrivals = arrival_offsets_s(load) or []
    return max((b - a for a, b in zip([0.0, *arrivals], arrivals, strict=False)), default=0.0)
