"""The capacity sweep against a real HTTP server of known capacity: the stub of tests/kit/sse_server.py started by
meshtop with ``--serial`` answers one request at a time, each 4 chunks 50 ms apart (0.15 s), so it takes 1 / 0.15
= 6.7 requests a second; its ``/metrics`` publish its waiting requests as vLLM does. Arrivals are nearly even
(``--burstiness 50``: gamma gaps of shape 50, a spread of 14 %), so the queue stays empty below capacity and
grows above it. Also: a rate the load generator cannot send on time (client-limited) is never capacity, --vary
ranks two settings of the server and stops each, and bad input is one line."""

from __future__ import annotations

import json
import math
import re
import sys
from pathlib import Path

import psutil
import pytest

from meshtop.recordings.capacity import capacity_report
from meshtop.recordings.manifest import read_manifest
from meshtop.recordings.reader import open_recording
from meshtop.recordings.summary import fold_recording, recording_blocker
from meshtop.runner.planner.capacity import RESOLUTION
from meshtop.tui.cli import main
from tests.kit.commands import one_line_error

ENDPOINT = "http://127.0.0.1:{port}"
STUB = [sys.executable, "-m", "tests.kit.sse_server"]
SERIAL = [*STUB, "4", "50", "0", "--serial", "--port", "{port}"]
"""A server of one slot, 0.15 s a request: 6.7 requests a second."""
KNOWN = 1 / 0.15
EVEN = ["--duration", "5", "--burstiness", "50", "--output-len", "4", "--slo", "ttft=400ms"]


def sweep(out: Path, *options: str, command: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    code = main(["sweep", str(out), "--endpoint", ENDPOINT, *options, "--", *command])
    return code, capsys.readouterr().out


def servers_left(output: str) -> list[psutil.Process]:
    """The processes still running of the servers the sweep said it started (by their ports)."""
    ports = set(re.findall(r"starting server \d+: .* --port (\d+)", output))
    assert ports
    left = []
    for process in psutil.process_iter(["cmdline"]):
        cmdline = process.info["cmdline"] or []
        if "tests.kit.sse_server" in cmdline and ports & set(cmdline):
            left.append(process)
    return left


@pytest.mark.slow
def test_fixed_rates_find_the_known_capacity_and_the_rate_above_saturates(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """3 and 6 requests/s pass (under 6.7), 12 saturates: capacity 6, limited by the queue; 24 is not run."""
    code, output = sweep(tmp_path / "s", "--rates", "3,6,12,24", *EVEN, command=SERIAL, capsys=capsys)
    assert code == 0, output
    report = capacity_report(tmp_path / "s")
    runs = {run["rate"]: run for run in report["runs"]}
    assert [run["rate"] for run in report["runs"]] == [3, 6, 12, 24]
    assert runs[3]["passed"] and runs[6]["passed"], runs
    above = runs[12]
    assert above["saturated"] and not above["passed"] and above["achieved_rate"] < 0.9 * 12
    assert above["blocker"]["kind"] == "queue"
    recording = open_recording(tmp_path / "s" / above["recording"])  # the run above, in its own recording
    blocker = recording_blocker(recording, fold_recording(recording))
    assert blocker is not None and blocker.kind == "queue"
    assert (runs[24]["status"], runs[24]["why"]) == ("not run", "not run: the run at 12 saturated")
    (row,) = report["capacity"]
    assert (row["config"], row["requests_per_s"], row["limited_by"], row["recording"]) == (
        "endpoint",
        6.0,
        "queue",
        "endpoint/rate-6",
    )
    assert re.search(
        r"\[2\] rate 6 req/s: SLO met by \d+ % · achieved [\d.]+ req/s · TTFT p99 \d+ ms .*· passed", output
    )
    assert (tmp_path / "s" / "capacity.txt").read_text().splitlines()[3].split()[:2] == ["endpoint", "6"]
    assert not servers_left(output)


@pytest.mark.slow
def test_auto_finds_the_capacity_within_a_tenth_in_fewer_runs_than_a_tenth_by_tenth_list(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """From 1 request/s: 1, 2, 4 pass, 8 fails, then bisection between 4 and 8 to within 10 %: a capacity within
    10 % of 6.7, in fewer runs than a fixed list rising by 10 % from 1 would take to reach it (1, 1.1, 1.21, ...:
    20 runs to 6.1)."""
    code, output = sweep(tmp_path / "s", *EVEN, command=SERIAL, capsys=capsys)
    assert code == 0, output
    report = capacity_report(tmp_path / "s")
    (row,) = report["capacity"]
    assert abs(row["requests_per_s"] - KNOWN) / KNOWN <= RESOLUTION, report["runs"]
    rates = [run["rate"] for run in report["runs"]]
    assert rates[:4] == [1, 2, 4, 8]
    tenth_by_tenth = math.ceil(math.log(row["requests_per_s"]) / math.log(1 + RESOLUTION)) + 1
    assert len(rates) < tenth_by_tenth
    print(f"auto: capacity {row['requests_per_s']} in {len(rates)} runs: {rates}", file=sys.stderr)
    assert not servers_left(output)


@pytest.mark.slow
def test_a_rate_the_client_cannot_send_on_time_is_never_capacity(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """20,000 requests/s for 0.25 s of one-token answers from a server that answers at once: the load generator
    (one event loop, a few thousand requests a second at most) sends them late (send lag p99 above 10 ms), so the
    run measured the client and is not the capacity, whatever its SLO says."""
    code, output = sweep(
        tmp_path / "s",
        *("--rates", "2,20000", "--duration", "0.25", "--output-len", "1", "--slo", "ttft=1s"),
        command=[*STUB, "1", "0", "0", "--port", "{port}"],
        capsys=capsys,
    )
    assert code == 0, output
    report = capacity_report(tmp_path / "s")
    fast = report["runs"][1]
    assert fast["client_limited"] and not fast["passed"] and fast["why"].startswith("client-limited: ")
    (row,) = report["capacity"]
    assert (row["requests_per_s"], row["limited_by"]) == (2.0, "client")
    assert "endpoint at 20000: never counted as capacity: client-limited: " in output
    assert not servers_left(output)


@pytest.mark.slow
def test_vary_ranks_the_faster_setting_first_and_stops_each_server(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """gap=20: 0.06 s a request (16.7/s); gap=60: 0.18 s (5.6/s). At 3, 6 and 12 requests/s the first passes
    all three (capacity 12), the second only 3 (capacity 3): gap=20 first; no server process is left."""
    code, output = sweep(
        tmp_path / "s",
        *("--rates", "3,6,12", "--vary", "gap=20,60", *EVEN),
        command=[*STUB, "4", "{gap}", "0", "--serial", "--port", "{port}"],
        capsys=capsys,
    )
    assert code == 0, output
    report = capacity_report(tmp_path / "s")
    assert [(row["config"], row["requests_per_s"]) for row in report["capacity"]] == [("gap=20", 12.0), ("gap=60", 3.0)]
    assert report["capacity"][1]["limited_by"] == "queue"
    for folder, gap in (("gap-20", "20"), ("gap-60", "60")):
        assert (tmp_path / "s" / folder / "server-0.log").is_file()
        started = read_manifest(tmp_path / "s" / folder / "rate-3").run.endpoint.server  # type: ignore[union-attr]
        assert started is not None and started.command[-6:-2] == ("4", gap, "0", "--serial"), started
    assert not servers_left(output)


def test_a_server_that_does_not_start_has_capacity_0_and_the_sweep_goes_on(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The first setting exits out of memory (fit), the second with an error of its own (failed): each is a row
    of capacity 0 with its reason, and the sweep ends failed (exit code 1)."""
    script = "print('torch.OutOfMemoryError: CUDA out of memory' if '{why}' == 'oom' else 'bad flag'); exit(1)"
    code, output = sweep(
        tmp_path / "s",
        *("--rates", "1", "--vary", "why=oom,flag", "--slo", "ttft=1s", "--requests", "2"),
        command=[sys.executable, "-c", script, "--port", "{port}"],
        capsys=capsys,
    )
    assert code == 1, output
    rows = capacity_report(tmp_path / "s")["capacity"]
    assert [(row["config"], row["requests_per_s"], row["limited_by"]) for row in rows] == [
        ("why=oom", 0.0, "fit"),
        ("why=flag", 0.0, "failed"),
    ]
    assert "before it answered" in rows[0]["reason"] and "\n" not in rows[0]["reason"]
    data = json.loads((tmp_path / "s" / "capacity.json").read_text())
    assert [c["status"] for c in data["configurations"]] == ["failed", "failed"]


@pytest.mark.parametrize(
    ("options", "said"),
    [
        (["--endpoint", "http://h:1", "--slo", "ttft=1s", "--plans", "dp2"], "--plans is not for a capacity sweep"),
        (["--endpoint", "http://h:1", "--slo", "ttft=1s", "--gpus", "2"], "--gpus is not for a capacity sweep"),
        (["--endpoint", "http://h:1", "--slo", "ttft=1s", "--request-rate", "2"], "(give --rates)"),
        (["--endpoint", "http://h:1", "--rates", "1,2"], "needs the SLO a run must meet: give --slo"),
        (["--endpoint", "http://h:1", "--slo", "ttft=1s", "--rates", "1,x"], "--rates '1,x': give numbers"),
        (["--endpoint", "http://h:1", "--slo", "ttft=1s", "--rates", "1", "--concurrencies", "2"], "give one of them"),
        (["--endpoint", "http://h:1", "--slo", "ttft=1s", "--users", "3"], "--users and --rate-per-user go together"),
        (["--endpoint", "http://h:1", "--slo", "ttft=1s", "--rates", "1", "--start-rate", "2"], "is for --rates auto"),
        (["--endpoint", "http://h:{port}", "--slo", "ttft=1s"], "{port} is filled only for a server command"),
        (["--endpoint", "http://h:1", "--slo", "ttft=1s", "--vary", "tp=1,2"], "give the command after --"),
        (["--rates", "1,2"], "--rates is for a capacity sweep: give --endpoint URL"),
        (["--slo", "ttft=1s"], "--slo is for a capacity sweep: give --endpoint URL"),
    ],
)
def test_bad_input_is_one_line_and_exit_code_2(
    options: list[str], said: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    line = one_line_error(["sweep", str(tmp_path / "s"), *options], capsys)
    assert said in line
    assert not (tmp_path / "s").exists()


def test_replicas_need_a_port_each(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    line = one_line_error(
        ["sweep", str(tmp_path / "s"), "--endpoint", "http://h:8000", "--slo", "ttft=1s", "--vary", "replicas=1,2",
         "--", *STUB, "--port", "8000"],
        capsys,
    )  # fmt: skip
    assert "each copy of the server needs a port of its own: put {port} in its command" in line


@pytest.mark.slow
def test_replicas_two_copies_take_about_twice_the_rate(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--vary replicas=1,2 starts the one-slot stub once and
    twice, the load spread round-robin: replicas=1 takes 6 of 3, 6, 12 requests/s, replicas=2 all three (13.3
    a second); per GPU (1 and 2 GPUs) both 6; each copy had its own port and is stopped."""
    code, output = sweep(
        tmp_path / "s",
        *("--rates", "3,6,12", "--vary", "replicas=1,2", *EVEN),
        command=SERIAL,
        capsys=capsys,
    )
    assert code == 0, output
    rows = {row["config"]: row for row in capacity_report(tmp_path / "s")["capacity"]}
    assert (rows["replicas=1"]["requests_per_s"], rows["replicas=1"]["gpus"]) == (6.0, 1)
    assert (rows["replicas=2"]["requests_per_s"], rows["replicas=2"]["gpus"]) == (12.0, 2)
    assert (tmp_path / "s" / "replicas-2" / "server-1.log").is_file()
    assert not servers_left(output)


def test_every_capacity_option_is_in_the_docs_tables() -> None:
    """tests/docs holds the tables of ``run``'s options to its parser; the capacity options are the sweep's."""
    import argparse

    from meshtop.tui.cli import build_parser
    from tests.kit.docs import ROOT

    commands = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    group = next(g for g in commands.choices["sweep"]._action_groups if g.title and g.title.startswith("a capacity"))
    names = [action.option_strings[0] for action in group._group_actions]
    assert "--rates" in names and "--vary" in names
    for page in (ROOT / "docs" / "serving.md", ROOT / "README.md"):
        rows = [line for line in page.read_text().splitlines() if line.startswith("| `--")]
        missing = [name for name in names if not any(f"`{name} " in row or f"`{name}`" in row for row in rows)]
        assert not missing, f"{page.name}: {missing}"


@pytest.mark.slow
def test_ctrl_c_keeps_what_finished_and_marks_the_cut_run_and_those_not_run(tmp_path: Path) -> None:
    """SIGINT during the second run of 2, 4, 8 requests/s: the first completed, the second interrupted, the third
    not run and why; the server stopped, the table printed, exit code 130."""
    import os
    import signal
    import subprocess
    import time

    out = tmp_path / "s"
    sweep_ = subprocess.Popen(
        [sys.executable, "-m", "meshtop.tui.cli", "sweep", str(out), "--endpoint", ENDPOINT, "--rates", "2,4,8",
         "--duration", "3", "--slo", "ttft=1s", "--", *SERIAL],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env={**os.environ},
    )  # fmt: skip
    assert sweep_.stdout is not None
    lines = []
    for line in sweep_.stdout:
        lines.append(line)
        if line.startswith("[2] rate 4 req/s: running"):
            time.sleep(1.0)
            sweep_.send_signal(signal.SIGINT)
            break
    rest, _ = sweep_.communicate(timeout=60)
    output = "".join(lines) + rest
    assert sweep_.returncode == 130, output
    runs = json.loads((out / "capacity.json").read_text())["runs"]
    assert [(run["rate"], run["status"]) for run in runs] == [(2, "completed"), (4, "interrupted"), (8, "not run")]
    assert runs[2]["reason"] == "not run: the sweep was interrupted before it"
    assert "configuration" in output and not servers_left(output)


@pytest.mark.slow
def test_concurrencies_search_closed_loop_and_capacity_is_the_achieved_rate(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The one-slot stub at 1, 2 and 4 in flight answers 6.7 a second at each; each request waits for those
    ahead of it: TTFT about 0, 0.15 and 0.45 s, so 4 misses a TTFT of 300 ms (a standing queue of 3: blocker
    queue). The capacity is the achieved rate of 2 in flight, near 6.7."""
    code, output = sweep(
        tmp_path / "s",
        *("--concurrencies", "1,2,4", "--duration", "4", "--output-len", "4", "--slo", "ttft=300ms"),
        command=SERIAL,
        capsys=capsys,
    )
    assert code == 0, output
    report = capacity_report(tmp_path / "s")
    assert report["search"] == "concurrency"
    assert [(run["rate"], run["passed"]) for run in report["runs"]] == [(1, True), (2, True), (4, False)]
    (row,) = report["capacity"]
    assert row["rate"] == 2 and abs(row["requests_per_s"] - KNOWN) / KNOWN < 0.15, row
    assert row["limited_by"] == "queue" and report["runs"][2]["recording"] == "endpoint/concurrency-4"
    assert "[3] concurrency 4 in flight: " in output
