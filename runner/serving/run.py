"""Run a load against a serving endpoint to its end: start the load generator in its own process, pass on
what it, the server's ``/metrics`` and this node's samplers report, answer a stop, and say how it ended.

The endpoint's counterpart of :func:`meshtop.runner.job.launch.run_job`, with the same contract (events to
``on_events``, ``control.stop`` and Ctrl-C stop it, a :class:`JobResult` at the end), so the session, the
recording, the console and the dashboard take either. Rank 0 is the load generator: its process samples
say whether the client, not the server, was short of CPU.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from meshtop.probes.arrivals import Arrivals
from meshtop.probes.collector import Collector
from meshtop.probes.events import ServerState
from meshtop.probes.wire import ADDRESS_ENV, TOKEN_ENV
from meshtop.recordings.manifest import ServerInfo
from meshtop.recordings.typed_json import RecordingError, dump, load
from meshtop.runner.errors import PlanError
from meshtop.runner.job.control import JobControl
from meshtop.runner.job.supervise import NodeProbes, Supervisor
from meshtop.runner.results import JobResult, RankExit, lifecycle_events
from meshtop.runner.serving.client import CLIENT_RANK, INTERRUPTED, ClientSpec, LoadStatus
from meshtop.runner.serving.endpoint import PROBE_TIMEOUT_S, EndpointRun, check_server
from meshtop.runner.serving.load import DEFAULT_TIMEOUT_S, request_to_json
from meshtop.runner.serving.scrape import Scraper
from meshtop.runner.serving.server import SERVER_LOG, ServerFailed, ServerProcess, StartupStopped

CLIENT_LOG = "client.log"
STATUS_NAME = "load-status.json"
SPEC_NAME = ".client.json"
STOP_GRACE_S = 10.0
"""After SIGINT, how long the load generator has to report its requests in flight before SIGKILL."""


def write_load(path: Path, run: EndpointRun) -> None:
    """The planned requests into ``path``, one a line (the recording's ``load.jsonl``)."""
    path.write_text("".join(json.dumps(request_to_json(request)) + "\n" for request in run.requests))


def failure_line(counts: dict[str, int], requests: int) -> str | None:
    """``"3 of 16 requests failed (refused 2, timeout 1)"``; ``None`` when none failed."""
    failed = {kind: n for kind, n in counts.items() if kind != "completed" and n}
    if not failed:
        return None
    kinds = ", ".join(f"{kind} {n}" for kind, n in sorted(failed.items(), key=lambda item: -item[1]))
    return f"{sum(failed.values())} of {requests} requests failed ({kinds})"


def replica_line(run: EndpointRun, status: LoadStatus) -> str:
    """Replicas: ``"; by replica: 1 (http://h:8001) 8 (gone: it refused its requests)"``, where some failed."""
    if not status.failed_by_replica:
        return ""
    parts = [
        f"{index} ({run.origins[int(index)].root}) {n}"
        + (" (gone: it refused its requests)" if int(index) in status.gone_replicas else "")
        for index, n in status.failed_by_replica.items()
    ]
    return "; by replica: " + ", ".join(parts)


def run_endpoint(
    run: EndpointRun,
    *,
    session_dir: Path,
    requests_path: Path,
    on_events: Callable[[Arrivals], None] = lambda arrivals: None,
    node_probes: NodeProbes = NodeProbes(),
    control: JobControl | None = None,
    on_resolved: Callable[[EndpointRun, ServerInfo | None], None] = lambda run, report: None,
) -> JobResult:
    """Send ``run``'s load from a load-generator process, passing its events (and the node samplers') to
    ``on_events``; stop it on ``control.stop`` or Ctrl-C (its requests in flight reported as interrupted).
    The load is written to ``requests_path`` first (the recording keeps it).

    A server to start (``run.server``) is started first, waited for (its progress as ``server_state`` events),
    asked what it serves, and stopped after the load, however it ended; ``on_resolved`` gets the run as the
    server made it (its model) and how the server ran."""
    control = control if control is not None else JobControl()
    session_dir.mkdir(parents=True, exist_ok=True)
    write_load(requests_path, run)
    started = time.monotonic()
    if run.server is None:
        return _send_load(run, session_dir, requests_path, on_events, node_probes, control, started, None)
    server: ServerProcess | None = None

    def said(state: str, line: str | None) -> None:
        elapsed = time.monotonic() - started
        on_events(Arrivals([ServerState(wall_ns=time.time_ns(), state=state, elapsed_s=elapsed, line=line)]))

    ready = False
    try:
        server = ServerProcess(run.server, session_dir / SERVER_LOG)
        said("starting", shlex.join(run.server.command))
        server.wait_ready(run.origin, progress=lambda elapsed, line: said("starting", line), stop=control.stop)
        ready = True
        # A server may do its first work at its first request (transformers serve starts its continuous-batching
        # loop then: past 30 s on a loaded 2-core machine): the probe request has what --startup-timeout leaves.
        left_s = run.server.startup_timeout_s - (time.monotonic() - started)
        run = check_server(run, probe_timeout_s=max(PROBE_TIMEOUT_S, left_s))
        said("ready", None)
        return _send_load(run, session_dir, requests_path, on_events, node_probes, control, started, server)
    except (StartupStopped, ServerFailed, PlanError) as error:
        # stopped (q, ctrl+c in the dashboard or SIGTERM) while it loaded, it never came up, or it serves not what
        # the load asks: nothing was sent
        stopped = isinstance(error, StartupStopped)
        if not stopped:
            said("failed", str(error))
        result = JobResult(
            status="interrupted" if stopped else "failed",
            ranks=(RankExit(rank=CLIENT_RANK, exit_code=None, signal=None, error="not started"),),
            duration_s=time.monotonic() - started,
            log_path=session_dir / SERVER_LOG,
            failure=None if stopped else str(error),
        )
        on_events(Arrivals(lifecycle_events(result)))
        return result
    finally:
        report = server.stop() if server is not None else None
        if ready and report is not None:
            said("stopped", f"exit code {report.exit_code}" if report.exit_code is not None else None)
        on_resolved(run, report)


def _send_load(
    run: EndpointRun,
    session_dir: Path,
    requests_path: Path,
    on_events: Callable[[Arrivals], None],
    node_probes: NodeProbes,
    control: JobControl,
    started: float,
    server: ServerProcess | None,
) -> JobResult:
    """The load generator's run, from its start to how it ended."""
    status_path = session_dir / STATUS_NAME
    spec = ClientSpec(
        urls=tuple(origin.base + origin.prefix for origin in run.origins),
        api=run.api,
        model=run.model,
        concurrency=run.load.concurrency,
        timeout_s=run.load.timeout_s or DEFAULT_TIMEOUT_S,
        ignore_eos=run.load.ignore_eos,
        requests_path=str(requests_path),
        status_path=str(status_path),
        duration_s=run.load.duration_s,
    )
    spec_path = session_dir / SPEC_NAME
    spec_path.write_text(json.dumps(dump(spec)))
    collector = Collector().start()
    supervisor = Supervisor(collector, node_probes, on_events=on_events)
    env = {**os.environ, ADDRESS_ENV: "{}:{}".format(*collector.address), TOKEN_ENV: collector.token}
    supervisor.start_sampling()
    with (session_dir / CLIENT_LOG).open("ab") as log:
        client = subprocess.Popen(
            [sys.executable, "-m", "meshtop.runner.serving.client", str(spec_path)],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
    supervisor.processes.watch(CLIENT_RANK, client.pid)
    scraper = Scraper(run.metrics_urls, emit=supervisor.emit)
    scraper.start()
    server_gone: str | None = None

    def server_still_up() -> bool:
        nonlocal server_gone
        if server is not None:
            server.watch()
            if (code := server.exited()) is not None:  # the rest of the load would only be refused
                how = f"code {code}" if code >= 0 else f"signal {signal.Signals(-code).name}"
                server_gone = f"the server exited with {how} during the load"
                return False
        return True

    interrupted = False
    try:
        supervisor.follow(lambda: client.poll() is None, control.stop, go_on=server_still_up)
        interrupted = client.poll() is None and server_gone is None
    except KeyboardInterrupt:
        interrupted = True
    finally:
        if client.poll() is None:
            client.send_signal(signal.SIGINT)  # the load generator reports what is in flight, then exits
            try:
                client.wait(STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                client.kill()
                client.wait()
        scraper.stop()
        supervisor.stop_sampling()
        time.sleep(0.05)  # the shipper's last frame is in once its process ended; let the collector queue it
        supervisor.last_batch()
        spec_path.unlink(missing_ok=True)
    result = endpoint_result(
        run,
        client.returncode,
        status_path,
        interrupted=interrupted,
        duration_s=time.monotonic() - started,
        log_path=session_dir / CLIENT_LOG,
        server_gone=server_gone,
    )
    supervisor.say_ended(result)
    return result


def endpoint_result(
    run: EndpointRun,
    code: int,
    status_path: Path,
    *,
    interrupted: bool,
    duration_s: float,
    log_path: Path,
    server_gone: str | None = None,
) -> JobResult:
    """How the load ended: ``completed`` when every request was answered, ``failed`` when one was not (the
    failures counted by kind), when the server was gone before the load's end (``server_gone``: the server
    meshtop started exited; or the load generator's own verdict) or the load generator itself failed,
    ``interrupted`` when stopped."""
    replicas = ""
    try:
        status = load(LoadStatus, json.loads(status_path.read_text()), whole=status_path.name)
        counts: dict[str, int] | None = status.by_kind
        server_gone = server_gone or (f"the server is gone ({status.gone})" if status.gone else None)
        not_sent = status.not_sent
        replicas = replica_line(run, status)
    except (OSError, ValueError, RecordingError):
        counts, not_sent = None, 0
    status_path.unlink(missing_ok=True)
    if server_gone is not None:
        sent = sum((counts or {}).values())
        unsent = f", {not_sent:,} of {sent + not_sent:,} requests not sent" if not_sent else ""
        failed = failure_line(counts or {}, sent)
        return JobResult(
            status="failed",
            ranks=(
                RankExit(
                    rank=CLIENT_RANK,
                    exit_code=0 if code == 0 else None,
                    signal="SIGINT" if code == INTERRUPTED else None,  # stopped by us: the server exited
                    error="the server is gone",
                ),
            ),
            duration_s=duration_s,
            log_path=log_path,
            failure=f"{server_gone}: the load was stopped{unsent}" + (f"; {failed}{replicas}" if failed else ""),
        )
    if interrupted or code == INTERRUPTED:
        return JobResult(
            status="interrupted",
            ranks=(RankExit(rank=CLIENT_RANK, exit_code=None, signal="SIGINT", error="stopped"),),
            duration_s=duration_s,
            log_path=log_path,
        )
    if code != 0 or counts is None:
        how = f"exit code {code}" if code >= 0 else f"signal {signal.Signals(-code).name}"
        tail = log_path.read_text(errors="replace").strip().splitlines()[-1:] if log_path.exists() else []
        return JobResult(
            status="failed",
            ranks=(RankExit(rank=CLIENT_RANK, exit_code=code, signal=None, error=(tail or ["no output"])[0]),),
            duration_s=duration_s,
            log_path=log_path,
            failure=f"the load generator ended with {how}: {(tail or ['no output'])[0]}",
        )
    sent = sum(counts.values()) if run.load.duration_s is not None else run.load.requests
    failed = failure_line(counts, sent)
    if failed is not None:
        failed += replicas
    return JobResult(
        status="failed" if failed is not None else "completed",
        ranks=(RankExit(rank=CLIENT_RANK, exit_code=0, signal=None, error=None),),
        duration_s=duration_s,
        log_path=log_path,
        failure=failed,
    )
