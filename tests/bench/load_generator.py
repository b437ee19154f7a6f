"""The load generator's ceiling, and what recording costs a request's TTFT.

``python -m tests.bench.load_generator [--rates 100,200,...] [--requests N] [--json PATH]``

- Ceiling: against a minimal streaming server in a process of its own (:mod:`tests.kit.sse_server`: 8
  chunks at once, no model), ``meshtop record --endpoint`` sends an open-loop Poisson load at each rate in
  turn; the ceiling is the highest rate whose send lag p99 stays within 10 ms (the client-limited rule of
  the metrics core) with every request answered. Each rate's lag p50 / p99, the rate achieved and the TTFT
  p50 are printed.
- Recording's cost: the same seeded load at half the ceiling, sent by the load generator with meshtop
  recording it (``meshtop record``) and with a bare collector that only keeps the events in memory (no
  files, no fold), in pairs (each pair's order alternating); TTFT p50 and p99 of each, and their differences.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from meshtop.probes.arrivals import Arrivals
from meshtop.probes.collector import Collector
from meshtop.probes.events import RequestDone
from meshtop.probes.wire import ADDRESS_ENV, TOKEN_ENV
from meshtop.recordings.manifest import Load
from meshtop.recordings.metrics.requests import CLIENT_LAG_LIMIT_S
from meshtop.recordings.typed_json import dump
from meshtop.runner.serving.client import ClientSpec
from meshtop.runner.serving.endpoint import EndpointRun
from meshtop.runner.serving.http import Origin
from meshtop.runner.serving.load import plan_load
from meshtop.runner.serving.run import write_load
from tests.kit.commands import run_meshtop
from tests.kit.sse_server import MODEL

RATES = (50, 100, 200, 400, 600, 800, 1200)


def start_server() -> tuple[subprocess.Popen[str], str]:
    process = subprocess.Popen([sys.executable, "-m", "tests.kit.sse_server", "8"], stdout=subprocess.PIPE, text=True)
    assert process.stdout is not None
    port = int(process.stdout.readline())
    return process, f"http://127.0.0.1:{port}"


def recorded(url: str, rate: float, requests: int, out: Path, seed: int = 0, *, even: bool = False) -> dict[str, Any]:
    """meshtop's record of a Poisson load (``even``: gaps nearly constant, a gamma of shape 10,000, as a peer's
    constant rate)."""
    shape = ["--burstiness", "10000"] if even else []
    done = run_meshtop(
        "record", out, "--endpoint", url, "--request-rate", str(rate), "--requests", str(requests),
        "--output-len", "8", "--seed", str(seed), "--timeout", "30", *shape,
    )  # fmt: skip
    if done.returncode not in (0, 1):
        raise RuntimeError(done.stderr)
    summary = json.loads(run_meshtop("summary", out, "--json").stdout)["requests"]
    return summary


def bare_ttfts(url: str, rate: float, requests: int, directory: Path, seed: int = 0) -> list[float]:
    """The load sent by the load generator alone, its events kept in memory by a bare collector."""
    load = Load(requests=requests, concurrency=None, request_rate_per_s=rate, output_len=(8, 8), seed=seed)
    run = EndpointRun(
        url=url, origins=(Origin.parse(url),), api="completions", model=MODEL,
        models=(MODEL,), load=load, requests=tuple(plan_load(load)),
    )  # fmt: skip
    write_load(directory / "load.jsonl", run)
    spec = ClientSpec(
        urls=(url + "/v1",), api="completions", model=MODEL, concurrency=None, timeout_s=30.0, ignore_eos=False,
        requests_path=str(directory / "load.jsonl"), status_path=str(directory / "status.json"),
    )  # fmt: skip
    (directory / "spec.json").write_text(json.dumps(dump(spec)))
    collector = Collector().start()
    env = {**os.environ, ADDRESS_ENV: "{}:{}".format(*collector.address), TOKEN_ENV: collector.token}
    subprocess.run(
        [sys.executable, "-m", "meshtop.runner.serving.client", str(directory / "spec.json")], env=env, check=True
    )
    time.sleep(0.3)
    events = [e for e in Arrivals(collector.drain()).events(("request",)) if isinstance(e, RequestDone)]
    collector.stop()
    return [(e.first_token_ns - e.arrival_ns) / 1e9 for e in events if e.first_token_ns is not None]


def guidellm_lags(guidellm: str, url: str, rate: float, requests: int, tokenizer: str, out: Path) -> dict[str, Any]:
    """guidellm's constant-rate load against the same server: each request's send lag by its own records
    (``request_start - targeted_start``: when it was sent less when it was meant to be, meshtop's definition)."""
    command = [
        guidellm, "run",
        "--backend", f"kind=openai_http,target={url}/v1,model={MODEL},request_format=/v1/completions",
        "--profile", f"kind=constant,rate={rate:g}",
        "--constraint", f"kind=max_requests,count={requests}",
        "--tokenizer", f"kind=huggingface_auto,model={tokenizer}",
        "--data", "kind=synthetic_text,prompt_tokens=32,output_tokens=8",
        "--output", f"kind=json,path={out}",
        "--disable-console",
    ]  # fmt: skip
    subprocess.run(command, check=True, capture_output=True, env={**os.environ, "HF_HUB_OFFLINE": "1"}, timeout=900)
    benchmark = json.loads(out.read_text())["benchmarks"][0]
    done = benchmark["requests"]["successful"]
    lags = [r["info"]["timings"]["request_start"] - r["info"]["timings"]["targeted_start"] for r in done]
    starts = sorted(r["info"]["timings"]["request_start"] for r in done)
    return {
        "rate": rate, "lag_p50_ms": quantile(lags, 0.5) * 1e3, "lag_p99_ms": quantile(lags, 0.99) * 1e3,
        "achieved": (len(starts) - 1) / (starts[-1] - starts[0]), "completed": len(done),
        "ttft_p50_ms": quantile([r["time_to_first_token_ms"] for r in done], 0.5),
    }  # fmt: skip


def quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    position = q * (len(ordered) - 1)
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rates", default=",".join(map(str, RATES)))
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--cost-requests", type=int, default=2000)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument(
        "--cost-rate", type=float, default=None, help="the rate recording's cost is measured at (half the ceiling)"
    )
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument(
        "--guidellm",
        default=None,
        metavar="EXE",
        help="also measure guidellm (its executable; a venv of its own) with constant arrivals beside meshtop's",
    )
    parser.add_argument("--tokenizer", default=None, help="a local tokenizer folder for guidellm's synthetic data")
    args = parser.parse_args(argv)
    if args.guidellm is not None:
        return side_by_side(args)
    server, url = start_server()
    result: dict[str, Any] = {"ceiling": [], "cost": []}
    try:
        with tempfile.TemporaryDirectory(prefix="meshtop-bench-") as scratch:
            ceiling = None
            for rate in (float(r) for r in args.rates.split(",")):
                figures = recorded(url, rate, args.requests, Path(scratch) / f"rate-{rate:g}")
                client = figures["client"]
                lag = client["send_lag_s"]
                ok = lag["p99"] <= CLIENT_LAG_LIMIT_S and figures["completed"] == args.requests
                row = {
                    "rate": rate, "lag_p50_ms": lag["p50"] * 1e3, "lag_p99_ms": lag["p99"] * 1e3,
                    "achieved": client["achieved_rate_per_s"], "ttft_p50_ms": figures["ttft_s"]["p50"] * 1e3,
                    "completed": figures["completed"], "within": ok,
                }  # fmt: skip
                result["ceiling"].append(row)
                print(
                    f"rate {rate:>6g}/s: lag p50 {row['lag_p50_ms']:.2f} ms p99 {row['lag_p99_ms']:.2f} ms, "
                    f"sent {row['achieved']:.1f}/s, TTFT p50 {row['ttft_p50_ms']:.2f} ms, "
                    f"{row['completed']}/{args.requests} answered {'ok' if ok else 'OVER'}",
                    flush=True,
                )
                if ok:
                    ceiling = rate
                else:
                    break
            result["ceiling_rate"] = ceiling
            print(f"ceiling: {ceiling} requests/s with send lag p99 <= {CLIENT_LAG_LIMIT_S * 1e3:g} ms")
            half = args.cost_rate or (ceiling or RATES[0]) / 2
            on_p50, on_p99, off_p50, off_p99 = [], [], [], []
            for rep in range(args.reps):
                # in alternating order, so a drift of the machine over the run weighs on both alike
                if rep % 2:
                    off = bare_ttfts(url, half, args.cost_requests, Path(tempfile.mkdtemp(dir=scratch)), seed=rep)
                on = recorded(url, half, args.cost_requests, Path(scratch) / f"on-{rep}", seed=rep)
                if not rep % 2:
                    off = bare_ttfts(url, half, args.cost_requests, Path(tempfile.mkdtemp(dir=scratch)), seed=rep)
                on_p50.append(on["ttft_s"]["p50"] * 1e3)
                on_p99.append(on["ttft_s"]["p99"] * 1e3)
                off_p50.append(quantile(off, 0.5) * 1e3)
                off_p99.append(quantile(off, 0.99) * 1e3)
                print(
                    f"recording at {half:g}/s, rep {rep}: TTFT p50 {on_p50[-1]:.2f} ms recorded, "
                    f"{off_p50[-1]:.2f} ms bare; p99 {on_p99[-1]:.2f} / {off_p99[-1]:.2f} ms",
                    flush=True,
                )
            result["cost"] = {
                "rate": half,
                "p50_added_ms": statistics.median(a - b for a, b in zip(on_p50, off_p50, strict=True)),
                "p99_added_ms": statistics.median(a - b for a, b in zip(on_p99, off_p99, strict=True)),
                "reps": args.reps,
            }
            print(
                f"recording adds TTFT p50 {result['cost']['p50_added_ms']:+.2f} ms, "
                f"p99 {result['cost']['p99_added_ms']:+.2f} ms (median of {args.reps} paired runs)"
            )
    finally:
        server.kill()
        server.wait()
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=2))
    return result


def side_by_side(args: argparse.Namespace) -> dict[str, Any]:
    """meshtop and guidellm, each rate in turn (meshtop first, then guidellm), constant arrivals, against the
    same server, the whole sweep ``--reps`` times: each one's send lag and the highest rate it holds within
    10 ms, in each repetition. A tool is no longer asked once two rates in a row were over (its ceiling is
    behind it; past it guidellm falls behind its schedule by seconds and a rate takes minutes)."""
    server, url = start_server()
    rows: list[dict[str, Any]] = []
    if args.tokenizer is None:
        args.tokenizer = str(tiny_tokenizer())
    try:
        with tempfile.TemporaryDirectory(prefix="meshtop-bench-") as scratch:
            for rep in range(args.reps):
                over = {"meshtop": 0, "guidellm": 0}
                for rate in (float(r) for r in args.rates.split(",")):
                    requests = max(500, int(rate * 3))
                    for name in ("meshtop", "guidellm"):
                        if over[name] >= 2:
                            continue
                        if name == "meshtop":
                            row = meshtop_lags(url, rate, requests, Path(scratch) / f"m-{rep}-{rate:g}")
                        else:
                            out = Path(scratch) / f"g-{rep}-{rate:g}.json"
                            row = guidellm_lags(args.guidellm, url, rate, requests, args.tokenizer, out)
                        row["tool"], row["requests"], row["rep"] = name, requests, rep
                        row["within"] = row["lag_p99_ms"] <= CLIENT_LAG_LIMIT_S * 1e3 and row["completed"] == requests
                        over[name] = 0 if row["within"] else over[name] + 1
                        rows.append(row)
                        print(
                            f"rep {rep} {name:>8} {rate:>6g}/s: lag p50 {row['lag_p50_ms']:.2f} ms "
                            f"p99 {row['lag_p99_ms']:.2f} ms, sent {row['achieved']:.1f}/s, "
                            f"TTFT p50 {row['ttft_p50_ms']:.2f} ms, {row['completed']}/{requests} answered "
                            f"{'ok' if row['within'] else 'OVER'}",
                            flush=True,
                        )
                    if over["meshtop"] >= 2 and over["guidellm"] >= 2:
                        break
    finally:
        server.kill()
        server.wait()
    ceilings = {
        tool: [
            max((r["rate"] for r in rows if r["tool"] == tool and r["rep"] == rep and r["within"]), default=None)
            for rep in range(args.reps)
        ]
        for tool in ("meshtop", "guidellm")
    }
    print(f"ceilings per repetition (send lag p99 <= {CLIENT_LAG_LIMIT_S * 1e3:g} ms): {ceilings}")
    result = {"rows": rows, "ceilings": ceilings}
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=2))
    return result


def meshtop_lags(url: str, rate: float, requests: int, out: Path) -> dict[str, Any]:
    """meshtop's constant-rate load (gamma arrivals of shape 10,000), as :func:`guidellm_lags` reads guidellm's."""
    figures = recorded(url, rate, requests, out, even=True)
    lag = figures["client"]["send_lag_s"]
    return {
        "rate": rate, "lag_p50_ms": lag["p50"] * 1e3, "lag_p99_ms": lag["p99"] * 1e3,
        "achieved": figures["client"]["achieved_rate_per_s"], "completed": figures["completed"],
        "ttft_p50_ms": figures["ttft_s"]["p50"] * 1e3,
    }  # fmt: skip


def tiny_tokenizer() -> Path:
    """The tiny test model's tokenizer (:mod:`tests.kit.hf_server`), saved once, for guidellm's synthetic data."""
    from tests.kit.hf_server import build_tiny_model

    folder = Path(tempfile.gettempdir()) / "meshtop-bench-tokenizer"
    if not (folder / "tokenizer.json").exists():
        build_tiny_model(folder)
    return folder


if __name__ == "__main__":
    main()
