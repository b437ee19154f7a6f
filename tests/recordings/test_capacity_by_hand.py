"""A capacity sweep's figures (recordings/capacity.py), worked out by hand from hand-made recordings: the
departure rate, saturation, the client's limit, each configuration's capacity, per GPU, what limited it and how
many of it an offered load needs, and the summary of a capacity sweep (text and JSON)."""

from __future__ import annotations

import dataclasses
import json
import tempfile
from pathlib import Path

import pytest

from meshtop.probes.events import RequestDone
from meshtop.recordings.capacity import (
    CAPACITY_FILE,
    SATURATED_SHARE,
    RunFiguresOfSweep,
    capacity_report,
    completed_ends,
    config_folder,
    departure_rate,
    is_capacity_sweep,
    limit_of,
    read_capacity,
    run_figures,
    run_folder,
    saturation,
)
from meshtop.recordings.manifest import Load, RunDescription
from meshtop.recordings.reader import open_recording
from meshtop.recordings.summary import fold_recording
from meshtop.recordings.typed_json import RecordingError
from meshtop.runner.serving.endpoint import plan_endpoint
from meshtop.runner.session.session import endpoint_description
from meshtop.tui.cli import main
from tests.kit.recordings import write_recording
from tests.recordings.test_serving_blocker_by_hand import requests as request_figures
from tests.recordings.test_serving_blocker_by_hand import run as figures_of
from tests.recordings.test_serving_blocker_by_hand import server as server_figures

BASE_NS = 1_700_000_000 * 10**9
S = 10**9


def request(index: int, *, sent_s: float, first_s: float, scheduled_s: float | None = None) -> RequestDone:
    """A request sent at ``sent_s``, its first token at ``first_s`` and its second 20 ms later (its end)."""
    first = BASE_NS + int(first_s * S)
    return RequestDone(
        rank=0,
        replica=0,
        request=index,
        arrival_ns=BASE_NS + int(sent_s * S),
        first_token_ns=first,
        end_ns=first + S // 50,
        prompt_tokens=4,
        output_tokens=2,
        token_ns=(first, first + S // 50),
        output_ids=(1, 2),
        status="completed",
        error=None,
        scheduled_ns=BASE_NS + int((sent_s if scheduled_s is None else scheduled_s) * S),
    )


def endpoint_run(rate: float) -> RunDescription:
    load = Load(requests=10, concurrency=None, request_rate_per_s=rate, slo_ttft_ms=500.0)
    return endpoint_description(plan_endpoint("http://127.0.0.1:9", api="completions", model="m", load=load))


def at_rate_2() -> list[RequestDone]:
    """10 requests sent every 0.5 s, each first token 100 ms later: departures (10 - 1) / 4.5 s = 2.0/s of 2.0
    sent, every TTFT 100 ms within 500 ms: passed."""
    return [request(i, sent_s=0.5 * i, first_s=0.5 * i + 0.1) for i in range(10)]


def at_rate_3_client_limited() -> list[RequestDone]:
    """As at rate 2, each request sent 20 ms after the load meant it (send lag p99 20 ms > 10 ms)."""
    return [request(i, sent_s=i / 3 + 0.02, first_s=i / 3 + 0.1, scheduled_s=i / 3) for i in range(10)]


def at_rate_4_saturated() -> list[RequestDone]:
    """10 requests sent every 0.25 s (4.0/s sent), answered one after another, each ending 0.5 s after the last:
    ends 0.5 ... 5.0 s, departures 9 / 4.5 s = 2.0/s, under 0.9 x 4.0; TTFT 0.48 + 0.25 i s, within 500 ms only
    for request 0: attainment 10 %."""
    return [request(i, sent_s=0.25 * i, first_s=0.5 * (i + 1) - 0.02) for i in range(10)]


def sweep_file(out: Path, **changes: object) -> None:
    data = {
        "version": 1,
        "started_at": "2026-12-06T05:00:00+0000",
        "command_line": ["sweep", str(out), "--endpoint", "http://127.0.0.1:{port}"],
        "slo": {"ttft_s": 0.5, "tpot_s": None},
        "attainment": 0.95,
        "search": "rate",
        "users": {"users": 10, "rate_per_user": 0.5, "offered_per_s": 5.0},
        "configurations": [
            {"config": "batch=1", "folder": "batch-1", "gpus": 2, "status": "completed", "reason": None},
            {
                "config": "batch=2",
                "folder": "batch-2",
                "gpus": 1,
                "status": "failed",
                "reason": "the server exited with code 1 before it answered; its last lines: CUDA out of memory",
                "limited_by": "fit",
            },
        ],
        "runs": [
            {"config": "batch=1", "rate": 2.0, "status": "completed", "recording": "batch-1/rate-2", "reason": None},
            {"config": "batch=1", "rate": 3.0, "status": "completed", "recording": "batch-1/rate-3", "reason": None},
            {"config": "batch=1", "rate": 4.0, "status": "completed", "recording": "batch-1/rate-4", "reason": None},
            {
                "config": "batch=1",
                "rate": 8.0,
                "status": "not run",
                "recording": None,
                "reason": "not run: 4 saturated",
            },
        ],
        **changes,
    }
    (out / CAPACITY_FILE).write_text(json.dumps(data))


@pytest.fixture
def sweep(tmp_path: Path) -> Path:
    for rate, events in ((2, at_rate_2()), (3, at_rate_3_client_limited()), (4, at_rate_4_saturated())):
        write_recording(tmp_path / "batch-1" / f"rate-{rate}", events, run=endpoint_run(float(rate)))
    sweep_file(tmp_path)
    return tmp_path


def test_departure_rate_and_saturation_by_the_rule() -> None:
    assert departure_rate([0, 2 * S, 4 * S]) == pytest.approx(0.5)  # (3 - 1) / 4 s
    assert departure_rate([S]) is None and departure_rate([S, S]) is None
    assert SATURATED_SHARE == 0.9
    assert saturation(3.61, 4.0, None, open_loop=True) is None  # 90.25 % of the sent rate
    said = saturation(3.59, 4.0, None, open_loop=True)
    assert said == "saturated: the server answered 3.59 requests/s of the 4.00 sent (under 90 %)"
    assert saturation(1.0, 4.0, None, open_loop=False) is None  # closed loop: no sent rate to fall behind
    assert saturation(4.0, 4.0, "the queue grew", open_loop=True) == "saturated: the queue grew"
    missed = RunFiguresOfSweep(attainment=0.947, met=False, achieved_rate=2.0, saturated=None, client_limited=None)
    assert missed.why(0.95) == "SLO missed: met by 94.7 % of the requests (under 95 %)" and not missed.passed
    # the client first: a client-limited run says so whatever else holds
    both = RunFiguresOfSweep(attainment=1.0, met=True, achieved_rate=2.0, saturated="saturated: x", client_limited="c")
    assert both.why(0.95) == "c" and not both.passed


def test_each_run_is_judged_and_capacity_is_the_highest_pass(sweep: Path) -> None:
    report = capacity_report(sweep)
    runs = {run["rate"]: run for run in report["runs"]}
    assert [run["rate"] for run in report["runs"]] == [2.0, 3.0, 4.0, 8.0]
    two, three, four, eight = runs[2.0], runs[3.0], runs[4.0], runs[8.0]
    assert two["achieved_rate"] == pytest.approx(2.0) and two["attainment"] == 1.0
    assert (two["met"], two["saturated"], two["client_limited"], two["passed"]) == (True, False, False, True)
    assert two["ttft_p99_s"] == pytest.approx(0.1) and two["why"] is None
    assert (three["met"], three["client_limited"], three["passed"]) == (True, True, False)
    assert three["why"].startswith("client-limited: the load generator sent requests 20.0 ms late at p99")
    assert three["blocker"]["kind"] == "client"
    assert four["achieved_rate"] == pytest.approx(2.0) and four["attainment"] == pytest.approx(0.1)
    assert (four["met"], four["saturated"], four["passed"]) == (False, True, False)
    assert four["why"] == "saturated: the server answered 2.00 requests/s of the 4.00 sent (under 90 %)"
    # no waiting gauge: TTFT p50 of the first third (0.73 s) to the last (2.48 s) while TPOT holds at 20 ms
    assert four["blocker"]["kind"] == "queue" and "TTFT p50 rose from 730.0 ms" in four["blocker"]["evidence"]
    assert (eight["status"], eight["why"], eight["recording"]) == ("not run", "not run: 4 saturated", None)
    best, failed = report["capacity"]
    # capacity 2 (rate 3 client-limited is never capacity); per GPU 2 / 2 GPUs = 1; offered 10 x 0.5 = 5 req/s:
    # ceil(5 / 2) = 3 servers, 3 x 2 = 6 GPUs; limited by the first run above capacity that did not pass: client
    assert best == {
        "config": "batch=1",
        "requests_per_s": 2.0,
        "per_gpu": 1.0,
        "gpus": 2,
        "rate": 2.0,
        "ttft_p99_s": pytest.approx(0.1),
        "tpot_p99_s": pytest.approx(0.02),
        "limited_by": "client",
        "recording": "batch-1/rate-2",
        "needed": 3,
        "needed_gpus": 6,
        "reason": None,
        "status": "completed",
    }
    assert (failed["config"], failed["requests_per_s"], failed["limited_by"], failed["needed"]) == (
        "batch=2",
        0.0,
        "fit",
        None,
    )
    assert failed["reason"].endswith("CUDA out of memory") and failed["recording"] is None


def test_without_the_client_limited_run_the_queue_limits(sweep: Path) -> None:
    data = json.loads((sweep / CAPACITY_FILE).read_text())
    data["runs"] = [run for run in data["runs"] if run["rate"] != 3.0]
    (sweep / CAPACITY_FILE).write_text(json.dumps(data))
    (best, _) = capacity_report(sweep)["capacity"]
    assert (best["requests_per_s"], best["limited_by"]) == (2.0, "queue")


def test_configurations_rank_by_capacity_per_gpu(tmp_path: Path) -> None:
    """batch=1 takes 2/s on 2 GPUs (1 per GPU), batch=2 the same 2/s on 1 GPU (2 per GPU): batch=2 first."""
    for folder in ("batch-1", "batch-2"):
        write_recording(tmp_path / folder / "rate-2", at_rate_2(), run=endpoint_run(2.0))
    config = {"status": "completed", "reason": None}
    sweep_file(
        tmp_path,
        users=None,
        configurations=[
            {"config": "batch=1", "folder": "batch-1", "gpus": 2, **config},
            {"config": "batch=2", "folder": "batch-2", "gpus": 1, **config},
        ],
        runs=[
            {"config": name, "rate": 2.0, "status": "completed", "recording": f"{folder}/rate-2", "reason": None}
            for name, folder in (("batch=1", "batch-1"), ("batch=2", "batch-2"))
        ],
    )
    ranked = capacity_report(tmp_path)["capacity"]
    assert [(row["config"], row["per_gpu"], row["limited_by"]) for row in ranked] == [
        ("batch=2", 2.0, None),
        ("batch=1", 1.0, None),
    ]


def test_summary_prints_the_table_and_the_json_under_sweep(sweep: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert is_capacity_sweep(sweep) and not is_capacity_sweep(sweep / "batch-1")
    assert main(["summary", str(sweep)]) == 0
    text = capsys.readouterr().out.splitlines()
    assert text[0].startswith("capacity within the SLO (TTFT <= 500 ms, met by 95 % of the requests)")
    header = next(line for line in text if line.startswith("configuration"))
    assert header.split() == ["configuration", "capacity", "req/s", "per", "GPU", "TTFT", "p99", "TPOT", "p99",
                              "limited", "by", "needed", "GPUs"]  # fmt: skip
    assert next(line for line in text if line.startswith("batch=1")).split() == [
        "batch=1", "2", "1", "100", "ms", "20", "ms", "client", "3", "6",
    ]  # fmt: skip
    assert any(line.startswith("batch=2: the server exited with code 1") for line in text)
    assert any(line.startswith("batch=1 at 3: never counted as capacity: client-limited: ") for line in text)
    assert main(["summary", str(sweep), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)["sweep"]
    assert report["kind"] == "capacity" and report["search"] == "rate"
    assert set(report["capacity"][0]) >= {
        "config",
        "requests_per_s",
        "per_gpu",
        "ttft_p99_s",
        "tpot_p99_s",
        "limited_by",
    }
    keys = {"config", "rate", "achieved_rate", "attainment", "met", "saturated", "client_limited", "recording"}
    assert all(set(run) >= keys for run in report["runs"])


def test_a_capacity_file_of_another_version_or_shape_is_one_line(tmp_path: Path) -> None:
    sweep_file(tmp_path, version=2)
    with pytest.raises(RecordingError, match="has capacity version 2; this meshtop reads version 1"):
        read_capacity(tmp_path)
    sweep_file(tmp_path, search=3)
    with pytest.raises(RecordingError, match="is not a capacity file this meshtop reads"):
        read_capacity(tmp_path)
    with pytest.raises(RecordingError, match="is not a capacity sweep"):
        read_capacity(tmp_path / "none")


def test_the_rules_at_their_edges() -> None:
    """Each rule at its boundary, worked by hand: 3.6 of 4.0 sent is 90 % exactly, not under 90 %, so not
    saturated; a rate unknown on either side saturates only by the queue; closed loop, the queue still does;
    a run with no request judged says so; a run that passed has no why."""
    assert saturation(3.6, 4.0, None, open_loop=True) is None  # 0.9 x 4.0 = 3.6: not below
    assert saturation(None, 4.0, None, open_loop=True) is None
    assert saturation(1.0, None, None, open_loop=True) is None
    assert saturation(None, None, "q", open_loop=True) == "saturated: q"
    assert saturation(1.0, 4.0, "q", open_loop=False) == "saturated: q"
    nothing = RunFiguresOfSweep(attainment=None, met=False, achieved_rate=None, saturated=None, client_limited=None)
    assert nothing.why(0.95) == "SLO missed: met by no request (under 95 %)" and not nothing.passed
    fine = RunFiguresOfSweep(attainment=1.0, met=True, achieved_rate=2.0, saturated=None, client_limited=None)
    assert fine.why(0.95) is None and fine.passed
    full = RunFiguresOfSweep(attainment=1.0, met=True, achieved_rate=2.0, saturated="saturated: q", client_limited=None)
    assert full.why(0.95) == "saturated: q" and not full.passed
    # the folders: = becomes -, a comma _, anything but a letter, digit, - _ or . becomes -
    assert config_folder("tp=2,util=0.9,model=org/m x") == "tp-2_util-0.9_model-org-m-x"
    assert [run_folder("rate", 2.0), run_folder("rate", 2.75), run_folder("concurrency", 4)] == [
        "rate-2",
        "rate-2.75",
        "concurrency-4",
    ]


def test_an_attainment_of_exactly_the_asked_share_is_met(sweep: Path) -> None:
    """--attainment 1.0: rate 2's every request within 500 ms (attainment 1.0, at least 1.0) still passes."""
    sweep_file(sweep, attainment=1.0)
    runs = {run["rate"]: run for run in capacity_report(sweep)["runs"]}
    assert (runs[2.0]["attainment"], runs[2.0]["met"], runs[2.0]["passed"]) == (1.0, True, True)


def test_an_offered_load_a_whole_multiple_of_capacity_needs_that_many(sweep: Path) -> None:
    """Offered 8 x 0.5 = 4 req/s at capacity 2: exactly 2 servers (4 / 2 = 2, not rounded up to 3), 2 x 2 = 4
    GPUs."""
    sweep_file(sweep, users={"users": 8, "rate_per_user": 0.5, "offered_per_s": 4.0})
    best = capacity_report(sweep)["capacity"][0]
    assert (best["requests_per_s"], best["needed"], best["needed_gpus"]) == (2.0, 2, 4)


def test_a_run_not_run_or_still_running_has_no_figures(sweep: Path) -> None:
    """Rate 8 was not run: every figure empty, nothing met or passed, its reason as why. A run still marked
    running is read as not finished, though its folder holds a whole recording (rate 2's)."""
    data = json.loads((sweep / CAPACITY_FILE).read_text())
    data["runs"].append(
        {"config": "batch=1", "rate": 16.0, "status": "running", "recording": "batch-1/rate-2", "reason": None}
    )
    (sweep / CAPACITY_FILE).write_text(json.dumps(data))
    runs = {run["rate"]: run for run in capacity_report(sweep)["runs"]}
    empty = dict.fromkeys(("achieved_rate", "attainment", "ttft_p50_s", "ttft_p99_s", "tpot_p50_s", "tpot_p99_s"))
    flags = {"met": False, "saturated": False, "client_limited": False, "passed": False, "blocker": None}
    assert runs[8.0] == {
        "config": "batch=1",
        "rate": 8.0,
        "recording": None,
        "status": "not run",
        "why": "not run: 4 saturated",
        **empty,
        **flags,
    }
    assert runs[16.0] == {
        "config": "batch=1",
        "rate": 16.0,
        "recording": "batch-1/rate-2",
        "status": "running",
        "why": None,
        **empty,
        **flags,
    }


def test_limited_by_reads_the_run_that_did_not_pass() -> None:
    """The rule of what stopped a configuration, row by row: the client first; a completed run's blocker
    where it names one; else a saturated run is the queue's and any other the latency's; a run that did not
    complete, whatever its blocker, failed."""

    def row(status: str = "completed", kind: str | None = None, saturated: bool = False) -> dict[str, object]:
        blocker = {"kind": kind, "evidence": "e", "suggestion": "s"} if kind is not None else None
        return {"client_limited": False, "blocker": blocker, "status": status, "saturated": saturated}

    assert limit_of({**row(kind="queue"), "client_limited": True}) == "client"
    assert limit_of(row(kind="fit")) == "fit"
    assert limit_of(row(kind="fit", saturated=True)) == "fit"
    assert [limit_of(row(kind="none", saturated=s)) for s in (True, False)] == ["queue", "latency"]
    assert [limit_of(row(saturated=s)) for s in (True, False)] == ["queue", "latency"]
    assert [limit_of(row(status, kind="fit")) for status in ("failed", "interrupted")] == ["failed", "failed"]


def test_the_queue_alone_saturates_a_run_the_server_kept_up_with() -> None:
    """10 requests every 0.5 s (2.0/s sent), TTFT 100 ms for the first seven and 300, 350, 400 ms for the last
    three: departures (10 - 1) / (4.92 - 0.12 s) = 1.875/s, at least 0.9 x 2.0 = 1.8, so not saturated by the
    rate; but TTFT p50 rose from 100 ms (first third) to 350 ms (last third, 3.5 x, at least 2 x) while TPOT held
    at 20 ms: the queue grows, saturated, open or closed loop. Every request within 500 ms: met."""
    ttfts = [0.1] * 7 + [0.3, 0.35, 0.4]
    events = [request(i, sent_s=0.5 * i, first_s=0.5 * i + ttft) for i, ttft in enumerate(ttfts)]
    with tempfile.TemporaryDirectory() as folder:
        directory = write_recording(Path(folder) / "run", events, run=endpoint_run(2.0))
        figures = fold_recording(open_recording(directory)).figures()
        ends = completed_ends(directory)
    for open_loop in (True, False):
        judged = run_figures(figures, ends, attainment=0.95, open_loop=open_loop)
        assert judged.achieved_rate == pytest.approx(1.875) and (judged.attainment, judged.met) == (1.0, True)
        assert judged.saturated == (
            "saturated: TTFT p50 rose from 100.0 ms over the first third of the requests to 350.0 ms over the last "
            "(at least 2 x) while TPOT p50 held (20.0 ms to 20.0 ms, within 1.25 x)"
        )
        assert not judged.passed


def test_a_run_without_send_times_or_a_load_has_no_client(tmp_path: Path) -> None:
    """Requests with no scheduled send (no client figures): nothing sent to compare, nothing client-limited,
    rate 2's figures otherwise (departures 2.0/s, all met). A recording with no load has no request figures:
    nothing met, no attainment."""
    events = [dataclasses.replace(event, scheduled_ns=None) for event in at_rate_2()]
    directory = write_recording(tmp_path / "run", events, run=endpoint_run(2.0))
    judged = run_figures(
        fold_recording(open_recording(directory)).figures(), completed_ends(directory), attainment=0.95, open_loop=True
    )
    assert (judged.achieved_rate, judged.met, judged.saturated, judged.client_limited) == (
        pytest.approx(2.0),
        True,
        None,
        None,
    )
    # no load: no request figures; two ends 1 s apart still depart at 1.0/s
    none = run_figures(figures_of(None), [0, S], attainment=0.95, open_loop=True)
    assert none == RunFiguresOfSweep(attainment=None, met=False, achieved_rate=1.0, saturated=None, client_limited=None)


def test_a_run_that_completed_nothing_is_not_saturated_by_its_queue() -> None:
    """The waiting gauge grew from 0 to 5 over the load (at least 1 and 2 x the first), but no request completed:
    the blocker judges no queue without a completed request, and the sweep agrees (the run fails its SLO
    instead); with 30 completed, the same gauge saturates it."""
    growing = server_figures(waiting=(0.0, 5.0))
    nothing = run_figures(figures_of(request_figures(completed=0), growing), [], attainment=0.95, open_loop=True)
    assert (nothing.saturated, nothing.met) == (None, False)
    some = run_figures(figures_of(request_figures(slo_met=1.0), growing), [], attainment=0.95, open_loop=True)
    assert some.saturated is not None and some.saturated.startswith("saturated: requests waiting grew from 0.00")


def test_departures_count_each_completed_request_once_warmup_left_out(tmp_path: Path) -> None:
    """Rate 2's ten requests, a warmup request before them, a failed one and request 0 reported again later: the
    ten ends of the first reports, 0.12 s + 0.5 i. Two ends 2 s apart depart at (2 - 1) / 2 s = 0.5/s exactly;
    three over 4 s at 2 / 4 = 0.5/s exactly."""
    warmup = dataclasses.replace(request(50, sent_s=-3, first_s=-2.9), warmup=True)
    failed = dataclasses.replace(request(51, sent_s=1, first_s=1.1), status="failed", error="boom")
    again = request(0, sent_s=0, first_s=9)
    directory = write_recording(tmp_path / "run", [warmup, *at_rate_2(), failed, again], run=endpoint_run(2.0))
    assert sorted(completed_ends(directory)) == [BASE_NS + int((0.5 * i + 0.1) * S) + S // 50 for i in range(10)]
    assert departure_rate([0, 2 * S]) == 0.5 and departure_rate([0, 2 * S, 4 * S]) == 0.5


def test_the_sweeps_own_status_of_a_run_stands_and_an_unreadable_run_says_why(sweep: Path) -> None:
    """A run the sweep marked failed or interrupted keeps that status though its recording completed (rate 2's
    recording read again); one marked completed whose recording was cut is interrupted; a run whose manifest
    cannot be read has no figures, and its why says what was wrong."""
    data = json.loads((sweep / CAPACITY_FILE).read_text())
    for rate, status in ((20.0, "failed"), (21.0, "interrupted"), (22.0, "completed")):
        data["runs"].append(
            {"config": "batch=1", "rate": rate, "status": status, "recording": "batch-1/rate-2", "reason": None}
        )
    broken = sweep / "batch-1" / "rate-5"
    broken.mkdir()
    (broken / "manifest.json").write_text("{")
    cut = sweep / "batch-1" / "cut"
    write_recording(cut, at_rate_2(), run=endpoint_run(2.0), status="interrupted")
    data["runs"].append(run_entry(23.0, "batch-1/cut"))
    data["runs"].append(
        {"config": "batch=1", "rate": 5.0, "status": "completed", "recording": "batch-1/rate-5", "reason": None}
    )
    (sweep / CAPACITY_FILE).write_text(json.dumps(data))
    runs = {run["rate"]: run for run in capacity_report(sweep)["runs"]}
    assert [runs[rate]["status"] for rate in (20.0, 21.0, 22.0)] == ["failed", "interrupted", "completed"]
    assert runs[22.0]["why"] is None and runs[22.0]["passed"]
    # marked completed, its recording interrupted: the recording's word, and no pass on a cut run
    assert (runs[23.0]["status"], runs[23.0]["passed"], runs[23.0]["met"]) == ("interrupted", False, True)
    assert runs[5.0]["why"].startswith(str(broken / "manifest.json")) and not runs[5.0]["met"]


def run_entry(rate: float, recording: str | None, status: str = "completed") -> dict[str, object]:
    return {"config": "batch=1", "rate": rate, "status": status, "recording": recording, "reason": None}


def test_capacity_is_the_highest_pass_whatever_the_order_and_only_runs_above_it_limit(sweep: Path) -> None:
    """Passes at 1 and 2 (rate 2's recording read for both), run in that order: capacity 2, not the first pass.
    A run below capacity that did not pass (rate 0.5, the saturated recording) limits nothing: the first
    above capacity does (3, client-limited). With nothing above but a run not run, nothing limited it."""
    runs = [
        run_entry(1.0, "batch-1/rate-2"),
        run_entry(0.5, "batch-1/rate-4"),
        run_entry(2.0, "batch-1/rate-2"),
        run_entry(3.0, "batch-1/rate-3"),
    ]
    sweep_file(sweep, runs=runs)
    best = capacity_report(sweep)["capacity"][0]
    assert (best["requests_per_s"], best["rate"], best["limited_by"]) == (2.0, 2.0, "client")
    sweep_file(sweep, runs=[*runs[:3], run_entry(8.0, None, "not run")])
    best = capacity_report(sweep)["capacity"][0]
    assert (best["requests_per_s"], best["limited_by"]) == (2.0, None)


def test_a_concurrency_search_takes_the_achieved_rate_as_capacity(sweep: Path) -> None:
    """Concurrency 2's run departs at (10 - 1) / 4.5 s = 2.0 req/s: its capacity (the concurrency is no rate);
    concurrency 4's run is no longer saturated by its rate (closed loop) but still by its queue (TTFT rose).
    A passing run of a single request has no departure rate: capacity 0."""
    sweep_file(sweep, search="concurrency")
    report = capacity_report(sweep)
    best = report["capacity"][0]
    assert (best["requests_per_s"], best["rate"], best["needed"]) == (pytest.approx(2.0), 2.0, 3)
    four = {run["rate"]: run for run in report["runs"]}[4.0]
    assert four["saturated"] and four["why"].startswith("saturated: TTFT p50 rose from 730.0 ms")
    write_recording(sweep / "batch-1" / "one", at_rate_2()[:1], run=endpoint_run(2.0))
    sweep_file(sweep, search="concurrency", runs=[run_entry(1.0, "batch-1/one")])
    best = capacity_report(sweep)["capacity"][0]
    assert (best["requests_per_s"], best["rate"], best["needed"]) == (0.0, 1.0, None)


def test_ranking_per_gpu_then_requests_and_why_a_configuration_has_none(sweep: Path) -> None:
    """Passes (rate 2's recording read for each) at the asked rates: c 4/s on 2 GPUs and d 2/s on 1 (2 a GPU
    each: c first, more requests/s), a 0.5/s on 1 GPU (0.5 a GPU), b 2/s on 8 (0.25); e's only run saturated
    and f ran nothing: capacity 0, last in the order run, each with why. Offered 5 req/s: a needs
    ceil(5 / 0.5) = 10 servers, 10 GPUs. d's reason (its server exited late) goes with its capacity."""
    config = {"status": "completed", "reason": None}
    names = [("a", 1, 0.5), ("b", 8, 2.0), ("c", 2, 4.0), ("d", 1, 2.0), ("e", 1, None), ("f", 1, None)]
    sweep_file(
        sweep,
        configurations=[
            {"config": name, "folder": name, "gpus": gpus, **config, **({"reason": "exited"} if name == "d" else {})}
            for name, gpus, _ in names
        ],
        runs=[
            *(
                {"config": name, "rate": rate, "status": "completed", "recording": "batch-1/rate-2", "reason": None}
                for name, _, rate in names
                if rate is not None
            ),
            {"config": "e", "rate": 4.0, "status": "completed", "recording": "batch-1/rate-4", "reason": None},
        ],
    )
    ranked = capacity_report(sweep)["capacity"]
    assert [(row["config"], row["requests_per_s"], row["per_gpu"]) for row in ranked] == [
        ("c", 4.0, 2.0),
        ("d", 2.0, 2.0),
        ("a", 0.5, 0.5),
        ("b", 2.0, 0.25),
        ("e", 0.0, 0.0),
        ("f", 0.0, 0.0),
    ]
    rows = {row["config"]: row for row in ranked}
    assert (rows["a"]["needed"], rows["a"]["needed_gpus"], rows["d"]["reason"]) == (10, 10, None)
    assert rows["e"]["reason"] == "saturated: the server answered 2.00 requests/s of the 4.00 sent (under 90 %)"
    assert (rows["e"]["limited_by"], rows["f"]["reason"], rows["f"]["limited_by"]) == ("queue", "no run finished", None)


def test_a_capacity_file_that_is_no_json_object_is_one_line(sweep: Path) -> None:
    """Not JSON: cannot be read, with the parser's words; JSON but no object: no version."""
    assert capacity_report(sweep)["sweep"] == str(sweep)
    path = sweep / CAPACITY_FILE
    path.write_text("{")
    with pytest.raises(RecordingError) as raised:
        read_capacity(sweep)
    assert str(raised.value) == (
        f"{path} cannot be read: Expecting property name enclosed in double quotes: line 1 column 2 (char 1)"
    )
    path.write_text("[1]")
    with pytest.raises(RecordingError) as raised:
        read_capacity(sweep)
    assert str(raised.value) == f"{path} has capacity version None; this meshtop reads version 1"


def test_a_run_that_only_missed_its_slo_says_by_how_much(sweep: Path) -> None:
    """Rate 2's requests, the last one's first token 550 ms after it was sent: 9 of 10 within 500 ms (90 %, under
    95 %); departures 9 / (5.07 - 0.12 s) = 1.82/s, at least 0.9 x 2.0; TTFT p50 of the last third 100 ms, no
    rise: not saturated, not client-limited, so the SLO alone fails it, and latency limited the configuration."""
    events = [*at_rate_2()[:9], request(9, sent_s=4.5, first_s=5.05)]
    write_recording(sweep / "batch-1" / "slow", events, run=endpoint_run(2.0))
    sweep_file(sweep, runs=[run_entry(2.0, "batch-1/rate-2"), run_entry(2.5, "batch-1/slow")])
    report = capacity_report(sweep)
    slow = {run["rate"]: run for run in report["runs"]}[2.5]
    assert (slow["attainment"], slow["met"], slow["saturated"], slow["client_limited"]) == (0.9, False, False, False)
    assert slow["why"] == "SLO missed: met by 90.0 % of the requests (under 95 %)"
    assert report["capacity"][0]["limited_by"] == "latency"
