"""Synthetic token data that a model can learn, identical for every plan."""

from __future__ import annotations

import torch

MAX_STRIDE = 8


def synthetic_tokens(*, step: int, seed: int, batch_size: int, seq_len: int, vocab_size: int) -> torch.Tensor:
    """The global batch of ``step``: ``[batch_size, seq_len + 1]`` int64 token ids.

    Each sequence counts from a random start by a random stride modulo the
    vocabulary, so the loss falls as the model learns to read the stride and
    a run shows real progress; the values depend only on seed and step.
    """
    generator = torch.Generator().manual_seed(seed * 1_000_003 + step + 1)
    start = torch.randint(vocab_size, (batch_size, 1), generator=generator)
    stride = torch.randint(1, MAX_STRIDE + 1, (batch_size, 1), generator=generator)
    return (start + stride * torch.arange(seq_len + 1)) % vocab_size


def replica_batch(tokens: torch.Tensor, *, dp_rank: int, dp: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Inputs and next-token targets of one data-parallel replica's share of ``tokens``."""
    share = tokens.chunk(dp, dim=0)[dp_rank]
    return share[:, :-1].contiguous(), share[:, 1:].contiguous()
