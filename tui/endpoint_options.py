"""The options of a load sent to a serving endpoint (``meshtop run|record --endpoint URL``): defined once,
checked, and turned into the :class:`~meshtop.runner.serving.endpoint.EndpointRun` the session runs.

The load's options the built-in inference shares (``--requests``, ``--concurrency``, ``--request-rate``,
``--prompt-len`` / ``--input-len``, ``--output-len``, ``--seed``, the SLOs) are the plan group's
(:mod:`meshtop.tui.options`); those of the built-in model alone are refused with ``--endpoint``, and those of
an endpoint alone without it.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import replace
from pathlib import Path

from meshtop.recordings.manifest import DEFAULT_OUTPUT_LEN, DEFAULT_PROMPT_LEN, LOAD_FILE, Load, read_manifest
from meshtop.runner.errors import PlanError
from meshtop.runner.load import DEFAULT_CONCURRENCY
from meshtop.runner.multinode.nodes import NODE_OPTIONS
from meshtop.runner.plan import option, parse_length
from meshtop.runner.serving.endpoint import EndpointRun, resolve_endpoint
from meshtop.runner.serving.load import APIS, DEFAULT_TIMEOUT_S, LoadRequest, request_from_json, requests_for
from meshtop.runner.serving.server import DEFAULT_STARTUP_TIMEOUT_S, ServerCommand


def add_endpoint_options(parser: argparse.ArgumentParser) -> None:
    """A serving endpoint to load instead of the built-in model (``--endpoint URL``); the load's shared
    options (--requests, --concurrency, --request-rate, --prompt-len, --output-len, --seed, the SLOs) apply."""
    serving = parser.add_argument_group("a serving endpoint (--endpoint URL: any OpenAI-compatible server)")
    serving.add_argument(
        "--endpoint",
        default=None,
        metavar="URL[,URL...]",
        help="load this server (http://host:port, /v1 optional) instead of the built-in model; several: replicas "
        "of one model, the requests spread round-robin",
    )
    serving.add_argument(
        "--api",
        choices=APIS,
        default=None,
        help="completions (default: /v1/completions) or chat (/v1/chat/completions)",
    )
    serving.add_argument(
        "--burstiness",
        type=float,
        default=None,
        metavar="K",
        help="with --request-rate: gamma arrivals of shape K (1, the default: Poisson; below 1 burstier)",
    )
    serving.add_argument(
        "--duration",
        type=float,
        default=None,
        metavar="S",
        help="send for S seconds at most; the load is the requests sent (with --request-rate: rate x S)",
    )
    serving.add_argument(
        "--warmup", type=int, default=None, metavar="N", help="requests sent first, recorded, left out of the figures"
    )
    serving.add_argument(
        "--prompts",
        default=None,
        metavar="FILE",
        help='prompts to draw from: JSON lines of {"prompt": ...} or {"messages": [...]}, or a ShareGPT file',
    )
    serving.add_argument(
        "--slo", default=None, metavar="ttft=200ms,tpot=50ms", help="goodput: the objectives a good request meets"
    )
    serving.add_argument(
        "--timeout",
        type=float,
        default=None,
        metavar="S",
        help=f"seconds a request may take, send to last byte (default {DEFAULT_TIMEOUT_S:g})",
    )
    serving.add_argument(
        "--ignore-eos", action="store_true", help="ask the server to generate past end-of-sequence (vLLM, SGLang)"
    )
    serving.add_argument(
        "--server-metrics",
        default=None,
        metavar="URL",
        help="the server's Prometheus metrics, where not at /metrics of --endpoint (scraped twice a second; "
        "replicas: one per replica, comma-separated)",
    )
    serving.add_argument(
        "--startup-timeout",
        type=float,
        default=None,
        metavar="S",
        help=f"with a server command after --: seconds it may take to answer (default {DEFAULT_STARTUP_TIMEOUT_S:g})",
    )
    serving.add_argument(
        "--same-load",
        default=None,
        metavar="REC",
        help="send the load recorded in REC again: the same prompts, lengths and send offsets",
    )


ENDPOINT_ONLY = (
    "api", "burstiness", "warmup", "prompts", "slo", "timeout", "ignore_eos", "same_load", "server_metrics",
    "startup_timeout", "duration",
)  # fmt: skip
BUILTIN_ONLY = (
    "dp", "tp", "pp", "fsdp", "schedule", "microbatches", "model_config", "dtype", "precision", "checkpoint",
    "steps", "batch_size", "seq_len", "max_batch", "activations", "tokens_per_step", "device", "loss",
)  # fmt: skip
"""Options of the built-in model that a load sent to an endpoint refuses (they would silently not apply)."""


def parse_slo(text: str | None) -> tuple[float | None, float | None]:
    """``ttft=200ms,tpot=50ms`` (ms or s, either key may be left out) as (TTFT ms, TPOT ms). A number without
    its unit is refused: ``ttft=0.5`` read as milliseconds was 0.5 s meant, an objective no request meets."""
    if text is None:
        return None, None
    values: dict[str, float] = {}
    for part in text.split(","):
        key, sep, value = part.strip().partition("=")
        key, number = key.strip().lower(), value.strip().lower()
        unit = "ms" if number.endswith("ms") else "s" if number.endswith("s") else ""
        try:
            parsed = float(number.removesuffix(unit)) * (1000.0 if unit == "s" else 1.0)
        except ValueError:
            parsed = -1.0
        if not sep or key not in ("ttft", "tpot") or not 0 < parsed < float("inf"):
            raise PlanError(f"--slo {text!r}: give ttft=TIME and/or tpot=TIME, such as ttft=200ms,tpot=50ms")
        if not unit:
            raise PlanError(f"--slo {text!r}: {part.strip()} has no unit: give one, such as 500ms or 0.5s")
        values[key] = parsed
    return values.get("ttft"), values.get("tpot")


SAME_LOAD_SHAPE = {
    "requests": "--requests", "concurrency": "--concurrency", "request_rate": "--request-rate",
    "burstiness": "--burstiness", "duration": "--duration", "warmup": "--warmup", "prompts": "--prompts",
    "prompt_len": "--input-len", "output_len": "--output-len",
}  # fmt: skip
"""The options that shape a load, which ``--same-load`` takes from its recording (``--seed`` too, when given)."""


def endpoint_from_args(args: argparse.Namespace) -> EndpointRun:
    """The load ``--endpoint`` sends, checked, and the server asked what it serves (one line when it cannot)."""
    server = None
    if args.script is not None:  # the server to start: the command after --
        timeout = args.startup_timeout if args.startup_timeout is not None else DEFAULT_STARTUP_TIMEOUT_S
        if not 0 < timeout <= 86_400:
            raise PlanError(f"--startup-timeout must be above 0 and at most 86400 seconds, got {timeout:g}")
        server = ServerCommand(command=tuple(args.script), startup_timeout_s=timeout)
    elif args.startup_timeout is not None:
        raise PlanError("--startup-timeout is for a server meshtop starts: give its command after --")
    defaults = {
        **args.builtin_defaults,
        "dtype": None,
        "device": "auto",
        "activations": False,
        "tokens_per_step": None,
        "loss": True,
    }
    given = [name for name in BUILTIN_ONLY if getattr(args, name, None) != defaults.get(name)]
    if args.mode != "train" or given:  # --mode infer is what --endpoint does already
        name = given[0] if given else "mode"
        raise PlanError(f"{option(name)} sets up the built-in model; --endpoint loads a server, which runs its own")
    for name in NODE_OPTIONS:
        if getattr(args, name) is not None:
            raise PlanError(f"{option(name)} is for jobs on many nodes; --endpoint runs on this one")
    if args.same_load is not None:
        given = [flag for name, flag in SAME_LOAD_SHAPE.items() if getattr(args, name) is not None]
        given += ["--seed"] if args.seed != args.builtin_defaults["seed"] else []
        if given:
            listed = given[0] if len(given) == 1 else f"{', '.join(given[:-1])} and {given[-1]}"
            raise PlanError(f"--same-load repeats a recorded load, its shape and seed included: leave out {listed}")
    if args.burstiness is not None and args.request_rate is None:
        raise PlanError("--burstiness shapes --request-rate's arrivals: give --request-rate too")
    slo_ttft, slo_tpot = parse_slo(args.slo)
    requests = None
    if args.same_load is not None:
        recorded, requests = same_load(args.same_load)
        load = replace(
            recorded,
            slo_ttft_ms=slo_ttft or args.slo_ttft_ms or recorded.slo_ttft_ms,
            slo_tpot_ms=slo_tpot or args.slo_tpot_ms or recorded.slo_tpot_ms,
            timeout_s=args.timeout or recorded.timeout_s,
            ignore_eos=args.ignore_eos or recorded.ignore_eos,
        )
    else:
        load = load_from_args(args, request_rate=args.request_rate, concurrency=args.concurrency)
    return resolve_endpoint(
        args.endpoint,
        api=args.api or "completions",
        model=args.model,
        load=load,
        requests=requests,
        same_load=args.same_load,
        server_metrics=args.server_metrics,
        server=server,
    )


def load_from_args(args: argparse.Namespace, *, request_rate: float | None, concurrency: int | None) -> Load:
    """The load the options shape, sent at ``request_rate`` (open loop) or ``concurrency`` (closed loop; the
    default concurrency where neither is given): ``run|record --endpoint``'s, and each run of a capacity sweep
    (the same shape and seed at each rate)."""
    slo_ttft, slo_tpot = parse_slo(args.slo)
    return Load(
        requests=requests_for(args.duration, request_rate, args.requests),
        duration_s=args.duration,
        concurrency=concurrency or (None if request_rate is not None else DEFAULT_CONCURRENCY),
        request_rate_per_s=request_rate,
        burstiness=args.burstiness,
        warmup=args.warmup or 0,
        prompt_len=parse_length("--input-len", args.prompt_len, DEFAULT_PROMPT_LEN),
        output_len=parse_length("--output-len", args.output_len, DEFAULT_OUTPUT_LEN),
        prompts=args.prompts,
        seed=args.seed,
        slo_ttft_ms=slo_ttft or args.slo_ttft_ms,
        slo_tpot_ms=slo_tpot or args.slo_tpot_ms,
        timeout_s=args.timeout,
        ignore_eos=args.ignore_eos,
    )


def same_load(recording: str) -> tuple[Load, list[LoadRequest]]:
    """The load a recording sent (its manifest's load and its ``load.jsonl``); one line when it has none."""
    directory = Path(recording)
    manifest = read_manifest(directory)
    load = manifest.run.load
    if manifest.run.endpoint is None or load is None or not (directory / LOAD_FILE).is_file():
        raise PlanError(f"--same-load {recording}: not a recording of a load sent to an endpoint (no {LOAD_FILE})")
    try:
        requests = [
            request_from_json(json.loads(line))
            for line in (directory / LOAD_FILE).read_text().splitlines()
            if line.strip()
        ]
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise PlanError(f"--same-load {recording}: cannot read {LOAD_FILE}: {error}") from None
    return load, requests
