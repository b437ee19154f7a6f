"""Named shapes of the built-in decoder-only transformer."""

from __future__ import annotations

from meshtop.probes.errors import MeshtopError
from meshtop.recordings.manifest import ModelShape


class PresetError(MeshtopError):
    """An unknown model preset was asked for."""


ROPE_THETA_LLAMA3 = 500000.0
"""The rotary base of the Llama 3 releases (1b, 8b); the others keep :class:`ModelShape`'s 10000."""
_SHAPES = (
    # name, n_layers, dim, n_heads, n_kv_heads, ffn_dim, vocab_size, default_seq_len, rope_theta
    ("tiny", 4, 64, 4, 2, 128, 256, 64, 10000.0),  # a step in milliseconds on two CPU cores; tp=2, pp=2 x v=2
    ("small", 8, 256, 8, 4, 768, 512, 128, 10000.0),  # compute-bound on CPU; a small vocabulary balances stages
    ("125m", 12, 768, 12, 12, 2048, 32000, 1024, 10000.0),
    ("1b", 16, 2048, 32, 8, 8192, 128256, 2048, ROPE_THETA_LLAMA3),
    ("7b", 32, 4096, 32, 32, 11008, 32000, 4096, 10000.0),
    ("8b", 32, 4096, 32, 8, 14336, 128256, 4096, ROPE_THETA_LLAMA3),
)
PRESETS: dict[str, ModelShape] = {
    name: ModelShape(
        name=name,
        n_layers=n_layers,
        dim=dim,
        n_heads=n_heads,
        n_kv_heads=n_kv_heads,
        ffn_dim=ffn_dim,
        vocab_size=vocab_size,
        default_seq_len=seq_len,
        rope_theta=rope_theta,
    )
    for name, n_layers, dim, n_heads, n_kv_heads, ffn_dim, vocab_size, seq_len, rope_theta in _SHAPES
}


def preset(name: str) -> ModelShape:
    """The shape named ``name``; a :class:`PresetError` naming the choices otherwise."""
    try:
        return PRESETS[name]
    except KeyError:
        choices = ", ".join(PRESETS)
        raise PresetError(f"unknown model preset {name!r}: use --model with one of {choices}") from None
