"""An endpoint load's counts as the dashboard shows them, worked by hand (issue 47): the SLO share is of the
completed requests (of the load's it read as the load's progress), and the requests a stopped load never
sent are counted as such, not as failed."""

from __future__ import annotations

from meshtop.probes.events import RequestDone
from meshtop.recordings.manifest import Load
from meshtop.recordings.metrics.requests import RequestFold
from meshtop.tui.requests_lines import request_counts
from meshtop.tui.view_records import RequestsView
from tests.kit.inference import failed, served

LOAD = Load(
    requests=10,
    concurrency=2,
    request_rate_per_s=None,
    prompt_len=(8, 8),
    output_len=(2, 2),
    max_batch=0,
    seed=0,
    slo_ttft_ms=50.0,
)
"""10 requests, an SLO of TTFT <= 50 ms."""


def answered(request: int, ttft_ms: float) -> RequestDone:
    """Sent at 100 ms x ``request``, its 2 tokens ``ttft_ms`` and 10 ms more after."""
    sent_ms = 100.0 * request
    return served(request, 0, sent_ms, [sent_ms + ttft_ms, sent_ms + ttft_ms + 10])


def fold_of(*events: RequestDone, sent_by_client: bool = True) -> RequestFold:
    fold = RequestFold(LOAD, replicas=1, sent_by_client=sent_by_client)
    for event in events:
        fold.add(event)
    return fold


def test_the_dashboards_slo_share_is_of_the_completed_requests() -> None:
    """4 of the 10 answered so far, TTFT 20, 30, 40 and 60 ms: 3 met TTFT <= 50 ms, 75 % of the completed
    (of the 10 planned: 30 %, a share that rises with the progress); a failed fifth leaves it at 75 %. Over
    0 to 370 ms (the last answer's end): 4 / 0.37 = 10.81 req/s, 8 tokens: 22 tok/s, 3 good: 8.11 req/s."""
    fold = fold_of(
        answered(0, 20), answered(1, 30), answered(2, 40), answered(3, 60), failed(4, 0, 400, 405, "HTTP 500: boom")
    )
    figures = fold.figures()
    assert figures.slo_met_of_completed == 0.75
    assert figures.slo_met == 0.3  # the load's share (summary's): of its 10 requests, 3 met it
    line = request_counts(RequestsView(figures=figures, total=10, history={}))
    assert line == (
        "4/10 completed · 1 failed · 10.81 req/s · 22 tok/s out · goodput 8.11 req/s · SLO met 75% of completed"
    )


def test_a_stopped_endpoint_load_says_its_unsent_requests_apart_from_the_failed() -> None:
    """Stopped after 4 of its 10 requests were sent: 3 answered, 1 in flight (reported interrupted); the other
    6 never went out. The load is then the 4 sent, 1 of them failed, 6 not sent."""
    sent = (
        answered(0, 20),
        answered(1, 30),
        answered(2, 40),
        failed(3, 0, 300, 305, "interrupted: the load was stopped"),
    )
    fold = fold_of(*sent)
    assert (fold.figures().failed, fold.figures().not_sent) == (1, 0)  # while it runs, nothing is unsent yet
    fold.ended_status = "interrupted"
    figures = fold.figures()
    assert (figures.count, figures.completed, figures.failed, figures.not_sent) == (4, 3, 1, 6)
    assert figures.failures == (("interrupted: the load was stopped", 1),)
    assert figures.to_json()["not_sent"] == 6
    line = request_counts(RequestsView(figures=figures, total=10, history={}))
    assert line.startswith("3/10 completed · 1 failed · 6 not sent · "), line
    # the built-in model's engine took the whole load: the 6 it never served failed with it
    built_in = fold_of(*sent, sent_by_client=False)
    built_in.ended_status = "interrupted"
    figures = built_in.figures()
    assert (figures.count, figures.completed, figures.failed, figures.not_sent) == (10, 3, 7, 0)
