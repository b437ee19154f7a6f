"""A Prometheus / OpenMetrics endpoint: ``/metrics`` with what the metrics core knows of a run, live or replayed.

Two kinds of series, each value defined where the rest of meshtop defines it:

- read from the session's fold at each scrape (:class:`meshtop.recordings.session_fold.SessionFold`, the one
  the console, the manifest and the dashboard read): steps completed and their time (a counter and a
  histogram over :class:`meshtop.recordings.metrics.steps.StepStats`), tokens/s, busbw p50 per group and op,
  exposed share, bubble per stage, MFU, memory by category per rank
  (:class:`meshtop.recordings.metrics.run.RunFigures`);
  requests by how they ended and their TTFT / TPOT / E2E histograms (the fold's
  :class:`meshtop.recordings.metrics.requests.RequestFold`: a request reported twice counts once);
  each rank's state (the ranks' lifecycle as the fold follows it: where each started, how it exited), and each
  GPU's samples and its latest readings (the fold's :class:`meshtop.recordings.metrics.gpus.GpuFold`);
- counted as events arrive (counters and histograms of what the fold keeps no per-event series of): each
  collective's in-flight seconds and bytes per op, group and node (:class:`meshtop.probes.events.CollectiveTiming`,
  from the tables the session's fold decoded: the rows it keeps, inside a step, as the core counts them), and
  dropped events.

Base units (seconds, bytes, ratios 0-1), ``_total`` counters, and labels bounded by the job's shape
(groups, ops, stages, nodes, GPUs). Per rank only the series that need a rank: whether it runs, its step time
(the median of its last closed steps, the rank grid's) and its memory; the collectives go per node, as NCCL's own
inspector aggregates them, since a 1024-rank job's 15-bucket histograms per op, group and rank would make a
scrape of tens of megabytes. ``per_rank`` (``--metrics-per-rank``) labels them by rank too. GPU series carry
``gpu``, ``UUID`` and ``Hostname``, the labels the DCGM exporter puts on its own, so the two join in a query.

:class:`MetricsServer` serves them with prometheus_client's own WSGI app: the format the scraper asks for
(OpenMetrics on ``Accept: application/openmetrics-text``, else Prometheus's text format 0.0.4), gzip where
it is accepted.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, make_server

import prometheus_client
import pyarrow as pa
import pyarrow.compute as pc
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest, make_wsgi_app
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.exposition import ThreadingWSGIServer
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from meshtop.probes.arrivals import Arrivals
from meshtop.probes.errors import MeshtopError
from meshtop.probes.events import Event, EventsDropped
from meshtop.recordings.manifest import RunDescription
from meshtop.recordings.metrics.attention import WINDOW
from meshtop.recordings.metrics.figures import RunFigures
from meshtop.recordings.metrics.gpus import LINK_LABELS, LINKS
from meshtop.recordings.metrics.requests import COMPLETED
from meshtop.recordings.schema import events_of
from meshtop.recordings.session_fold import Folded, SessionFold

DEFAULT_BIND = "127.0.0.1"
METRICS_PATH = "/metrics"
COLLECTIVE_BUCKETS = (1e-5, 3e-5, 1e-4, 3e-4, 1e-3, 3e-3, 0.01, 0.03, 0.1, 0.3, 1.0, 3.0, 10.0, 30.0, 120.0)
STEP_BUCKETS = (0.01, 0.03, 0.1, 0.3, 1.0, 3.0, 10.0, 30.0, 100.0, 300.0)
REQUEST_BUCKETS = (0.001, 0.003, 0.01, 0.03, 0.1, 0.3, 1.0, 3.0, 10.0, 30.0, 120.0)
REQUEST_SERIES = (
    ("ttft_s", "meshtop_request_ttft_seconds", "Time to first token"),
    ("tpot_s", "meshtop_request_tpot_seconds", "Time per output token after the first"),
    ("e2e_s", "meshtop_request_e2e_seconds", "Request latency, arrival to last token"),
)
"""Each request latency served as a histogram: the fold's key, the series, its help."""


prometheus_client.disable_created_metrics()  # no `_created` series: a scrape holds the figures and nothing else


class MetricsError(MeshtopError):
    """The metrics endpoint cannot be served as asked."""


class RunMetrics:
    """The series of one run: counted from its events in arrival order, and read from its session's fold
    (:meth:`follow`) at each scrape. Thread-safe: fed by the session, read by the HTTP server's threads."""

    def __init__(self, run: RunDescription, *, per_rank: bool = False) -> None:
        self.run = run
        """The run described: the series' labels are bounded by its shape."""
        self.per_rank = per_rank
        """The collectives' series per rank (and node), not per node alone."""
        self.session: SessionFold | None = None
        """The fold the gauges read (until the session gives it: no figure yet)."""
        self.registry = CollectorRegistry(auto_describe=False)
        self._lock = threading.Lock()
        registry = self.registry
        where = ["op", "group", "node", "rank"] if per_rank else ["op", "group", "node"]
        self.collective_seconds = Histogram(
            "meshtop_collective_seconds",
            "Collective in-flight time, issue to completion",
            where,
            buckets=COLLECTIVE_BUCKETS,
            registry=registry,
        )
        self.collective_bytes = Counter(
            "meshtop_collective_bytes", "Bytes the collectives moved", where, registry=registry
        )
        self.dropped = Counter(
            "meshtop_events_dropped", "Telemetry events lost to a full buffer", ["where"], registry=registry
        )
        registry.register(_Figures(self))

    # -- input ------------------------------------------------------------------------------------

    def follow(self, session: SessionFold) -> None:
        """Read the figures of ``session``'s fold from now on (the session's, or a replay's screen's)."""
        self.session = session

    def take(self, arrivals: Arrivals, folded: Folded) -> None:
        """What a live session delivered: its collectives from the tables its fold decoded (``folded``: no
        second decoding), its reports of dropped events from ``arrivals``. These two are counted as they come:
        the fold keeps no series of each operation, and none of the drops."""
        collectives = [(kind, table) for kind, table in folded.tables if kind == "collective"]
        with self._lock:
            self._count_dropped(arrivals.events({"events_dropped"}))
            self._count_collectives(collectives)

    def count(self, tables: Iterable[tuple[str, pa.Table]]) -> None:
        """Tables of events, in the order a replay plays them: the collectives and dropped events counted."""
        with self._lock:
            for kind, table in tables:
                if kind == "collective":
                    self._count_collectives([(kind, table)])
                elif kind == "events_dropped":
                    self._count_dropped(events_of(kind, table))

    def _count_collectives(self, tables: Iterable[tuple[str, pa.Table]]) -> None:
        """Each collective the fold keeps (a rank of the job, an end after its start) inside a step (set-up
        and tear-down are outside every step, as the metrics core counts them)."""
        for _, table in tables:
            nodes: dict[int, int] = {}
            if self.session is not None:
                with self.session.reading() as fold:  # a rank's start, folded first, says its node
                    table, nodes = fold.of_the_job("collective", table), dict(fold.nodes)
            table = table.filter(pc.is_valid(table.column("step")))
            columns = table.select(["op", "group", "rank", "start_ns", "end_ns", "bytes"]).to_pydict()
            for op, group, rank, start_ns, end_ns, size in zip(*columns.values(), strict=True):
                node = str(nodes[rank]) if rank in nodes else ""
                labels = (op, group, node, str(rank)) if self.per_rank else (op, group, node)
                self.collective_seconds.labels(*labels).observe((end_ns - start_ns) / 1e9)
                self.collective_bytes.labels(*labels).inc(size)

    def _count_dropped(self, events: Iterable[Event]) -> None:
        for event in events:
            if isinstance(event, EventsDropped):
                self.dropped.labels(event.where).inc(event.count)

    # -- read at each scrape ----------------------------------------------------------------------

    def gauges(self) -> Iterator[Any]:
        """The series read from the fold (every family, empty before the session gives its fold)."""
        figures, steps, buckets, total_s = None, 0, [0] * len(STEP_BUCKETS), 0.0
        ranks: dict[int, tuple[str, str]] = {}
        """Each rank that started: its host and node."""
        exits: dict[int, int | None] = {}
        gpus: list[tuple[tuple[str, str, str], int, dict[str, Any]]] = []
        """Each GPU's labels, samples and last readings."""
        rank_steps: dict[int, float] = {}
        ended: dict[str, int] = {}
        latencies = {key: ([0] * len(REQUEST_BUCKETS), 0, 0.0) for key, _, _ in REQUEST_SERIES}
        if self.session is not None:
            with self.session.reading() as fold:
                figures = fold.figures()
                rank_steps = fold.recent_by_rank.medians("step")
                ranks = {rank: (fold.hosts.get(node, ""), str(node)) for rank, node in fold.nodes.items()}
                exits = dict(fold.exits)
                for row in fold.gpus.rows():
                    last = fold.gpus.last[row.node, row.gpu]
                    gpus.append(((str(row.gpu), last["uuid"] or "", fold.hosts.get(row.node, "")), row.samples, last))
                steps, buckets, total_s = (
                    fold.steps.count,
                    fold.steps.durations_s.counts_at_most(STEP_BUCKETS),
                    fold.steps.durations_s.total(),
                )
                if (requests := fold.requests) is not None:
                    ended = {COMPLETED: requests.completed, **requests.failures}
                    for key in latencies:
                        values = requests.latencies[key]
                        latencies[key] = (values.counts_at_most(REQUEST_BUCKETS), values.count, values.total())
        by_status = CounterMetricFamily("meshtop_requests", "Requests answered or failed", labels=["status"])
        for status, count in ended.items():
            if count:
                by_status.add_metric([status], count)
        yield by_status
        for key, name, documentation in REQUEST_SERIES:
            counts, count, total = latencies[key]
            yield HistogramMetricFamily(
                name,
                documentation,
                buckets=[*zip(map(floatToGoString, REQUEST_BUCKETS), counts, strict=True), ("+Inf", count)],
                sum_value=total,
            )
        yield CounterMetricFamily("meshtop_steps", "Job steps completed (inference: rank 0's iterations)", value=steps)
        yield HistogramMetricFamily(
            "meshtop_step_seconds",
            "Job step time: the slowest rank's step",
            buckets=[*zip(map(floatToGoString, STEP_BUCKETS), buckets, strict=True), ("+Inf", steps)],
            sum_value=total_s,
        )
        yield from self._figures(figures, ranks)
        yield from self._gpu_gauges(gpus)
        state = GaugeMetricFamily(
            "meshtop_rank_up", "1 while the rank runs, 0 once it exited", labels=["rank", "Hostname", "node"]
        )
        rank_step = GaugeMetricFamily(
            "meshtop_rank_step_seconds",
            f"A rank's step time: its median over its last {WINDOW} closed steps",
            labels=["rank", "Hostname", "node"],
        )
        code = GaugeMetricFamily(
            "meshtop_rank_exit_code",
            "How an exited rank ended (negative: a signal)",
            labels=["rank", "Hostname", "node"],
        )
        for rank, (host, node) in sorted(ranks.items()):
            labels = [str(rank), host, node]
            state.add_metric(labels, 0 if rank in exits else 1)
            if rank in rank_steps:
                rank_step.add_metric(labels, rank_steps[rank])
            if (exit_code := exits.get(rank)) is not None:
                code.add_metric(labels, exit_code)
        yield state
        yield code
        yield rank_step

    def _figures(self, figures: RunFigures | None, ranks: dict[int, tuple[str, str]]) -> Iterator[GaugeMetricFamily]:
        rate = GaugeMetricFamily("meshtop_tokens_per_second", "Tokens per second, p50 of the steps")
        mfu = GaugeMetricFamily("meshtop_mfu_ratio", "Model FLOPs utilisation (GPU runs with a known peak)")
        busbw = GaugeMetricFamily(
            "meshtop_collective_busbw_bytes_per_second",
            "Bus bandwidth, p50 of the operations that ran alone",
            labels=["op", "group"],
        )
        share = GaugeMetricFamily(
            "meshtop_collective_exposed_ratio",
            "Share of the step the ranks waited in this op (an upper bound where no wait was seen)",
            labels=["op", "group"],
        )
        bubble = GaugeMetricFamily(
            "meshtop_stage_bubble_ratio", "Pipeline stage idle share of the step", labels=["stage"]
        )
        memory = GaugeMetricFamily(
            "meshtop_memory_bytes",
            "Memory per rank: its peak over the run, and each category at the last step",
            labels=["rank", "Hostname", "node", "category"],
        )
        if figures is not None:
            if figures.steps.tokens_per_s is not None:
                rate.add_metric([], figures.steps.tokens_per_s)
            if figures.mfu.value is not None:
                mfu.add_metric([], figures.mfu.value)
            for row in figures.collectives:
                if row.busbw_p50_gbps is not None:
                    busbw.add_metric([row.op, row.group], row.busbw_p50_gbps * 1e9)
                if row.exposed_share is not None:
                    share.add_metric([row.op, row.group], row.exposed_share)
            for stage in figures.stages:
                bubble.add_metric([str(stage.stage)], stage.bubble_fraction)
            for memory_row in figures.memory:
                rank = memory_row.rank
                where = list(ranks.get(rank, ("", "")))
                for category in ("peak", "weights", "grads", "optimizer", "activations", "kv_cache"):
                    value = getattr(memory_row, f"{category}_bytes")
                    if value is not None:
                        memory.add_metric([str(rank), *where, category], value)
        yield from (rate, mfu, busbw, share, bubble, memory)

    def _gpu_gauges(
        self, gpus: list[tuple[tuple[str, str, str], int, dict[str, Any]]]
    ) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        """Each GPU's samples taken and its last readings, labelled as the DCGM exporter labels its own."""
        samples = CounterMetricFamily("meshtop_gpu_samples", "NVML readings taken", labels=["gpu", "UUID", "Hostname"])
        for labels, count, _ in gpus:
            samples.add_metric(list(labels), count)
        yield samples
        series = (
            ("meshtop_gpu_utilization_ratio", "GPU busy share (NVML)", "utilization_pct", 0.01),
            ("meshtop_gpu_memory_used_bytes", "GPU memory in use (NVML)", "memory_used_bytes", 1.0),
            ("meshtop_gpu_power_watts", "GPU power draw (NVML)", "power_w", 1.0),
            ("meshtop_gpu_temperature_celsius", "GPU temperature (NVML)", "temperature_c", 1.0),
            ("meshtop_gpu_sm_clock_hertz", "GPU SM clock (NVML)", "sm_clock_mhz", 1e6),
            *(
                (f"meshtop_gpu_{name}_bytes_per_second", f"GPU {LINK_LABELS[name]} rate (NVML)", column, 1.0)
                for name, column in LINKS.items()
            ),
        )
        for name, documentation, field, scale in series:
            family = GaugeMetricFamily(name, documentation, labels=["gpu", "UUID", "Hostname"])
            for labels, _, last in gpus:
                if last[field] is not None:
                    family.add_metric(list(labels), last[field] * scale)
            yield family

    def exposition(self) -> bytes:
        """The series in Prometheus's text format."""
        return generate_latest(self.registry)


class _Figures(Collector):
    def __init__(self, metrics: RunMetrics) -> None:
        self.metrics = metrics

    def collect(self) -> Iterator[Any]:
        return self.metrics.gauges()


class _Current(Collector):
    """The series of whichever :class:`RunMetrics` ``metrics`` gives at the scrape."""

    def __init__(self, metrics: Callable[[], RunMetrics]) -> None:
        self.metrics = metrics

    def collect(self) -> Iterator[Any]:
        return iter(list(self.metrics().registry.collect()))


class _Quiet(WSGIRequestHandler):
    """No line on stderr per request (it would draw over a dashboard)."""

    def log_message(self, format: str, *args: Any) -> None:
        return


def metrics_app(metrics: Callable[[], RunMetrics]) -> Callable[..., Iterable[bytes]]:
    """prometheus_client's WSGI app over the series ``metrics`` gives at each scrape, at :data:`METRICS_PATH`
    only (anything else: 404); a scrape that fails is a 500 naming the error, never a traceback on the
    dashboard's terminal."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Current(metrics))
    app = make_wsgi_app(registry)

    def only_metrics(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        if environ.get("PATH_INFO") != METRICS_PATH:
            start_response("404 Not Found", [("Content-Type", "text/plain; charset=utf-8")])
            return [f"only {METRICS_PATH} is served here\n".encode()]
        try:
            return app(environ, start_response)
        except Exception as error:  # a scrape never stops the session: it gets a 500
            start_response("500 Internal Server Error", [("Content-Type", "text/plain; charset=utf-8")])
            return [f"{type(error).__name__}\n".encode()]

    return only_metrics


class MetricsServer:
    """``GET /metrics`` over HTTP on a thread of its own, served by prometheus_client (content negotiation,
    OpenMetrics, gzip); ``metrics`` gives the series to serve at each scrape (a replay starts them anew when
    it seeks back)."""

    def __init__(self, metrics: Callable[[], RunMetrics], *, port: int, bind: str = DEFAULT_BIND) -> None:
        try:
            family = socket.getaddrinfo(bind, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0][0]

            class Server(ThreadingWSGIServer):
                address_family = family

            self._server = make_server(bind, port, metrics_app(metrics), Server, handler_class=_Quiet)
        except (OSError, OverflowError, ValueError) as error:  # ValueError: a name IDNA refuses ("a..b")
            why = getattr(error, "strerror", None) or str(error)
            raise MetricsError(f"cannot serve metrics on {bind}:{port}: {why}") from None
        self._thread = threading.Thread(  # shutdown() waits up to one poll interval (0.5 s by default)
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, name="meshtop-metrics", daemon=True
        )

    @property
    def address(self) -> tuple[str, int]:
        host, port = self._server.server_address[:2]
        return str(host), int(port)

    def start(self) -> MetricsServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
