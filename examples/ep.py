"""Expert-parallel training: a mixture of experts, one expert a rank, tokens dispatched with all-to-all.

Each rank embeds its own tokens and routes them (top-1; the embedding and the router are replicated on
every rank), sends each token to the rank that holds its expert and gets the expert's output back, as MoE
layers do (GShard, DeepSpeed-MoE, torchtitan). A step issues, per rank: an all-to-all of the token counts
(int64), an all-to-all of the tokens there and one back going forward and the two again going back
(uneven splits: as many tokens as the router sent), then an all-reduce of each replicated gradient (the
embedding's and the router's weight and bias): 5 all-to-alls and 4 all-reduces.

A plain torchrun script (it imports nothing of meshtop's)::

    torchrun --standalone --nproc-per-node 2 examples/ep.py --steps 8
    meshtop record OUT -- torchrun --standalone --nproc-per-node 2 examples/ep.py --steps 8

nccl with one GPU per rank where there are GPUs, gloo on CPU otherwise.
"""

import argparse
import os

import torch
import torch.distributed as dist
import torch.distributed.nn.functional as differentiable
from torch import nn


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--tokens", type=int, default=32, help="tokens each rank routes a step")
    args = parser.parse_args()
    cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if cuda else "gloo")
    device = torch.device("cuda", int(os.environ["LOCAL_RANK"])) if cuda else torch.device("cpu")
    world, rank = dist.get_world_size(), dist.get_rank()
    torch.manual_seed(0)
    embedding = nn.Linear(args.dim, args.dim).to(device)  # the same on every rank, as is the router:
    router = nn.Linear(args.dim, world).to(device)  # their gradients are all-reduced
    replicated = [*embedding.parameters(), *router.parameters()]
    torch.manual_seed(1 + rank)
    expert = nn.Sequential(nn.Linear(args.dim, 4 * args.dim), nn.GELU(), nn.Linear(4 * args.dim, args.dim))
    expert = expert.to(device)  # this rank's own expert
    optimizer = torch.optim.AdamW([*replicated, *expert.parameters()], lr=1e-3)
    data = torch.Generator().manual_seed(100 + rank)
    for step in range(args.steps):
        x = torch.randn(args.tokens, args.dim, generator=data).to(device)
        hidden = embedding(x)
        gate, choice = router(hidden).softmax(-1).max(-1)  # top-1: each token's expert, and its weight
        order = choice.argsort()
        send_counts = torch.bincount(choice, minlength=world)
        recv_counts = torch.empty_like(send_counts)
        dist.all_to_all_single(recv_counts, send_counts)  # how many tokens each rank sends this one
        sent, received = send_counts.tolist(), recv_counts.tolist()
        arrived = differentiable.all_to_all_single(
            torch.empty(sum(received), args.dim, device=device), hidden[order], received, sent
        )
        returned = differentiable.all_to_all_single(
            torch.empty(args.tokens, args.dim, device=device), expert(arrived), sent, received
        )
        out = torch.empty_like(returned).index_copy(0, order, returned) * gate[:, None]
        loss = (out - x).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        for parameter in replicated:
            assert parameter.grad is not None
            dist.all_reduce(parameter.grad)
            parameter.grad /= world
        optimizer.step()
        if rank == 0:
            print(f"step {step} loss {loss.item():.4f}", flush=True)
    dist.barrier()  # every rank done before any tears its group down
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
