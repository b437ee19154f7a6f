"""Generation with the KV cache: the same greedy tokens as recomputing the whole sequence, batched or alone."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from runner.generate import Generator, Request, generate_all
from runner.model import Transformer
from runner.presets import PRESETS
from runner.weights import init_weights


SEED = 3


def tiny_model() -> Transformer:
    model = Transformer(PRESETS["tiny"])
    with torch.no_grad():
        init_weights(model, model=PRESETS["tiny"], seed=SEED, device=torch.device("cpu"))
    return model.eval()


@torch.no_grad()
def greedy_without_cache(model: Transformer, prompt: tuple[int, ...], count: int) -> list[int]:
    """The reference: run the whole sequence again for every new token."""
    sequence, out = list(prompt), []
    for _ in range(count):
        token = int(model(torch.tensor([sequence]))[0, -1].argmax())
        out.append(token)
        sequence.append(token)
    return out


def requests() -> list[Request]:
    gen = torch.Generator().manual_seed(7)
    lengths = [(5, 9), (17, 4), (2, 12), (11, 1), (8, 7), (30, 5)]
    return [Request(id=i, prompt=tuple(torch.randint(0, 256, (p,), generator=gen).tolist()), output_len=n)
            for i, (p, n) in enumerate(lengths)]


def test_cached_greedy_tokens_equal_recomputing_the_whole_sequence() -> None:
    model = tiny_model()
    for request in requests():
        generator = Generator(model, max_batch=1, max_len=64, device=torch.device("cpu"), dtype=torch.float32)
        got = generate_all(generator, [request])[request.id]
        assert got == greedy_without_cache(model, request.prompt, request.output_len), request.id


def test_continuous_batching_gives_each_request_the_tokens_it_gets_alone() -> None:
    model = tiny_model()
    alone = {r.id: greedy_without_cache(model, r.prompt, r.output_len) for r in requests()}
    generator = Generator(model, max_batch=2, max_len=64, device=torch.device("cpu"), dtype=torch.float32)
    batched = generate_all(generator, requests())
    assert batched == alone
    assert generator.cache.nbytes == 2 * 4 * 2 * 64 * 2 * 16 * 4  # K and V, 4 layers, 2 slots x 64 x 2 heads x 16


@pytest.mark.slow
def test_tensor_parallel_generation_gives_the_single_process_tokens(tmp_path: Path) -> None:
    model = tiny_model()
    alone = {str(r.id): greedy_without_cache(model, r.prompt, r.output_len) for r in requests()}
    out = tmp_path / "tokens.json"
    subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
                    "-m", "tests.generate_worker", "2", str(out)], check=True, capture_output=True, timeout=300,
                   env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert json.loads(out.read_text()) == alone
