"""``/metrics`` over real HTTP, served by prometheus_client: OpenMetrics when the scraper asks for it, the text
format 0.0.4 otherwise, gzip where accepted, 404 off the path; the series read the session's one fold."""

from __future__ import annotations

import gzip
import urllib.error
import urllib.request
from collections.abc import Iterator

import numpy as np
import pytest
from prometheus_client.openmetrics.parser import text_string_to_metric_families as openmetrics_families
from prometheus_client.parser import text_string_to_metric_families

from meshtop.probes.arrivals import Arrivals
from meshtop.recordings.metrics.stats import Distribution
from meshtop.recordings.prometheus import MetricsError, MetricsServer, RunMetrics
from meshtop.recordings.session_fold import SessionFold
from tests.kit.events import step
from tests.kit.recordings import description

STEP_TIMES_S = (0.02, 0.05, 0.5)


@pytest.fixture
def served() -> Iterator[tuple[str, SessionFold]]:
    """A one-rank run of three steps (20 ms, 50 ms, 500 ms) folded by its session and served on a free port."""
    session = SessionFold(description(dp=1))
    session.take(Arrivals([step(0, number, seconds) for number, seconds in enumerate(STEP_TIMES_S)]))
    metrics = RunMetrics(session.run)
    metrics.follow(session)
    server = MetricsServer(lambda: metrics, port=0).start()
    host, port = server.address
    try:
        yield f"http://{host}:{port}/metrics", session
    finally:
        server.stop()


def get(url: str, **headers: str) -> tuple[dict[str, str], bytes]:
    with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=10) as response:
        return dict(response.headers), response.read()


def samples_of(families: Iterator[object]) -> dict[str, list[tuple[dict[str, str], float]]]:
    samples: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in families:
        for sample in family.samples:  # type: ignore[attr-defined]
            samples.setdefault(sample.name, []).append((sample.labels, sample.value))
    return samples


def assert_the_steps(samples: dict[str, list[tuple[dict[str, str], float]]]) -> None:
    """3 steps; 1 at most 30 ms, 2 at most 100 ms, all 3 at most 1 s; 570 ms in all."""
    assert samples["meshtop_steps_total"] == [({}, 3.0)]
    buckets = {labels["le"]: value for labels, value in samples["meshtop_step_seconds_bucket"]}
    assert (buckets["0.01"], buckets["0.03"], buckets["0.1"], buckets["1.0"], buckets["+Inf"]) == (0, 1, 2, 3, 3)
    assert samples["meshtop_step_seconds_count"] == [({}, 3.0)]
    assert samples["meshtop_step_seconds_sum"][0][1] == pytest.approx(0.57)


def test_openmetrics_when_the_scraper_asks_for_it(served: tuple[str, SessionFold]) -> None:
    url, _ = served
    headers, body = get(url, Accept="application/openmetrics-text; version=1.0.0,text/plain;q=0.5")
    assert headers["Content-Type"].startswith("application/openmetrics-text; version=1.0.0")
    text = body.decode()
    assert text.endswith("# EOF\n")
    assert_the_steps(samples_of(openmetrics_families(text)))


def test_the_text_format_otherwise(served: tuple[str, SessionFold]) -> None:
    url, _ = served
    for headers in ({}, {"Accept": "text/plain"}):
        got, body = get(url, **headers)
        assert got["Content-Type"] == "text/plain; version=0.0.4; charset=utf-8"
        assert "# EOF" not in body.decode()
        assert_the_steps(samples_of(text_string_to_metric_families(body.decode())))


def test_gzip_where_it_is_accepted(served: tuple[str, SessionFold]) -> None:
    url, _ = served
    headers, body = get(url, **{"Accept-Encoding": "gzip"})
    assert headers["Content-Encoding"] == "gzip"
    assert_the_steps(samples_of(text_string_to_metric_families(gzip.decompress(body).decode())))
    headers, body = get(url)
    assert "Content-Encoding" not in headers and body.startswith(b"# HELP")


def test_only_metrics_is_served_and_a_scrape_reads_the_fold_as_it_is_now(served: tuple[str, SessionFold]) -> None:
    url, session = served
    for path in ("/", "/metricsx", "/favicon.ico"):
        with pytest.raises(urllib.error.HTTPError) as refused:
            get(url.replace("/metrics", path))
        assert refused.value.code == 404
    session.take(Arrivals([step(0, 3, 2.0)]))  # a fourth step, of 2 s
    samples = samples_of(text_string_to_metric_families(get(url)[1].decode()))
    buckets = {labels["le"]: value for labels, value in samples["meshtop_step_seconds_bucket"]}
    assert samples["meshtop_steps_total"] == [({}, 4.0)] and (buckets["1.0"], buckets["3.0"]) == (3, 4)


def test_a_port_taken_or_an_address_not_here_is_one_line() -> None:
    metrics = RunMetrics(description(dp=1))
    server = MetricsServer(lambda: metrics, port=0).start()
    try:
        with pytest.raises(MetricsError, match=r"cannot serve metrics on 127\.0\.0\.1:\d+: "):
            MetricsServer(lambda: metrics, port=server.address[1])
        with pytest.raises(MetricsError, match=r"cannot serve metrics on no\.such\.host\.invalid:0: "):
            MetricsServer(lambda: metrics, port=0, bind="no.such.host.invalid")
        with pytest.raises(MetricsError, match=r"cannot serve metrics on a\.\.b:0: .*idna"):  # not a ValueError
            MetricsServer(lambda: metrics, port=0, bind="a..b")
    finally:
        server.stop()


def test_before_the_session_gives_its_fold_every_series_is_there_at_zero() -> None:
    samples = samples_of(text_string_to_metric_families(RunMetrics(description(dp=1)).exposition().decode()))
    assert samples["meshtop_steps_total"] == [({}, 0.0)] and samples["meshtop_step_seconds_count"] == [({}, 0.0)]


def test_histogram_buckets_count_the_values_at_most_each_bound() -> None:
    exact = Distribution([0.02, 0.05, 0.5])
    assert exact.counts_at_most([0.01, 0.02, 0.03, 0.1, 1.0]) == [0, 1, 1, 2, 3]  # at most: 0.02 counts at 0.02
    many = Distribution()
    many.extend(np.ones(200_001))  # past the exact limit: kept in buckets
    many.add(3.0)
    many.add(0.0)
    # 1.0's bucket middle is 1 + 1/256, 3.0's is 3.0078: zeros count under every bound
    assert many.counts_at_most([0.5, 1.001, 1.01, 3.0, 4.0]) == [1, 1, 200_002, 200_002, 200_003]
