"""Named shapes of the built-in decoder-only transformer."""

from __future__ import annotations

from meshtop.probes.errors import MeshtopError
from meshtop.recordings.manifest import ModelShape


class PresetError(MeshtopError):
    """An unknown model preset was asked for."""


PRESETS: dict[str, ModelShape] = {
    shape.name: shape
    for shape in (
        # Runs a step in milliseconds on two CPU cores; divisible by tp=2 and pp=2 x v=2.
        ModelShape(
            name="tiny", n_layers=4, dim=64, n_heads=4, n_kv_heads=2, ffn_dim=128, vocab_size=256, default_seq_len=64
        ),
        # Compute-bound on CPU, with a small vocabulary so that pipeline stages stay balanced.
        ModelShape(
            name="small", n_layers=8, dim=256, n_heads=8, n_kv_heads=4, ffn_dim=768, vocab_size=512, default_seq_len=128
        ),
        ModelShape(
            name="125m",
            n_layers=12,
            dim=768,
            n_heads=12,
            n_kv_heads=12,
            ffn_dim=2048,
            vocab_size=32000,
            default_seq_len=1024,
        ),
        ModelShape(
            name="1b",
            n_layers=16,
            dim=2048,
            n_heads=32,
            n_kv_heads=8,
            ffn_dim=8192,
            vocab_size=128256,
            default_seq_len=2048,
            rope_theta=500000.0,
        ),
        ModelShape(
            name="7b",
            n_layers=32,
            dim=4096,
            n_heads=32,
            n_kv_heads=32,
            ffn_dim=11008,
            vocab_size=32000,
            default_seq_len=4096,
        ),
        ModelShape(
            name="8b",
            n_layers=32,
            dim=4096,
            n_heads=32,
            n_kv_heads=8,
            ffn_dim=14336,
            vocab_size=128256,
            default_seq_len=4096,
            rope_theta=500000.0,
        ),
    )
}


def preset(name: str) -> ModelShape:
    """The shape named ``name``; a :class:`PresetError` naming the choices otherwise."""
    try:
        return PRESETS[name]
    except KeyError:
        choices = ", ".join(PRESETS)
        raise PresetError(f"unknown model preset {name!r}: use --model with one of {choices}") from None
