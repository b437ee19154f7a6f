"""An endpoint load's own figures, against numbers worked out by hand: the warmup left out, the send lag, the
achieved rate, client-limited past 10 ms, and where the token counts came from."""

from __future__ import annotations

import dataclasses

import pytest

from meshtop.probes.events import RequestDone
from meshtop.recordings.manifest import Load
from meshtop.recordings.metrics.requests import RequestFold
from tests.kit.inference import BASE_NS, MS, served

LOAD = Load(
    requests=4,
    concurrency=None,
    request_rate_per_s=10.0,
    prompt_len=(8, 8),
    output_len=(3, 3),
    max_batch=0,
    seed=0,
    warmup=1,
)


def sent(
    request: int, *, planned_ms: float, lag_ms: float, warmup: bool = False, tokens_from: str = "usage"
) -> RequestDone:
    """A request meant for ``planned_ms`` and written ``lag_ms`` later, its 3 tokens 10 ms apart after 20 ms."""
    arrival = planned_ms + lag_ms
    event = served(request, 0, arrival, [arrival + 20, arrival + 30, arrival + 40])
    return dataclasses.replace(
        event, scheduled_ns=BASE_NS + int(planned_ms * MS), warmup=warmup, tokens_from=tokens_from, output_ids=()
    )


def fold_of(*events: RequestDone) -> RequestFold:
    fold = RequestFold(LOAD, replicas=1)
    for event in events:
        fold.add(event)
    return fold


def test_warmup_is_counted_and_left_out_and_the_lag_and_rate_are_the_clients() -> None:
    fold = fold_of(
        sent(0, planned_ms=-500, lag_ms=90, warmup=True),  # a warmup's lag and latency count nowhere
        sent(1, planned_ms=0, lag_ms=1),
        sent(2, planned_ms=100, lag_ms=2),
        sent(3, planned_ms=200, lag_ms=3),
        sent(4, planned_ms=300, lag_ms=4, tokens_from="chunks"),
    )
    figures = fold.figures()
    assert (figures.count, figures.completed, figures.warmup) == (4, 4, 1)
    assert figures.latencies["ttft_s"]["p50"] == pytest.approx(0.020, rel=0.01)
    assert figures.tokens_from == (("chunks", 1), ("usage", 3))
    client = figures.client
    assert client is not None
    assert client.send_lag_p50_s == pytest.approx(0.0025, rel=0.02)  # of 1, 2, 3, 4 ms
    assert client.send_lag_p99_s == pytest.approx(0.00397, rel=0.02)
    assert client.achieved_rate_per_s == pytest.approx(3 / 0.303)  # sends at 1, 102, 203, 304 ms
    assert client.asked_rate_per_s == 10.0
    assert client.limited is None
    # the window runs from the first send to the last end: 1 ms to 344 ms, 4 requests
    assert figures.request_throughput_per_s == pytest.approx(4 / 0.343)


def test_tpot_runs_to_the_last_token_and_e2e_to_the_streams_end() -> None:
    """Tokens at 20, 30 and 40 ms after the send; the usage chunk and [DONE] end the stream at 47 ms: TPOT
    (40 - 20) / 2 = 10 ms (the 7 ms after the last token are no decode), e2e 47 ms."""
    event = dataclasses.replace(sent(1, planned_ms=0, lag_ms=0), end_ns=BASE_NS + 47 * MS)
    figures = fold_of(event).figures()
    assert figures.latencies["tpot_s"]["p50"] == pytest.approx(0.010)
    assert figures.latencies["e2e_s"]["p50"] == pytest.approx(0.047)


def test_a_cpu_bound_load_generator_is_client_limited_by_its_samples_in_the_loads_window() -> None:
    """Sends at 1, 102, 203 and 304 ms, the last end at 344 ms: the window. The samples at -50 ms (its imports)
    and 400 ms (after the load) are outside it; 95 % and 92 % inside: mean 93.5 %, at least 90 %: CPU-bound.
    The same load at 40 % and 60 %: mean 50 %, max 60 %, not limited."""
    events = [sent(i + 1, planned_ms=100 * i, lag_ms=i + 1) for i in range(4)]
    busy = fold_of(*events)
    for at_ms, pct in ((-50, 100.0), (50, 95.0), (250, 92.0), (400, 100.0)):
        busy.add_client_cpu(BASE_NS + int(at_ms * MS), pct)
    client = busy.figures().client
    assert client is not None
    assert (client.cpu_mean_pct, client.cpu_max_pct) == (pytest.approx(93.5), 95.0)
    assert client.limited is not None and "CPU-bound (94 % of a core on average" in client.limited
    idle = fold_of(*events)
    for at_ms, pct in ((50, 40.0), (250, 60.0), (260, None)):  # a sample with no reading counts for nothing
        idle.add_client_cpu(BASE_NS + int(at_ms * MS), pct)
    client = idle.figures().client
    assert client is not None
    assert (client.cpu_mean_pct, client.cpu_max_pct, client.limited) == (pytest.approx(50.0), 60.0, None)


def test_a_send_lag_past_10_ms_at_p99_says_the_client_limited_the_result() -> None:
    """Every request 11 ms late: p99 11 ms, past 10 ms; 9 ms late: within it."""
    over = fold_of(*(sent(i + 1, planned_ms=100 * i, lag_ms=11) for i in range(4))).figures()
    assert over.client is not None and over.client.limited == (
        "client-limited: the load generator sent requests 11.0 ms late at p99 (more than 10 ms): "
        "the server saw a lighter load than asked"
    )
    under = fold_of(*(sent(i + 1, planned_ms=100 * i, lag_ms=9) for i in range(4))).figures()
    assert under.client is not None and under.client.send_lag_p99_s == pytest.approx(0.009)
    assert under.client.limited is None


def test_the_built_in_load_has_no_client_figures() -> None:
    fold = RequestFold(LOAD, replicas=1)
    fold.add(served(0, 0, 0.0, [10.0, 20.0]))
    assert fold.figures().client is None and fold.figures().tokens_from == ()
