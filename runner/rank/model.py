"""The built-in decoder-only transformer: Llama-style blocks.

The model is written so that each parallelism can be applied from outside:
layers sit in a ``ModuleDict`` keyed by their index (a pipeline stage deletes
the ones it does not own and the names stay those of the whole model), the
projections are plain ``nn.Linear`` (tensor parallelism shards them), and
attention reshapes with ``-1`` heads so a shard with fewer local heads works.

Activation checkpointing is a block's own setting (``Block.recompute``, set by
:func:`checkpoint_blocks`), not a wrapper module, so parameter names stay the
model's and a pipeline cut or FSDP2 unit sees the same blocks. The
recomputation runs inside the block's ``forward`` (torch's non-reentrant
checkpoint): FSDP2's hooks stay on the block, whose parameters are already
gathered for its backward when the recomputation runs, as torchtitan orders
them. ``full`` keeps each block's input and recomputes the whole block;
``selective`` recomputes the feed-forward half (its norm and SwiGLU), whose
saved tensors are most of a block's (docs/planner.md counts them):
Korthikanti et al.'s selective recomputation of the attention core saves
nothing here, since the flash-style attention never keeps the ``s x s``
scores.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.overrides import TorchFunctionMode
from torch.utils.checkpoint import checkpoint

from meshtop.recordings.manifest import ModelShape
from meshtop.runner.rank.kv_cache import KVCache, LayerCache
from meshtop.runner.rank.rotary import apply_rotary, rotary_tables


class Attention(nn.Module):
    """Causal grouped-query self-attention with rotary positions."""

    def __init__(self, shape: ModelShape) -> None:
        super().__init__()
        self.head_dim = shape.head_dim
        self.wq = nn.Linear(shape.dim, shape.n_heads * shape.head_dim, bias=False)
        self.wk = nn.Linear(shape.dim, shape.n_kv_heads * shape.head_dim, bias=False)
        self.wv = nn.Linear(shape.dim, shape.n_kv_heads * shape.head_dim, bias=False)
        self.wo = nn.Linear(shape.n_heads * shape.head_dim, shape.dim, bias=False)

    def forward(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, cache: LayerCache | None = None
    ) -> torch.Tensor:
        batch, seq, _ = x.shape
        # -1 heads: under tensor parallelism each rank holds only its own heads.
        q = self.wq(x).view(batch, seq, -1, self.head_dim)
        k = self.wk(x).view(batch, seq, -1, self.head_dim)
        v = self.wv(x).view(batch, seq, -1, self.head_dim)
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        mask = None
        if cache is not None:  # append this step's keys and values, attend over each row's whole prefix
            k, v, mask = cache.extend(k, v)
        repeats = q.size(2) // k.size(2)
        if repeats > 1:
            k = k.repeat_interleave(repeats, dim=2)
            v = v.repeat_interleave(repeats, dim=2)
        out = F.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_mask=mask, is_causal=mask is None
        )
        return self.wo(out.transpose(1, 2).reshape(batch, seq, -1))


class FeedForward(nn.Module):
    """SwiGLU MLP: ``w2(silu(w1 x) * w3 x)``."""

    def __init__(self, shape: ModelShape) -> None:
        super().__init__()
        self.w1 = nn.Linear(shape.dim, shape.ffn_dim, bias=False)
        self.w3 = nn.Linear(shape.dim, shape.ffn_dim, bias=False)
        self.w2 = nn.Linear(shape.ffn_dim, shape.dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Block(nn.Module):
    """One pre-norm transformer block."""

    def __init__(self, shape: ModelShape) -> None:
        super().__init__()
        self.attention_norm = nn.RMSNorm(shape.dim, eps=shape.norm_eps)
        self.attention = Attention(shape)
        self.ffn_norm = nn.RMSNorm(shape.dim, eps=shape.norm_eps)
        self.feed_forward = FeedForward(shape)
        self.recompute = "none"
        """Activation checkpointing of this block: none, full or selective (see the module's docstring)."""

    def forward(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, cache: LayerCache | None = None
    ) -> torch.Tensor:
        if self.recompute == "none" or not torch.is_grad_enabled():
            return self._block(x, cos, sin, cache)
        if self.recompute == "full":
            return checkpoint(self._block, x, cos, sin, cache, use_reentrant=False)
        h = x + self.attention(self.attention_norm(x), cos, sin, cache)
        return h + checkpoint(self._feed_forward, h, use_reentrant=False)

    def _block(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, cache: LayerCache | None = None
    ) -> torch.Tensor:
        h = x + self.attention(self.attention_norm(x), cos, sin, cache)
        return h + self._feed_forward(h)

    def _feed_forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.feed_forward(self.ffn_norm(h))


class Transformer(nn.Module):
    """Token ids in, logits out; or, for a pipeline stage, hidden states in or out.

    A stage keeps ``tok_embeddings`` only if it is the first, ``norm`` and
    ``output`` only if it is the last (the others are set to ``None``).

    With ``shape.tie_embeddings`` the output projection's weight is the
    embedding's Parameter (both are ``[vocab, dim]``). ``to_empty`` of plain
    parameters off the meta device and tensor parallelism's
    ``parallelize_module`` give each module a parameter of its own again:
    :meth:`tie_weights` ties them back (DTensor parameters, as FSDP2 and
    replicate make, are swapped in place by ``to_empty`` and stay tied).
    Pipeline stages hold the two ends apart, each its own copy
    (:mod:`meshtop.runner.rank.pipeline`).
    """

    def __init__(self, shape: ModelShape) -> None:
        super().__init__()
        self.shape = shape
        self.tok_embeddings: nn.Embedding | None = nn.Embedding(shape.vocab_size, shape.dim)
        self.layers = nn.ModuleDict({str(i): Block(shape) for i in range(shape.n_layers)})
        self.norm: nn.RMSNorm | None = nn.RMSNorm(shape.dim, eps=shape.norm_eps)
        self.output: nn.Linear | None = nn.Linear(shape.dim, shape.vocab_size, bias=False)
        self.tie_weights()

    def tie_weights(self) -> None:
        """Make the output projection use the embedding's Parameter, where the shape ties them and this
        model (or pipeline stage) holds both; a no-op otherwise."""
        if self.shape.tie_embeddings and self.tok_embeddings is not None and self.output is not None:
            self.output.weight = self.tok_embeddings.weight

    def forward(self, tokens_or_hidden: torch.Tensor, cache: KVCache | None = None) -> torch.Tensor:
        """Training and pipeline stages: no ``cache``. Generation: the rows and positions are the cache's."""
        h = self.tok_embeddings(tokens_or_hidden) if self.tok_embeddings is not None else tokens_or_hidden
        if cache is None:
            cos, sin = rotary_tables(h.size(1), self.shape.head_dim, self.shape.rope_theta, device=h.device)
        else:
            cos, sin = cache.rotary(h.size(1), self.shape.head_dim, self.shape.rope_theta)
        for name, layer in self.layers.items():
            h = layer(h, cos, sin, cache.layer(int(name)) if cache is not None else None)
        if self.norm is not None:
            h = self.norm(h)
        return self.output(h) if self.output is not None else h


class _SkipInit(TorchFunctionMode):
    """Leaves out torch.nn.init's calls: a layer's default initialisation of a meta tensor is work thrown away,
    and meta ``normal_`` goes through torch's Python references, whose first call imports torch._dynamo (some 2 s
    of CPU at each rank's start)."""

    def __torch_function__(
        self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None
    ) -> Any:
        if getattr(func, "__module__", None) == "torch.nn.init":
            return args[0] if args else (kwargs or {})["tensor"]
        return func(*args, **(kwargs or {}))


def meta_transformer(shape: ModelShape, dtype: torch.dtype) -> Transformer:
    """The whole model of ``shape`` on the meta device, in ``dtype``, its values left to
    :func:`meshtop.runner.rank.weights.init_weights` once it is parallelised and materialised."""
    with torch.device("meta"), _SkipInit():
        return Transformer(shape).to(dtype)


def checkpoint_blocks(model: Transformer, recompute: str) -> None:
    """Set every block of ``model`` to checkpoint its activations as ``recompute`` says (none, full,
    selective)."""
    for block in model.layers.values():
        assert isinstance(block, Block)
        block.recompute = recompute


def next_token_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy of ``logits`` ``[batch, seq, vocab]`` against ``targets``."""
    return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())
