"""The load meshtop sends to a serving endpoint: which prompts, how long each answer may be, and when each
request is sent.

Everything here is a function of the load's options, its seed and the prompts file, and imports neither
torch nor an HTTP client: the same options and seed give the same list of requests, with the same prompts
and the same send offsets, on any machine (what ``--same-load`` relies on, through the recording's
``load.jsonl``, so a prompts file that changed since does not change the load).

- Prompts: from ``--prompts FILE`` (JSON lines of ``{"prompt": TEXT}`` or ``{"messages": [...]}``, or a
  ShareGPT-style JSON array of ``{"conversations": [{"from": "human", "value": TEXT}, ...]}``, its first
  human turn), drawn with replacement by the seed; else ``--input-len`` (the load's ``prompt_len``) words
  drawn from :data:`WORDS`, a list of short common English words each of which is one token in the usual
  BPE vocabularies (the server's own count, from its ``usage``, is what the recording keeps; meshtop never
  tokenizes).
- Answers: ``max_tokens`` drawn from ``--output-len``; with ``--ignore-eos`` the server is asked to go on
  past its end-of-sequence token (vLLM and SGLang accept ``ignore_eos``), so lengths hold.
- Arrivals: closed loop (``--concurrency C``: C clients, each sends its next request when the previous is
  answered) or open loop (``--request-rate R``: gaps drawn from a gamma distribution of mean 1/R and shape
  ``--burstiness`` K, as the built-in inference's are: :func:`meshtop.runner.load.arrival_offsets_s`).
- Warmup: ``--warmup N`` requests are sent first (closed loop at the load's concurrency, else one at a
  time) and answered before the load's own requests start; they are recorded, marked, and left out of
  every figure.
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TypeAlias

from meshtop.recordings.manifest import Load
from meshtop.runner.errors import PlanError
from meshtop.runner.load import DEFAULT_REQUESTS, PlannedRequest, plan_requests

APIS = ("completions", "chat")
DEFAULT_TIMEOUT_S = 120.0
MAX_REQUESTS = 1_000_000
MAX_PROMPTS_BYTES = 1 << 30
"""A prompts file larger than this is refused (the load is planned in memory)."""
WORDS = tuple(
    """
the of and to in is it you that he was for on are as with his they at be this have from or one had by word
but not what all were we when your can said there use an each which she do how their if will up other about
out many then them these so some her would make like him into time has look two more write go see number no
way could people my than first water been call who oil its now find long down day did get come made may part
over new sound take only little work know place year live me back give most very after thing our just name
good sentence man think say great where help through much before line right too mean old any same tell boy
follow came want show also around form three small set put end does another well large must big even such
because turn here why ask went men read need land different home us move try kind hand picture again change
off play spell air away animal house point page letter mother answer found study still learn should world
high every near add food between own below country
""".split()  # noqa: SIM905 (a list of 200 words reads better as text)
)
"""Short, common English words: each one token in the usual BPE vocabularies (GPT-2's, Llama's, Qwen's)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Prompt:
    """One prompt of a prompts file: a text (completions) or chat messages."""

    text: str | None = None
    messages: tuple[tuple[str, str], ...] | None = None
    """(role, content) pairs."""


LoadRequest: TypeAlias = "PlannedRequest[Prompt]"
"""One request of the load, as it will be sent."""


def request_to_json(request: LoadRequest) -> dict[str, object]:
    """A line of the recording's ``load.jsonl``."""
    prompt: dict[str, object] = (
        {"prompt": request.prompt.text}
        if request.prompt.messages is None
        else {"messages": [{"role": role, "content": content} for role, content in request.prompt.messages]}
    )
    return {
        "id": request.id,
        **prompt,
        "max_tokens": request.output_len,
        "offset_s": request.offset_s,
        "warmup": request.warmup,
    }


def request_from_json(record: dict[str, object]) -> LoadRequest:
    """A request of a recording's ``load.jsonl``, as it was sent."""
    offset = record.get("offset_s")
    return PlannedRequest(
        id=int(record["id"]),  # type: ignore[call-overload]
        prompt=prompt_of(record),
        output_len=int(record["max_tokens"]),  # type: ignore[call-overload]
        offset_s=None if offset is None else float(offset),  # type: ignore[arg-type]
        warmup=bool(record.get("warmup", False)),
    )


def prompt_of(record: object) -> Prompt:
    """The prompt of one record of a prompts file or ``load.jsonl``; ``ValueError`` when it holds none."""
    if not isinstance(record, dict):
        raise ValueError("not a JSON object")
    if isinstance(record.get("prompt"), str):
        return Prompt(text=record["prompt"])
    messages = record.get("messages")
    if isinstance(messages, list) and messages:
        pairs = []
        for message in messages:
            if not (isinstance(message, dict) and isinstance(message.get("content"), str)):
                raise ValueError("a message without a text 'content'")
            pairs.append((str(message.get("role", "user")), message["content"]))
        return Prompt(messages=tuple(pairs))
    turns = record.get("conversations")
    if isinstance(turns, list):  # ShareGPT: the first human turn is the prompt
        for turn in turns:
            if isinstance(turn, dict) and turn.get("from") in ("human", "user") and isinstance(turn.get("value"), str):
                return Prompt(text=turn["value"])
        raise ValueError("a conversation without a human turn")
    raise ValueError("no 'prompt', 'messages' or 'conversations'")


def read_prompts(path: Path) -> list[Prompt]:
    """The prompts of ``path`` (JSON lines, or one JSON array of ShareGPT records); one line when it cannot."""
    try:
        size = path.stat().st_size
        if size > MAX_PROMPTS_BYTES:
            raise PlanError(f"--prompts {path}: {size:,} bytes, more than {MAX_PROMPTS_BYTES:,}: use a smaller file")
        text = path.read_text(encoding="utf-8")
    except OSError as error:
        raise PlanError(f"--prompts {path}: {error.strerror or error}") from None
    except UnicodeDecodeError:
        raise PlanError(f"--prompts {path}: not UTF-8 text") from None
    stripped = text.lstrip()
    records: list[tuple[int, object]]
    if stripped.startswith("["):
        try:
            array = json.loads(stripped)
        except ValueError as error:
            raise PlanError(f"--prompts {path}: not JSON: {error}") from None
        records = list(enumerate(array, 1)) if isinstance(array, list) else [(1, array)]
    else:
        records = []
        for number, line in enumerate(text.splitlines(), 1):
            if line.strip():
                try:
                    records.append((number, json.loads(line)))
                except ValueError:
                    raise PlanError(f"--prompts {path}: line {number} is not JSON") from None
    prompts = []
    for number, record in records:
        try:
            prompts.append(prompt_of(record))
        except ValueError as error:
            where = "record" if stripped.startswith("[") else "line"
            raise PlanError(f"--prompts {path}: {where} {number}: {error}") from None
    if not prompts:
        raise PlanError(f"--prompts {path}: no prompts in it")
    return prompts


def plan_load(load: Load, prompts: Sequence[Prompt] | None = None) -> list[LoadRequest]:
    """Every request of the load (:func:`meshtop.runner.load.plan_requests`), each prompt one of ``prompts``
    drawn with replacement, else ``prompt_len`` words."""

    def draw_prompt(rng: random.Random) -> Prompt:
        if prompts:
            return prompts[rng.randrange(len(prompts))]
        return Prompt(text=" ".join(rng.choice(WORDS) for _ in range(rng.randint(*load.prompt_len))))

    return plan_requests(load, draw_prompt)


DURATION_REQUESTS = 20_000
"""A closed loop with ``--duration`` and no ``--requests``: the requests planned (it ends at the duration, or
when they are all answered, whichever comes first)."""


def requests_for(duration_s: float | None, rate_per_s: float | None, requests: int | None) -> int:
    """The requests to plan: ``--requests`` where given; with ``--duration``, enough for it (an open loop's
    rate x duration, a quarter more for its randomness; a closed loop's :data:`DURATION_REQUESTS`)."""
    if requests is not None:
        return requests
    if duration_s is None:
        return DEFAULT_REQUESTS
    if rate_per_s is not None:
        return min(MAX_REQUESTS, math.ceil(rate_per_s * duration_s * 1.25) + 10)
    return DURATION_REQUESTS


def endpoint_load(load: Load) -> Load:
    """``load`` checked (:func:`check_load`), with an endpoint's own fields filled in: the timeout
    (:data:`DEFAULT_TIMEOUT_S` where none was given), an open loop's gamma shape (1, Poisson, where none was
    given; ``None`` in closed loop) and ``max_batch``, the most requests in flight (the concurrency; 0 in open
    loop)."""
    check_load(load)
    open_loop = load.request_rate_per_s is not None
    return replace(
        load,
        timeout_s=DEFAULT_TIMEOUT_S if load.timeout_s is None else load.timeout_s,
        burstiness=(1.0 if load.burstiness is None else load.burstiness) if open_loop else None,
        max_batch=load.concurrency or 0,
    )


def check_load(load: Load) -> None:
    """Every value of ``load`` in range, each error naming the option to change."""
    if load.requests < 1 or load.requests > MAX_REQUESTS:
        raise PlanError(f"--requests must be 1 to {MAX_REQUESTS:,}, got {load.requests}")
    if load.concurrency is not None and not 1 <= load.concurrency <= 100_000:
        raise PlanError(f"--concurrency must be 1 to 100,000, got {load.concurrency}")
    if load.concurrency is not None and load.request_rate_per_s is not None:
        raise PlanError("--concurrency (closed loop) and --request-rate (open loop) exclude each other: give one")
    for name, value in (
        ("--request-rate", load.request_rate_per_s),
        ("--burstiness", load.burstiness),
        ("--timeout", load.timeout_s),
        ("--slo-ttft-ms", load.slo_ttft_ms),
        ("--slo-tpot-ms", load.slo_tpot_ms),
    ):
        if value is not None and not (value > 0 and math.isfinite(value)):
            raise PlanError(f"{name} must be above 0, got {value:g}")
    if load.duration_s is not None and not 0 < load.duration_s <= 86_400:
        raise PlanError(f"--duration must be above 0 and at most 86400 seconds, got {load.duration_s:g}")
    if load.warmup < 0 or load.warmup > MAX_REQUESTS:
        raise PlanError(f"--warmup must be 0 to {MAX_REQUESTS:,}, got {load.warmup}")
