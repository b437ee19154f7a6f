"""What meshtop's results are checked against, computed the plain way (shared by tests of several modules)."""

from __future__ import annotations

import torch

from meshtop.runner.rank.model import Transformer


@torch.no_grad()
def greedy_without_cache(model: Transformer, prompt: tuple[int, ...], count: int) -> list[int]:
    """The reference: run the whole sequence again for every new token."""
    sequence, out = list(prompt), []
    for _ in range(count):
        out.append(int(model(torch.tensor([sequence]))[0, -1].argmax()))
        sequence.append(out[-1])
    return out
