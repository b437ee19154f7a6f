"""The tiny model and data every framework script of the corpus trains: a Llama of random weights, random tokens.

Built here, never downloaded: ``LlamaConfig`` with hidden 32, 2 layers, 4 heads (2 of them key/value), vocabulary
128; sequences of 16 tokens drawn from a seeded generator, the same on every rank (each framework's sampler gives
each rank its own share). It imports nothing of meshtop's.
"""

from __future__ import annotations

import torch

VOCAB = 128
SEQ_LEN = 16


def tiny_llama() -> torch.nn.Module:
    """A ``LlamaForCausalLM`` of random weights (seed 0), in float32 (its loss: the mean cross-entropy of its
    shifted labels)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=VOCAB,
        max_position_embeddings=SEQ_LEN,
        tie_word_embeddings=False,
    )
    return LlamaForCausalLM(config).float()


def random_tokens(samples: int, *, seed: int = 1) -> torch.Tensor:
    """``samples`` sequences of ``SEQ_LEN`` random tokens, the same for a given seed on every rank."""
    return torch.randint(0, VOCAB, (samples, SEQ_LEN), generator=torch.Generator().manual_seed(seed))


class TokenDataset(torch.utils.data.Dataset):
    """Random token sequences as causal-LM examples: ``input_ids`` and ``labels`` (the same tokens; the model
    shifts them)."""

    def __init__(self, samples: int) -> None:
        self.tokens = random_tokens(samples)

    def __len__(self) -> int:
        return len(self.tokens)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.tokens[index], "labels": self.tokens[index]}
