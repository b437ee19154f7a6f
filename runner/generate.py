"""Greedy generation with a KV cache and continuous batching, on one model replica.

``Generator.add`` prefills a request's prompt into a free slot and returns its
first token; ``Generator.decode`` adds one token to every active request in
one batched forward; a request that has all its tokens leaves, and its slot
takes the next request at once. Greedy (argmax) sampling makes every output
a function of the weights and the prompt alone, whatever else shares the batch.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from runner.kv_cache import KVCache
from runner.model import Transformer


@dataclass(frozen=True, slots=True, kw_only=True)
class Request:
    """One generation request of the load."""

    id: int
    prompt: tuple[int, ...]
    output_len: int
    """Tokens to generate (the first comes from the prefill)."""


@dataclass(slots=True, kw_only=True)
class Active:
    request: Request
    slot: int
    tokens: list[int] = field(default_factory=list)

    @property
    def done(self) -> bool:
        return len(self.tokens) >= self.request.output_len


class Generator:
    """A replica's generation loop state: the model, its cache, and the requests in its slots."""

    def __init__(self, model: Transformer, *, max_batch: int, max_len: int, device: torch.device,
                 dtype: torch.dtype) -> None:
        self.model = model
        self.cache = KVCache(slots=max_batch, max_len=max_len, dtype=dtype, device=device)
        self.device = device
        self.active: dict[int, Active] = {}
        self._free = list(range(max_batch - 1, -1, -1))

    @property
    def has_room(self) -> bool:
        return bool(self._free)

    @torch.no_grad()
    def add(self, request: Request) -> Active:
        """Prefill ``request`` into a free slot; it comes back holding its first token."""
        if not request.prompt or request.output_len < 1:
            raise ValueError("a request needs a prompt and at least one token to generate")
        slot = self._free.pop()
        rows = torch.tensor([slot], device=self.device)
        self.cache.begin(rows, len(request.prompt))
        logits = self.model(torch.tensor([request.prompt], device=self.device), cache=self.cache)
        self.cache.commit()
        active = self.active[slot] = Active(request=request, slot=slot, tokens=[int(logits[0, -1].argmax())])
        return active

    @torch.no_grad()
    def decode(self) -> list[Active]:
        """One token more for every active request that needs one; the requests that advanced."""
        stepping = [a for a in self.active.values() if not a.done]
        if not stepping:
            return []
        rows = torch.tensor([a.slot for a in stepping], device=self.device)
        last = torch.tensor([[a.tokens[-1]] for a in stepping], device=self.device)
        self.cache.begin(rows, 1)
        logits = self.model(last, cache=self.cache)
        self.cache.commit()
        for active, token in zip(stepping, logits[:, -1].argmax(dim=-1).tolist()):
            active.tokens.append(int(token))
        return stepping

    def finish(self) -> list[Active]:
        """Take out the requests that have all their tokens, freeing their slots."""
        done = [a for a in self.active.values() if a.done]
        for active in done:
            del self.active[active.slot]
            self.cache.free(active.slot)
            self._free.append(active.slot)
        return done


def generate_all(generator: Generator, requests: list[Request]) -> dict[int, list[int]]:
    """Serve ``requests`` in order with continuous batching: each freed slot takes the next waiting one."""
    waiting = list(reversed(requests))
    outputs: dict[int, list[int]] = {}
    while waiting or generator.active:
        while waiting and generator.has_room:
            generator.add(waiting.pop())
        generator.decode()
        for active in generator.finish():
            outputs[active.request.id] = active.tokens
    return outputs
