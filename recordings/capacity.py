"""A capacity sweep: how many requests a second a server configuration takes within its SLO, from one ordinary
recording per run under one folder, and the configurations ranked by that per GPU.

On disk: ``OUT/capacity.json`` (what was asked, each configuration and each run's status), read typed as the
manifest is (:func:`read_capacity`: :class:`CapacityFile`); ``OUT/<config>/<run>/``, a recording ``summary``,
``compare`` and ``replay`` read as any other; ``OUT/<config>/server-<i>.log`` for the servers meshtop started.
The figures are computed from those files whenever asked (:func:`capacity_report`), so an interrupted sweep
reports the runs that finished.

The rule, per run (its request figures, :class:`~meshtop.recordings.metrics.requests.RequestFigures`):

- **attainment**: the share of the load's requests that met the SLO (``slo_met``: a failed request did not);
- **met**: attainment at least the sweep's ``--attainment`` (default
  :data:`~meshtop.recordings.metrics.blocker.ATTAINMENT`, the share the blocker holds a run to);
- **achieved rate**: the departure rate, (completed - 1) / (last end - first end) of the load's completed
  requests: the rate the server answered at, which a backlog cannot raise (the rate the requests were *sent*
  at is the client's, ``client.achieved_rate_per_s``);
- **saturated**: open loop, the achieved rate below :data:`SATURATED_SHARE` of the rate the load generator
  sent; or the queue grows through the run (the blocker's rule,
  :func:`~meshtop.recordings.metrics.blocker.queue_grows`). Either way the server answers fewer requests a
  second than it is asked, and a higher rate only grows the backlog;
- **client-limited**: the load generator limited the run (``client.limited``): the run measured the client;
- **passed**: met, not saturated and not client-limited. A client-limited run never passes, so the client's
  limit is never taken for the server's capacity.

Per configuration: the **capacity** is the highest asked rate whose run passed (a concurrency search: that
run's achieved rate, the concurrency being no rate); 0 where none did. **per GPU** = capacity / the
configuration's GPUs. **limited by**: the blocker kind of the first run above capacity that did not pass (a
failed run without one: ``failed``; ``client`` for a client-limited run); a server that did not start:
``fit`` where it ran out of memory, else ``failed``. With ``--users N --rate-per-user R`` (offered = N x R
requests/s), **needed** = ceil(offered / capacity) servers of the configuration, and needed x its GPUs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from meshtop.recordings.metrics.blocker import queue_grows
from meshtop.recordings.metrics.figures import RunFigures
from meshtop.recordings.reader import open_recording
from meshtop.recordings.summary import blocker_json, fold_recording, job_status, recording_blocker
from meshtop.recordings.typed_json import RecordingError, read_versioned

CAPACITY_FILE = "capacity.json"
CAPACITY_VERSION = 1
SATURATED_SHARE = 0.9
"""A run is saturated when the server answered at less than this share of the rate it was sent: a Poisson
load of 30 s or more departs within a few percent of its arrivals while the server keeps up, and a server that
does not falls behind by its whole shortfall; a tenth is beyond the arrivals' chance and within what a higher
rate would only add to the backlog."""
ENDPOINT_CONFIG = "endpoint"
"""The configuration of a sweep without ``--vary``: the endpoint as given."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Slo:
    ttft_s: float | None
    tpot_s: float | None


@dataclass(frozen=True, kw_only=True, slots=True)
class Users:
    """The offered load ``--users N --rate-per-user R`` asks of the configurations."""

    users: int
    rate_per_user: float
    offered_per_s: float


@dataclass(frozen=True, kw_only=True, slots=True)
class ConfigEntry:
    """One configuration of the sweep (``capacity.json``'s ``configurations``)."""

    config: str
    """Its label: ``endpoint``, or the values it fills in, ``tp=1,replicas=2``."""
    folder: str
    """Its folder under the sweep's (``tp-1_replicas-2``)."""
    gpus: int
    status: str
    """pending, running, completed, failed (its server did not start), interrupted or not run."""
    reason: str | None
    limited_by: str | None = None
    """Set where no run could be sent: ``fit`` (the server did not start for memory) or ``failed``."""


@dataclass(frozen=True, kw_only=True, slots=True)
class RunEntry:
    """One run of the sweep (``capacity.json``'s ``runs``), in the order run."""

    config: str
    rate: float
    """The asked rate in requests/s (a concurrency search: the concurrency)."""
    status: str
    """running, completed, failed, interrupted or not run."""
    recording: str | None
    """Its recording's folder relative to the sweep's."""
    reason: str | None
    """Why it failed or did not run."""


@dataclass(frozen=True, kw_only=True, slots=True)
class CapacityFile:
    """``OUT/capacity.json``: what was asked, and what became of each configuration and run."""

    version: int
    started_at: str
    command_line: tuple[str, ...]
    slo: Slo
    attainment: float
    search: str
    """``rate`` or ``concurrency``."""
    users: Users | None
    configurations: tuple[ConfigEntry, ...]
    runs: tuple[RunEntry, ...]


def is_capacity_sweep(path: Path) -> bool:
    return (path / CAPACITY_FILE).is_file()


def read_capacity(out: Path) -> CapacityFile:
    """``OUT/capacity.json``, typed; a :class:`RecordingError` (one line) where it is missing, unreadable, of
    another version or not of this shape."""
    return read_versioned(
        out / CAPACITY_FILE,
        CapacityFile,
        version=CAPACITY_VERSION,
        what="capacity",
        missing=f"{out} is not a capacity sweep (no {CAPACITY_FILE})",
    )


def config_folder(label: str) -> str:
    """``tp=1,replicas=2`` -> ``tp-1_replicas-2``: the configuration's folder."""
    folder = label.replace("=", "-").replace(",", "_")
    return "".join(c if c.isalnum() or c in "-_." else "-" for c in folder)


def run_folder(search: str, rate: float) -> str:
    """``rate-2``, ``rate-2.75``, ``concurrency-4``."""
    return f"{search}-{rate:g}"


def departure_rate(ends_ns: list[int]) -> float | None:
    """(completed - 1) / (last end - first end) of the completed requests' ends; ``None`` under 2 of them or
    with no time between."""
    if len(ends_ns) < 2 or max(ends_ns) == min(ends_ns):
        return None
    return (len(ends_ns) - 1) / ((max(ends_ns) - min(ends_ns)) / 1e9)


def saturation(
    achieved_per_s: float | None, sent_per_s: float | None, queue: str | None, *, open_loop: bool
) -> str | None:
    """Why a run is saturated by the module's rule (``queue``: the blocker's evidence of a growing queue);
    ``None`` where it is not."""
    if (
        open_loop
        and achieved_per_s is not None
        and sent_per_s is not None
        and achieved_per_s < SATURATED_SHARE * sent_per_s
    ):
        return (
            f"saturated: the server answered {achieved_per_s:.2f} requests/s of the {sent_per_s:.2f} sent "
            f"(under {SATURATED_SHARE:.0%})".replace("%", " %")
        )
    return f"saturated: {queue}" if queue is not None else None


@dataclass(frozen=True, kw_only=True, slots=True)
class RunFiguresOfSweep:
    """One run's figures by the module's rule."""

    attainment: float | None
    met: bool
    achieved_rate: float | None
    saturated: str | None
    """Why it is saturated; ``None`` where it is not."""
    client_limited: str | None
    """Why the client limited it; ``None`` where it did not."""

    @property
    def passed(self) -> bool:
        return self.met and self.saturated is None and self.client_limited is None

    def why(self, attainment: float) -> str | None:
        """Why it did not pass (the client first: its figures say nothing of the server); ``None`` where it did."""
        if self.client_limited is not None:
            return self.client_limited
        if self.saturated is not None:
            return self.saturated
        if not self.met:
            met = "no request" if self.attainment is None else f"{self.attainment:.1%} of the requests"
            return f"SLO missed: met by {met} (under {attainment:.0%})".replace("%", " %")
        return None


def run_figures(figures: RunFigures, ends_ns: list[int], *, attainment: float, open_loop: bool) -> RunFiguresOfSweep:
    """A run's figures from its metrics (``ends_ns``: its completed requests' ends)."""
    requests = figures.requests
    achieved = departure_rate(ends_ns)
    if requests is None:
        return RunFiguresOfSweep(
            attainment=None, met=False, achieved_rate=achieved, saturated=None, client_limited=None
        )
    client = requests.client
    sent = client.achieved_rate_per_s if client is not None else None
    queue = queue_grows(figures, requests) if requests.completed else None
    return RunFiguresOfSweep(
        attainment=requests.slo_met,
        met=requests.slo_met is not None and requests.slo_met >= attainment,
        achieved_rate=achieved,
        saturated=saturation(achieved, sent, queue, open_loop=open_loop),
        client_limited=client.limited if client is not None else None,
    )


def completed_ends(directory: Path) -> list[int]:
    """The ends of the load's completed requests (a request's first report, warmup left out)."""
    table = open_recording(directory).arrow("request", ["request", "end_ns", "status", "warmup"])
    seen: dict[int, tuple[int, str]] = {}
    for row in table.to_pylist():
        if not row["warmup"] and row["request"] not in seen:
            seen[row["request"]] = (row["end_ns"], row["status"])
    return [end for end, status in seen.values() if status == "completed"]


def run_row(out: Path, sweep: CapacityFile, entry: RunEntry) -> dict[str, Any]:
    """One run's row of the report (its figures where its recording holds any)."""
    row: dict[str, Any] = {
        "config": entry.config,
        "rate": entry.rate,
        "achieved_rate": None,
        "attainment": None,
        "met": False,
        "saturated": False,
        "client_limited": False,
        "passed": False,
        "recording": entry.recording,
        "status": entry.status,
        **dict.fromkeys(("ttft_p50_s", "ttft_p99_s", "tpot_p50_s", "tpot_p99_s")),
        "blocker": None,
        "why": entry.reason,
    }
    directory = out / entry.recording if entry.recording else None
    if directory is None or not (directory / "manifest.json").is_file() or entry.status == "running":
        return row
    try:
        recording = open_recording(directory)
        fold = fold_recording(recording)
        figures = fold.figures()
        judged = run_figures(
            figures, completed_ends(directory), attainment=sweep.attainment, open_loop=sweep.search == "rate"
        )
        blocker = recording_blocker(recording, fold)
        status = job_status(recording)
    except RecordingError as problem:
        row["why"] = row["why"] or str(problem)
        return row
    requests = figures.requests
    if requests is not None:
        for name in ("ttft", "tpot"):
            for quantile in ("p50", "p99"):
                row[f"{name}_{quantile}_s"] = requests.latencies[f"{name}_s"][quantile]
    row.update(
        achieved_rate=judged.achieved_rate,
        attainment=judged.attainment,
        met=judged.met,
        saturated=judged.saturated is not None,
        client_limited=judged.client_limited is not None,
        passed=judged.passed and status == "completed",
        blocker=blocker_json(blocker),
        status=entry.status if entry.status in ("interrupted", "failed") else status,
    )
    if status == "completed":
        row["why"] = judged.why(sweep.attainment)
    return row


def limit_of(row: dict[str, Any]) -> str:
    """What a run that did not pass says stopped the configuration."""
    if row["client_limited"]:
        return "client"
    blocker = row["blocker"]
    if row["status"] == "completed" and blocker is not None and blocker["kind"] != "none":
        return str(blocker["kind"])
    if row["status"] == "completed":
        return "queue" if row["saturated"] else "latency"
    return "failed"


def capacity_row(config: ConfigEntry, runs: list[dict[str, Any]], sweep: CapacityFile) -> dict[str, Any]:
    """A configuration's capacity by the module's rule."""
    passed = [row for row in runs if row["passed"]]
    best = max(passed, key=lambda row: row["rate"]) if passed else None
    if best is None:
        capacity = 0.0
    elif sweep.search == "rate":
        capacity = float(best["rate"])
    else:
        capacity = float(best["achieved_rate"] or 0.0)
    above = sorted(
        (row for row in runs if row["status"] != "not run" and not row["passed"]),
        key=lambda row: row["rate"],
    )
    above = [row for row in above if best is None or row["rate"] > best["rate"]]
    limited_by = config.limited_by or (limit_of(above[0]) if above else None)
    reason = config.reason
    if best is None and reason is None:
        reason = above[0]["why"] if above else "no run finished"
    needed = None
    if sweep.users is not None and capacity > 0:
        needed = math.ceil(sweep.users.offered_per_s / capacity - 1e-9)
    return {
        "config": config.config,
        "requests_per_s": capacity,
        "per_gpu": capacity / config.gpus,
        "gpus": config.gpus,
        "rate": best["rate"] if best is not None else None,
        "ttft_p99_s": best["ttft_p99_s"] if best is not None else None,
        "tpot_p99_s": best["tpot_p99_s"] if best is not None else None,
        "limited_by": limited_by,
        "recording": best["recording"] if best is not None else None,
        "needed": needed,
        "needed_gpus": needed * config.gpus if needed is not None else None,
        "reason": reason if best is None else None,
        "status": config.status,
    }


def capacity_report(out: Path) -> dict[str, Any]:
    """The sweep at ``out``: each configuration's capacity, best first (per GPU, then requests/s; those of no
    capacity last, in the order run), and every run with its figures, in the order run."""
    sweep = read_capacity(out)
    runs = [run_row(out, sweep, entry) for entry in sweep.runs]
    rows = [
        capacity_row(config, [r for r in runs if r["config"] == config.config], sweep)
        for config in sweep.configurations
    ]
    ranked = sorted(
        enumerate(rows),
        key=lambda item: (item[1]["requests_per_s"] <= 0, -item[1]["per_gpu"], -item[1]["requests_per_s"], item[0]),
    )
    return {
        "sweep": str(out),
        "kind": "capacity",
        "search": sweep.search,
        "slo": {"ttft_s": sweep.slo.ttft_s, "tpot_s": sweep.slo.tpot_s},
        "attainment": sweep.attainment,
        "users": (
            {
                "users": sweep.users.users,
                "rate_per_user": sweep.users.rate_per_user,
                "offered_per_s": sweep.users.offered_per_s,
            }
            if sweep.users is not None
            else None
        ),
        "capacity": [row for _, row in ranked],
        "runs": runs,
    }
