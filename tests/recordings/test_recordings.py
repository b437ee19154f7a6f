"""Recordings: compact on close, readable while written or after a crash, damage reported, summary JSON."""

from __future__ import annotations

import json
import math
import socket
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from meshtop.recordings.manifest import Manifest, RecordingError, manifest_bytes, write_manifest
from meshtop.recordings.reader import open_recording
from meshtop.recordings.samples import SAMPLE
from meshtop.recordings.summary import summarize
from meshtop.tui.cli import main
from tests.kit.commands import run_meshtop
from tests.kit.recordings import description

SAMPLE_MANIFEST = json.loads((SAMPLE / "manifest.json").read_text())


@pytest.mark.slow
def test_clean_close_leaves_parquet_tables_only(recorded: Path) -> None:
    files = {p.name for p in (recorded / "events").iterdir()}
    assert {"step.parquet", "collective.parquet", "stage_action.parquet", "memory.parquet"} <= files
    assert not any(name.endswith(".jsonl") for name in files)


@pytest.mark.slow
def test_summary_json_has_the_documented_keys(recorded: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["summary", str(recorded), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["run"] == {
        "label": "dp2 x tp1 x pp2 (1f1b, 4 mb)",
        "dp": 2,
        "tp": 1,
        "pp": 2,
        "fsdp": False,
        "world_size": 4,
        "mode": "train",
        "schedule": "1f1b",
        "microbatches": 4,
        "model": "tiny",
        "device": "cpu",
        "dtype": "fp32",
        "precision": "fp32",
        "checkpoint": "none",
        "instrumented": True,
        "status": "completed",
        "hang": None,
        "script": None,
        "endpoint": None,
        "reason": None,
    }
    assert summary["steps"]["count"] == 4
    assert set(summary["steps"]["time_s"]) == {"p50", "p90", "mean"}
    assert set(summary) == {
        "recording",
        "run",
        "steps",
        "mfu",
        "requests",
        "collectives",
        "stages",
        "memory",
        "most_loaded_rank",
        "headroom_bytes",
        "stragglers",
        "ranks",
        "hosts",
        "starts",
        "problems",
        "server",
        "gpus",
        "breakdown",
        "blocker",
    }
    assert summary["server"] is None and isinstance(summary["gpus"], list)  # no endpoint here
    assert set(summary["blocker"]) == {"kind", "evidence", "suggestion"}  # its kinds worked by hand elsewhere
    assert summary["blocker"]["kind"] in ("data", "communication", "bubble", "compute")  # trained, fitted
    breakdown = summary["breakdown"]  # each rank's step parts add up to its step, a pipeline's idle in its bubble
    assert sorted(breakdown["per_rank"]) == ["0", "1", "2", "3"]
    for parts in breakdown["per_rank"].values():
        assert sum(row["share"] for row in parts.values()) == pytest.approx(1.0, abs=0.01)
        assert parts["bubble"]["share"] > 0 and parts["forward"]["share"] > 0 and parts["backward"]["share"] > 0
    assert summary["starts"] == [{"restart": 0, "world_size": 4, "first_step": 0}]
    peak = max(row["peak_bytes"] for row in summary["memory"])
    assert summary["hosts"] == [
        {
            "node": 0,
            "host": socket.gethostname(),
            "ranks": [0, 1, 2, 3],
            "gpus": [],
            "clock_offset_ns": 0,
            "clock_rtt_ns": 0,
            "peak_bytes": peak,
        }
    ]
    assert {(r["node"], r["host"]) for r in summary["ranks"]} == {(0, socket.gethostname())}
    assert summary["mfu"]["value"] is None and summary["mfu"]["why_not"] == "no peak FLOP/s for a cpu device"
    groups = {(row["group"], row["op"]) for row in summary["collectives"]}
    assert groups == {("pp", "send"), ("pp", "recv"), ("dp", "all_reduce")}
    for row in summary["collectives"]:
        assert set(row) == {"group", "op", "count", "bytes", "in_flight_s", "busbw_gbps", "exposed_s"}
        assert set(row["in_flight_s"]) == {"total", "p50", "p99"} and set(row["busbw_gbps"]) == {"p50", "ops"}
        assert set(row["exposed_s"]) == {"per_step", "share", "measured"}
        assert row["count"] > 0 and row["bytes"] > 0 and row["in_flight_s"]["total"] > 0
        assert 0 < row["exposed_s"]["share"] < 1
    assert [row["stage"] for row in summary["stages"]] == [0, 1]
    assert all(0 < row["bubble_fraction"] < 1 for row in summary["stages"])
    assert [row["rank"] for row in summary["memory"]] == [0, 1, 2, 3]
    assert all(row["weights_bytes"] > 0 and row["peak_bytes"] > 0 for row in summary["memory"])
    assert [(r["rank"], r["exit_code"]) for r in summary["ranks"]] == [(r, 0) for r in range(4)]


@pytest.mark.slow
def test_summary_text_names_plan_steps_and_collectives(recorded: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["summary", str(recorded)]) == 0
    text = capsys.readouterr().out
    assert "completed" in text and "dp2 x tp1 x pp2 (1f1b, 4 mb)" in text
    assert "steps: 4" in text and "all_reduce" in text and "bubble" in text


def write_live_recording(directory: Path, *, torn: bool) -> None:
    """A recording as meshtop leaves it mid-run: manifest 'running', JSON-lines tables."""
    (directory / "events").mkdir(parents=True)
    write_manifest(directory, Manifest(run=description(dp=1), status="running"))
    lines = [
        json.dumps({"rank": 0, "step": n, "start_ns": n, "duration_s": 0.5, "tokens": 100, "loss": 2.0, "kind": "step"})
        for n in range(3)
    ]
    body = "\n".join(lines) + "\n"
    if torn:
        body += '{"rank": 0, "step": 3, "start'  # the write that a SIGKILL cut short
    (directory / "events" / "step.jsonl").write_text(body)


def test_live_or_killed_recording_loads_what_is_whole(tmp_path: Path) -> None:
    write_live_recording(tmp_path / "rec", torn=True)
    recording = open_recording(tmp_path / "rec")
    steps = recording.table("step")
    assert list(steps.step) == [0, 1, 2] and steps.step.dtype == "int64"
    assert recording.problems == ["step.jsonl: 1 line(s) unreadable and skipped"]
    summary = summarize(recording)
    assert summary["run"]["status"] == "interrupted"
    assert summary["steps"]["count"] == 3


def test_a_kind_with_no_events_is_an_empty_table_with_its_columns(tmp_path: Path) -> None:
    write_live_recording(tmp_path / "rec", torn=False)
    table = open_recording(tmp_path / "rec").table("collective")
    assert table.empty and {"op", "group", "bytes", "start_ns", "end_ns"} <= set(table.columns)


def test_damaged_parquet_is_reported_not_raised(tmp_path: Path) -> None:
    write_live_recording(tmp_path / "rec", torn=False)
    (tmp_path / "rec" / "events" / "memory.parquet").write_bytes(b"PAR1 this is not parquet")
    recording = open_recording(tmp_path / "rec")
    assert recording.table("memory").empty
    assert "memory.parquet is damaged" in recording.problems[0]


def test_a_parquet_table_damaged_past_its_first_row_group_is_folded_as_far_as_it_reads(tmp_path: Path) -> None:
    write_live_recording(tmp_path / "rec", torn=False)
    lines = tmp_path / "rec" / "events" / "step.jsonl"
    steps = pa.concat_tables([open_recording(tmp_path / "rec").arrow("step")] * 4000)
    numbers = pa.array(range(len(steps)), pa.int64())
    steps = steps.set_column(steps.column_names.index("step"), "step", numbers)
    path = lines.with_suffix(".parquet")  # compacted, in two row groups
    pq.write_table(steps, path, compression="zstd", row_group_size=len(steps) // 2)
    lines.unlink()
    second = pq.ParquetFile(path).metadata.row_group(1).column(0)
    data = bytearray(path.read_bytes())
    middle = second.data_page_offset + second.total_compressed_size // 2
    data[middle : middle + 64] = bytes(64)
    path.write_bytes(bytes(data))
    recording = open_recording(tmp_path / "rec")
    read = sum(len(batch) for batch in recording.batches("step", rows=len(steps) // 2))
    assert read == len(steps) // 2
    assert recording.problems == [
        f"step.parquet is damaged ({recording.problems[0].split('(', 1)[1].split(')')[0]}) past its first {read} "
        "events; the rest not loaded"
    ]


@pytest.mark.parametrize(
    ("setup", "message"),
    [
        (lambda d: None, "does not exist"),
        (lambda d: d.mkdir(), "is not a meshtop recording: no manifest.json"),
        (lambda d: (d.mkdir(), (d / "manifest.json").write_text("{not json")), "manifest.json is damaged"),
        (
            lambda d: (d.mkdir(), (d / "manifest.json").write_text('{"schema_version": 99}')),
            "has recording schema version 99; this meshtop reads versions 1, 2, 3",
        ),
        (
            lambda d: (d.mkdir(), (d / "manifest.json").write_text(json.dumps({**SAMPLE_MANIFEST, "colour": "red"}))),
            "unknown field colour",
        ),
        (
            lambda d: (
                d.mkdir(),
                (d / "manifest.json").write_text(
                    json.dumps({**SAMPLE_MANIFEST, "plan": {**SAMPLE_MANIFEST["plan"], "dp": "two"}})
                ),
            ),
            "plan.dp must be an integer",
        ),
        (lambda d: d.write_text("a file"), "is not a recording directory"),
    ],
)
def test_unreadable_recordings_are_one_line_and_exit_2(
    setup, message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    target = tmp_path / "rec"
    setup(target)
    with pytest.raises(RecordingError, match=message.replace("(", r"\(")):
        open_recording(target)
    assert main(["summary", str(target)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0]


def test_compacted_tables_equal_the_lines_they_came_from(tmp_path: Path) -> None:
    from meshtop.recordings.tables import compact

    write_live_recording(tmp_path / "rec", torn=False)
    before = open_recording(tmp_path / "rec").table("step")
    assert compact(tmp_path / "rec") == ["step"]
    after = open_recording(tmp_path / "rec").table("step")
    pd.testing.assert_frame_equal(before.reset_index(drop=True), after.reset_index(drop=True))


@pytest.mark.parametrize("parquet", [False, True], ids=["json-lines", "parquet"])
def test_integers_that_may_be_missing_stay_exact_integers(tmp_path: Path, parquet: bool) -> None:
    from meshtop.probes.events import CollectiveTiming
    from tests.kit.recordings import write_recording

    wall = 1_764_000_000_123_456_789  # float64 would round this to 256 ns
    ops = [
        CollectiveTiming(
            rank=0,
            step=step,
            op="send",
            group="pp",
            group_size=2,
            peer=peer,
            bytes=8,
            dtype="float32",
            start_ns=wall,
            end_ns=wall + 1,
            clock="completion",
            waited_ns=waited,
        )
        for step, peer, waited in ((None, None, None), (0, 1, 7))
    ]
    recording = open_recording(write_recording(tmp_path / "r", ops, run=description(dp=1), parquet=parquet))
    frame = recording.table("collective")
    assert str(frame.step.dtype) == str(frame.peer.dtype) == str(frame.waited_ns.dtype) == "Int64"
    assert frame.start_ns.dtype == "int64" and frame.start_ns.tolist() == [wall, wall]
    assert frame.peer.tolist()[1] == 1 and frame.peer.isna().tolist() == [True, False]
    assert recording.arrow("collective").column("waited_ns").to_pylist() == [None, 7]


@pytest.mark.slow
def test_a_killed_rank_costs_at_most_its_last_second_of_events(tmp_path: Path) -> None:

    out = tmp_path / "rank-killed"
    done = run_meshtop(
        "record",
        str(out),
        "--dp",
        "2",
        "--steps",
        "500",
        "--device",
        "cpu",
        env={"MESHTOP_FAULT": "kill:1:60"},
        timeout_s=300,
    )
    assert done.returncode == 1
    recording = open_recording(out)
    assert recording.status == "failed" and recording.problems == []
    steps = recording.table("step")
    ends = steps.start_ns + steps.duration_s * 1e9
    # rank 1 died as step 60 began, once rank 0 had finished step 59; rank 0 is stopped moments later, and on a
    # loaded machine it can go before it ships that step: its last recorded step end stands for the moment then
    killed_at = ends[(steps["rank"] == 0) & (steps.step <= 59)].max()
    last_of_killed = ends[steps["rank"] == 1].max()
    assert killed_at - last_of_killed < 1e9
    ranks = {r.rank: r for r in recording.manifest.ranks}
    assert ranks[1].signal == "SIGKILL"


def test_the_writer_keeps_workers_blocks_as_they_came_and_the_reader_drops_what_is_no_event(tmp_path: Path) -> None:
    from meshtop.probes.arrivals import EncodedEvents, encode_lines
    from meshtop.probes.events import EventsDropped, StepTiming
    from meshtop.recordings.events_log import EventWriter
    from meshtop.recordings.tables import read_json_lines

    steps = [StepTiming(rank=1, step=n, start_ns=n, duration_s=0.5, tokens=8, loss=2.0) for n in range(3)]
    foreign = b'{"kind":"collective","rank":1}\n{"kind":"step","rank":1}\n'  # another kind's; a step without fields
    writer = EventWriter(tmp_path)
    writer.write(
        [
            EncodedEvents("step", 1, encode_lines(steps[:2]) + foreign, 4),
            EventsDropped(wall_ns=5, rank=None, where="collector", count=3),
            EncodedEvents("step", 1, encode_lines(steps[2:]), 1),
        ]
    )
    writer.close()
    assert writer.written == 6
    events = tmp_path / "events"
    assert (events / "step.jsonl").read_bytes() == encode_lines(steps[:2]) + foreign + encode_lines(steps[2:])
    table = read_json_lines(events / "step.jsonl", "step")
    assert (table.table.column("step").to_pylist(), table.lost_lines) == ([0, 1, 2], 2)
    dropped = read_json_lines(events / "events_dropped.jsonl", "events_dropped")
    assert (dropped.table.column("count").to_pylist(), dropped.lost_lines) == ([3], 0)


GOOD_STEP = b'{"rank":0,"step":1,"start_ns":5,"duration_s":0.5,"tokens":8,"loss":2.0,"kind":"step"}\n'


@pytest.mark.parametrize(
    ("line", "why"),
    [
        (b'{"rank":true,"step":1,"start_ns":5,"duration_s":0.5,"tokens":8,"loss":2.0}\n', "a bool for an integer"),
        (b'{"rank":1,"step":"3","start_ns":5,"duration_s":0.5,"tokens":8,"loss":2.0}\n', "a string for an integer"),
        (b'{"rank":' + b"1" * 5000 + b',"step":3,"start_ns":5,"duration_s":0.5,"tokens":8,"loss":2.0}\n', "huge"),
        (b'{"rank":99999999999999999999,"step":3,"start_ns":5,"duration_s":0.5,"tokens":8,"loss":2.0}\n', "past int64"),
        (b"[" * 100_000 + b"\n", "nested too deep"),
        (b"[1,2]\n", "not an object"),
        (b'{"rank":1,"step":3,"start_ns":5,"duration_s":0.5,"loss":null}\n', "a required field missing"),
        (
            b'{"rank":1,"step":3,"start_ns":5,"duration_s":0.5,"tokens":8,"loss":2.0,"kind":"collective"}\n',
            "another kind",
        ),
        (b"\xff\xfe not utf-8\n", "not UTF-8"),
        (b'{"rank":0,"step":1,"start_ns":1.5,"duration_s":0.5,"tokens":8,"loss":2.0}\n', "a fraction for an integer"),
        (b'{"rank":0,"step":1,"start_ns":5,"duration_s":true,"tokens":8,"loss":2.0}\n', "a bool for a number"),
        (b'{"rank":0,"step":1,"start_ns":5,"duration_s":NaN,"tokens":8,"loss":2.0}\n', "not a number"),
        (b'{"rank":0,"step":1,"start_ns":5,"duration_s":0.5,"tokens":8,"loss":2.0,"cpu_s":Infinity}\n', "infinite"),
        (
            b'{"rank":0,"step":1,"start_ns":5,"duration_s":0.5,"tokens":8,"phases":"ff","phase_start_ns":[5,null],'
            b'"phase_end_ns":[6,7]}\n',
            "a null among a list's numbers",
        ),
    ],
)
@pytest.mark.parametrize("clean", [1, 20_000], ids=["small block", "big block"])
def test_the_decoder_counts_a_line_that_is_no_event_and_keeps_the_rest(line: bytes, why: str, clean: int) -> None:
    from meshtop.recordings.schema import decode_lines

    decoded = decode_lines("step", GOOD_STEP * clean + line)
    assert (decoded.table.num_rows, decoded.bad) == (clean, 1), why


@pytest.mark.parametrize("clean", [1, 20_000], ids=["small block", "big block"])
@pytest.mark.parametrize("bad_tail", [b"", b"not json\n"], ids=["one call", "line by line"])
def test_a_loss_that_is_not_a_number_is_kept_as_a_measurement(clean: int, bad_tail: bytes) -> None:
    """A diverged step's loss (NaN, or infinite either way) is what the step measured: the step is kept with it,
    whichever parser reads the block; the same value in another float column still makes the line bad."""
    from meshtop.recordings.schema import decode_lines

    diverged = b"".join(
        b'{"rank":0,"step":%d,"start_ns":5,"duration_s":0.5,"tokens":8,"loss":%s,"kind":"step"}\n' % (step, value)
        for step, value in ((2, b"NaN"), (3, b"Infinity"), (4, b"-Infinity"))
    )
    decoded = decode_lines("step", GOOD_STEP * clean + diverged + bad_tail)
    assert (decoded.table.num_rows, decoded.bad) == (clean + 3, 1 if bad_tail else 0)
    losses = decoded.table.column("loss").to_pylist()[-3:]
    assert math.isnan(losses[0]) and losses[1:] == [math.inf, -math.inf]


PHASED_STEP = (
    b'{"rank":0,"step":1,"start_ns":5,"duration_s":0.5,"tokens":8,"loss":2.0,"phases":"fb",'
    b'"phase_start_ns":[5,6],"phase_end_ns":[6,7],"kind":"step"}\n'
)


@pytest.mark.parametrize("clean", [1, 20_000], ids=["small block", "big block"])
def test_a_block_read_without_some_columns_gives_the_same_rows_without_them(clean: int) -> None:
    """A live fold behind reads steps without their phase times: the other columns as a whole read gives them,
    whichever parser reads the block (a bad line sends it to the line-by-line one)."""
    from meshtop.recordings.schema import decode_lines

    without = frozenset({"phase_start_ns", "phase_end_ns"})
    for block in (PHASED_STEP * clean, PHASED_STEP * clean + b"not json\n"):
        whole, partial = decode_lines("step", block), decode_lines("step", block, without)
        assert not without & set(partial.table.column_names) and partial.bad == whole.bad
        assert partial.table == whole.table.drop_columns(list(without))


def test_a_string_that_utf_8_cannot_hold_is_a_bad_line_not_an_error() -> None:
    from meshtop.recordings.schema import decode_lines

    line = b'{"kind":"sampler_error","wall_ns":1,"sampler":"x","message":"\\ud800"}\n'
    good = b'{"kind":"sampler_error","wall_ns":1,"sampler":"x","message":"ok"}\n'
    for block in (good + line, good * 20_000 + line):
        decoded = decode_lines("sampler_error", block)
        assert decoded.bad == 1 and decoded.table.column("message").to_pylist()[-1] == "ok"


def test_a_big_block_with_a_line_longer_than_arrows_block_decodes_whole_and_in_order() -> None:
    from meshtop.recordings.schema import ARROW_JSON_BLOCK, decode_lines

    def line(number: int, message: str) -> bytes:
        return b'{"kind":"sampler_error","wall_ns":%d,"sampler":"x","message":"%s"}\n' % (number, message.encode())

    long = "m" * (2 * ARROW_JSON_BLOCK)  # parsed in threads a block at a time, it straddles two: read again
    block = b"".join(line(n, long if n == 7_000 else "ok") for n in range(20_000))
    decoded = decode_lines("sampler_error", block)
    assert decoded.bad == 0
    assert decoded.table.column("wall_ns").to_pylist() == list(range(20_000))
    assert decoded.table.column("message").to_pylist()[7_000] == long


def test_the_manifest_names_torchs_own_versions_without_importing_torch() -> None:
    """meshtop's own process reads torch's version file as text (importing torch costs it seconds at each start):
    the versions must still be the ones torch reports of itself."""
    probe = (
        "import json, sys; from meshtop.recordings.manifest import software_versions; s = software_versions(); "
        "print(json.dumps([s.torch, s.cuda, 'torch' in sys.modules]))"
    )
    read = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True)
    import torch

    assert json.loads(read.stdout) == [torch.__version__, torch.version.cuda, torch.version.cuda is not None]


def test_a_manifest_keeps_nvml_as_earlier_meshtops_wrote_it() -> None:
    """The shipped sample's manifest, written by an earlier meshtop, reads, and its ``nvml`` writes back the same,
    key order included: the probes' NvmlState the manifest holds keeps only its state, detail, driver version and
    GPU count on disk."""
    written = json.loads((SAMPLE / "manifest.json").read_text())
    manifest = Manifest.from_json(written)
    assert manifest.nvml is not None and manifest.nvml.state == "no_library" and manifest.nvml.gpu_count == 0
    again = json.loads(manifest_bytes(manifest))["nvml"]
    assert list(again.items()) == list(written["nvml"].items())
