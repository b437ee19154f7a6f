"""meshtop's request figures against a peer load generator's, on the same server and the same load.

``python -m tests.bench.peer_figures --guidellm EXE [--requests 64] [--concurrency 4] [--output-len 16]``

Two servers answer both tools: a stub of known timing (:mod:`tests.kit.sse_server`: the first token 20 ms
after the request, the next ones 5 ms apart, so TTFT, TPOT and e2e are known beforehand), and a real
``transformers serve`` (a tiny random Llama on the CPU, :mod:`tests.kit.hf_server`). Both tools send the same
prompts (one JSON lines file, ``{"prompt": ...}`` a line: meshtop's ``--prompts``, guidellm's ``json_file``
data) at the same concurrency, in turn after a warm-up run: meshtop, guidellm, meshtop, guidellm (``--reps``),
so each tool's own spread is the noise a difference is read against. The servers run on the second core and
both tools on the first, so neither tool's CPU slows a server.

Each figure is computed from each tool's own per-request records with one quantile rule
(:func:`meshtop.recordings.metrics.stats.quantile`):

- TTFT: meshtop's (first token - sent), by :func:`meshtop.recordings.metrics.requests.request_latency`;
  guidellm's ``time_to_first_token_ms``.
- TPOT: meshtop's (last token - first token) / (output tokens - 1), the same function; guidellm calls it
  ``inter_token_latency_ms`` (its own ``time_per_output_token_ms`` divides by all output tokens and counts
  from the request's start, so it is not compared).
- E2E: meshtop's (end - sent); guidellm's ``request_latency``.
- input / output tokens: both from the server's ``usage``.

guidellm asks for ``ignore_eos`` where a data row gives an output length, which ``transformers serve``
refuses; the lines here give none, and both tools send ``max_tokens`` = ``--output-len`` (guidellm by its
backend's ``max_tokens``), so a request ends at that many tokens or at an end-of-sequence token alike.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from meshtop.recordings.metrics.requests import request_latency
from meshtop.recordings.metrics.stats import quantile
from meshtop.recordings.reader import open_recording
from tests.kit.commands import run_meshtop
from tests.kit.hf_server import Server, build_tiny_model
from tests.kit.sse_server import MODEL as STUB_MODEL

FIRST_MS, GAP_MS = 20.0, 5.0
"""The stub server's timing: its first token 20 ms after the request, each next one 5 ms later."""
FIGURES = ("ttft_ms", "tpot_ms", "e2e_ms", "input_tokens", "output_tokens")
WORDS = ("the", "quick", "brown", "fox", "jumps", "over", "lazy", "dog", "and", "meshtop", "measures", "it")


def write_prompts(path: Path, count: int, words: int) -> None:
    """``count`` distinct prompts of ``words`` words each, a JSON line apiece."""
    rng = np.random.default_rng(0)
    lines = [json.dumps({"prompt": " ".join(rng.choice(WORDS, size=words))}) for _ in range(count)]
    path.write_text("\n".join(lines) + "\n")


def meshtop_requests(url: str, prompts: Path, args: argparse.Namespace, out: Path) -> list[dict[str, float | None]]:
    done = run_meshtop(
        "record", out, "--endpoint", url, "--prompts", prompts, "--requests", str(args.requests),
        "--concurrency", str(args.concurrency), "--output-len", str(args.output_len), "--timeout", "60",
    )  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(done.stderr)
    rows = []
    for event in open_recording(out).arrow("request").to_pylist():
        if event["status"] != "completed" or event["warmup"]:
            continue
        latency = request_latency(
            arrival_ns=event["arrival_ns"], first_token_ns=event["first_token_ns"], end_ns=event["end_ns"],
            output_tokens=event["output_tokens"], token_ns=event["token_ns"],
        )  # fmt: skip
        rows.append({
            "ttft_ms": latency.ttft_s * 1e3 if latency.ttft_s is not None else None,
            "tpot_ms": latency.tpot_s * 1e3 if latency.tpot_s is not None else None,
            "e2e_ms": latency.e2e_s * 1e3,
            "input_tokens": float(event["prompt_tokens"]), "output_tokens": float(event["output_tokens"]),
        })  # fmt: skip
    return rows


def guidellm_requests(
    url: str, model: str, prompts: Path, args: argparse.Namespace, out: Path
) -> list[dict[str, float | None]]:
    backend = f"kind=openai_http,target={url}/v1,model={model},request_format=/v1/completions"
    command = [
        args.guidellm, "run",
        "--backend", f"{backend},max_tokens={args.output_len}",
        "--tokenizer", f"kind=huggingface_auto,model={args.tokenizer}",
        "--profile", f"kind=concurrent,streams={args.concurrency}",
        "--constraint", f"kind=max_requests,count={args.requests}",
        "--data", f"kind=json_file,path={prompts}",
        "--output", f"kind=json,path={out}",
        "--disable-console",
    ]  # fmt: skip
    done = subprocess.run(
        command, capture_output=True, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"}, timeout=900
    )
    if done.returncode != 0:
        raise RuntimeError(done.stderr[-3000:])
    benchmark = json.loads(out.read_text())["benchmarks"][0]
    return [
        {
            "ttft_ms": r["time_to_first_token_ms"],
            "tpot_ms": r["inter_token_latency_ms"],
            "e2e_ms": r["request_latency"] * 1e3,
            "input_tokens": float(r["prompt_tokens"]),
            "output_tokens": float(r["output_tokens"]),
        }
        for r in benchmark["requests"]["successful"]
    ]


def figures(rows: list[dict[str, float | None]]) -> dict[str, dict[str, float | None]]:
    out: dict[str, dict[str, float | None]] = {}
    for name in FIGURES:
        values = np.array([row[name] for row in rows if row[name] is not None], dtype=float)
        out[name] = {"mean": float(values.mean()), "p50": quantile(values, 0.5), "p90": quantile(values, 0.9)}
    out["completed"] = {"count": float(len(rows))}
    return out


def side_by_side(url: str, model: str, prompts: Path, args: argparse.Namespace, base: Path) -> dict[str, Any]:
    """Each tool ``--reps`` times against ``url``, in turn, after a warm-up run of meshtop's."""
    result: dict[str, Any] = {}
    meshtop_requests(url, prompts, args, base / "warmup")  # a server's first requests are slower
    for rep in range(1, args.reps + 1):
        result[f"meshtop {rep}"] = figures(meshtop_requests(url, prompts, args, base / f"m{rep}"))
        result[f"guidellm {rep}"] = figures(guidellm_requests(url, model, prompts, args, base / f"g{rep}.json"))
    return result


def print_table(title: str, result: dict[str, Any], truth: dict[str, float] | None = None) -> None:
    print(title)
    print(f"{'figure':<22}" + "".join(f"{tool:>14}" for tool in result) + ("       known" if truth else ""))
    for name in FIGURES:
        for stat in ("p50", "p90", "mean"):
            cells = "".join(f"{result[tool][name][stat]:>14.2f}" for tool in result)
            known = f"{truth[name]:>12.2f}" if truth and name in truth and stat == "p50" else ""
            print(f"{name + ' ' + stat:<22}{cells}{known}")
    print(f"{'completed':<22}" + "".join(f"{result[tool]['completed']['count']:>14.0f}" for tool in result))


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--guidellm", required=True, metavar="EXE", help="guidellm's executable (a venv of its own)")
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--output-len", type=int, default=16)
    parser.add_argument("--prompt-words", type=int, default=24)
    parser.add_argument("--reps", type=int, default=2)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    result: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="meshtop-peer-") as scratch:
        base = Path(scratch)
        model = build_tiny_model(base / "tiny-llama")
        args.tokenizer = model  # guidellm counts the prompts' tokens with it
        prompts = base / "prompts.jsonl"
        write_prompts(prompts, args.requests, args.prompt_words)
        # The servers on the second core, both tools on the first: on 2 cores a tool's own CPU would otherwise
        # slow the server it measures (guidellm's worker processes did, by a third), and the tools would be
        # read against different servers.
        os.sched_setaffinity(0, {1})
        stub = subprocess.Popen(
            [sys.executable, "-m", "tests.kit.sse_server", str(args.output_len), str(GAP_MS), str(FIRST_MS)],
            stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        server = Server(model, base / "server.log")
        os.sched_setaffinity(0, {0})
        try:
            assert stub.stdout is not None
            stub_url = f"http://127.0.0.1:{int(stub.stdout.readline())}"
            result["known"] = side_by_side(stub_url, STUB_MODEL, prompts, args, base / "stub")
            result["transformers serve"] = side_by_side(server.url, str(model), prompts, args, base / "hf")
        finally:
            server.stop()
            stub.kill()
            stub.wait()
    setting = f"{args.requests} requests, concurrency {args.concurrency}, max_tokens {args.output_len}"
    truth = {"ttft_ms": FIRST_MS, "tpot_ms": GAP_MS, "e2e_ms": FIRST_MS + GAP_MS * (args.output_len - 1)}
    print_table(f"a stub server of known timing ({setting}):", result["known"], truth)
    print_table(f"transformers serve, a tiny Llama on one core ({setting}):", result["transformers serve"])
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
