"""A real serving engine on the GPU, loaded by meshtop: ``python -m tests.bench.gpu_serving OUT``.

``transformers serve --continuous-batching`` of a random-weight Llama with the ``1b`` preset's shape (layers,
widths, heads, the 128,256-token vocabulary), built on the spot (no download), loaded by ``meshtop record
--endpoint`` at each concurrency (closed loop), with the server started by meshtop after ``--`` (so each
recording holds the server's start, its log and its process tree too). Its tokenizer is a word-level one over
the whole vocabulary ("[UNK]" and ``t1`` ... ``t128255``): meshtop's generated prompts are words it does not
know, one token each, so a prompt's tokens are its words, and any token the random model generates decodes.

Each recording's summary is printed (``meshtop record`` ends with it); the recordings stay in ``OUT`` (``c1``,
``c8``, ``c32``). Then each GPU's link rates over the load, from ``summary --json`` (the metrics core's, NVML's
counters: :mod:`meshtop.probes.nvml`), one line a GPU: PCIe must have been read on a GPU that served (NVML
reads it on every bare-metal GPU since Maxwell: none is a broken sampler, and the run fails); NVLink is printed
as read (``None`` on a GPU without NVLink peers), to hold against ``nvidia-smi dmon``'s PCIe columns and
``nvidia-smi nvlink -gt d`` in the device call's logs. ``--device cpu --shape tiny`` runs the same path on a CPU in
minutes (a rehearsal of the device call).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from meshtop.runner.presets import preset
from tests.kit.commands import meshtop
from tests.kit.ports import free_port

BUILD = """
import sys
import torch
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

out, dtype = sys.argv[1], getattr(torch, sys.argv[2])
layers, dim, heads, kv_heads, ffn, vocab, tied, theta = (float(v) if "." in v else int(v) for v in sys.argv[3:])
words = {"[UNK]": 0, **{f"t{i}": i for i in range(1, vocab)}}
tokenizer = Tokenizer(models.WordLevel(words, unk_token="[UNK]"))
tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, unk_token="[UNK]", bos_token="t1", eos_token="t2")
fast.save_pretrained(out)
config = LlamaConfig(
    vocab_size=vocab, hidden_size=dim, intermediate_size=ffn, num_hidden_layers=layers, num_attention_heads=heads,
    num_key_value_heads=kv_heads, max_position_embeddings=8192, rope_theta=theta, bos_token_id=1, eos_token_id=2,
    tie_word_embeddings=bool(tied),
)
torch.manual_seed(0)
model = LlamaForCausalLM(config).to(dtype)  # made on the CPU, whatever serves it: nothing else then waits for it
model.save_pretrained(out)
print(f"built {sum(p.numel() for p in model.parameters()) / 1e9:.2f}B parameters into {out}", flush=True)
"""


def build_model(directory: Path, shape_name: str, device: str) -> Path:
    """The random Llama of ``shape_name``'s shape and its tokenizer, saved into ``directory`` in the dtype it
    is served in on ``device`` (bf16 on a GPU)."""
    shape = preset(shape_name)
    fields = (shape.n_layers, shape.dim, shape.n_heads, shape.n_kv_heads, shape.ffn_dim, shape.vocab_size)
    fields += (int(shape.tie_embeddings),)
    theta = float(shape.rope_theta)
    dtype = "bfloat16" if device == "cuda" else "float32"
    argv = [sys.executable, "-c", BUILD, str(directory), dtype, *map(str, fields), repr(theta)]
    subprocess.run(argv, check=True)
    return directory


def server_command(model: Path, port: int, device: str) -> list[str]:
    """``transformers serve`` through its module (the image's ``transformers`` script may be elsewhere on PATH)."""
    serve = [sys.executable, "-c", "from transformers.cli.transformers import main; main()", "serve", str(model)]
    where = ["--host", "127.0.0.1", "--port", str(port), "--device", "cuda:0" if device == "cuda" else "cpu"]
    return [*serve, *where, "--dtype", "bfloat16" if device == "cuda" else "float32", "--continuous-batching"]


def record(out: Path, model: Path, device: str, concurrency: int, requests: int, args: argparse.Namespace) -> int:
    port = free_port()
    load = ["--endpoint", f"http://127.0.0.1:{port}", "--concurrency", str(concurrency), "--requests", str(requests)]
    load += ["--input-len", str(args.input_len), "--output-len", str(args.output_len), "--seed", "1"]
    # --model: transformers serve 5.17 lists only its hub cache's models in /v1/models, not the one it serves
    load += ["--warmup", str(min(concurrency, 4)), "--startup-timeout", "240", "--model", str(model)]
    argv = meshtop("record", out, *load, "--", *server_command(model, port, device))
    print("$", " ".join(argv), flush=True)
    started = time.monotonic()
    # transformers 5.17's /v1/models lists the hub's cache and answers 500 where that folder is missing (a bare
    # machine): one that exists, empty.
    cache = out.parent / "hf-cache"
    cache.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(argv, check=False, env={**os.environ, "HF_HUB_CACHE": str(cache)})
    print(f"record c{concurrency}: exit {done.returncode} in {time.monotonic() - started:.1f} s", flush=True)
    return done.returncode


def link_rates(recording: Path, device: str) -> bool:
    """Each sampled GPU's link rates over the load, printed; whether PCIe was read on each (a CPU run: none)."""
    done = subprocess.run(meshtop("summary", recording, "--json"), capture_output=True, text=True, check=False)
    if done.returncode != 0:
        print(f"links {recording.name}: summary failed: {done.stderr.strip()}", flush=True)
        return False
    gpus = json.loads(done.stdout).get("gpus") or []

    def gb(value: float | None) -> str:
        return "None" if value is None else f"{value / 1e9:.3f}"

    for gpu in gpus:
        rates = "  ".join(f"{name} {gb(rate['mean'])}/{gb(rate['peak'])}" for name, rate in gpu["links"].items())
        print(f"links {recording.name} GPU {gpu['gpu']} over the {gpu['links_over']} (GB/s mean/peak): {rates}")
    unread = [gpu["gpu"] for gpu in gpus if gpu["links"]["pcie_rx"]["mean"] is None]
    if device == "cuda" and (not gpus or unread):
        print(f"links {recording.name}: FAILED: PCIe not read ({'no GPU sampled' if not gpus else unread})")
        return False
    return True


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path, help="a new directory: the model and a recording a concurrency")
    parser.add_argument("--shape", default="1b", help="the meshtop preset whose shape the Llama takes")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--concurrency", default="1,8,32", help="comma-separated closed-loop concurrencies")
    parser.add_argument("--requests-per-client", type=int, default=4, help="requests = this x concurrency (16 min)")
    parser.add_argument("--input-len", type=int, default=128)
    parser.add_argument("--output-len", type=int, default=64)
    parser.add_argument("--model", type=Path, help="a model built by an earlier run (else one is built in OUT)")
    parser.add_argument("--build-only", action="store_true", help="build the model into OUT/model, load nothing")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    model = args.model or build_model(args.out / "model", args.shape, args.device)
    if args.build_only:
        return
    failed = 0
    for concurrency in (int(c) for c in args.concurrency.split(",")):
        requests = max(16, concurrency * args.requests_per_client)
        failed += record(args.out / f"c{concurrency}", model, args.device, concurrency, requests, args) != 0
        failed += not link_rates(args.out / f"c{concurrency}", args.device)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
