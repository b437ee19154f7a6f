"""The pieces torchtune's recipe instantiates from ``torchtune_tiny.yaml``: the tiny Llama (torchtune's own
``llama3`` builder at the corpus's sizes), no tokenizer (the data is tokens already), and random tokens as
torchtune's SFT samples (``tokens``, and ``labels`` shifted by one, the last ignored). It imports nothing of
meshtop's.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch
from tiny_llama import SEQ_LEN, VOCAB, random_tokens

IGNORE_INDEX = -100


def tiny_llama() -> torch.nn.Module:
    from torchtune.models.llama3 import llama3

    return llama3(
        vocab_size=VOCAB,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        embed_dim=32,
        max_seq_len=SEQ_LEN,
        intermediate_dim=64,
    )


class NoTokenizer:
    """What the recipe asks of a tokenizer when the dataset brings its tokens: the padding id."""

    pad_id = 0
    max_seq_len = SEQ_LEN


def no_tokenizer() -> NoTokenizer:
    return NoTokenizer()


class RandomSamples(torch.utils.data.Dataset):
    def __init__(self, samples: int) -> None:
        self.tokens = random_tokens(samples)

    def __len__(self) -> int:
        return len(self.tokens)

    def __getitem__(self, index: int) -> dict[str, list[int]]:
        tokens = self.tokens[index].tolist()
        return {"tokens": tokens, "labels": [*tokens[1:], IGNORE_INDEX]}


def random_samples(tokenizer: NoTokenizer, samples: int) -> RandomSamples:
    return RandomSamples(samples)


def write_checkpoint(directory: Path) -> None:
    """The tiny Llama's random weights (seed 0) as torchtune's checkpoint ``model.pt``; every rank writes the
    same file, each by an atomic rename."""
    torch.manual_seed(0)
    directory.mkdir(parents=True, exist_ok=True)
    partial = directory / f"model.pt.{os.getpid()}"
    torch.save(tiny_llama().state_dict(), partial)
    os.replace(partial, directory / "model.pt")
