"""Named shapes of the built-in decoder-only transformer."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from meshtop.probes.errors import MeshtopError


class PresetError(MeshtopError):
    """An unknown model preset was asked for."""


@dataclass(frozen=True, kw_only=True, slots=True)
class ModelShape:
    """The shape of a Llama-style decoder (RMSNorm, rotary attention, SwiGLU)."""

    name: str
    """The preset's name, as given to ``--model``."""
    n_layers: int
    """Number of transformer blocks."""
    dim: int
    """Width of the residual stream."""
    n_heads: int
    """Attention (query) heads."""
    n_kv_heads: int
    """Key / value heads (grouped-query attention when fewer than ``n_heads``)."""
    ffn_dim: int
    """Hidden width of the SwiGLU MLP."""
    vocab_size: int
    """Number of token ids."""
    default_seq_len: int
    """Sequence length used when ``--seq-len`` is not given."""
    norm_eps: float = 1e-5
    """Epsilon of every RMSNorm."""
    rope_theta: float = 10000.0
    """Base of the rotary position embedding."""
    tie_embeddings: bool = False
    """The output projection is the token embedding's matrix (one parameter, as ``tie_word_embeddings``)."""

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_heads

    def parameter_count(self) -> int:
        """Parameters of the whole model (embedding and output counted apart unless tied)."""
        attention = self.dim * self.head_dim * (2 * self.n_heads + 2 * self.n_kv_heads)
        mlp = 3 * self.dim * self.ffn_dim
        norms = 2 * self.dim
        per_layer = attention + mlp + norms
        ends = (1 if self.tie_embeddings else 2) * self.vocab_size * self.dim
        return self.n_layers * per_layer + ends + self.dim

    def describe(self) -> dict[str, object]:
        """Plain fields for manifests, plus the parameter count."""
        fields = asdict(self)
        fields["parameters"] = self.parameter_count()
        return fields


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
