"""``meshtop sweep OUT --endpoint URL --slo ...``: the capacity search over one server, or over each
configuration of a server command meshtop starts, one ordinary recording per run.

The search (:func:`next_rate`, a pure step: the outcomes so far in, the next rate or done out):

- fixed ``--rates R1,R2,..`` (or ``--concurrencies C1,..``): ascending, stopping once a run saturates (a
  higher rate only grows the backlog: the rest are not run);
- ``--rates auto``: from ``--start-rate``, doubling until a run does not pass (SLO missed, saturated or
  client-limited), then bisecting between the highest pass and the lowest non-pass until they are within
  :data:`RESOLUTION` of the pass; where the first run does not pass, halving (:data:`HALVINGS` times at most)
  to find one, else the capacity is 0; ``--max-runs`` runs at most (:data:`DEFAULT_MAX_RUNS`).

Each run sends the same seeded load shape at its rate (``load_at``). Configurations (``--vary NAME=V1,V2``,
their cartesian product in the order given) fill ``{NAME}`` in the server command, and ``{port}`` (in the
command and the endpoint) with a free port; ``replicas`` starts the command that many times, each copy on a
port of its own and its share of the visible GPUs, the load spread over their endpoints. Each configuration's
servers are started, waited for, asked what they serve, sent the runs and stopped whole before the next, however
the sweep ends. ``OUT/capacity.json`` (:mod:`meshtop.recordings.capacity`) is rewritten after every run; an
interrupt keeps the runs that finished, marks the one it cut and what did not run, and is raised again.
"""

from __future__ import annotations

import itertools
import math
import os
import re
import socket
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from meshtop.probes.errors import MeshtopError
from meshtop.recordings.capacity import (
    CAPACITY_FILE,
    CAPACITY_VERSION,
    ENDPOINT_CONFIG,
    config_folder,
    read_capacity,
    run_folder,
    run_row,
)
from meshtop.recordings.manifest import Load, new_recording
from meshtop.recordings.metrics.blocker import OUT_OF_MEMORY
from meshtop.recordings.sweep import write_sweep
from meshtop.runner.errors import PlanError
from meshtop.runner.job.supervise import NodeProbes
from meshtop.runner.serving.endpoint import PROBE_TIMEOUT_S, check_server, plan_endpoint
from meshtop.runner.serving.http import Origin
from meshtop.runner.serving.server import (
    DEFAULT_STARTUP_TIMEOUT_S,
    ServerCommand,
    ServerFailed,
    ServerProcess,
    log_tail,
)
from meshtop.runner.session.console import follow_job
from meshtop.runner.session.session import EndpointWork, SessionOptions, start_recording

RESOLUTION = 0.10
"""The auto search stops once (lowest non-pass - highest pass) / highest pass is at most this: a tenth is
within the run-to-run spread of a rate near capacity on a shared server, so a finer step would measure noise."""
HALVINGS = 4
"""Where the start rate does not pass, halve it at most this many times (down to a sixteenth) before calling
the capacity 0: a server that misses its SLO at a sixteenth of the start has no capacity worth a search."""
DEFAULT_MAX_RUNS = 12
DEFAULT_START_RATE = 1.0
DEFAULT_DURATION_S = 30.0
"""Each run's length where neither --requests nor --duration is given: long enough for a queue to grow in
thirds and for a Poisson load's departures to settle near its arrivals."""
REPLICAS = "replicas"
PLACEHOLDER = re.compile(r"\{(\w+)\}")


@dataclass(frozen=True, slots=True, kw_only=True)
class Outcome:
    """What a run of the search came to."""

    rate: float
    passed: bool
    saturated: bool


def rounded(rate: float) -> float:
    """A rate to 4 significant digits (the run's folder name, ``rate-2.75``)."""
    return float(f"{rate:.4g}")


def next_rate(
    outcomes: Sequence[Outcome],
    *,
    fixed: Sequence[float] | None,
    start: float = DEFAULT_START_RATE,
    max_runs: int = DEFAULT_MAX_RUNS,
) -> float | None:
    """The next rate to run by the module's search (``fixed``: the list given, else auto), ``None`` when done."""
    if fixed is not None:
        if any(outcome.saturated for outcome in outcomes):
            return None
        done = {outcome.rate for outcome in outcomes}
        return next((rate for rate in sorted(fixed) if rate not in done), None)
    if len(outcomes) >= max_runs:
        return None
    if not outcomes:
        return start
    passes = [outcome.rate for outcome in outcomes if outcome.passed]
    failures = [outcome.rate for outcome in outcomes if not outcome.passed]
    if not passes:
        return rounded(min(failures) / 2) if len(outcomes) <= HALVINGS else None
    if not failures:
        return rounded(max(passes) * 2)
    high = min(failures)
    low = max((rate for rate in passes if rate < high), default=None)
    if low is None or (high - low) / low <= RESOLUTION:
        return None
    middle = rounded((low + high) / 2)
    return middle if low < middle < high else None


def parse_rates(text: str, flag: str, *, whole: bool = False) -> tuple[float, ...]:
    """``1,2,4`` as rates above 0 (``whole``: concurrencies, whole numbers); one line when it is not."""
    try:
        values = tuple(float(part) for part in text.split(","))
    except ValueError:
        values = ()
    if not values or not all(0 < value < math.inf and (not whole or value == int(value)) for value in values):
        kind = "whole numbers" if whole else "numbers"
        raise PlanError(f"{flag} {text!r}: give {kind} above 0 separated by commas, such as {flag} 1,2,4")
    if len(set(values)) != len(values):
        raise PlanError(f"{flag} {text!r}: a value is given twice")
    return values


@dataclass(frozen=True, slots=True, kw_only=True)
class Configuration:
    """One setting of the server command: the values it fills in, and the GPUs it holds."""

    label: str
    values: tuple[tuple[str, str], ...]
    gpus: int
    replicas: int = 1

    @property
    def folder(self) -> str:
        return config_folder(self.label)


def parse_vary(texts: Sequence[str]) -> list[tuple[str, tuple[str, ...]]]:
    """``--vary NAME=V1,V2`` (repeatable) as (name, values), in the order given; one line when malformed."""
    varied: list[tuple[str, tuple[str, ...]]] = []
    for text in texts:
        name, sep, listed = text.partition("=")
        values = tuple(value.strip() for value in listed.split(","))
        if not sep or not re.fullmatch(r"\w+", name.strip()) or not all(values):
            raise PlanError(f"--vary {text!r}: give NAME=V1,V2,..., such as --vary tp=1,2")
        if name.strip() in (dict(varied)) or name.strip() == "port":
            raise PlanError(f"--vary {text!r}: {name.strip()} is given twice or is meshtop's own ({{port}})")
        varied.append((name.strip(), values))
    return varied


def configurations(
    vary: Sequence[str], command: Sequence[str] | None, endpoint: str, *, gpus_per_config: int
) -> list[Configuration]:
    """Every configuration of ``--vary`` over the server ``command`` (their cartesian product, in the order
    given); without ``--vary``, the endpoint as given. The GPUs of one: tp x pp where varied, else
    ``gpus_per_config``, times its replicas."""
    varied = parse_vary(vary)
    if varied and command is None:
        raise PlanError("--vary fills {NAME} in a server command: give the command after --")
    if not varied:
        return [Configuration(label=ENDPOINT_CONFIG, values=(), gpus=gpus_per_config)]
    assert command is not None
    text = " ".join([*command, endpoint])
    names = {name for name, _ in varied}
    unknown = sorted(set(PLACEHOLDER.findall(text)) - names - {"port"})
    if unknown:
        raise PlanError(f"{{{unknown[0]}}} in the server command is not varied: give --vary {unknown[0]}=V1,V2")
    for name in names - {REPLICAS}:
        if f"{{{name}}}" not in text:
            raise PlanError(f"--vary {name}: the server command has no {{{name}}} to fill")
    found = []
    for combination in itertools.product(*(values for _, values in varied)):
        values = tuple(zip((name for name, _ in varied), combination, strict=True))
        given = dict(values)
        try:
            sizes = {name: int(given[name]) for name in (REPLICAS, "tp", "pp") if name in given}
        except ValueError:
            raise PlanError("--vary replicas, tp and pp take whole numbers") from None
        if (small := next((name for name, size in sizes.items() if size < 1), None)) is not None:
            raise PlanError(f"--vary {small}={sizes[small]}: give 1 or more")
        replicas = sizes.get(REPLICAS, 1)
        per_server = math.prod(sizes[name] for name in ("tp", "pp") if name in sizes)
        if not ("tp" in given or "pp" in given):
            per_server = gpus_per_config
        if replicas > 1 and "{port}" not in " ".join(command):
            raise PlanError(
                f"--vary replicas={replicas}: each copy of the server needs a port of its own: put {{port}} in its "
                "command and in --endpoint"
            )
        label = ",".join(f"{name}={value}" for name, value in values)
        found.append(Configuration(label=label, values=values, gpus=per_server * replicas, replicas=replicas))
    return found


def fill(text: str, values: Sequence[tuple[str, str]], port: int | None) -> str:
    """``text`` with each ``{NAME}`` and ``{port}`` filled in."""
    for name, value in values:
        text = text.replace(f"{{{name}}}", value)
    return text.replace("{port}", str(port)) if port is not None else text


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
    return port


def gpu_shares(visible: Sequence[str], replicas: int) -> list[str | None]:
    """Each replica's ``CUDA_VISIBLE_DEVICES``: the visible GPUs split evenly between them (``None``: none
    visible, the environment left as it is)."""
    if not visible:
        return [None] * replicas
    each = max(1, len(visible) // replicas)
    return [",".join(visible[i * each : (i + 1) * each]) or None for i in range(replicas)]


@dataclass(slots=True, kw_only=True)
class CapacitySweep:
    """What the sweep is asked: where, what to search, and the load at a rate."""

    out: Path
    endpoint: str
    api: str
    model: str | None
    load_at: Callable[[float | None, int | None], Load]
    """The load at (rate, concurrency): the same seeded shape at each."""
    slo: tuple[float | None, float | None]
    """(TTFT s, TPOT s)."""
    attainment: float
    fixed: tuple[float, ...] | None
    """The rates or concurrencies given; ``None``: auto."""
    search: str = "rate"
    start_rate: float = DEFAULT_START_RATE
    max_runs: int = DEFAULT_MAX_RUNS
    configurations: list[Configuration] = field(default_factory=list)
    command: tuple[str, ...] | None = None
    startup_timeout_s: float = DEFAULT_STARTUP_TIMEOUT_S
    visible_gpus: tuple[str, ...] = ()
    users: dict[str, Any] | None = None
    server_metrics: str | None = None


class CapacityRunner:
    """The sweep's loop: configurations, their servers, the search, and ``capacity.json`` after every run."""

    def __init__(
        self, sweep: CapacitySweep, *, stream: TextIO, command_line: list[str], node_probes: NodeProbes
    ) -> None:
        self.sweep = sweep
        self.stream = stream
        self.command_line = command_line
        self.node_probes = node_probes
        self.file: dict[str, Any] = {
            "version": CAPACITY_VERSION,
            "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "command_line": command_line,
            "slo": {"ttft_s": sweep.slo[0], "tpot_s": sweep.slo[1]},
            "attainment": sweep.attainment,
            "search": sweep.search,
            "users": sweep.users,
            "configurations": [
                {"config": c.label, "folder": c.folder, "gpus": c.gpus, "status": "pending", "reason": None}
                for c in sweep.configurations
            ],
            "runs": [],
        }
        self.failed = False
        self.count = 0

    def say(self, line: str) -> None:
        print(line, file=self.stream, flush=True)

    def write(self) -> None:
        write_sweep(self.sweep.out, self.file, CAPACITY_FILE)

    def run(self) -> str:
        """Every configuration's search; completed, or failed where a server or a run failed."""
        new_recording(self.sweep.out, command="sweep")
        self.write()
        entries = self.file["configurations"]
        for index, (config, entry) in enumerate(zip(self.sweep.configurations, entries, strict=True)):
            try:
                self.configuration(config, entry)
            except KeyboardInterrupt:
                if entry["status"] in ("pending", "running"):
                    entry.update(status="interrupted", reason="the sweep was interrupted during it")
                self.not_run(config.label, "not run: the sweep was interrupted before it")
                for later, later_entry in zip(
                    self.sweep.configurations[index + 1 :], entries[index + 1 :], strict=True
                ):
                    later_entry.update(status="not run", reason="the sweep was interrupted before it")
                    self.not_run(later.label, "not run: the sweep was interrupted before it")
                self.write()
                raise
            self.write()
        return "failed" if self.failed else "completed"

    def configuration(self, config: Configuration, entry: dict[str, Any]) -> None:
        """Start its servers (where there is a command), search its capacity, stop them whole."""
        sweep = self.sweep
        entry["status"] = "running"
        self.write()
        folder = sweep.out / config.folder
        folder.mkdir(parents=True, exist_ok=True)
        servers: list[ServerProcess] = []
        try:
            try:
                urls = [sweep.endpoint]
                if sweep.command is not None:
                    urls = self.start_servers(config, folder, servers)
                base = plan_endpoint(
                    ",".join(urls),
                    api=sweep.api,
                    model=sweep.model,
                    load=sweep.load_at(*self.shape(sweep.fixed[0] if sweep.fixed else sweep.start_rate)),
                    server_metrics=sweep.server_metrics,
                )
                # a server meshtop started may do its first work at its first request: the probe has what
                # --startup-timeout gives
                probe_s = max(PROBE_TIMEOUT_S, sweep.startup_timeout_s if sweep.command is not None else 0.0)
                model = check_server(base, probe_timeout_s=probe_s).model
            except ServerFailed as error:
                lines = [str(error), *(line for server in servers for line in log_tail(server.log_path))]
                fit = any(OUT_OF_MEMORY.search(line) for line in lines)
                entry.update(status="failed", reason=str(error), limited_by="fit" if fit else "failed")
                self.failed = True
                self.say(f"{config.label}: the server did not start: {error}")
                return
            except PlanError as error:
                entry.update(status="failed", reason=str(error), limited_by="failed")
                self.failed = True
                self.say(f"{config.label}: {error}")
                return
            gone = self.search(config, base.url, model, servers)
            entry.update(status="completed" if gone is None else "failed", reason=gone)
        finally:
            self.stop(servers)

    def shape(self, value: float) -> tuple[float | None, int | None]:
        """(rate, concurrency) of a run at ``value``."""
        return (value, None) if self.sweep.search == "rate" else (None, int(value))

    def start_servers(self, config: Configuration, folder: Path, servers: list[ServerProcess]) -> list[str]:
        """Each copy of the command, on its own port and GPUs, waited for; their endpoints."""
        sweep = self.sweep
        assert sweep.command is not None
        urls = []
        for index, gpus in enumerate(gpu_shares(sweep.visible_gpus, config.replicas)):
            port = free_port()
            command = tuple(fill(part, config.values, port) for part in sweep.command)
            env = dict(os.environ)
            if gpus is not None and config.replicas > 1:
                env["CUDA_VISIBLE_DEVICES"] = gpus
            self.say(f"{config.label}: starting server {index}: {' '.join(command)}")
            spec = ServerCommand(command=command, startup_timeout_s=sweep.startup_timeout_s)
            servers.append(ServerProcess(spec, folder / f"server-{index}.log", env=env))
            urls.append(fill(sweep.endpoint, config.values, port))
        for server, url in zip(servers, urls, strict=True):
            server.wait_ready(
                Origin.parse(url), progress=lambda elapsed, line: self.say(f"  starting ({elapsed:.0f} s): {line}")
            )
        return urls

    def stop(self, servers: list[ServerProcess]) -> None:
        while servers:
            servers.pop().stop()

    def search(self, config: Configuration, url: str, model: str, servers: list[ServerProcess]) -> str | None:
        """The runs of one configuration, by :func:`next_rate`; why they stopped early where a server exited."""
        sweep = self.sweep
        outcomes: list[Outcome] = []
        gone_said = None
        while (
            value := next_rate(outcomes, fixed=sweep.fixed, start=sweep.start_rate, max_runs=sweep.max_runs)
        ) is not None:
            gone = [server for server in servers if server.exited() is not None]
            if gone:
                self.failed = True
                gone_said = f"the server exited with code {gone[0].exited()} during the search, which stopped there"
                self.say(f"{config.label}: {gone_said}")
                break
            outcomes.append(self.one_run(config, url, model, value, servers))
        saturated = next((outcome.rate for outcome in outcomes if outcome.saturated), None)
        if gone_said is not None:
            self.not_run(config.label, f"not run: {gone_said}")
        else:
            self.not_run(config.label, f"not run: the run at {saturated:g} saturated" if saturated else "not run")
        self.write()
        return gone_said

    def not_run(self, config: str, why: str) -> None:
        """The given rates (or concurrencies) of ``config`` that have no run yet, listed as not run and why."""
        done = {run["rate"] for run in self.file["runs"] if run["config"] == config}
        for value in sorted(self.sweep.fixed or ()):
            if value not in done:
                entry = {"config": config, "rate": value, "status": "not run", "recording": None, "reason": why}
                self.file["runs"].append(entry)

    def one_run(
        self, config: Configuration, url: str, model: str, value: float, servers: Sequence[ServerProcess]
    ) -> Outcome:
        """One recording at ``value`` (``servers``: those meshtop started for it, named in its manifest); its
        outcome by :mod:`meshtop.recordings.capacity`'s rule."""
        sweep = self.sweep
        self.count += 1
        name = run_folder(sweep.search, value)
        recording = f"{config.folder}/{name}"
        entry = {"config": config.label, "rate": value, "status": "running", "recording": recording, "reason": None}
        self.file["runs"].append(entry)
        self.write()
        unit = "req/s" if sweep.search == "rate" else "in flight"
        where = "" if config.label == ENDPOINT_CONFIG else f"{config.label} "
        head = f"[{self.count}] {where}{sweep.search} {value:g} {unit}"
        self.say(f"{head}: running")
        directory = sweep.out / recording
        try:
            run = plan_endpoint(
                url,
                api=sweep.api,
                model=model,
                load=sweep.load_at(*self.shape(value)),
                server_metrics=sweep.server_metrics,
            )
            work = EndpointWork(run, servers[0].report if servers else None)
            manifest = start_recording(directory, work, self.node_probes, self.command_line)
            with (sweep.out / config.folder / "console.log").open("a") as console:
                result = follow_job(
                    work,
                    session_dir=directory,
                    out=console,
                    manifest=manifest,
                    options=SessionOptions(node_probes=self.node_probes),
                )
            if result.status == "interrupted":
                raise KeyboardInterrupt
            entry["status"] = result.status
            if result.status != "completed":
                self.failed = True
                entry["reason"] = result.failure or "the run failed"
        except KeyboardInterrupt:
            entry.update(status="interrupted", reason="the sweep was interrupted during this run")
            self.write()
            raise
        except MeshtopError as error:
            entry.update(status="failed", reason=str(error))
            self.failed = True
        self.write()
        written = read_capacity(sweep.out)
        row = run_row(sweep.out, written, written.runs[-1])
        self.say(f"{head}: {run_line(row)}")
        return Outcome(rate=value, passed=bool(row["passed"]), saturated=bool(row["saturated"]))


def run_line(row: dict[str, Any]) -> str:
    """``SLO met by 97 % · achieved 3.9 req/s · TTFT p99 210 ms · TPOT p99 30 ms · passed``."""
    if row["status"] != "completed":
        return f"{row['status']}: {row['why']}"
    parts = []
    if row["attainment"] is not None:
        parts.append(f"SLO met by {row['attainment']:.0%}".replace("%", " %"))
    if row["achieved_rate"] is not None:
        parts.append(f"achieved {row['achieved_rate']:.2f} req/s")
    for name in ("ttft", "tpot"):
        if (value := row[f"{name}_p99_s"]) is not None:
            parts.append(f"{name.upper()} p99 {value * 1e3:.0f} ms")
    parts.append("passed" if row["passed"] else f"not passed ({row['why']})")
    return " · ".join(parts)


def run_capacity_sweep(
    sweep: CapacitySweep, *, stream: TextIO, command_line: list[str], node_probes: NodeProbes = NodeProbes()
) -> str:
    """Run the sweep into the new directory ``sweep.out``; completed, or failed where a server or a run failed.
    An interrupt is raised again once ``capacity.json`` says what it cut."""
    return CapacityRunner(sweep, stream=stream, command_line=command_line, node_probes=node_probes).run()
