"""Plans are checked before launch: defaults, and one clear line for every bad plan."""

from __future__ import annotations

import pytest

from meshtop.runner.errors import PlanError
from meshtop.runner.plan import RunSpec, resolve, split_layers
from meshtop.tui.cli import main
from tests.kit.commands import one_line_error, run_meshtop

# The bad plans tried, and what meshtop answers (exit code 2, one line, no traceback).
BAD_PLANS = [
    (["--dp", "0"], "--dp must be at least 1, got 0"),
    (["--tp", "-2"], "--tp must be at least 1"),
    (["--pp", "0"], "--pp must be at least 1"),
    (["--steps", "0"], "--steps must be at least 1"),
    (["--batch-size", "-8"], "--batch-size must be at least 1"),
    (["--seq-len", "0"], "--seq-len must be at least 1"),
    (["--seed", "-1"], "--seed must be 0 or more"),
    (["--dp", "two"], "argument --dp: invalid int value: 'two'"),
    (["--schedule", "zigzag", "--pp", "2"], "argument --schedule: invalid choice: 'zigzag'"),
    (["--dtype", "fp8"], "argument --dtype: invalid choice: 'fp8'"),
    (["--model", "70b"], "unknown model preset '70b': use --model with one of tiny"),
    (["--device", "cuda"], "--device cuda asked for but no CUDA GPU is visible: use --device cpu or auto"),
    (["--tp", "3"], "--tp 3 does not divide the 4 attention heads of model tiny"),
    (["--tp", "4"], "--tp 4 does not divide the 2 key/value heads of model tiny"),
    (["--model", "125m", "--tp", "5"], "--tp 5 does not divide the 12 attention heads"),
    (["--pp", "8"], "model tiny has 4 layers, fewer than the 8 pipeline stages: lower --pp"),
    (
        ["--pp", "4", "--schedule", "interleaved-1f1b"],
        "fewer than the 8 pipeline stages (2 per rank for interleaved-1f1b)",
    ),
    (
        ["--pp", "2", "--microbatches", "1"],
        "--schedule 1f1b needs at least one microbatch per stage: use --microbatches 2",
    ),
    (
        ["--pp", "2", "--schedule", "interleaved-1f1b", "--microbatches", "3"],
        "--schedule interleaved-1f1b needs --microbatches a multiple of --pp 2",
    ),
    (["--schedule", "gpipe"], "--schedule gpipe orders pipeline stages: it needs --pp 2 or more"),
    (["--microbatches", "4"], "--microbatches splits the batch between pipeline stages: it needs --pp 2"),
    (["--batch-size", "7"], "--batch-size 7 cannot be split evenly into dp 2 replicas: use a multiple of 2"),
    (
        ["--pp", "2", "--microbatches", "4", "--batch-size", "6"],
        "--batch-size 6 cannot be split evenly into dp 1 x 4 microbatches: use a multiple of 4",
    ),
    (["--fsdp", "--dp", "1"], "--fsdp shards over the data-parallel ranks: give --dp 2 or more"),
    (["--dp", "65"], "65 CPU ranks: lower the degrees to at most 64 ranks"),
    (
        ["--model", "125m", "--model-config", "config.json"],
        "--model 125m and --model-config config.json each name the model: give one of them",
    ),
    (["--activations", "--no-instrument"], "--activations needs the hooks: leave out --no-instrument"),
    (["--precision", "fp16"], "argument --precision: invalid choice: 'fp16'"),
    (["--checkpoint", "some"], "argument --checkpoint: invalid choice: 'some'"),
    (
        ["--precision", "mixed", "--dtype", "bf16"],
        "--dtype bf16 and --precision mixed both name the training's number format: give --precision alone",
    ),
    (["--mode", "infer", "--precision", "mixed"], "--precision is a training option: leave it out with --mode infer"),
    (["--mode", "infer", "--checkpoint", "full"], "--checkpoint is a training option: leave it out with --mode infer"),
]


@pytest.mark.parametrize(("argv", "message"), BAD_PLANS, ids=[" ".join(a) for a, _ in BAD_PLANS])
def test_bad_plan_is_one_line_and_exit_2(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("meshtop.tui.options.gpus_visible", lambda: 0)
    assert message in one_line_error(["run", *argv], capsys)


def test_bad_plan_from_the_shell_has_no_traceback() -> None:
    done = run_meshtop("run", "--tp", "3", timeout_s=120)
    assert done.returncode == 2
    assert "Traceback" not in done.stderr
    assert done.stderr.count("\n") == 1


def test_record_refuses_a_directory_that_holds_files(tmp_path, capsys) -> None:
    (tmp_path / "keep.txt").write_text("precious")
    code = main(["record", str(tmp_path), "--device", "cpu"])
    assert code == 2
    assert "is not empty" in capsys.readouterr().err
    assert (tmp_path / "keep.txt").read_text() == "precious"


def test_resolve_refuses_two_models_and_activations_without_hooks_for_any_caller() -> None:
    """The plan owns these checks (the command line only maps options to a spec): a spec built in code, and
    the planner's question, are refused with the command line's words."""
    from meshtop.runner.planner.plans import Question, candidates

    both = RunSpec(model="125m", model_config="config.json")  # refused before the file is read: none exists
    named = "--model 125m and --model-config config.json each name the model: give one of them"
    with pytest.raises(PlanError) as refused:
        resolve(both, gpus_visible=0)
    assert str(refused.value) == named
    with pytest.raises(PlanError) as refused:
        candidates(Question(base=both, ranks=4, gpus=False))
    assert str(refused.value) == named
    with pytest.raises(PlanError) as refused:
        resolve(RunSpec(activations=True, instrument=False), gpus_visible=0)
    assert str(refused.value) == "--activations needs the hooks: leave out --no-instrument"
    assert resolve(RunSpec(activations=True), gpus_visible=0).activations
    assert resolve(RunSpec(model="125m"), gpus_visible=0).shape.name == "125m"


def test_cuda_plan_needs_one_gpu_per_rank() -> None:
    with pytest.raises(PlanError, match=r"= 4 ranks but 2 GPU\(s\) are visible: .* at most 2"):
        resolve(RunSpec(dp=2, tp=2, device="cuda"), gpus_visible=2)


def test_defaults_fill_the_devices() -> None:
    cpu = resolve(RunSpec(), gpus_visible=0)
    assert (cpu.device, cpu.plan.dp, cpu.plan.world_size, cpu.dtype) == ("cpu", 2, 2, "fp32")
    gpu = resolve(RunSpec(), gpus_visible=4)
    assert (gpu.device, gpu.plan.dp, gpu.plan.world_size, gpu.dtype) == ("cuda", 4, 4, "bf16")
    assert resolve(RunSpec(tp=2), gpus_visible=0).plan.dp == 1
    assert resolve(RunSpec(device="cpu"), gpus_visible=8).device == "cpu"


def test_pipeline_defaults() -> None:
    run = resolve(RunSpec(pp=2), gpus_visible=0)
    assert (run.plan.schedule, run.microbatches, run.plan.virtual_stages) == ("1f1b", 4, 1)
    assert run.batch_size % (run.plan.dp * run.microbatches) == 0
    assert run.plan.stage_layers == ((0, 1), (2, 3))
    interleaved = resolve(RunSpec(pp=2, schedule="interleaved-1f1b"), gpus_visible=0)
    assert interleaved.plan.num_stages == 4
    assert interleaved.plan.stage_layers == ((0,), (1,), (2,), (3,))


def test_split_layers_is_contiguous_and_even() -> None:
    assert split_layers(7, 3) == ((0, 1, 2), (3, 4), (5, 6))
    stages = split_layers(32, 8)
    assert [layer for stage in stages for layer in stage] == list(range(32))
    assert {len(stage) for stage in stages} == {4}


def test_resolved_run_survives_json() -> None:
    from meshtop.runner.plan import ResolvedRun

    run = resolve(RunSpec(dp=2, tp=2, pp=2, schedule="gpipe", seed=7), gpus_visible=0)
    assert ResolvedRun.from_json(run.to_json()) == run
