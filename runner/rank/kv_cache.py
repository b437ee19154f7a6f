"""The key / value cache of generation: a fixed number of slots, one sequence each, filled as it grows.

A forward pass in generation works on some rows (slots) of the cache, each
adding the same number of tokens: a prefill adds a prompt to one slot, a
decode step adds one token to every active slot. Each row attends over its
own prefix only; what a freed slot held before is masked out, so a slot is
reused without clearing it (continuous batching).
"""

from __future__ import annotations

import torch

from meshtop.runner.rank.rotary import rotary_tables


class KVCache:
    """Keys and values of every layer for ``slots`` sequences of at most ``max_len`` tokens."""

    def __init__(self, *, slots: int, max_len: int, dtype: torch.dtype, device: torch.device) -> None:
        self.slots, self.max_len = slots, max_len
        self.dtype, self.device = dtype, device
        self.lengths = torch.zeros(slots, dtype=torch.long, device=device)
        """Tokens held per slot."""
        self._layers: dict[int, LayerCache] = {}
        self._rows: torch.Tensor | None = None
        self._positions: torch.Tensor | None = None
        self._tables: tuple[torch.Tensor, torch.Tensor] | None = None

    def begin(self, rows: torch.Tensor, count: int) -> None:
        """The next forward adds ``count`` tokens to each slot of ``rows``."""
        start = self.lengths[rows]
        if int(start.max()) + count > self.max_len:
            raise ValueError(f"a sequence would exceed the cache's {self.max_len} tokens")
        self._rows = rows
        self._positions = start[:, None] + torch.arange(count, device=self.device)

    def commit(self) -> None:
        """The forward is done: its tokens are now part of their slots."""
        assert self._rows is not None and self._positions is not None, "begin() first"
        self.lengths[self._rows] = self._positions[:, -1] + 1
        self._rows = self._positions = None

    def free(self, slot: int) -> None:
        self.lengths[slot] = 0

    def rotary(self, seq: int, head_dim: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
        """Cosine and sine at each token's own position: ``[rows, seq, head_dim // 2]``."""
        if self._tables is None:
            self._tables = rotary_tables(self.max_len, head_dim, theta, device=self.device)
        assert self._positions is not None and self._positions.size(1) == seq, "begin() with this many tokens"
        cos, sin = self._tables
        return cos[self._positions], sin[self._positions]

    def layer(self, index: int) -> LayerCache:
        if index not in self._layers:
            self._layers[index] = LayerCache(self)
        return self._layers[index]

    @property
    def nbytes(self) -> int:
        """Memory the cache holds (its KV-cache category)."""
        return sum(layer.nbytes for layer in self._layers.values())


class LayerCache:
    """One layer's keys and values, allocated on first use (their head count is the rank's own under TP)."""

    def __init__(self, cache: KVCache) -> None:
        self.cache = cache
        self.keys: torch.Tensor | None = None
        self.values: torch.Tensor | None = None

    def extend(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Store ``k``, ``v`` ``[rows, seq, heads, head_dim]``; the rows' keys, values and attention mask."""
        cache = self.cache
        rows, positions = cache._rows, cache._positions
        assert rows is not None and positions is not None, "KVCache.begin() first"
        if self.keys is None or self.values is None:
            shape = (cache.slots, cache.max_len, k.size(2), k.size(3))
            self.keys = torch.zeros(shape, dtype=k.dtype, device=k.device)
            self.values = torch.zeros(shape, dtype=v.dtype, device=v.device)
        self.keys[rows[:, None], positions] = k
        self.values[rows[:, None], positions] = v
        total = int(positions[:, -1].max()) + 1
        keys, values = self.keys[rows, :total], self.values[rows, :total]
        # Token i of a row sees the row's keys up to its own position: its prefix, nothing stale beyond.
        mask = torch.arange(total, device=k.device)[None, None, :] <= positions[:, :, None]
        return keys, values, mask[:, None, :, :]

    @property
    def nbytes(self) -> int:
        if self.keys is None or self.values is None:
            return 0
        return self.keys.numel() * self.keys.element_size() * 2
