"""Rotary position embeddings (RoPE): the cosine and sine tables and the rotation they apply.

Shared by the model (positions 0..seq-1 for every row) and the key / value cache of generation (each
token's own position in its slot), so neither imports the other for them.
"""

from __future__ import annotations

import torch


def rotary_tables(
    seq_len: int, head_dim: int, theta: float, *, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """Cosine and sine tables of shape ``[seq_len, head_dim // 2]`` in float32."""
    inverse_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=device, dtype=torch.float32) / head_dim))
    angles = torch.outer(torch.arange(seq_len, device=device, dtype=torch.float32), inverse_freq)
    return angles.cos(), angles.sin()


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate pairs of channels of ``x`` ``[batch, seq, heads, head_dim]`` by position.

    ``cos`` / ``sin`` are ``[seq, head_dim // 2]`` (positions 0..seq-1 for every row) or
    ``[batch, seq, head_dim // 2]`` (each token's own position, as in cached generation).
    """
    pairs = x.float().unflatten(-1, (-1, 2))
    even, odd = pairs[..., 0], pairs[..., 1]
    cos, sin = (
        (cos[None, :, None, :], sin[None, :, None, :]) if cos.dim() == 2 else (cos[:, :, None, :], sin[:, :, None, :])
    )
    rotated = torch.stack((even * cos - odd * sin, even * sin + odd * cos), dim=-1)
    return rotated.flatten(-2).type_as(x)
