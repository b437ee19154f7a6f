"""A hang triaged by torch's flight recorder beside meshtop's own report.

A user's script hangs at its third step in one of two ways, under ``meshtop record --hang-timeout 3``:
rank 1 skips an all-reduce and goes on to a broadcast (both ranks then wait, each in its own collective),
or rank 1 is stuck before the all-reduce (rank 0 waits in it). meshtop's heartbeats say where each rank is;
torch's analyzer, on every rank's flight-recorder dump, names the collective where they diverge. Both are
in the hang report (the manifest, ``summary``, the console), the verdict is a ``flight_verdict`` event of
the recording, and the dumps stay in its ``flight/`` folder.

A size mismatch does not hang on gloo: gloo checks each message's size and aborts the rank (the job fails,
rank 1 named first). The analyzer's verdict on one is checked on real dumps with one record edited. An
analyzer that fails or is missing is one line, and meshtop's own report stays. SIGUSR1 to a headless
``record`` takes the dumps too, while the job runs.
"""

from __future__ import annotations

import json
import os
import pickle
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from meshtop.probes.flight import FlightDumps
from meshtop.runner.job import flight
from meshtop.runner.job.flight import FlightTriage, analyze, run_analyzer
from tests.kit.commands import line_matching, meshtop, run_meshtop

SCRIPT = """
import sys
import time

import torch
import torch.distributed as dist

fault = sys.argv[1]
dist.init_process_group("gloo")
rank = dist.get_rank()
model = torch.nn.Linear(8, 8)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(3):
    model(torch.ones(8)).sum().backward()
    for parameter in model.parameters():
        dist.all_reduce(parameter.grad)
    if step == 2 and rank == 1 and fault == "skip":
        dist.broadcast(torch.ones(8), src=0)  # the all-reduce below skipped: on to the next collective
    elif step == 2 and rank == 1 and fault == "stuck":
        time.sleep(600)  # never reaches the all-reduce below
    elif step == 2 and rank == 1 and fault == "size":
        dist.broadcast(torch.ones(3), src=0)  # rank 0 broadcasts 8 values
    elif step == 2 and fault == "size":
        dist.broadcast(torch.ones(8), src=0)
    elif step == 2:
        dist.all_reduce(torch.ones(8))  # collective #7 of the group: 2 a step before it, and this
    optimizer.step()
    optimizer.zero_grad()
dist.barrier()
dist.destroy_process_group()
"""
VERDICTS = {
    "skip": (
        "ranks 0, 1 wait in a collective",
        "torch's flight recorder: all_reduce #7 of group 0:default_pg: rank 1 collective type mismatch "
        "(Expected collective type: 'all_reduce' does not match found collective type: 'broadcast')",
    ),
    "stuck": (
        "rank 0 waits in a collective; rank 1 is not in one: look there first",
        "torch's flight recorder: rank 1 never entered all_reduce #7 of group 0:default_pg (its peers did)",
    ),
}


def hang(tmp_path: Path, fault: str) -> Path:
    (tmp_path / "faulty.py").write_text(textwrap.dedent(SCRIPT))
    out = tmp_path / f"rec-{fault}"
    done = run_meshtop(
        "record",
        out,
        "--hang-timeout",
        "3",
        "--",
        "torchrun",
        "--standalone",
        "--nproc-per-node=2",
        "faulty.py",
        fault,
        cwd=tmp_path,
        env={"CUDA_VISIBLE_DEVICES": ""},
        timeout_s=240,
    )
    assert done.returncode == 1, done.stdout + done.stderr
    return out


@pytest.mark.slow
@pytest.mark.parametrize("fault", VERDICTS)
def test_a_hang_is_named_by_meshtop_and_by_torchs_flight_recorder(tmp_path: Path, fault: str) -> None:
    out = hang(tmp_path, fault)
    ours, torchs = VERDICTS[fault]
    report = json.loads((out / "manifest.json").read_text())["hang"]
    assert report.splitlines()[0] == ours
    assert torchs in report.splitlines()
    summary = run_meshtop("summary", out)
    assert f"hung: {ours}" in summary.stdout and f"  {torchs}" in summary.stdout
    verdicts = pq.read_table(out / "events" / "flight_verdict.parquet").to_pylist()
    assert [row["verdict"] for row in verdicts] == [torchs] and verdicts[0]["error"] is None
    assert sorted(path.name for path in (out / "flight").glob("rank_*")) == ["rank_0", "rank_1"]
    if fault == "skip":
        size_mismatch(out / "flight", tmp_path / "edited")


def size_mismatch(dumps: Path, edited: Path) -> None:
    """Rank 1's record of the broadcast it issued instead, made an all-reduce of 3 values: the analyzer's
    size mismatch (gloo aborts a rank on a real one before anything hangs)."""
    shutil.copytree(dumps, edited)
    dump = pickle.loads((edited / "rank_1").read_bytes())
    record = dump["entries"][-1]
    assert record["profiling_name"] == "gloo:broadcast"
    record.update(profiling_name="gloo:all_reduce", input_sizes=[[3]], output_sizes=[[3]])
    (edited / "rank_1").write_bytes(pickle.dumps(dump))
    assert analyze(edited) == (
        "torch's flight recorder: all_reduce #7 of group 0:default_pg: rank 1 size or syntax mismatch "
        "(Expected input sizes: '[[8]]' does not match found input sizes: '[[3]]')"
    )


@pytest.mark.slow
def test_a_size_mismatch_on_gloo_aborts_the_rank_and_names_it(tmp_path: Path) -> None:
    out = hang(tmp_path, "size")
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["status"] == "failed" and manifest["hang"] is None
    assert manifest["root_cause_rank"] == 1


def test_an_analyzer_that_fails_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "rank_0").write_bytes(b"not a dump")
    (tmp_path / "rank_1").write_bytes(b"not a dump")
    verdict, error = run_analyzer(tmp_path)
    assert verdict is None and error is not None
    assert error.startswith("torch's flight-recorder analyzer failed: ") and "\n" not in error


def test_a_torch_without_the_analyzer_is_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A torch release without ``torch.distributed.flight_recorder`` (the import fails as it would there)."""
    monkeypatch.setitem(sys.modules, "torch.distributed.flight_recorder.components.builder", None)
    flight.main([str(tmp_path)])
    answer = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert answer["verdict"] is None and answer["error"].startswith("this torch has no flight-recorder analyzer")


def test_a_rank_that_does_not_answer_is_named_and_no_verdict_is_made(tmp_path: Path) -> None:
    triage = FlightTriage(tmp_path / "flight", collect_s=0.3)
    verdict = triage.triage({0: os.getpid()})
    assert (tmp_path / "flight" / "request").read_text().endswith(" 1")  # the first request
    assert verdict.verdict is None and verdict.error == "no flight-recorder dump from rank 0 within 0.3 s"
    assert verdict.lines() == ["torch's flight recorder: no verdict: no flight-recorder dump from rank 0 within 0.3 s"]
    on_nodes = FlightTriage(tmp_path / "flight", on_one_node=False).triage({0: os.getpid()})
    assert on_nodes.verdict is None and on_nodes.error is not None and "one node" in on_nodes.error


@pytest.mark.slow
def test_a_second_triage_waits_for_new_dumps_and_never_analyzes_the_first_ones(tmp_path: Path) -> None:
    """One session's triage asked twice (two stack dumps, or a dump then a hang). Rank 0, this process,
    answers the first request with a real dump (its recorder holds no collective), then stops answering: the
    second triage must find no dump from it, not take the first request's dump for its answer."""
    folder = tmp_path / "flight"
    rank_0 = FlightDumps(0, folder)
    answering = threading.Event()
    answering.set()

    def answer() -> None:  # the shipper's poll, while rank 0 still answers
        while answering.is_set():
            rank_0.poll()
            time.sleep(0.02)

    responder = threading.Thread(target=answer)
    responder.start()
    triage = FlightTriage(folder, collect_s=0.3)
    try:
        first = triage.triage({0: os.getpid()})
    finally:
        answering.clear()
        responder.join()
    assert (first.verdict, first.error) == (
        "torch's flight recorder: the 0 collectives recorded match on every rank",
        None,
    )
    assert (folder / "rank_0").exists()

    second = triage.triage({0: os.getpid()})
    assert (folder / "request").read_text().endswith(" 2")  # the second request
    assert (second.verdict, second.error) == (None, "no flight-recorder dump from rank 0 within 0.3 s")
    assert not (folder / "rank_0").exists(), "the first request's dump is gone, not left for torchfrtrace to mix in"


def test_a_stopped_rank_is_not_waited_for_and_is_named_stopped(tmp_path: Path) -> None:
    """A rank frozen by SIGSTOP (or held by a debugger) cannot dump: the wait ends as soon as only such ranks are
    left, and the verdict says why, where a live rank that does not answer is waited for to the end."""
    frozen = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        os.kill(frozen.pid, signal.SIGSTOP)
        deadline = time.monotonic() + 10
        while not flight.is_stopped(frozen.pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        started = time.monotonic()
        verdict = FlightTriage(tmp_path / "flight", collect_s=5.0).triage({1: frozen.pid})
        assert time.monotonic() - started < 2.0
        assert verdict.error == "no flight-recorder dump from rank 1 (rank 1 is stopped: SIGSTOP or a debugger)"
        both = FlightTriage(tmp_path / "flight", collect_s=0.5).triage({0: os.getpid(), 1: frozen.pid})
        assert both.error == (
            "no flight-recorder dump from ranks 0, 1 within 0.5 s (rank 1 is stopped: SIGSTOP or a debugger)"
        )
    finally:
        frozen.kill()
        frozen.wait()


@pytest.mark.slow
def test_sigusr1_to_a_headless_record_dumps_the_stacks_and_the_flight_records(tmp_path: Path) -> None:
    out = tmp_path / "rec"
    process = subprocess.Popen(
        meshtop("record", out, "--device", "cpu", "--steps", "100000"),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        line_matching(process, r"step +\d+", timeout_s=180)
        process.send_signal(signal.SIGUSR1)
        line_matching(process, r"torch's flight recorder: ", timeout_s=120)
        assert line_matching(process, r"torch's flight recorder: \(dumped while the job ran")
    finally:
        process.send_signal(signal.SIGINT)
        process.wait(timeout=120)
    verdicts = pq.read_table(out / "events" / "flight_verdict.parquet").to_pylist()
    assert len(verdicts) == 1 and verdicts[0]["error"] is None, verdicts
    assert sorted(path.name for path in (out / "flight").glob("rank_*")) == ["rank_0", "rank_1"]
