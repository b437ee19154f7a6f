"""Inference mode end to end: real jobs serve a load, every plan gives the single process's greedy tokens,
and every request is accounted for."""

from __future__ import annotations

import itertools
import json
import statistics
import subprocess
from dataclasses import replace
from pathlib import Path

import pandas as pd
import pytest
import torch

from meshtop.recordings.manifest import Load
from meshtop.runner.load import arrival_offsets_s, replica_concurrency, replica_share, token_requests
from meshtop.runner.presets import PRESETS
from meshtop.runner.rank.model import Transformer
from meshtop.runner.rank.weights import init_weights
from tests.kit.commands import one_line_error, run_meshtop, summary_json
from tests.kit.reference import greedy_without_cache

LOAD = [
    "--mode",
    "infer",
    "--requests",
    "10",
    "--concurrency",
    "4",
    "--max-batch",
    "3",
    "--prompt-len",
    "3-20",
    "--output-len",
    "1-9",
    "--seed",
    "5",
    "--device",
    "cpu",
]
"""Mixed lengths, more clients than slots: requests wait, slots are reused, batches change every op."""
PLANS = {
    "single": ["--dp", "1"],
    "tp2": ["--dp", "1", "--tp", "2"],
    "pp2": ["--dp", "1", "--pp", "2"],
    "dp2": ["--dp", "2"],
}


def record(out: Path, *argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return run_meshtop("record", str(out), *argv, env=env, timeout_s=300)


def served(recording: Path) -> pd.DataFrame:
    return pd.read_parquet(recording / "events" / "request.parquet").sort_values("request")


@pytest.fixture(scope="module")
def recordings(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("infer")
    paths = {}
    for name, plan in PLANS.items():
        done = record(root / name, *LOAD, *plan)
        assert done.returncode == 0, done.stdout + done.stderr
        paths[name] = root / name
    return paths


@pytest.mark.slow  # launches ranks
def test_every_plan_generates_the_single_process_tokens(recordings: dict[str, Path]) -> None:
    shape = PRESETS["tiny"]
    model = Transformer(shape)
    init_weights(model, model=shape, seed=5, device=torch.device("cpu"))
    load = Load(
        requests=10, concurrency=4, request_rate_per_s=None, prompt_len=(3, 20), output_len=(1, 9), max_batch=3, seed=5
    )
    expected = {
        r.id: greedy_without_cache(model.eval(), r.prompt, r.output_len)
        for r in token_requests(load, vocab_size=shape.vocab_size)
    }
    assert len({len(tokens) for tokens in expected.values()}) > 3, "the load mixes output lengths"
    for name, path in recordings.items():
        table = served(path)
        assert list(table.request) == list(range(10)), name
        assert (table.status == "completed").all(), name
        outputs = {int(r.request): [int(t) for t in r.output_ids] for r in table.itertuples()}
        assert outputs == expected, f"{name} generated other tokens than the single process"


@pytest.mark.slow  # launches ranks
def test_no_rank_leaves_a_collective_unwaited(recordings: dict[str, Path]) -> None:
    """A tp rank that is not the leader never reads its logits; their all-gather must still be waited on,
    or torch warns of unwaited collectives at exit, and gloo could abort the rank there (SIGABRT after
    every request was served)."""
    for name, path in recordings.items():
        assert "unwaited collective" not in (path / "launcher.log").read_text(), name


@pytest.mark.slow  # launches ranks
def test_replicas_share_the_load_round_robin_and_report_requests(recordings: dict[str, Path]) -> None:
    table = served(recordings["dp2"])
    assert dict(zip(table.request, table.replica, strict=False)) == {i: i % 2 for i in range(10)}
    assert set(table["rank"]) == {0, 1}  # each replica's leader reports its own
    for row in table.itertuples():
        times = list(row.token_ns)
        assert len(times) == row.output_tokens == len(row.output_ids)
        assert row.arrival_ns <= row.first_token_ns == times[0] <= times[-1] == row.end_ns
        assert times == sorted(times)
    summary = summary_json(recordings["dp2"])
    requests = summary["requests"]
    assert requests["count"] == requests["completed"] == 10 and requests["failed"] == 0
    for key in ("ttft_s", "tpot_s", "e2e_s"):
        assert 0 < requests[key]["p50"] <= requests[key]["p99"]
    assert requests["output_tokens_per_s"] > requests["request_throughput_per_s"] > 0
    assert summary["run"]["mode"] == "infer"


@pytest.mark.slow  # launches ranks
def test_kv_cache_is_its_own_memory_category(recordings: dict[str, Path]) -> None:
    memory = summary_json(recordings["pp2"])["memory"]
    shape = PRESETS["tiny"]
    # Each stage holds its 2 layers' keys and values: 3 slots x (20 + 9) positions x kv heads x head dim.
    per_layer = 2 * 3 * 29 * shape.n_kv_heads * shape.head_dim * 4
    assert [row["kv_cache_bytes"] for row in memory] == [2 * per_layer, 2 * per_layer]
    assert all(row["grads_bytes"] == 0 and row["optimizer_bytes"] == 0 for row in memory)


@pytest.mark.slow  # launches ranks
def test_pipeline_stages_report_their_wait_in_decode(recordings: dict[str, Path]) -> None:
    steps = pd.read_parquet(recordings["pp2"] / "events" / "step.parquet")
    assert steps.pipeline_wait_s.notna().all()
    for rank, part in steps.groupby("rank"):
        assert (part.pipeline_wait_s <= part.duration_s + 1e-6).all()
        assert part.pipeline_wait_s.sum() > 0, f"stage {rank} never waited on its neighbour"
    actions = pd.read_parquet(recordings["pp2"] / "events" / "stage_action.parquet")
    assert set(actions.action) == {"prefill", "decode"}
    assert actions.groupby("rank").size().nunique() == 1  # both stages ran every op


@pytest.mark.slow  # launches ranks
def test_open_loop_requests_arrive_on_their_poisson_schedule(tmp_path: Path) -> None:
    done = record(
        tmp_path / "open",
        "--mode",
        "infer",
        "--requests",
        "12",
        "--request-rate",
        "40",
        "--output-len",
        "4",
        "--prompt-len",
        "8",
        "--dp",
        "1",
        "--device",
        "cpu",
    )
    assert done.returncode == 0, done.stdout + done.stderr
    table = served(tmp_path / "open")
    load = Load(
        requests=12,
        concurrency=None,
        request_rate_per_s=40.0,
        prompt_len=(8, 8),
        output_len=(4, 4),
        max_batch=16,
        seed=0,
    )
    planned = arrival_offsets_s(load)
    assert planned is not None
    offsets = [(t - table.arrival_ns.iloc[0]) / 1e9 for t in table.arrival_ns]
    assert offsets == pytest.approx([p - planned[0] for p in planned], abs=2e-3)
    assert (table.status == "completed").all()


@pytest.mark.slow  # launches ranks
def test_a_killed_replica_leaves_its_requests_counted_as_not_served(tmp_path: Path) -> None:
    # Killed at its 400th op (of about 960): late enough that both replicas have shipped finished requests
    # (a rank killed within its first shipment interval, 0.25 s, leaves nothing; at op 200 it could be).
    done = record(
        tmp_path / "killed",
        "--mode",
        "infer",
        "--requests",
        "40",
        "--concurrency",
        "2",
        "--output-len",
        "48",
        "--dp",
        "2",
        "--device",
        "cpu",
        env={"MESHTOP_FAULT": "kill:1:400"},
    )
    assert done.returncode == 1, done.stdout + done.stderr
    requests = summary_json(tmp_path / "killed")["requests"]
    assert requests["count"] == 40
    assert 0 < requests["completed"] < 40
    assert requests["completed"] + requests["failed"] == 40
    assert sum(f["count"] for f in requests["failures"]) == requests["failed"]
    assert all("not served" in f["reason"] for f in requests["failures"])


def test_the_load_is_a_function_of_its_options_and_seed() -> None:
    load = Load(
        requests=2000,
        concurrency=None,
        request_rate_per_s=50.0,
        prompt_len=(4, 9),
        output_len=(1, 3),
        max_batch=4,
        seed=11,
    )
    first, again = token_requests(load, vocab_size=256), token_requests(load, vocab_size=256)
    assert first == again
    assert {len(r.prompt) for r in first} == set(range(4, 10)) and {r.output_len for r in first} == {1, 2, 3}
    gaps = [b.offset_s - a.offset_s for a, b in itertools.pairwise(first)]  # type: ignore[operator]
    assert statistics.mean(gaps) == pytest.approx(1 / 50, rel=0.05)  # 2,000 draws: the mean within 5 %
    assert statistics.stdev(gaps) == pytest.approx(1 / 50, rel=0.1)  # exponential: sd equals the mean
    other_lengths = replace(load, prompt_len=(1, 2), output_len=(1, 1))
    assert arrival_offsets_s(other_lengths) == [r.offset_s for r in first]


def test_replicas_split_requests_and_clients() -> None:
    load = Load(
        requests=7, concurrency=5, request_rate_per_s=None, prompt_len=(2, 2), output_len=(1, 1), max_batch=2, seed=0
    )
    requests = token_requests(load, vocab_size=16)
    shares = [replica_share(requests, replica=r, replicas=3) for r in range(3)]
    assert [[q.id for q in share] for share in shares] == [[0, 3, 6], [1, 4], [2, 5]]
    assert [replica_concurrency(load, replica=r, replicas=3) for r in range(3)] == [2, 2, 1]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--mode", "infer", "--fsdp", "--dp", "2"], "--fsdp is a training option: leave it out with --mode infer"),
        (["--mode", "infer", "--steps", "3"], "--steps is a training option"),
        (["--requests", "5"], "--requests is an inference option: add --mode infer"),
        (["--mode", "infer", "--concurrency", "2", "--request-rate", "3"], "exclude each other"),
        (["--mode", "infer", "--dp", "4", "--concurrency", "2"], "use --concurrency 4 or more"),
        (["--mode", "infer", "--prompt-len", "9-3"], "LO at most HI"),
        (["--mode", "infer", "--output-len", "many"], "--output-len takes a number of tokens or a range LO-HI"),
        (["--mode", "infer", "--request-rate", "0"], "--request-rate must be above 0"),
        (["--mode", "infer", "--max-batch", "0"], "--max-batch must be at least 1"),
        (["--mode", "infer", "--prompt-len", "30000", "--output-len", "5000"], "more than 32768"),
    ],
)
def test_bad_inference_options_are_one_line(
    argv: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    line = one_line_error(["record", str(tmp_path / "out"), "--device", "cpu", *argv], capsys)
    assert message in line
    assert not (tmp_path / "out").exists()


@pytest.mark.slow  # launches ranks
def test_the_perfetto_trace_shows_each_request_from_arrival_to_its_last_token(
    recordings: dict[str, Path], tmp_path: Path
) -> None:
    from meshtop.recordings.export import export_perfetto
    from meshtop.recordings.reader import open_recording

    export_perfetto(open_recording(recordings["dp2"]), tmp_path / "trace.json")
    events = [e for e in json.loads((tmp_path / "trace.json").read_text())["traceEvents"] if e.get("cat") == "request"]
    begins = {e["id"]: e for e in events if e["ph"] == "b"}
    ends = {e["id"]: e for e in events if e["ph"] == "e"}
    assert sorted(begins) == sorted(ends) == list(range(10))
    table = served(recordings["dp2"]).set_index("request")
    for ident, begin in begins.items():
        assert begin["pid"] - ends[ident]["pid"] == 0 and begin["pid"] % 2 == ident % 2  # its replica's track
        assert begin["ts"] == pytest.approx(table.arrival_ns[ident] / 1e3)
        assert ends[ident]["ts"] == pytest.approx(table.end_ns[ident] / 1e3) and ends[ident]["ts"] >= begin["ts"]
