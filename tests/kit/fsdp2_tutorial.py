"""A torchrun script in the shape of PyTorch's own FSDP2 tutorial and example, to check what meshtop records of it.

``torchrun --nproc-per-node 2 tests/kit/fsdp2_tutorial.py --out DIR [--steps 10] [--nan-from K]``

As the tutorial does: a small Transformer built on the meta device, ``fully_shard`` on each layer and then on
the root, ``to_empty`` and ``reset_parameters``, ``torch.optim.Adam``, and each step ``loss = model(x).sum();
loss.backward(); clip_grad_norm_(...); optim.step(); optim.zero_grad()``, then a checkpoint saved with
``torch.distributed.checkpoint`` and the process group destroyed (no barrier). ``--nan-from K``: from step K
the loss is multiplied by NaN, as a run that diverged. Each rank writes ``DIR/rank{R}.jsonl``, a line a step
with its loss. It imports nothing of meshtop's.
"""

import argparse
import json
import math
import os
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import get_state_dict
from torch.distributed.fsdp import fully_shard

VOCAB, DIM, HEADS, LAYERS, SEQ, BATCH = 128, 32, 4, 3, 16, 8


class Attention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.wq, self.wk, self.wv, self.wo = (nn.Linear(DIM, DIM, bias=False) for _ in range(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, _ = x.shape
        q, k, v = (w(x).view(batch, seq, HEADS, DIM // HEADS).transpose(1, 2) for w in (self.wq, self.wk, self.wv))
        out = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.wo(out.transpose(1, 2).reshape(batch, seq, DIM))

    def reset_parameters(self) -> None:
        for linear in (self.wq, self.wk, self.wv, self.wo):
            linear.reset_parameters()


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.attention_norm, self.attention = nn.LayerNorm(DIM), Attention()
        self.ffn_norm = nn.LayerNorm(DIM)
        self.feed_forward = nn.Sequential(nn.Linear(DIM, 4 * DIM), nn.GELU(), nn.Linear(4 * DIM, DIM))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x + self.attention(self.attention_norm(x))
        return h + self.feed_forward(self.ffn_norm(h))

    def reset_parameters(self) -> None:
        self.attention_norm.reset_parameters()
        self.attention.reset_parameters()
        self.ffn_norm.reset_parameters()
        self.feed_forward[0].reset_parameters()
        self.feed_forward[2].reset_parameters()


class Transformer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.tok_embeddings, self.pos_embeddings = nn.Embedding(VOCAB, DIM), nn.Embedding(SEQ, DIM)
        self.layers = nn.ModuleList(Block() for _ in range(LAYERS))
        self.norm, self.output = nn.LayerNorm(DIM), nn.Linear(DIM, VOCAB, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.tok_embeddings(tokens) + self.pos_embeddings(torch.arange(tokens.shape[1], device=tokens.device))
        for layer in self.layers:
            h = layer(h)
        return self.output(self.norm(h)).float()

    def reset_parameters(self) -> None:
        for module in (self.tok_embeddings, self.pos_embeddings, self.norm, self.output, *self.layers):
            module.reset_parameters()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--nan-from", type=int, default=None)
    args = parser.parse_args()
    rank = int(os.environ["LOCAL_RANK"])
    cuda = torch.cuda.is_available()
    device = torch.device("cuda", rank) if cuda else torch.device("cpu")
    backend = dist.get_default_backend_for_device(device)
    dist.init_process_group(backend=backend, device_id=device) if cuda else dist.init_process_group(backend=backend)
    torch.manual_seed(0)
    with torch.device("meta"):
        model = Transformer()
    for layer in model.layers:
        fully_shard(layer)
    fully_shard(model)
    model.to_empty(device=device)
    model.reset_parameters()
    optim = torch.optim.Adam(model.parameters(), lr=1e-2)
    lines = []
    for step in range(args.steps):
        x = torch.randint(0, VOCAB, (BATCH, SEQ), device=device)
        loss = model(x).sum()
        if args.nan_from is not None and step >= args.nan_from:
            loss = loss * math.nan
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)
        optim.step()
        optim.zero_grad()
        lines.append({"step": step, "loss": loss.item()})
    model_state, optim_state = get_state_dict(model, optim)
    dcp.save({"model": model_state, "optim": optim_state}, checkpoint_id=str(args.out / "checkpoint"))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"rank{dist.get_rank()}.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    dist.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
