"""The KV cache in one process: the same greedy tokens as recomputing the whole sequence, batched or alone,
with slots reused. (The serving engine that drives it under every plan: tests/runner/test_inference.py.)"""

from __future__ import annotations

import torch

from meshtop.runner.presets import PRESETS
from meshtop.runner.rank.kv_cache import KVCache
from meshtop.runner.rank.model import Transformer
from meshtop.runner.rank.weights import init_weights
from tests.kit.reference import greedy_without_cache

SEED = 3
PROMPTS = {0: (5, 9), 1: (17, 4), 2: (2, 12), 3: (11, 1), 4: (8, 7), 5: (30, 5)}
"""Request id: (prompt length, tokens to generate)."""


def tiny_model() -> Transformer:
    model = Transformer(PRESETS["tiny"])
    with torch.no_grad():
        init_weights(model, model=PRESETS["tiny"], seed=SEED, device=torch.device("cpu"))
    return model.eval()


def prompts() -> dict[int, tuple[tuple[int, ...], int]]:
    gen = torch.Generator().manual_seed(7)
    return {i: (tuple(torch.randint(0, 256, (p,), generator=gen).tolist()), n) for i, (p, n) in PROMPTS.items()}


@torch.no_grad()
def forward(model: Transformer, cache: KVCache, slots: list[int], tokens: list[list[int]]) -> list[int]:
    cache.begin(torch.tensor(slots), len(tokens[0]))
    logits = model(torch.tensor(tokens), cache=cache)
    cache.commit()
    return logits[:, -1].argmax(dim=-1).tolist()


def serve_in_slots(
    model: Transformer, cache: KVCache, requests: dict[int, tuple[tuple[int, ...], int]]
) -> dict[int, list[int]]:
    """Continuous batching in its simplest form: prefill into a free slot, decode all slots together."""
    waiting, active, out = list(requests), {}, {}
    free = list(range(cache.slots))
    while waiting or active:
        while waiting and free:
            request, slot = waiting.pop(0), free.pop(0)
            cache.free(slot)
            active[slot] = request
            out[request] = forward(model, cache, [slot], [list(requests[request][0])])
        for slot, request in list(active.items()):  # finished requests leave their slot
            if len(out[request]) >= requests[request][1]:
                del active[slot]
                free.append(slot)
        if active:
            slots = list(active)
            for slot, token in zip(
                slots, forward(model, cache, slots, [[out[active[s]][-1]] for s in slots]), strict=False
            ):
                out[active[slot]].append(token)
    return out


def test_cached_greedy_tokens_equal_recomputing_the_whole_sequence() -> None:
    model = tiny_model()
    for request, (prompt, count) in prompts().items():
        cache = KVCache(slots=1, max_len=64, dtype=torch.float32, device=torch.device("cpu"))
        assert serve_in_slots(model, cache, {request: (prompt, count)})[request] == greedy_without_cache(
            model, prompt, count
        ), request


def test_batched_requests_in_reused_slots_get_the_tokens_they_get_alone() -> None:
    model = tiny_model()
    requests = prompts()
    alone = {r: greedy_without_cache(model, prompt, n) for r, (prompt, n) in requests.items()}
    cache = KVCache(slots=2, max_len=64, dtype=torch.float32, device=torch.device("cpu"))
    assert serve_in_slots(model, cache, requests) == alone
    assert cache.nbytes == 2 * 4 * 2 * 64 * 2 * 16 * 4  # K and V, 4 layers, 2 slots x 64 x 2 heads x 16
