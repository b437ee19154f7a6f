"""Serving trade-off: the same ranks as dp replicas, tp shards or pp stages, at low and high concurrency.

``python -m tests.bench.serving [--model small] [--requests 32] [--reps 2] [--json PATH]``

Each configuration serves the same seeded load (closed loop) with ``meshtop
record --mode infer``; runs are interleaved (every plan once per repetition,
in turn), so the machine's drift hits each plan alike. Per configuration:
TTFT, TPOT and end-to-end p50, output tokens / s (median over repetitions,
spread min-max), then each plan's ratio to dp at the same concurrency.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from meshtop.recordings.reader import open_recording
from meshtop.recordings.summary import summarize
from tests.kit.commands import meshtop

PLANS = {"dp2": ["--dp", "2"], "tp2": ["--dp", "1", "--tp", "2"], "pp2": ["--dp", "1", "--pp", "2"]}
CONCURRENCY = (2, 16)
METRICS = ("ttft_p50_ms", "tpot_p50_ms", "e2e_p50_ms", "output_tokens_per_s")


def serve_once(
    out: Path,
    plan: list[str],
    *,
    model: str,
    requests: int,
    concurrency: int,
    prompt_len: int,
    output_len: int,
    device: str,
) -> dict[str, float]:
    argv = meshtop(
        "record",
        str(out),
        "--mode",
        "infer",
        "--device",
        device,
        "--model",
        model,
        "--requests",
        str(requests),
        "--concurrency",
        str(concurrency),
        "--prompt-len",
        str(prompt_len),
        "--output-len",
        str(output_len),
        "--max-batch",
        "16",
        *plan,
    )
    done = subprocess.run(argv, capture_output=True, text=True, timeout=900)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed:\n{done.stdout}{done.stderr}")
    figures = summarize(open_recording(out))["requests"]
    assert figures["completed"] == requests, figures
    return {
        "ttft_p50_ms": figures["ttft_s"]["p50"] * 1e3,
        "tpot_p50_ms": figures["tpot_s"]["p50"] * 1e3,
        "e2e_p50_ms": figures["e2e_s"]["p50"] * 1e3,
        "output_tokens_per_s": figures["output_tokens_per_s"],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="small")
    parser.add_argument("--requests", type=int, default=32)
    parser.add_argument("--prompt-len", type=int, default=128)
    parser.add_argument("--output-len", type=int, default=32)
    parser.add_argument("--reps", type=int, default=2)
    parser.add_argument("--device", default="cpu", help="cpu, or cuda on a machine with 2 GPUs")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    runs: dict[tuple[str, int], list[dict[str, float]]] = {(p, c): [] for c in CONCURRENCY for p in PLANS}
    with tempfile.TemporaryDirectory() as tmp:
        for rep in range(args.reps):
            for (plan, concurrency), results in runs.items():
                out = Path(tmp) / f"{plan}-c{concurrency}-{rep}"
                results.append(
                    serve_once(
                        out,
                        PLANS[plan],
                        model=args.model,
                        requests=args.requests,
                        concurrency=concurrency,
                        prompt_len=args.prompt_len,
                        output_len=args.output_len,
                        device=args.device,
                    )
                )
                print(
                    f"  rep {rep + 1}/{args.reps} {plan} c={concurrency}: "
                    f"{results[-1]['output_tokens_per_s']:.0f} tok/s",
                    file=sys.stderr,
                    flush=True,
                )
    rows: list[dict[str, Any]] = []
    for (plan, concurrency), results in runs.items():
        row: dict[str, Any] = {"plan": plan, "concurrency": concurrency, "reps": len(results)}
        for name in METRICS:
            values = [r[name] for r in results]
            row[name] = {"median": statistics.median(values), "min": min(values), "max": max(values)}
        rows.append(row)
    base = {r["concurrency"]: r for r in rows if r["plan"] == "dp2"}
    for row in rows:
        row["vs_dp2"] = {name: row[name]["median"] / base[row["concurrency"]][name]["median"] for name in METRICS}
    print(
        f"serving: model {args.model}, {args.requests} requests, prompt {args.prompt_len}, output "
        f"{args.output_len}, 2 {args.device} ranks each, {args.reps} interleaved repetitions (median, min-max)"
    )
    print(
        f"{'plan':<6}{'C':>4}{'TTFT p50 ms':>22}{'TPOT p50 ms':>22}{'e2e p50 ms':>24}{'output tok/s':>20}"
        f"{'tok/s vs dp2':>14}"
    )
    for row in rows:
        cells = "".join(
            f"{row[n]['median']:>9.1f} ({row[n]['min']:.0f}-{row[n]['max']:.0f})".rjust(w)
            for n, w in zip(METRICS, (22, 22, 24, 20), strict=False)
        )
        print(f"{row['plan']:<6}{row['concurrency']:>4}{cells}{row['vs_dp2']['output_tokens_per_s']:>14.2f}")
    if args.json is not None:
        args.json.write_text(json.dumps({"model": args.model, "requests": args.requests, "rows": rows}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
