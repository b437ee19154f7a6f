"""The load of an inference run: which requests, how long, and when each arrives.

Everything here is a function of the load's options and its seed, and
imports no torch: every rank computes the same requests on its own, and the
plan checks the options before anything is launched.

One planner (:func:`plan_requests`) plans the built-in model's requests and
those sent to an endpoint alike; they differ only in how a prompt is drawn.
Arrivals are closed loop (``concurrency``: C clients, each sends its next
request when the previous one is answered) or open loop (``request_rate_per_s``:
gamma gaps, :func:`arrival_offsets_s`). DP replicas share the load round-robin:
request i goes to replica i mod dp, and in closed loop replica r holds its
share of the C clients (C // dp, the first C mod dp replicas one more), the
steady state of a round-robin balancer in front of equal replicas.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeAlias, TypeVar

from meshtop.recordings.manifest import Load

DEFAULT_REQUESTS = 64
DEFAULT_CONCURRENCY = 8
DEFAULT_MAX_BATCH = 16
MAX_REQUESTS = 100_000
MAX_SEQUENCE = 32_768
"""Prompt plus output, per request: the KV cache holds this many positions per slot."""


P = TypeVar("P")


@dataclass(frozen=True, slots=True, kw_only=True)
class PlannedRequest(Generic[P]):
    """One request of the load: its prompt, how many tokens it wants, and (open loop) when it arrives. The prompt
    is the built-in model's token ids, or what an endpoint is sent (:class:`meshtop.runner.serving.load.Prompt`).

    Built by this class, never by a subscripted name (``TokenRequest``, ``LoadRequest``): those are for annotations,
    since calling a subscripted slotted, frozen dataclass fails (it sets ``__orig_class__`` on the instance)."""

    id: int
    """Its place in the load: the warmup's first (0 .. warmup - 1), then the load's own."""
    prompt: P
    output_len: int
    """Tokens to generate (an endpoint's ``max_tokens``)."""
    offset_s: float | None
    """Open loop: seconds after the load's own requests start; ``None`` in closed loop, where answers pace
    arrivals, and for the warmup."""
    warmup: bool = False
    """An endpoint's: sent first and left out of every figure."""


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


TokenRequest: TypeAlias = "PlannedRequest[tuple[int, ...]]"
"""A request of the built-in model: its prompt is token ids."""


def plan_requests(load: Load, draw_prompt: Callable[[random.Random], P]) -> list[PlannedRequest[P]]:
    """Every request of the load, the warmup first, in id order: the same list on every rank and machine. Each
    request's prompt is drawn by ``draw_prompt``, then its output length, from one random stream (seeded
    2 x seed); the arrivals come from their own (:func:`arrival_offsets_s`)."""
    rng = random.Random(2 * load.seed)
    offsets = arrival_offsets_s(load)
    requests = []
    for index in range(load.warmup + load.requests):
        prompt = draw_prompt(rng)
        own = index - load.warmup
        requests.append(
            PlannedRequest(
                id=index,
                prompt=prompt,
                output_len=rng.randint(*load.output_len),
                offset_s=offsets[own] if offsets is not None and own >= 0 else None,
                warmup=own < 0,
            )
        )
    return requests


def token_requests(load: Load, *, vocab_size: int) -> list[TokenRequest]:
    """The built-in model's requests: each prompt ``prompt_len`` token ids below ``vocab_size``."""
    return plan_requests(
        load, lambda rng: tuple(rng.randrange(vocab_size) for _ in range(rng.randint(*load.prompt_len)))
    )


def replica_share(requests: list[PlannedRequest[P]], *, replica: int, replicas: int) -> list[PlannedRequest[P]]:
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
