"""guidellm's capacity against meshtop's: the highest request rate that one server takes within one SLO.

``flock /tmp/meshtop-serve.lock python -m tests.bench.peer_capacity [--guidellm EXE] [--runs 3]
[--slo ttft=50ms,tpot=20ms] [--seconds 10] [--guidellm-only] [--json PATH]``

A benchmark, never run in CI: it starts ``transformers serve`` with continuous batching (a tiny random Llama on
the CPU, :mod:`tests.kit.hf_server`; about 14 GB, hence the lock), so it runs under the serving lock. It skips
with one line when guidellm is not installed (``--guidellm``, default ``/work/guidellm-venv/bin/guidellm``: a
venv of its own, with the CPU torch, since guidellm needs torch).

Both tools send the same prompts (one JSON lines file, ``{"prompt": ...}`` a line: guidellm's ``json_file`` data,
meshtop's ``--prompts``) for ``--output-len`` tokens (``max_tokens``; ``transformers serve`` refuses
``ignore_eos``, which guidellm asks for only where a data row gives an output length, so none does here), each
rate for ``--seconds``. The server runs on the second core and both tools on the first, so neither tool's CPU
slows the server it measures.

guidellm's side is its ``sweep`` profile ``--runs`` times: a synchronous run, a throughput run (everything at
once, up to the sweep's ``max_concurrency``), then ``sweep_size - 2`` open-loop rates evenly spaced from the
synchronous run's rate to the throughput run's, the last equal to it. Each run has its own seed. The sweep's
``max_concurrency`` is 16 here, not guidellm's 512: 512 requests at once slow ``transformers serve`` below what
it does one at a time, so the throughput run's rate fell under the synchronous one's and every rate of the
sweep lay below a rate already passed. At each rate
the share of requests meeting the SLO is computed from guidellm's per-request records by meshtop's rule
(:class:`meshtop.recordings.metrics.requests.Slo`: TTFT is guidellm's ``time_to_first_token_ms``, TPOT its
``inter_token_latency_ms``, which excludes the first token as meshtop's TPOT does), over two populations:

- guidellm's: the completed and failed requests; the requests still in flight when the rate's time ran out
  were cancelled by guidellm and are left out (its own ``slo_attainment``, printed beside as a check);
- all sent: those cancelled requests count as misses, as they do in meshtop, which waits for every request it
  sent (an overloaded rate's late requests are the ones that miss).

A run's capacity is the highest asked rate (the synchronous run's counted at the rate it reached) with at
least ``--attainment`` of its requests meeting the SLO; the spread is the lowest and highest capacity over the runs.
Beside it: the highest rate below the run's first failure (what a search that stops there finds), and the
capacity by meshtop's rules (cancelled requests missed; a rate guidellm sent below 90 % of, held back by its
``max_concurrency``, failed). The sweep asks no rate above its throughput run's, so where that rate passes
the capacity is only a floor. The default SLO is one this server misses within the sweep's range.

guidellm's Poisson arrivals run in one worker process (``GUIDELLM__MAX_WORKER_PROCESSES``, ``--workers``):
each of its worker processes draws its gaps from a generator seeded alike, so with its default of 10 workers
every gap comes ten times in a row, which is not a Poisson process and sent well off the rate asked.

meshtop's side is ``meshtop sweep OUT --endpoint URL --slo ... --rates auto`` on the same server with the same
prompts, output length and seconds per rate, read back by ``meshtop summary OUT --json``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from meshtop.recordings.metrics.requests import RequestLatency, Slo
from meshtop.recordings.metrics.stats import quantile
from tests.bench.peer_figures import write_prompts
from tests.kit.commands import run_meshtop
from tests.kit.hf_server import Server, build_tiny_model

GUIDELLM = Path("/work/guidellm-venv/bin/guidellm")
PROMPTS = 4000
"""Prompts in the file both tools draw from: more than the fastest rate sends in a run's time."""
SATURATED_SHARE = 0.9
"""meshtop's saturation rule (the capacity sweep's contract): a run that sent below this share of the rate
asked does not pass."""
SEND_LAG_LIMIT_MS = 10.0
"""meshtop's client-limited rule (docs/serving.md): a send lag p99 above this, here of guidellm's
``request_dispatch_delay`` (its time from the scheduled send to the send), means the server saw a lighter load
than asked. Shown (``*``), not applied: guidellm's lag on a shared 2-core machine is above it at every rate."""
RATE_KINDS = ("synchronous", "constant", "poisson")
"""guidellm's strategies that ask for a rate (the synchronous one at the rate it reached); its throughput run
sends everything at once, so it asks for none and is not a candidate for capacity."""


def parse_slo(text: str) -> Slo:
    """``ttft=100ms,tpot=20ms`` (ms or s) as an :class:`Slo`."""
    values: dict[str, float] = {}
    for part in text.split(","):
        match = re.fullmatch(r"\s*(ttft|tpot)\s*=\s*([0-9.]+)\s*(ms|s)\s*", part)
        if match is None:
            raise SystemExit(f"--slo: {part!r} is not ttft=N(ms|s) or tpot=N(ms|s)")
        values[f"{match[1]}_s"] = float(match[2]) / (1e3 if match[3] == "ms" else 1.0)
    return Slo(**values)


def guidellm_sweep(url: str, model: Path, prompts: Path, seed: int, args: argparse.Namespace, out: Path) -> Path:
    """One guidellm sweep against ``url``; its JSON report is ``out``."""
    slo = {"ttft_ms": args.slo.ttft_s * 1e3, "tpot_ms": args.slo.tpot_s * 1e3}
    command = [
        str(args.guidellm), "run",
        "--backend", f"kind=openai_http,target={url}/v1,model={model},request_format=/v1/completions,"
                     f"max_tokens={args.output_len},timeout=60",
        "--tokenizer", f"kind=huggingface_auto,model={model}",
        "--profile", f"kind=sweep,sweep_size={args.sweep_size},strategy_type={args.strategy},"
                     f"max_concurrency={args.max_concurrency}",
        "--constraint", f"kind=max_duration,seconds={args.seconds}",
        "--seed", f"kind=static,value={seed}",
        "--data", f"kind=json_file,path={prompts}",
        "--metrics", json.dumps({"kind": "generative", "slo": {k: v for k, v in slo.items() if v}}),
        "--output", f"kind=json,path={out}",
        "--disable-console-interactive",
    ]  # fmt: skip
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "GUIDELLM__MAX_WORKER_PROCESSES": str(args.workers)}
    print("$ " + shlex.join(command), flush=True)
    log = out.parent / f"{out.stem}.log"
    with log.open("w") as sink:
        # a session of its own, so that stopping the benchmark stops guidellm's worker processes too
        process = subprocess.Popen(command, stdout=sink, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        try:
            code = process.wait()
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
    if code != 0:
        raise RuntimeError(f"guidellm exited {code}: {log.read_text()[-3000:]}")
    return out


def met(request: dict[str, Any], slo: Slo) -> bool:
    """Whether one of guidellm's completed requests met ``slo``, by meshtop's rule."""
    ttft = request["time_to_first_token_ms"]
    tpot = request["inter_token_latency_ms"]
    latency = RequestLatency(
        ttft_s=None if ttft is None else ttft / 1e3,
        tpot_s=None if tpot is None else tpot / 1e3,
        e2e_s=request["request_latency"],
        gaps_s=(),
    )
    return slo.met(latency)


def rate_rows(report: dict[str, Any], slo: Slo, attainment: float) -> list[dict[str, Any]]:
    """One row per benchmark of a guidellm report: its rate, what it sent and reached, and its attainment."""
    rows = []
    for benchmark in report["benchmarks"]:
        strategy = benchmark["config"]["strategy"]
        requests = benchmark["requests"]
        done, failed, cancelled = requests["successful"], requests["errored"], requests["incomplete"]
        starts = sorted(
            r["info"]["timings"]["request_start"]
            for r in done + failed + cancelled
            if r["info"]["timings"]["request_start"]
        )
        sent_per_s = (len(starts) - 1) / (starts[-1] - starts[0]) if len(starts) > 1 else None
        reached = benchmark["metrics"]["requests_per_second"]["successful"]["mean"]
        good = sum(met(r, slo) for r in done)
        ttft = np.array([r["time_to_first_token_ms"] for r in done if r["time_to_first_token_ms"] is not None])
        tpot = np.array([r["inter_token_latency_ms"] for r in done if r["inter_token_latency_ms"] is not None])
        # guidellm 0.8.1 gives a request whose scheduled time it lost a "delay" of the whole epoch time
        lag = np.array(
            [r["request_dispatch_delay"] for r in done + failed if (r["request_dispatch_delay"] or 1e9) < 3600]
        )
        row = {
            "strategy": str(strategy["type_"]),
            "rate": strategy.get("rate") if strategy["type_"] != "synchronous" else reached,
            "sent_per_s": sent_per_s,
            "completed_per_s": reached,
            "completed": len(done),
            "errored": len(failed),
            "cancelled": len(cancelled),
            "attainment": good / max(1, len(done) + len(failed)),
            "attainment_all_sent": good / max(1, len(done) + len(failed) + len(cancelled)),
            "guidellm_attainment": benchmark["metrics"]["slo_attainment"],
            "ttft_p50_ms": quantile(ttft, 0.5) if ttft.size else None,
            "ttft_p99_ms": quantile(ttft, 0.99) if ttft.size else None,
            "tpot_p50_ms": quantile(tpot, 0.5) if tpot.size else None,
            "tpot_p99_ms": quantile(tpot, 0.99) if tpot.size else None,
            "send_lag_p99_ms": quantile(lag, 0.99) * 1e3 if lag.size else None,
        }
        row["client_limited"] = row["send_lag_p99_ms"] is not None and row["send_lag_p99_ms"] > SEND_LAG_LIMIT_MS
        row["met"] = row["attainment"] >= attainment
        # guidellm holds a request past max_concurrency in flight, and its TTFT starts at the send: a rate it
        # could not send is the server's overload hidden in the client, a run meshtop calls saturated
        asked = row["rate"] if row["strategy"] in RATE_KINDS else None
        row["held_back"] = asked is not None and sent_per_s is not None and sent_per_s < SATURATED_SHARE * asked
        row["met_all_sent"] = row["attainment_all_sent"] >= attainment and not row["held_back"]
        rows.append(row)
    return rows


def capacity(rows: Sequence[dict[str, Any]], key: str = "met", *, below_failure: bool = False) -> float:
    """The highest asked rate whose benchmark met the SLO (0 when none did); the throughput run asks none.
    ``below_failure``: the highest below the lowest rate that failed, the answer a search that stops at its
    first failure gives (a short run's attainment near the target passes and fails by chance, so a sweep's
    pass above a failure is common)."""
    rated = [row for row in rows if row["strategy"] in RATE_KINDS]
    ceiling = min((row["rate"] for row in rated if not row[key]), default=float("inf")) if below_failure else None
    return max((row["rate"] for row in rated if row[key] and (ceiling is None or row["rate"] < ceiling)), default=0.0)


def meshtop_capacity(url: str, prompts: Path, args: argparse.Namespace, out: Path) -> dict[str, Any]:
    """``meshtop sweep OUT --endpoint URL --rates auto`` on the same load, and its capacity row."""
    slo = ",".join(
        f"{name}={value * 1e3:g}ms" for name, value in (("ttft", args.slo.ttft_s), ("tpot", args.slo.tpot_s)) if value
    )
    command = [
        "sweep", out, "--endpoint", url, "--slo", slo, "--rates", "auto", "--attainment", str(args.attainment),
        "--prompts", prompts, "--output-len", str(args.output_len), "--duration", str(args.seconds),
        "--api", "completions", "--timeout", "60", *args.meshtop_arg,
    ]  # fmt: skip
    print("$ meshtop " + shlex.join(map(str, command)), flush=True)
    done = run_meshtop(*command, timeout_s=3600)
    if done.returncode != 0:
        raise RuntimeError(f"meshtop sweep exited {done.returncode}: {done.stderr[-3000:]}")
    summary = run_meshtop("summary", out, "--json")
    if summary.returncode != 0:
        raise RuntimeError(f"meshtop summary exited {summary.returncode}: {summary.stderr[-3000:]}")
    sweep = json.loads(summary.stdout)["sweep"]
    return {"capacity": sweep["capacity"][0], "runs": sweep["runs"]}


def fmt(value: float | None, spec: str = ".1f") -> str:
    return "-" if value is None else format(value, spec)


def print_rows(run: int, rows: Sequence[dict[str, Any]]) -> None:
    print(f"guidellm sweep {run}:")
    print(
        f"{'strategy':<12}{'rate':>7}{'sent/s':>8}{'done/s':>8}{'done':>6}{'cancel':>7}{'attain':>8}{'(gl)':>7}"
        f"{'all':>7}{'ttft50':>8}{'ttft99':>8}{'tpot50':>8}{'tpot99':>8}{'lag99':>8}"
    )
    for row in rows:
        print(
            f"{row['strategy']:<12}{fmt(row['rate'] if row['strategy'] in RATE_KINDS else None, '.2f'):>7}"
            f"{fmt(row['sent_per_s'], '.2f'):>8}{fmt(row['completed_per_s'], '.2f'):>8}{row['completed']:>6}"
            f"{row['cancelled']:>7}{row['attainment']:>8.3f}{fmt(row['guidellm_attainment'], '.3f'):>7}"
            f"{row['attainment_all_sent']:>7.3f}{fmt(row['ttft_p50_ms']):>8}{fmt(row['ttft_p99_ms']):>8}"
            f"{fmt(row['tpot_p50_ms']):>8}{fmt(row['tpot_p99_ms']):>8}{fmt(row['send_lag_p99_ms']):>8}"
            + ("*" if row["client_limited"] else "")
        )
    print("(gl): guidellm's own slo_attainment; all: cancelled requests counted as misses; *: client-limited")


FIGURES = {
    "capacity": ("highest rate passed", "met", False),
    "capacity_below_failure": ("highest rate below the first failure", "met", True),
    "capacity_meshtop_rules": ("by meshtop's rules", "met_all_sent", False),
}
"""Each capacity figure of a sweep: its words, the row's pass key, and whether it stops at the first failure."""


def sweep_figures(report: Path, args: argparse.Namespace) -> dict[str, Any]:
    """One guidellm report's rows and capacities, printed."""
    rows = rate_rows(json.loads(report.read_text()), args.slo, args.attainment)
    print_rows(len(args.figures) + 1, rows)
    figures: dict[str, Any] = {"report": str(report), "rows": rows}
    for name, (_, key, below_failure) in FIGURES.items():
        figures[name] = capacity(rows, key, below_failure=below_failure)
    args.figures.append(figures)
    return figures


def spread(result: dict[str, Any], args: argparse.Namespace) -> None:
    """Print the guidellm sweeps' capacities, and whether meshtop's lies between the lowest and highest."""
    print(f"guidellm's capacity over {len(result['guidellm'])} sweeps ({args.slo.describe()}, attainment >= "
          f"{args.attainment}), req/s:")  # fmt: skip
    for name, (words, _, _) in FIGURES.items():
        values = [run[name] for run in result["guidellm"]]
        result[f"spread_{name}"] = [min(values), max(values)]
        listed = ", ".join(f"{value:.2f}" for value in values)
        print(f"  {words:<40}{min(values):>8.2f} .. {max(values):<8.2f}({listed})")
    if "meshtop" in result:
        low, high = result["spread_capacity"]
        found = result["meshtop"]["capacity"]["requests_per_s"]
        result["within"] = low <= found <= high
        print(f"meshtop's capacity: {found:.2f} req/s: {'within' if result['within'] else 'outside'} guidellm's spread")
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=2))


def read_reports(args: argparse.Namespace) -> dict[str, Any]:
    """The figures of guidellm reports already written (another SLO over the same runs)."""
    result: dict[str, Any] = {"slo": {"ttft_s": args.slo.ttft_s, "tpot_s": args.slo.tpot_s}, "guidellm": args.figures}
    for report in args.reports:
        sweep_figures(report, args)
    spread(result, args)
    return result


def main(argv: list[str] | None = None) -> dict[str, Any] | None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--guidellm", type=Path, default=GUIDELLM, metavar="EXE", help="guidellm's executable")
    parser.add_argument("--runs", type=int, default=3, help="guidellm sweeps (their capacities' spread)")
    parser.add_argument("--slo", type=parse_slo, default=parse_slo("ttft=50ms,tpot=20ms"))
    parser.add_argument("--attainment", type=float, default=0.95)
    parser.add_argument("--seconds", type=float, default=10.0, help="time each rate sends for")
    parser.add_argument("--output-len", type=int, default=8)
    parser.add_argument("--prompt-words", type=int, default=30, help="words a prompt (a token each, about)")
    parser.add_argument("--sweep-size", type=int, default=10, help="guidellm's sweep_size")
    parser.add_argument("--strategy", choices=("poisson", "constant"), default="poisson")
    parser.add_argument("--max-concurrency", type=int, default=16, help="guidellm's sweep max_concurrency")
    parser.add_argument("--workers", type=int, default=1, help="guidellm's worker processes")
    parser.add_argument("--guidellm-only", action="store_true", help="leave meshtop's side out")
    parser.add_argument("--meshtop-arg", action="append", default=[], help="one more argument to meshtop sweep")
    parser.add_argument("--keep", type=Path, default=None, help="keep the reports and recordings in this folder")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument(
        "--reports",
        type=Path,
        nargs="+",
        default=None,
        help="read these guidellm reports (of --keep) instead of running",
    )
    args = parser.parse_args(argv)
    args.figures = []
    if args.reports:
        return read_reports(args)
    # a stop (SIGTERM) unwinds like Ctrl-C, so the server and guidellm are stopped on the way out
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    if not args.guidellm.exists():
        print(f"skipped: guidellm is not installed at {args.guidellm} (--guidellm EXE)")
        return None
    result: dict[str, Any] = {"slo": {"ttft_s": args.slo.ttft_s, "tpot_s": args.slo.tpot_s}, "guidellm": args.figures}
    with tempfile.TemporaryDirectory(prefix="meshtop-peer-capacity-") as scratch:
        base = args.keep or Path(scratch)
        base.mkdir(parents=True, exist_ok=True)
        model = build_tiny_model(base / "tiny-llama")
        prompts = base / "prompts.jsonl"
        write_prompts(prompts, PROMPTS, args.prompt_words)
        os.sched_setaffinity(0, {1})
        server = Server(model, base / "server.log")
        os.sched_setaffinity(0, {0})
        try:
            for run in range(1, args.runs + 1):
                sweep_figures(
                    guidellm_sweep(server.url, model, prompts, run, args, base / f"guidellm-{run}.json"), args
                )
            if not args.guidellm_only:
                result["meshtop"] = meshtop_capacity(server.url, prompts, args, base / "meshtop-sweep")
        finally:
            server.stop()
    spread(result, args)
    return result


if __name__ == "__main__":
    main()
