"""A serving endpoint to load: its URL, API and model, checked against the server before any load is sent
(a server meshtop starts itself: once it is up).

:func:`resolve_endpoint` asks the server what it serves (``GET /v1/models``) and sends one request of the
load's own shape (``max_tokens`` 1, streamed, usage asked for), so an unreachable URL, a server that does not
speak the OpenAI API, an unknown model and a refused request body are each one line (exit 2) before
anything is recorded. That request is not part of the load and is not recorded.

Replicas: ``--endpoint URL1,URL2`` names several servers of the same model, which the load generator spreads
its requests over. Each is asked and probed as one server is, and they must serve the same model (a load
spread over two different models measures neither).
"""

from __future__ import annotations

import http.client
import json
import urllib.error
import urllib.request
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from meshtop.probes.errors import one_line
from meshtop.recordings.manifest import Load
from meshtop.runner.errors import PlanError
from meshtop.runner.load import PlannedRequest
from meshtop.runner.serving.http import Origin, error_message
from meshtop.runner.serving.load import (
    DEFAULT_TIMEOUT_S,
    LoadRequest,
    Prompt,
    endpoint_load,
    plan_load,
    read_prompts,
)
from meshtop.runner.serving.server import ServerCommand

PROBE_TIMEOUT_S = 30.0
MAX_PROBE_BYTES = 4 << 20


@dataclass(frozen=True, kw_only=True, slots=True)
class EndpointRun:
    """A load sent to a serving endpoint: what ``meshtop run|record --endpoint URL`` runs."""

    url: str
    """The server's base URL as given (replicas: their comma-separated list)."""
    origins: tuple[Origin, ...]
    """Each replica's, in the order the load's requests go round them."""
    api: str
    """``completions`` or ``chat``."""
    model: str
    models: tuple[str, ...]
    """Every model the server listed."""
    load: Load
    requests: tuple[LoadRequest, ...]
    """The load, planned: the warmup first."""
    same_load: str | None = None
    """The recording whose load this repeats (``--same-load``)."""
    server_metrics: str | None = None
    """The server's Prometheus metrics, where not at ``/metrics`` of the endpoint (``--server-metrics``; replicas:
    one URL, or one per replica, comma-separated)."""
    server: ServerCommand | None = None
    """The server meshtop starts (the command after ``--``), asked only once it is up."""

    @property
    def origin(self) -> Origin:
        """The first replica's (a single server's)."""
        return self.origins[0]

    @property
    def metrics_urls(self) -> tuple[str, ...]:
        """Where the servers' Prometheus metrics are scraped: each replica's ``/metrics``, or ``--server-metrics``'."""
        if self.server_metrics is not None:
            return tuple(url.strip() for url in self.server_metrics.split(","))
        return tuple(f"{origin.base}/metrics" for origin in self.origins)

    @property
    def name(self) -> str:
        """A short name for the session's folder: the model's last path part (a server meshtop starts and
        no --model: the server command's program)."""
        stem = self.model.rstrip("/").rsplit("/", 1)[-1]
        if not stem and self.server is not None:
            stem = self.server.command[0].rsplit("/", 1)[-1]
        stem = stem or "model"
        return "".join(c if c.isalnum() or c in "-_." else "-" for c in stem)[:40]


def _get_json(
    url: str, *, body: dict[str, object] | None = None, timeout_s: float | None = None
) -> tuple[int, object, bytes]:
    """GET (or POST ``body``) ``url``, within ``timeout_s`` (``None``: :data:`PROBE_TIMEOUT_S`): the status, the
    parsed JSON (``None`` when it is not) and the raw body."""
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"} if data else {})
    try:
        with urllib.request.urlopen(request, timeout=PROBE_TIMEOUT_S if timeout_s is None else timeout_s) as response:
            status, raw = response.status, response.read(MAX_PROBE_BYTES)
    except urllib.error.HTTPError as error:
        status, raw = error.code, error.read(MAX_PROBE_BYTES)
    try:
        parsed = json.loads(raw) if body is None else None
    except ValueError:
        parsed = None
    return status, parsed, raw


def served_models(origin: Origin) -> tuple[str, ...]:
    """The ids ``/v1/models`` lists, maybe none (``transformers serve`` 5.17 lists only its hub cache's, not
    the model it was started with); one line when the server cannot be reached, fails, or does not answer
    as an OpenAI-compatible server does."""
    url = origin.url("/models")
    try:
        status, parsed, raw = _get_json(url)
    except urllib.error.URLError as error:
        reason = error.reason
        why = getattr(reason, "strerror", None) or str(reason)
        raise PlanError(f"--endpoint {origin.root}: cannot reach the server ({why}): is it running?") from None
    except (OSError, ValueError) as error:  # a timeout, a reset, a malformed response
        raise PlanError(f"--endpoint {origin.root}: no answer from {url} ({error})") from None
    except http.client.HTTPException as error:  # another service on the port (after OSError: a hang-up is both)
        raise PlanError(
            f"--endpoint {origin.root}: {url} did not answer in HTTP ({one_line(error)}): is it the server's port?"
        ) from None
    if status >= 500:
        raise PlanError(
            f"--endpoint {origin.root}: the server failed to answer GET {url}: HTTP {status} "
            f"({error_message(raw)}): its own log says why"
        )
    if status != 200:
        raise PlanError(
            f"--endpoint {origin.root}: GET {url} answered HTTP {status} ({error_message(raw)}): "
            "not an OpenAI-compatible server?"
        )
    data = parsed.get("data") if isinstance(parsed, dict) else None
    if not isinstance(data, list):
        raise PlanError(f"--endpoint {origin.root}: GET {url} gave no list of models: not an OpenAI-compatible server?")
    return tuple(str(model["id"]) for model in data if isinstance(model, dict) and "id" in model)


def probe_request(origin: Origin, api: str, model: str, load: Load, timeout_s: float = PROBE_TIMEOUT_S) -> None:
    """One request of the load's shape (1 token), so a body the server refuses is one line before the load."""
    from meshtop.runner.serving.client import ClientSpec, request_body

    spec = ClientSpec(
        urls=(origin.base + origin.prefix,),
        api=api,
        model=model,
        concurrency=None,
        timeout_s=load.timeout_s or DEFAULT_TIMEOUT_S,
        ignore_eos=load.ignore_eos,
        requests_path="",
        status_path="",
    )
    path, body = request_body(spec, PlannedRequest(id=-1, prompt=Prompt(text="hello"), output_len=1, offset_s=None))
    try:
        status, _, raw = _get_json(origin.url(path), body=body, timeout_s=timeout_s)
    except (OSError, ValueError, http.client.HTTPException) as error:
        raise PlanError(f"--endpoint {origin.root}: POST {origin.url(path)} failed ({one_line(error)})") from None
    if status != 200:
        hint = " (drop --ignore-eos: this server does not take it?)" if load.ignore_eos else ""
        raise PlanError(
            f"--endpoint {origin.root}: the server refused a {api} request for {model!r}: HTTP {status}: "
            f"{error_message(raw) or 'no message'}{hint}"
        )


def parse_origins(url: str) -> tuple[Origin, ...]:
    """``--endpoint``'s URL, or its comma-separated replicas, each parsed; one line naming the bad one."""
    items = [item.strip() for item in url.split(",")]
    origins = []
    for index, item in enumerate(items):
        if not item:
            where = f"item {index + 1} of {len(items)} is empty" if len(items) > 1 else "no URL given"
            raise PlanError(f"--endpoint {url!r}: {where}: give URL or URL1,URL2,...")
        try:
            origins.append(Origin.parse(item))
        except ValueError as error:
            raise PlanError(f"--endpoint: {error}") from None
    seen: set[Origin] = set()
    for origin in origins:
        if origin in seen:
            raise PlanError(f"--endpoint {url}: {origin.root} is listed twice: each replica once")
        seen.add(origin)
    return tuple(origins)


def plan_endpoint(
    url: str,
    *,
    api: str,
    model: str | None,
    load: Load,
    requests: list[LoadRequest] | None = None,
    same_load: str | None = None,
    server_metrics: str | None = None,
    server: ServerCommand | None = None,
) -> EndpointRun:
    """The endpoint run with every option checked and the load planned, the server not asked yet (its
    ``model`` is ``--model``'s, or empty until :func:`check_server`); ``requests`` (``--same-load``'s) replace
    the planned load."""
    load = endpoint_load(load)
    origins = parse_origins(url)
    if server is not None and len(origins) > 1:
        raise PlanError(
            f"--endpoint {url}: meshtop starts one server (the command after --); give one URL, or start the "
            "replicas yourself and leave out the command"
        )
    if server_metrics is not None:
        metrics = server_metrics.split(",")
        if len(metrics) not in (1, len(origins)):
            raise PlanError(
                f"--server-metrics {server_metrics}: give one URL, or one per --endpoint replica ({len(origins)})"
            )
        for item in metrics:
            try:
                Origin.parse(item.strip())
            except ValueError as error:
                raise PlanError(f"--server-metrics: {error}") from None
    prompts: list[Prompt] | None = None
    if requests is None and load.prompts is not None:
        prompts = read_prompts(Path(load.prompts))
        if api == "completions" and any(prompt.messages is not None for prompt in prompts):
            raise PlanError(f"--prompts {load.prompts} holds chat messages: add --api chat")
    planned = requests if requests is not None else plan_load(load, prompts)
    return EndpointRun(
        url=url,
        origins=origins,
        api=api,
        model=model or "",
        models=(),
        load=load,
        requests=tuple(planned),
        same_load=same_load,
        server_metrics=server_metrics,
        server=server,
    )


def check_server(run: EndpointRun, probe_timeout_s: float = PROBE_TIMEOUT_S) -> EndpointRun:
    """``run`` with the server asked what it serves (its model, when ``--model`` gave none) and one request of
    the load's shape accepted, within ``probe_timeout_s``; one line (:class:`PlanError`) when it cannot be.
    Replicas are each asked and probed; they must serve the same model."""
    model, models = _served_model(run.origin, run.model or None)
    for replica in run.origins[1:]:
        other, listed = _served_model(replica, run.model or None)
        if other != model:
            raise PlanError(
                f"--endpoint: the replicas serve different models: {run.origin.root} {model!r}, "
                f"{replica.root} {other!r}: give replicas of one model"
            )
        models = models or listed
    for origin in run.origins:
        probe_request(origin, run.api, model, run.load, probe_timeout_s)
    return replace(run, model=model, models=models)


def _served_model(origin: Origin, model: str | None) -> tuple[str, tuple[str, ...]]:
    """The model to load at ``origin`` (``--model``'s, or the one it serves) and every model it lists."""
    models = served_models(origin)
    if not models:  # it may still serve --model's: the probe request says whether it does
        if model is None:
            raise PlanError(f"--endpoint {origin.root}: the server lists no models: name the one to load with --model")
    elif model is None:
        if len(models) > 1:
            raise PlanError(
                f"--endpoint {origin.root} serves {len(models)} models: pick one with --model ({', '.join(models)})"
            )
        model = models[0]
    elif model not in models:
        raise PlanError(f"--model {model!r}: {origin.root} serves {', '.join(models)}")
    return model, models


def resolve_endpoint(url: str, *, api: str, model: str | None, load: Load, **options: Any) -> EndpointRun:
    """:func:`plan_endpoint`, then :func:`check_server` (a server meshtop starts is asked once it is up)."""
    run = plan_endpoint(url, api=api, model=model, load=load, **options)
    return run if run.server is not None else check_server(run)
