"""The planner's arithmetic and ``meshtop plan``: every plan listed (or refused with the runner's reason), the
parameter shards adding up to the model, placement warnings, and a plan of an 8B model without torch."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from meshtop.runner.errors import PlanError
from meshtop.runner.plan import RunSpec, resolve
from meshtop.runner.planner.plans import (
    Prediction,
    Question,
    candidates,
    check_counts,
    chunk_rows,
    factorizations,
    in_flight,
    layer_activation_bytes,
    parse_plan_key,
    plan_key,
    predict,
)
from meshtop.runner.planner.report import Budget, check_budget, parse_size, placement, report
from meshtop.runner.presets import PRESETS
from tests.kit.commands import one_line_error, run_meshtop

REPO = Path(__file__).resolve().parents[2]


def question(ranks: int = 4, model: str = "tiny", plans: tuple[str, ...] = ()) -> Question:
    return Question(base=RunSpec(model=model, device="cpu"), ranks=ranks, gpus=False, with_fsdp=True, plans=plans)


def test_every_factorization_is_listed_once_and_refused_plans_say_why() -> None:
    assert sorted(factorizations(4)) == [(1, 1, 4), (1, 2, 2), (1, 4, 1), (2, 1, 2), (2, 2, 1), (4, 1, 1)]
    found = {c.label: c for c in candidates(question())}
    assert set(found) == {"dp4", "fsdp4", "dp2xpp2", "fsdp2xpp2", "pp4", "dp2xtp2", "fsdp2xtp2", "tp2xpp2", "tp4"}
    assert found["tp4"].prediction is None  # tiny has 2 key/value heads
    assert "--tp 4 does not divide the 2 key/value heads" in (found["tp4"].reason or "")
    assert all(c.prediction is not None for key, c in found.items() if key != "tp4")


def test_the_shards_of_every_plan_add_up_to_the_model() -> None:
    shape = PRESETS["small"]
    for candidate in candidates(question(model="small")):
        assert candidate.prediction is not None
        run = candidate.prediction.run
        weights = sum(m.weights_bytes for m in candidate.prediction.memory) // 4  # fp32
        copies = run.plan.dp // (run.plan.dp if run.plan.fsdp else 1)  # replicas hold a copy each; fsdp shards hold one
        norms = 2 * shape.dim * shape.n_layers + shape.dim  # replicated over tp
        assert weights == copies * (shape.parameter_count() + (run.plan.tp - 1) * norms), candidate.label


def test_fsdp_shards_rows_as_torch_chunk_does() -> None:
    assert [chunk_rows(10, 4, i) for i in range(4)] == [3, 3, 3, 1]
    assert [chunk_rows(2, 4, i) for i in range(4)] == [1, 1, 0, 0]


def test_pipeline_stages_hold_the_microbatches_their_schedule_keeps_in_flight() -> None:
    def run_of(schedule: str, m: int):  # type: ignore[no-untyped-def]
        found = candidates(
            Question(
                base=RunSpec(model="small", device="cpu", schedule=schedule, microbatches=m),
                ranks=4,
                gpus=False,
                plans=("pp4",),
            )
        )
        assert found[0].prediction is not None
        return found[0].prediction.run

    assert [len(in_flight(run_of("gpipe", 8), r)) for r in range(4)] == [8, 8, 8, 8]
    assert [len(in_flight(run_of("1f1b", 8), r)) for r in range(4)] == [4, 3, 2, 1]
    assert [len(in_flight(run_of("gpipe", 4), r)) for r in range(4)] == [4, 4, 4, 4]
    interleaved = run_of("interleaved-1f1b", 8)
    # torch's warm-up: (v - 1) x 4 + 2 x (3 - rank), plus the steady state's first forward
    assert [len(in_flight(interleaved, r)) for r in range(4)] == [11, 9, 7, 5]


def test_a_tied_model_in_a_pipeline_sums_its_two_embedding_copies() -> None:
    from dataclasses import replace as change

    from meshtop.runner.planner.plans import rank_traffic

    tied = change(PRESETS["tiny"], tie_embeddings=True)
    found = candidates(question(plans=("dp2xpp2",)))
    assert found[0].prediction is not None
    run = change(found[0].prediction.run, shape=tied)
    embedding = [t for rank in range(4) for t in rank_traffic(run, rank) if t.group == "embedding"]
    assert [(t.rank, t.op, t.bytes) for t in embedding] == [(r, "all_reduce", 256 * 64 * 4) for r in range(4)]
    untied = [t for rank in range(4) for t in rank_traffic(found[0].prediction.run, rank) if t.group == "embedding"]
    assert untied == []


def test_plan_keys_round_trip_and_bad_ones_are_refused() -> None:
    for dp, tp, pp, fsdp in [(4, 1, 1, False), (2, 2, 1, True), (1, 2, 2, False), (1, 1, 1, False)]:
        assert parse_plan_key(plan_key(dp, tp, pp, fsdp)) == (dp, tp, pp, fsdp)
    for bad in ("dp2+tp2", "dp2xdp2", "tp0", "fsdp1xtp4"):
        with pytest.raises(PlanError, match=f"--plans entry '{re.escape(bad)}'"):
            parse_plan_key(bad)
    assert parse_size("80GiB") == 80 << 30 and parse_size("80GB") == 80 * 10**9 and parse_size("1024") == 1024


def test_tp_across_nodes_or_without_nvlink_is_warned_about() -> None:
    found = candidates(
        Question(base=RunSpec(model="small", device="cuda"), ranks=4, gpus=True, plans=("tp4", "dp2xtp2"))
    )
    tp4, dp2xtp2 = (c.prediction.run for c in found if c.prediction is not None)
    across = placement(tp4, ranks_per_node=2)
    assert across.groups["tp"] == [[0, 1, 2, 3]] and "spans nodes 0, 1" in across.warnings[0]
    assert placement(dp2xtp2, ranks_per_node=2).warnings == []  # tp pairs stay inside a node
    slow = placement(dp2xtp2, ranks_per_node=4, slow_pairs=[(3, 2)])
    assert slow.groups == {"dp": [[0, 2], [1, 3]], "tp": [[0, 1], [2, 3]]}
    assert slow.warnings == ["tp group {2,3}: GPUs 2 and 3 have no NVLink between them"]


def test_the_report_says_what_fits_and_the_headroom() -> None:
    q = Question(base=RunSpec(model="8b", device="cuda"), ranks=8, gpus=True)
    result = report(q, candidates(q), Budget(device_memory_bytes=80 << 30))
    rows = {row["key"]: row for row in result["plans"]}
    assert rows["dp8"]["fits"] is False and rows["pp8"]["fits"] is True
    assert rows["pp8"]["headroom_bytes"] == (80 << 30) - rows["pp8"]["peak"]["total_bytes"]
    # 8B in bf16 replicated: weights 2 bytes, gradients 2, AdamW's two moments 4, per parameter
    assert rows["dp8"]["peak"]["weights_bytes"] == 2 * PRESETS["8b"].parameter_count()
    assert rows["dp8"]["step_bytes"] == {"dp all_reduce": 8 * 2 * PRESETS["8b"].parameter_count()}


def test_serving_plans_hold_the_kv_cache_of_their_layers() -> None:
    q = Question(
        base=RunSpec(model="small", device="cpu", mode="infer", max_batch=4, prompt_len="16", output_len="16"),
        ranks=2,
        gpus=False,
    )
    predictions = {c.label: c.prediction for c in candidates(q) if c.prediction is not None}
    shape = PRESETS["small"]
    per_layer = 2 * 4 * 32 * shape.n_kv_heads * shape.head_dim * 4
    assert predictions["dp2"].memory[0].kv_cache_bytes == per_layer * shape.n_layers
    assert predictions["tp2"].memory[0].kv_cache_bytes == per_layer * shape.n_layers // 2
    assert predictions["pp2"].memory[0].kv_cache_bytes == per_layer * shape.n_layers // 2
    assert predictions["dp2"].memory[0].grads_bytes == 0 and predictions["dp2"].traffic == ()


def test_plan_of_an_8b_model_on_8_gpus_prints_a_table_without_torch() -> None:
    code = (
        "import sys; from meshtop.tui.cli import main; code = main(['plan', '--model', '8b', '--gpus', '8', "
        "'--device-memory', '80GiB']); assert 'torch' not in sys.modules, 'torch was imported'; sys.exit(code)"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("model 8b (8.03 B parameters, 32 layers), train, bf16, 8 GPUs")
    assert any(line.startswith("pp8 ") and " yes " in line for line in lines)
    assert any(line.startswith("dp8 ") and " NO " in line for line in lines)


def test_plan_json_holds_every_rank_and_collective() -> None:
    done = run_meshtop("plan", "--ranks", "4", "--model", "tiny", "--json", cwd=REPO, timeout_s=60)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    dp2xtp2 = next(row for row in result["plans"] if row["key"] == "dp2xtp2")
    assert [row["rank"] for row in dp2xtp2["ranks"]] == [0, 1, 2, 3]
    assert {(t["group"], t["op"]) for t in dp2xtp2["traffic"]} == {
        ("dp", "all_reduce"),
        ("tp", "all_reduce"),
        ("tp", "all_gather"),
    }


@pytest.mark.parametrize(
    "argv, message",
    [
        (["plan", "--ranks", "4", "--device-memory", "lots"], "--device-memory 'lots': give a size such as 80GiB"),
        (["plan", "--ranks", "0"], "--ranks must be at least 1"),
        (["plan", "--ranks", "4", "--plans", "dp2"], "--plans dp2: dp x tp x pp = 2, not the 4 ranks asked for"),
        (["plan", "--ranks", "4", "--plans", "dp2*tp2"], "write each degree once, as dp2 (or fsdp2), tp2, pp2"),
        (["plan", "--ranks", "4", "--plans", "dp4,dp4"], "--plans names dp4 twice: give each plan once"),
        (["plan", "--ranks", "1", "--model-config", "/no/such/config.json"], "/no/such/config.json"),
        (["plan", "--ranks", "2", "--device-memory", "0.5"], "give a size such as 80GiB"),
        (["plan", "--ranks", "4", "--model", "huge"], "unknown model preset 'huge'"),
        (["plan", "--gpus", "2", "--ranks", "2"], "not allowed with argument"),
        (["plan", "--ranks", "2", "--mode", "infer", "--microbatches", "2"], "--microbatches is a training option"),
    ],
)
def test_bad_plan_questions_get_one_line_and_exit_code_2(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert message in one_line_error(argv, capsys)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--ranks", "0"], "--ranks must be at least 1, got 0"),
        (["--gpus", "-1"], "--gpus must be at least 1, got -1"),
        (["--ranks", "4", "--gpus-per-node", "0"], "--gpus-per-node must be at least 1, got 0"),
        (["--ranks", "4", "--busbw", "0"], "--busbw must be above 0"),
        (["--ranks", "4", "--busbw", "10", "--tflops", "-3"], "--tflops must be above 0"),
        (["--ranks", "4", "--tflops", "100"], "give --busbw too"),
        (["--ranks", "4", "--mode", "infer", "--busbw", "10"], "leave them out with --mode infer"),
    ],
)
def test_a_plan_question_out_of_range_is_refused_in_one_line(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert message in one_line_error(["plan", *argv], capsys)


def test_the_planners_checks_refuse_what_the_cli_would_without_it() -> None:
    """The checks live in the planner (runner/planner), so a caller other than the CLI gets them too."""
    check_counts(gpus=None, ranks=4, gpus_per_node=None)
    with pytest.raises(PlanError, match="--ranks must be at least 1, got 0"):
        check_counts(gpus=None, ranks=0, gpus_per_node=None)
    check_budget(Budget(busbw_bytes_per_s=1e10, flops_per_s=1e14), mode="train")
    check_budget(Budget(), mode="infer")
    with pytest.raises(PlanError, match="give --busbw too"):
        check_budget(Budget(flops_per_s=1e14), mode="train")
    with pytest.raises(PlanError, match="--busbw must be above 0"):
        check_budget(Budget(busbw_bytes_per_s=float("inf")), mode="train")


def test_each_recipe_changes_the_states_activations_and_traffic_by_its_own_rule() -> None:
    """By hand for tiny on dp2 (h 64, a 4, f 128, 256 tokens a rank): mixed precision keeps bf16 weights and
    gradients and 4 + 8 bytes a parameter in the optimizer (FSDP2: fp32 shards, bf16 gathers, fp32
    reduce-scatters); checkpointing keeps a block's input (full) or swaps the feed-forward for its input
    (selective), and holds one block's recomputation."""

    def predicted(**spec: object) -> Prediction:
        spec = {"model": "tiny", "dp": 2, "device": "cpu", "batch_size": 8, **spec}
        return predict(resolve(RunSpec(**spec), gpus_visible=0))  # type: ignore[arg-type]

    n = PRESETS["tiny"].parameter_count()
    tensors = 3 + 9 * 4  # embedding, final norm, output; 9 a block
    fp32, bf16, mixed = predicted(), predicted(precision="bf16"), predicted(precision="mixed")
    assert fp32.memory[0].optimizer_bytes == 8 * n + 4 * tensors
    assert (mixed.memory[0].weights_bytes, mixed.memory[0].grads_bytes) == (2 * n, 2 * n)
    assert mixed.memory[0].optimizer_bytes == 12 * n + 4 * tensors
    assert mixed.memory[0].activations_bytes == bf16.memory[0].activations_bytes
    assert mixed.step_bytes() == bf16.step_bytes() == {("dp", "all_reduce"): 2 * 2 * n}
    sharded, sharded_fp32 = predicted(precision="mixed", fsdp=True), predicted(fsdp=True)
    states = ("weights_bytes", "grads_bytes", "optimizer_bytes")
    assert [getattr(sharded.memory[0], key) for key in states] == [
        getattr(sharded_fp32.memory[0], key) for key in states
    ]
    gathers, scatters = ("dp", "all_gather"), ("dp", "reduce_scatter")
    assert sharded.step_bytes()[gathers] * 2 == sharded_fp32.step_bytes()[gathers]  # gathered in bf16
    assert sharded.step_bytes()[scatters] == sharded_fp32.step_bytes()[scatters]  # reduced in fp32
    tokens, h, e = 4 * 64, 64, 4
    block = layer_activation_bytes(fp32.run, 4)
    norm, mlp = 3 * h * e + 4, 4 * 128 * e
    full, selective = predicted(checkpoint="full").memory[0], predicted(checkpoint="selective").memory[0]
    assert fp32.memory[0].activations_bytes - full.activations_bytes == 4 * (block - tokens * h * e)
    assert fp32.memory[0].activations_bytes - selective.activations_bytes == 4 * tokens * (norm + mlp - h * e)
    assert (full.recompute_bytes, selective.recompute_bytes) == (block, tokens * (norm + mlp))
    assert full.fit_bytes == full.total_bytes + block and fp32.memory[0].recompute_bytes == 0
