"""An inference load's request figures against numbers worked out by hand: each latency from its token times
(or, without them, its first token and end), a latency equal to its SLO meeting it, the counts (warmups,
second reports, failures, requests never served), the window and the rates, the client's send lag, achieved
rate and CPU window, and the JSON ``summary --json`` writes.

Times are milliseconds after :data:`~tests.kit.inference.BASE_NS` unless a test says otherwise; a whole number
of milliseconds divided by 1e3 (or of nanoseconds by 1e9) is the nearest float to that many seconds, so a
figure that is one such quotient is compared exactly."""

from __future__ import annotations

import dataclasses

import pytest

from meshtop.probes.events import RequestDone
from meshtop.recordings.manifest import Load
from meshtop.recordings.metrics.requests import RequestFold, client_figures, request_latency
from meshtop.recordings.metrics.stats import Distribution
from tests.kit.inference import BASE_NS, MS, failed, served


def load(requests: int, **changes: object) -> Load:
    plain = Load(
        requests=requests,
        concurrency=None,
        request_rate_per_s=None,
        prompt_len=(8, 8),
        output_len=(1, 4),
        max_batch=0,
        seed=0,
    )
    return dataclasses.replace(plain, **changes)


def on_schedule(event: RequestDone, *, planned_ms: int, **changes: object) -> RequestDone:
    """``event`` as an endpoint's load generator reports it: meant to go out at ``planned_ms``."""
    return dataclasses.replace(event, scheduled_ns=BASE_NS + planned_ms * MS, **changes)


def sent(request: int, *, planned_ms: int, lag_ms: int) -> RequestDone:
    """Meant for ``planned_ms``, written ``lag_ms`` later (earlier where negative); 3 tokens 10 ms apart after
    20 ms."""
    at = planned_ms + lag_ms
    return on_schedule(served(request, 0, at, [at + 20, at + 30, at + 40]), planned_ms=planned_ms)


def fold_of(*events: RequestDone, of: Load | None = None, replicas: int = 1) -> RequestFold:
    fold = RequestFold(load(len(events)) if of is None else of, replicas=replicas)
    for event in events:
        fold.add(event)
    return fold


# -- one request's latencies ------------------------------------------------------------------------------


def test_without_token_times_a_requests_latencies_come_from_its_first_token_and_its_end() -> None:
    """Arrival 0, first token 20 ms, end 50 ms, 4 tokens and no token times: TTFT 20 ms, TPOT (50 - 20) / 3 =
    10 ms, e2e 50 ms, no gaps. Without a first token either: no TTFT, no TPOT."""
    latency = request_latency(arrival_ns=0, first_token_ns=20 * MS, end_ns=50 * MS, output_tokens=4, token_ns=())
    assert (latency.ttft_s, latency.tpot_s, latency.e2e_s, latency.gaps_s) == (0.02, pytest.approx(0.01), 0.05, ())
    none = request_latency(arrival_ns=0, first_token_ns=None, end_ns=30 * MS, output_tokens=0, token_ns=())
    assert (none.ttft_s, none.tpot_s, none.e2e_s, none.gaps_s) == (None, None, 0.03, ())
    # the fold takes the first token from the report where it has no token times
    report = dataclasses.replace(served(0, 0, 0, [20, 30, 40, 50]), token_ns=())
    figures = fold_of(report).figures()
    assert figures.latencies["ttft_s"]["p50"] == 0.02
    assert figures.latencies["tpot_s"]["p50"] == pytest.approx(0.01)
    assert figures.latencies["itl_s"]["p50"] is None


def test_a_latency_equal_to_its_slo_meets_it() -> None:
    """SLOs TTFT 50 ms, TPOT 20 ms. Request 0: first token at 50 ms, second at 70: TTFT 50, TPOT 20, both at
    their SLO: good. Request 1: TPOT 21 ms; request 2: TTFT 51 ms: not good. SLO met 1 / 3."""
    fold = fold_of(
        served(0, 0, 0, [50, 70]),
        served(1, 0, 0, [50, 71]),
        served(2, 0, 0, [51, 71]),
        of=load(3, slo_ttft_ms=50, slo_tpot_ms=20),
    )
    figures = fold.figures()
    assert (fold.good, figures.slo_met, figures.slo_met_of_completed) == (1, pytest.approx(1 / 3), pytest.approx(1 / 3))


# -- counts ------------------------------------------------------------------------------------------------


def test_warmups_second_reports_and_failures_are_each_counted() -> None:
    """Two warmups; request 0 reported three times (its first counts: 2 second reports); two timeouts and a
    failure without a reason."""
    warm = dataclasses.replace(served(9, 0, 0, [10]), warmup=True)
    fold = fold_of(
        warm,
        warm,
        served(0, 0, 0, [10]),
        served(0, 0, 5, [10]),
        served(0, 0, 5, [10]),
        failed(1, 0, 0, 30, "timeout"),
        failed(2, 0, 0, 30, "timeout"),
        failed(3, 0, 0, 30, None),  # type: ignore[arg-type]
        of=load(4),
    )
    assert fold.duplicates == 2
    figures = fold.figures()
    assert (figures.count, figures.completed, figures.failed, figures.warmup) == (4, 1, 3, 2)
    assert figures.failures == (("timeout", 2), ("failed (no reason given)", 1))


def test_a_fresh_fold_has_no_second_reports() -> None:
    assert RequestFold(load(1), replicas=1).duplicates == 0


def test_the_loads_requests_without_a_report_fail_as_not_served_once_the_job_ended() -> None:
    """5 requests, 2 reported: by default (the built-in load) the 3 others failed, not served. A report that
    failed for the same reason adds to them; with every request reported, nothing was left unserved."""
    fold = fold_of(served(0, 0, 0, [10]), served(1, 0, 0, [10]), of=load(5))
    fold.ended_status = "failed"
    figures = fold.figures()
    assert (figures.count, figures.failed, figures.not_sent) == (5, 3, 0)
    assert figures.failures == (("not served: the job ended failed first", 3),)
    same = fold_of(failed(0, 0, 0, 10, "not served: the job ended failed first"), of=load(3))
    same.ended_status = "failed"
    assert same.figures().failures == (("not served: the job ended failed first", 3),)  # 1 reported + 2 not
    every = fold_of(served(0, 0, 0, [10]), failed(1, 0, 0, 10, "timeout"), of=load(2))
    every.ended_status = "completed"
    assert every.figures().failures == (("timeout", 1),) and every.figures().failed == 1


# -- the window, the rates and the JSON --------------------------------------------------------------------


def test_a_small_loads_figures_and_their_json() -> None:
    """3 requests sent on time (lag 0) at 0, 10 and 20 ms, TTFT SLO 50 ms, 2 replicas declared, replica 0 served
    them all; a warmup besides.
    request 0: tokens at 20, 30, 40 (usage): TTFT 20, TPOT (40 - 20) / 2 = 10, gaps 10 and 10, e2e 40: good
    request 1: one token at 70 (chunks): TTFT 60 (over 50: not good), no TPOT, no gap, e2e 60
    request 2: failed at 30 ms (timeout)
    Window 0 to 70 ms = 0.07 s: 2 / 0.07 requests/s, 4 / 0.07 tokens/s, goodput 1 / 0.07; SLO met 1 / 3, of the
    completed 1 / 2. TTFT over [20, 60] ms: mean and p50 40, p90 20 + 0.9 x 40 = 56, p99 59.6; e2e over [40, 60]:
    50, 50, 58, 59.8. Replica 1 served none: 0 requests, 0 tokens/s, no TTFT. Client: sends at 0, 10, 20: (3 - 1)
    / 0.02 = 100 requests/s, asked 100."""
    events = [
        on_schedule(served(0, 0, 0, [20, 30, 40]), planned_ms=0, tokens_from="usage"),
        on_schedule(served(1, 0, 10, [70]), planned_ms=10, tokens_from="chunks"),
        on_schedule(failed(2, 0, 20, 30, "timeout"), planned_ms=20),
        dataclasses.replace(served(7, 0, -100, [-90]), warmup=True),
    ]
    figures = fold_of(*events, of=load(3, slo_ttft_ms=50, request_rate_per_s=100.0), replicas=2).figures()
    assert figures.window_s == 0.07
    assert figures.to_json() == {
        "count": 3,
        "completed": 2,
        "failed": 1,
        "failures": [{"reason": "timeout", "count": 1}],
        "ttft_s": {
            "mean": pytest.approx(0.04),
            "p50": pytest.approx(0.04),
            "p90": pytest.approx(0.056),
            "p99": pytest.approx(0.0596),
        },
        "tpot_s": {"mean": 0.01, "p50": 0.01, "p90": 0.01, "p99": 0.01},
        "itl_s": {"mean": 0.01, "p50": 0.01, "p90": 0.01, "p99": 0.01},
        "e2e_s": {"mean": 0.05, "p50": 0.05, "p90": pytest.approx(0.058), "p99": pytest.approx(0.0598)},
        "window_s": 0.07,
        "request_throughput_per_s": pytest.approx(2 / 0.07),
        "output_tokens_per_s": pytest.approx(4 / 0.07),
        "slo": {"ttft_s": 0.05, "tpot_s": None},
        "goodput_per_s": pytest.approx(1 / 0.07),
        "slo_met": pytest.approx(1 / 3),
        "slo_met_of_completed": 0.5,
        "not_sent": 0,
        "per_replica": [
            {
                "replica": 0,
                "completed": 2,
                "output_tokens_per_s": pytest.approx(4 / 0.07),
                "ttft_s": {"p50": pytest.approx(0.04)},
            },
            {"replica": 1, "completed": 0, "output_tokens_per_s": 0.0, "ttft_s": {"p50": None}},
        ],
        "warmup": 1,
        "tokens_from": {"chunks": 1, "usage": 1},
        "client": {
            "send_lag_s": {"p50": 0.0, "p99": 0.0},
            "achieved_rate_per_s": pytest.approx(100.0, rel=1e-12),
            "asked_rate_per_s": 100.0,
            "cpu_pct": {"mean": None, "max": None},
            "limited": None,
        },
    }


def test_without_a_completed_request_there_is_no_window_and_without_an_slo_no_slo_figures() -> None:
    only_failed = fold_of(failed(0, 0, 0, 30, "timeout")).figures()
    assert (only_failed.window_s, only_failed.request_throughput_per_s, only_failed.client) == (None, None, None)
    no_slo = fold_of(served(0, 0, 0, [10, 20])).figures()
    assert (no_slo.slo_met, no_slo.slo_met_of_completed, no_slo.goodput_per_s) == (None, None, None)


# -- the client's figures ----------------------------------------------------------------------------------


def test_the_send_lag_is_never_below_zero_and_a_p99_of_exactly_10_ms_is_not_client_limited() -> None:
    """Meant for 0, 100, 200, 300 ms; sent on time, 5 ms early (a lag of 0, not -5), 10 and 10 ms late: lags
    [0, 0, 10, 10] ms: p50 at 1.5, halfway: 5 ms; p99 at 2.97, between two 10s: 10 ms, not above the limit.
    Sends at 0, 95, 210, 310 ms: (4 - 1) / 0.31 s."""
    fold = fold_of(
        sent(0, planned_ms=0, lag_ms=0),
        sent(1, planned_ms=100, lag_ms=-5),
        sent(2, planned_ms=200, lag_ms=10),
        sent(3, planned_ms=300, lag_ms=10),
        of=load(4, request_rate_per_s=10.0),
    )
    client = fold.figures().client
    assert client is not None
    assert (client.send_lag_p50_s, client.send_lag_p99_s, client.limited) == (0.005, 0.010, None)
    assert client.achieved_rate_per_s == pytest.approx(3 / 0.31, rel=1e-12)
    assert client.asked_rate_per_s == 10.0


def test_the_achieved_rate_needs_two_sends_apart() -> None:
    """One send: no rate; two at the same moment: no rate; two 50 ms apart: 1 / 0.05 = 20 requests/s."""
    one = fold_of(sent(0, planned_ms=0, lag_ms=0)).figures().client
    assert one is not None and one.achieved_rate_per_s is None
    together = fold_of(sent(0, planned_ms=0, lag_ms=0), sent(1, planned_ms=0, lag_ms=0)).figures().client
    assert together is not None and together.achieved_rate_per_s is None
    apart = fold_of(sent(0, planned_ms=0, lag_ms=0), sent(1, planned_ms=50, lag_ms=0)).figures().client
    assert apart is not None and apart.achieved_rate_per_s == pytest.approx(20.0, rel=1e-12)


def test_client_figures_without_sends_or_a_load() -> None:
    figures = client_figures(Distribution(), None, None)
    assert (figures.send_lag_p50_s, figures.achieved_rate_per_s, figures.asked_rate_per_s) == (None, None, None)
    assert (figures.cpu_mean_pct, figures.cpu_max_pct, figures.limited) == (None, None, None)
    no_load = RequestFold(None, replicas=1)  # no load described: no rate asked
    no_load.add(sent(0, planned_ms=0, lag_ms=0))
    client = no_load.figures().client
    assert client is not None and client.asked_rate_per_s is None


def test_a_send_lag_of_100_ms_reads_100_ms() -> None:
    fold = fold_of(*(sent(i, planned_ms=100 * i, lag_ms=100) for i in range(3)))
    client = fold.figures().client
    assert client is not None and client.limited == (
        "client-limited: the load generator sent requests 100.0 ms late at p99 (more than 10 ms): "
        "the server saw a lighter load than asked"
    )


def test_the_clients_cpu_counts_its_samples_from_the_first_send_to_the_last_end_both_included() -> None:
    """Sent at 0 and 100 ms, ended at 40 and 140 ms: the window is [0, 140] ms. Samples 1 ns before it and 1 ns
    after it count for nothing; at 0 ms 70 %, at 120 ms (after the last send) 100 %, at 140 ms 100 %: mean 270
    / 3 = 90 %, at least 90 %: CPU-bound."""
    fold = fold_of(sent(0, planned_ms=0, lag_ms=0), sent(1, planned_ms=100, lag_ms=0))
    for at_ns, pct in ((-1, 0.0), (0, 70.0), (120 * MS, 100.0), (140 * MS, 100.0), (140 * MS + 1, 0.0)):
        fold.add_client_cpu(BASE_NS + at_ns, pct)
    client = fold.figures().client
    assert client is not None
    assert (client.cpu_mean_pct, client.cpu_max_pct) == (90.0, 100.0)
    assert client.limited == (
        "client-limited: the load generator was CPU-bound (90 % of a core on average, at least 90 %): "
        "its latencies include its own queueing"
    )


def test_with_no_request_completed_the_clients_cpu_window_ends_at_its_last_send() -> None:
    """Sent at 0 and 100 ms, both failed: the window is [0, 100] ms; the sample at 50 ms (95 %) is in it, the one
    at 150 ms (10 %) is not."""
    fold = fold_of(
        on_schedule(failed(0, 0, 0, 30, "timeout"), planned_ms=0),
        on_schedule(failed(1, 0, 100, 130, "timeout"), planned_ms=100),
    )
    fold.add_client_cpu(BASE_NS + 50 * MS, 95.0)
    fold.add_client_cpu(BASE_NS + 150 * MS, 10.0)
    client = fold.figures().client
    assert client is not None and (client.cpu_mean_pct, client.cpu_max_pct) == (95.0, 95.0)


def test_a_window_of_one_instant_holds_only_the_samples_at_that_instant() -> None:
    """On a clock counted from the load's start: one request sent at 0 ns that failed; the window is [0, 0]: the
    sample at 0 ns (50 %) is in it, the one at 1 ns (100 %) is not."""
    report = failed(0, 0, 0, 30, "timeout")
    fold = fold_of(dataclasses.replace(report, arrival_ns=0, end_ns=30 * MS, scheduled_ns=0))
    fold.add_client_cpu(0, 50.0)
    fold.add_client_cpu(1, 100.0)
    client = fold.figures().client
    assert client is not None and (client.cpu_mean_pct, client.cpu_max_pct) == (50.0, 50.0)
