"""The built-in transformer: shapes, parameter counts, causality, rotary positions, learning."""

from __future__ import annotations

import pytest
import torch

from meshtop.runner.presets import PRESETS, PresetError, preset
from meshtop.runner.rank.data import replica_batch, synthetic_tokens
from meshtop.runner.rank.model import Transformer, next_token_loss
from meshtop.runner.rank.rotary import apply_rotary, rotary_tables
from meshtop.runner.rank.weights import init_weights


def tiny_model(seed: int = 0) -> Transformer:
    model = Transformer(preset("tiny"))
    init_weights(model, model=model.shape, seed=seed, device=torch.device("cpu"))
    return model


@pytest.mark.parametrize("name", PRESETS)
def test_parameter_count_matches_the_built_model(name: str) -> None:
    with torch.device("meta"):
        model = Transformer(PRESETS[name])
    assert sum(p.numel() for p in model.parameters()) == PRESETS[name].parameter_count()


def test_preset_sizes_are_what_their_names_say() -> None:
    assert 100e6 < PRESETS["125m"].parameter_count() < 200e6
    assert 1.0e9 < PRESETS["1b"].parameter_count() < 1.6e9
    assert 6.5e9 < PRESETS["7b"].parameter_count() < 7.5e9


def test_unknown_preset_names_the_choices() -> None:
    with pytest.raises(PresetError, match="tiny, small, 125m"):
        preset("13b")


def test_logits_shape_and_causality() -> None:
    model = tiny_model()
    tokens = torch.randint(256, (2, 16))
    logits = model(tokens)
    assert logits.shape == (2, 16, 256)
    changed = tokens.clone()
    changed[:, 10:] = (changed[:, 10:] + 1) % 256
    # Positions before the change cannot see it; positions after it do.
    assert torch.allclose(model(changed)[:, :10], logits[:, :10], atol=1e-6)
    assert not torch.allclose(model(changed)[:, 10:], logits[:, 10:], atol=1e-4)


def test_rotary_scores_depend_on_relative_position_only() -> None:
    cos, sin = rotary_tables(32, 8, 10000.0, device=torch.device("cpu"))
    q = torch.randn(1, 1, 1, 8).expand(1, 32, 1, 8)
    k = torch.randn(1, 1, 1, 8).expand(1, 32, 1, 8)
    rq, rk = apply_rotary(q, cos, sin)[0, :, 0], apply_rotary(k, cos, sin)[0, :, 0]
    assert torch.dot(rq[5], rk[2]) == pytest.approx(torch.dot(rq[20], rk[17]).item(), rel=1e-4)
    assert torch.dot(rq[5], rk[2]) != pytest.approx(torch.dot(rq[5], rk[4]).item(), rel=1e-3)


def test_same_seed_same_weights_other_seed_other_weights() -> None:
    a, b, c = tiny_model(0), tiny_model(0), tiny_model(1)
    for (name, pa), pb, pc in zip(a.named_parameters(), b.parameters(), c.parameters(), strict=True):
        assert torch.equal(pa, pb), name
        if not name.endswith("norm.weight"):
            assert not torch.equal(pa, pc), name


def test_synthetic_data_is_deterministic_and_split_between_replicas() -> None:
    first = synthetic_tokens(step=3, seed=0, batch_size=8, seq_len=16, vocab_size=256)
    assert torch.equal(first, synthetic_tokens(step=3, seed=0, batch_size=8, seq_len=16, vocab_size=256))
    assert not torch.equal(first, synthetic_tokens(step=4, seed=0, batch_size=8, seq_len=16, vocab_size=256))
    inputs, targets = replica_batch(first, dp_rank=1, dp=2)
    assert torch.equal(inputs, first[4:, :-1]) and torch.equal(targets, first[4:, 1:])


def test_model_learns_the_synthetic_task() -> None:
    torch.manual_seed(0)
    model = tiny_model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    losses = []
    for step in range(30):
        tokens = synthetic_tokens(step=step, seed=0, batch_size=8, seq_len=32, vocab_size=256)
        loss = next_token_loss(model(tokens[:, :-1]), tokens[:, 1:])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0] - 0.5
