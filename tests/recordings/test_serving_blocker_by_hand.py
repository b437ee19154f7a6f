"""What blocks a serving run (recordings/metrics/blocker.py's serving rule), worked out by hand: each kind from
hand-made request and server figures at and around its threshold, in the rule's order, and the blocker of the
shipped inference sample in summary and the dashboard's alerts (its figures worked out below)."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

import pytest

from meshtop.recordings.metrics.blocker import (
    ATTAINMENT,
    FULL_CACHE,
    QUEUE_FLOOR,
    QUEUE_GROWTH,
    SERVING_SUGGESTIONS,
    TPOT_HOLD,
    TPOT_LIMIT_S,
    TTFT_RISE,
    Blocker,
    blocker_of,
)
from meshtop.recordings.metrics.figures import RunFigures
from meshtop.recordings.metrics.mfu import Mfu
from meshtop.recordings.metrics.requests import ClientFigures, RequestFigures, Slo
from meshtop.recordings.metrics.server import ServerFigures
from meshtop.recordings.metrics.steps import StepFigures
from meshtop.recordings.samples import INFER_SAMPLE
from meshtop.tui.alerts import alerts_of
from meshtop.tui.cli import main
from tests.kit.screen import replayed

TRY = {
    "fit": "give the model and its KV cache more memory: tensor parallel over more GPUs, a smaller or quantised "
    "model, a shorter maximum length (max-model-len) or fewer requests at once (max-num-seqs); vLLM's "
    "gpu-memory-utilization leaves the cache more of each GPU",
    "client": "give the load generator room (a core of its own, nothing else busy on its machine) or ask a lower "
    "rate: this run measured the client, not the server",
    "queue": "more replicas (a second server sharing the load), or a lower rate: the server takes fewer requests "
    "a second than this load asks",
    "latency": "tensor parallel over the fastest links (NVLink) to split each answer's work, or a smaller or "
    "quantised model",
    "none": "nothing blocks at this load: a higher rate finds where the SLO stops holding",
}
"""What each serving kind suggests, in the words a user reads."""
FAST_TPOT = {"mean": 0.02, "p50": 0.02, "p90": 0.03, "p99": 0.04}
"""A decode of 20 ms a token at p50, 30 ms at p90: under every objective below."""
NO_SLO = Slo()
TTFT = {"mean": 0.1, "p50": 0.1, "p90": 0.2, "p99": 0.3}


def requests(
    *,
    completed: int = 30,
    failures: tuple[tuple[str, int], ...] = (),
    tpot: dict[str, float | None] | None = None,
    slo: Slo = NO_SLO,
    slo_met: float | None = None,
    client: ClientFigures | None = None,
    thirds: dict[str, tuple[float, float]] | None = None,
) -> RequestFigures:
    """A serving run's request figures: ``completed`` answered, the failures given, TTFT of :data:`TTFT`."""
    failed = sum(count for _, count in failures)
    latencies: dict[str, dict[str, float | None]] = {"ttft_s": dict(TTFT), "tpot_s": dict(tpot or FAST_TPOT)}
    return RequestFigures(
        count=completed + failed,
        completed=completed,
        failed=failed,
        failures=failures,
        latencies=latencies,
        window_s=10.0,
        request_throughput_per_s=completed / 10.0,
        output_tokens_per_s=None,
        slo=slo,
        goodput_per_s=None,
        slo_met=slo_met,
        per_replica=(),
        client=client,
        thirds=thirds if thirds is not None else {"ttft_s": (0.1, 0.1), "tpot_s": (0.02, 0.02)},
    )


def server(
    *,
    waiting: tuple[float, float] | None = None,
    waiting_mean: float = 0.0,
    cache_max: float = 0.5,
    preemptions: float | None = 0.0,
    scrapes: int = 30,
) -> ServerFigures:
    """The server's scraped figures: the waiting gauge's mean and its thirds (``None``: fewer than 3 scrapes)."""
    gauges: dict[str, dict[str, float | None]] = {
        "requests_waiting": {"last": 0.0, "mean": waiting_mean, "max": 9.0},
        "kv_cache_usage": {"last": 0.1, "mean": 0.3, "max": cache_max},
    }
    return ServerFigures(
        scrapes=scrapes,
        series=12,
        gauges=gauges,
        counters={"preemptions": preemptions} if preemptions is not None else {},
        thirds={"requests_waiting": waiting} if waiting is not None else {},
    )


def run(figures: RequestFigures, served_by: ServerFigures | None = None) -> RunFigures:
    return RunFigures(
        steps=StepFigures(count=0, time_s={}, tokens_per_s=None, first_loss=None, last_loss=None),
        collectives=(),
        stages=(),
        memory=(),
        most_loaded_rank=None,
        headroom_bytes=None,
        requests=figures,
        mfu=Mfu(value=None, why_not="cpu"),
        stragglers=(),
        server=served_by,
    )


def kind(figures: RunFigures, server_failure: tuple[str, ...] = ()) -> str | None:
    found = blocker_of(figures, {}, server_failure)
    return found.kind if found is not None else None


LIMITED = ClientFigures(
    send_lag_p50_s=0.004,
    send_lag_p99_s=0.0153,
    achieved_rate_per_s=7.61,
    asked_rate_per_s=8.0,
    limited="client-limited: the load generator sent requests 15.3 ms late at p99 (more than 10 ms): the server "
    "saw a lighter load than asked",
)


def test_each_serving_kind_suggests_what_to_try() -> None:
    assert SERVING_SUGGESTIONS == TRY


def test_fit_holds_first_by_each_of_its_signs() -> None:
    """Each sign of memory over a run that would otherwise be client-limited: the server's own failure (vLLM's
    words at its start, in its log's last lines), a rank out of memory, one preemption, the KV cache at 95 %,
    two requests failed out of memory."""
    limited = requests(client=LIMITED)
    vllm = "ValueError: No available memory for the cache blocks. Try increasing `gpu_memory_utilization`"
    failure = ("the server exited with code 1 before it answered", "INFO loading weights", vllm)
    assert blocker_of(run(limited), {}, failure) == Blocker(
        kind="fit", evidence=f"the server failed out of memory: {vllm}", suggestion=TRY["fit"]
    )
    newer = "ValueError: ... 4.0 GiB KV cache is needed, which is larger than the available KV cache memory (2.1 GiB)"
    assert kind(run(limited), (newer,)) == "fit"
    assert kind(run(limited), ("the server exited with code 1 before it answered", "ImportError: vllm")) == "client"
    cuda = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"
    rank = blocker_of(run(limited), {1: cuda, 0: None})
    assert rank == Blocker(kind="fit", evidence=f"rank 1 failed out of memory: {cuda}", suggestion=TRY["fit"])
    preempted = blocker_of(run(limited, server(preemptions=1.0)), {})
    assert preempted == Blocker(
        kind="fit",
        evidence="the server preempted 1 requests: its KV cache was full, and they were computed again",
        suggestion=TRY["fit"],
    )
    assert FULL_CACHE == 0.95
    full = blocker_of(run(limited, server(cache_max=0.95)), {})
    assert full is not None and (full.kind, full.evidence) == (
        "fit",
        "the server's KV cache reached 95 % (at least 95 %)",
    )
    assert kind(run(limited, server(cache_max=0.9499))) == "client"
    failed = requests(failures=(("HTTP 500: boom", 3), (f"HTTP 500: {cuda}", 2)))
    found = blocker_of(run(failed), {})
    assert found == Blocker(kind="fit", evidence=f"2 requests failed out of memory: HTTP 500: {cuda}",
                            suggestion=TRY["fit"])  # fmt: skip
    assert kind(run(requests(failures=(("HTTP 500: boom", 3),)))) == "none"


def test_nothing_is_judged_without_a_completed_request() -> None:
    assert blocker_of(run(requests(completed=0, failures=(("connection refused", 5),))), {}) is None


def test_the_client_blocks_when_it_limited_the_run() -> None:
    """The client's own verdict, with its achieved rate beside the asked one: 7.61 of 8 requests/s; over a
    queue that grows (the client is judged first: the server saw another load than asked)."""
    growing = server(waiting=(0.0, 5.0), waiting_mean=2.5)
    assert blocker_of(run(requests(client=LIMITED), growing), {}) == Blocker(
        kind="client", evidence=f"{LIMITED.limited} (sent 7.61 requests/s of 8 asked)", suggestion=TRY["client"]
    )
    on_time = replace(LIMITED, limited=None)
    assert kind(run(requests(client=on_time), growing)) == "queue"


def test_a_queue_grows_from_a_request_waiting_in_the_last_third_and_twice_the_first() -> None:
    """Waiting 0.5 on average over the first third of the scrapes, 1.0 over the last: at the floor (1) and at
    2 x the first: queue. 0.99 is under the floor; 0.51 to 1.0 is under 2 x (1.02). From none waiting at all
    to 1: queue."""
    assert (QUEUE_FLOOR, QUEUE_GROWTH) == (1.0, 2.0)
    assert blocker_of(run(requests(), server(waiting=(0.5, 1.0), waiting_mean=0.7)), {}) == Blocker(
        kind="queue",
        evidence="requests waiting grew from 0.50 on average over the first third of the scrapes while the load "
        "was sent to 1.00 over the last (at least 1 and 2 x the first)",
        suggestion=TRY["queue"],
    )
    assert kind(run(requests(), server(waiting=(0.49, 0.99), waiting_mean=0.7))) == "none"
    assert kind(run(requests(), server(waiting=(0.51, 1.0), waiting_mean=0.7))) == "none"
    assert kind(run(requests(), server(waiting=(0.0, 1.0), waiting_mean=0.5))) == "queue"


def test_without_the_gauge_ttft_rising_while_tpot_holds_is_a_queue() -> None:
    """TTFT p50 125 ms over the first third, 250 ms over the last: 2 x; TPOT p50 62.5 ms to 78.125 ms: 1.25 x,
    it holds: queue. TTFT to 249.9 ms is under 2 x; TPOT to 78.2 ms is beyond 1.25 x; no TPOT (one-token
    answers) holds; a TTFT of 0 in the first third is no measure. A server that publishes the gauge is judged
    by it alone (here: too few scrapes for thirds, and none waiting)."""
    assert (TTFT_RISE, TPOT_HOLD) == (2.0, 1.25)
    rising = {"ttft_s": (0.125, 0.25), "tpot_s": (0.0625, 0.078125)}
    assert blocker_of(run(requests(thirds=rising)), {}) == Blocker(
        kind="queue",
        evidence="TTFT p50 rose from 125.0 ms over the first third of the requests to 250.0 ms over the last (at "
        "least 2 x) while TPOT p50 held (62.5 ms to 78.1 ms, within 1.25 x)",
        suggestion=TRY["queue"],
    )
    assert kind(run(requests(thirds={**rising, "ttft_s": (0.125, 0.2499)}))) == "none"
    assert kind(run(requests(thirds={**rising, "tpot_s": (0.0625, 0.0782)}))) == "none"
    one_token = blocker_of(run(requests(thirds={"ttft_s": (0.125, 0.25)})), {})
    assert one_token is not None and one_token.kind == "queue" and one_token.evidence.endswith("while no TPOT")
    assert kind(run(requests(thirds={"ttft_s": (0.0, 0.0)}))) == "none"
    assert kind(run(requests(thirds=rising), server(scrapes=2))) == "none"


def test_latency_is_a_slow_decode_with_nothing_waiting() -> None:
    """SLO TPOT 50 ms: TPOT p90 50.1 ms is above it: latency, with 0.99 waiting on average (under 1); at 50 ms
    it is not. Without a TPOT objective, TPOT p50 100.1 ms is above 100 ms: latency; 100 ms is not. With a
    standing queue (1.0 waiting on average, not growing) the same slow decode is a queue."""
    slo = Slo(ttft_s=0.5, tpot_s=0.05)
    slow = {**FAST_TPOT, "p90": 0.0501}
    assert blocker_of(run(requests(tpot=slow, slo=slo, slo_met=0.96), server(waiting_mean=0.99)), {}) == Blocker(
        kind="latency",
        evidence="TPOT p90 50.1 ms above the SLO's 50.0 ms with nothing waiting (requests waiting 0.99 on average)",
        suggestion=TRY["latency"],
    )
    assert kind(run(requests(tpot={**FAST_TPOT, "p90": 0.05}, slo=slo, slo_met=0.96))) == "none"
    assert TPOT_LIMIT_S == 0.1
    assert blocker_of(run(requests(tpot={**FAST_TPOT, "p50": 0.1001})), {}) == Blocker(
        kind="latency",
        evidence="TPOT p50 100.1 ms above 100.0 ms (no TPOT objective set) with nothing waiting (TTFT p50 100.0 ms "
        "over the first third of the requests, 100.0 ms over the last)",
        suggestion=TRY["latency"],
    )
    assert kind(run(requests(tpot={**FAST_TPOT, "p50": 0.1}))) == "none"
    standing = blocker_of(run(requests(tpot=slow, slo=slo, slo_met=0.96), server(waiting_mean=1.0)), {})
    assert standing == Blocker(
        kind="queue",
        evidence="TPOT p90 50.1 ms above the SLO's 50.0 ms with a standing queue (requests waiting 1.00 on average)",
        suggestion=TRY["queue"],
    )


def test_a_missed_slo_is_latency_with_nothing_waiting_and_a_queue_with_a_standing_one() -> None:
    """SLO TTFT 500 ms met by 94.99 % of the requests (under 95 %), TPOT fast: latency without the gauge (the
    prefill), queue with 1.0 waiting on average; met by 95 %: none, its room stated."""
    slo = Slo(ttft_s=0.5)
    assert ATTAINMENT == 0.95
    assert blocker_of(run(requests(slo=slo, slo_met=0.9499)), {}) == Blocker(
        kind="latency",
        evidence="SLO met by 95 % of the requests (under 95 %; TTFT <= 500 ms): TTFT p90 200.0 ms, TPOT p90 30.0 ms "
        "with nothing waiting (TTFT p50 100.0 ms over the first third of the requests, 100.0 ms over the last)",
        suggestion=TRY["latency"],
    )
    assert kind(run(requests(slo=slo, slo_met=0.9499), server(waiting_mean=1.0))) == "queue"
    assert blocker_of(run(requests(slo=slo, slo_met=0.95), server(waiting=(0.2, 0.3), waiting_mean=0.25)), {}) == (
        Blocker(
            kind="none",
            evidence="SLO met by 95 % of the requests (at least 95 %; TTFT <= 500 ms): TTFT p90 200.0 ms, TPOT p90 "
            "30.0 ms, requests waiting 0.25 on average",
            suggestion=TRY["none"],
        )
    )


INFER_BLOCKER = {
    "kind": "none",
    "evidence": "no SLO set and no limit found: TTFT p90 295.8 ms, TPOT p90 42.4 ms, TTFT p50 224.0 ms over the "
    "first third of the requests, 138.1 ms over the last",
    "suggestion": TRY["none"],
}
"""The shipped tp2 inference sample (the built-in model: no server metrics, no client, no SLO): 24 requests
in three waves of 8 at 0, 1.41 and 2.75 s (concurrency 8; of equal arrivals, the lower id first). TTFTs of
the first wave 92.5, 133.6, 161.6, 201.1, 247.0, 288.9, 321.3 and 366.4 ms: p50 (201.069 + 246.954) / 2 =
224.0 ms; of the last wave 33.4, 59.6, 90.6, 122.1, 154.1, 196.0, 231.4 and 269.4 ms: p50 (122.056 +
154.052) / 2 = 138.1 ms, lower, not twice: no queue. TPOT p50 38.8 ms, under 100 ms: no latency. TTFT p90 of
the 24: rank 0.9 x 23 = 20.7 between 288.939 and 298.701 ms: 288.939 + 0.7 x 9.762 = 295.8 ms; TPOT p90
42.4 ms."""


def test_summary_and_alerts_of_the_inference_sample_say_nothing_blocks_it(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["summary", str(INFER_SAMPLE), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["blocker"] == INFER_BLOCKER
    assert main(["summary", str(INFER_SAMPLE)]) == 0
    text = capsys.readouterr().out.splitlines()
    at = text.index("blocker: none")
    assert text[at + 1 : at + 3] == [f"  {INFER_BLOCKER['evidence']}", f"  try: {INFER_BLOCKER['suggestion']}"]
    texts = [(alert.severity, alert.text) for alert in alerts_of(replayed(INFER_SAMPLE))]
    assert ("info", f"blocker: none\n  {INFER_BLOCKER['evidence']}\n  try: {TRY['none']}") in texts


def test_a_recorded_server_that_failed_out_of_memory_is_fit(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The sample's manifest as an endpoint's whose server meshtop started failed: its log's last lines hold
    vLLM's words; compare says the blocker changed."""
    failed = shutil.copytree(INFER_SAMPLE, tmp_path / "failed")
    manifest = json.loads((failed / "manifest.json").read_text())
    line = "ValueError: No available memory for the cache blocks. Try increasing `gpu_memory_utilization`"
    started = {"command": ["vllm", "serve", "m"], "log_tail": ["INFO loading", line], "exit_code": 1}
    manifest["endpoint"] = {"url": "http://127.0.0.1:8000", "api": "completions", "model": "m", "server": started}
    manifest.update(status="failed", reason="the server exited with code 1 before it answered")
    (failed / "manifest.json").write_text(json.dumps(manifest))
    assert main(["summary", str(failed), "--json"]) == 0
    found = json.loads(capsys.readouterr().out)["blocker"]
    assert found == {"kind": "fit", "evidence": f"the server failed out of memory: {line}", "suggestion": TRY["fit"]}
    assert main(["summary", str(failed)]) == 0  # an endpoint's summary says it in text too
    text = capsys.readouterr().out.splitlines()
    at = text.index("blocker: fit")
    assert text[at + 1 : at + 3] == [f"  {found['evidence']}", f"  try: {TRY['fit']}"]
    assert main(["compare", str(INFER_SAMPLE), str(failed), "--json"]) == 0
    compared = json.loads(capsys.readouterr().out)["blocker"]
    assert (compared["a"], compared["b"], compared["changed"]) == (INFER_BLOCKER, found, True)


def test_what_a_run_lacks_is_said_and_judged_as_absent() -> None:
    """One request out of memory: ``1 request``. A client-limited run with no achieved rate (a single send):
    its verdict alone. A server without a preemptions counter (TGI publishes none) and a waiting gauge with no
    mean: no fit, nothing waiting. Fewer than 3 requests, no gauge: no thirds, said so. One-token answers only:
    no TPOT, said ``none``."""
    cuda = "CUDA out of memory"
    assert blocker_of(run(requests(failures=((cuda, 1),))), {}) == Blocker(
        kind="fit", evidence=f"1 request failed out of memory: {cuda}", suggestion=TRY["fit"]
    )
    single = replace(LIMITED, achieved_rate_per_s=None)
    found = blocker_of(run(requests(client=single)), {})
    assert found is not None and (found.kind, found.evidence) == ("client", LIMITED.limited)
    silent = server(preemptions=None)
    silent.gauges["requests_waiting"]["mean"] = None
    slow = {**FAST_TPOT, "p50": 0.2}
    found = blocker_of(run(requests(tpot=slow), silent), {})
    assert found is not None and found.kind == "latency"
    assert blocker_of(run(requests(completed=2, tpot=slow, thirds={})), {}) == Blocker(
        kind="latency",
        evidence="TPOT p50 200.0 ms above 100.0 ms (no TPOT objective set) with nothing waiting (no waiting gauge, "
        "and too few requests for thirds)",
        suggestion=TRY["latency"],
    )
    no_tpot = dict.fromkeys(FAST_TPOT)
    found = blocker_of(run(requests(tpot=no_tpot, thirds={})), {})
    assert found is not None and found.evidence == (
        "no SLO set and no limit found: TTFT p90 200.0 ms, TPOT p90 none, no waiting gauge, and too few requests "
        "for thirds"
    )
