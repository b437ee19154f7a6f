"""``--model-config``: a Hugging Face config.json gives the shape, bad ones are one line, and tied embeddings
are one parameter that every parallel plan trains as one process does."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pandas as pd
import pytest
import torch

from meshtop.probes.events import CollectiveTiming
from meshtop.recordings.manifest import Load
from meshtop.recordings.reader import open_recording
from meshtop.runner.errors import ModelConfigError, PlanError
from meshtop.runner.load import token_requests
from meshtop.runner.model_config import load_model_config
from meshtop.runner.plan import ResolvedRun, RunSpec, resolve
from meshtop.runner.presets import preset
from meshtop.runner.rank.data import synthetic_tokens
from meshtop.runner.rank.model import Transformer, next_token_loss
from meshtop.runner.rank.pipeline import cut_stage
from meshtop.runner.rank.weights import init_weights
from tests.kit.commands import one_line_error, run_meshtop
from tests.kit.jobs import RTOL, LaunchedRun, launch
from tests.kit.reference import greedy_without_cache

LLAMA_3_2_1B = {
    "architectures": ["LlamaForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": 128000,
    "eos_token_id": 128001,
    "head_dim": 64,
    "hidden_act": "silu",
    "hidden_size": 2048,
    "initializer_range": 0.02,
    "intermediate_size": 8192,
    "max_position_embeddings": 131072,
    "mlp_bias": False,
    "model_type": "llama",
    "num_attention_heads": 32,
    "num_hidden_layers": 16,
    "num_key_value_heads": 8,
    "pretraining_tp": 1,
    "rms_norm_eps": 1e-05,
    "rope_scaling": {
        "factor": 32.0,
        "high_freq_factor": 4.0,
        "low_freq_factor": 1.0,
        "original_max_position_embeddings": 8192,
        "rope_type": "llama3",
    },
    "rope_theta": 500000.0,
    "tie_word_embeddings": True,
    "torch_dtype": "bfloat16",
    "transformers_version": "4.45.0.dev0",
    "use_cache": True,
    "vocab_size": 128256,
}
"""meta-llama/Llama-3.2-1B's config.json as published."""

TINY_TIED = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 64,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "intermediate_size": 128,
    "vocab_size": 256,
    "max_position_embeddings": 64,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "tie_word_embeddings": True,
}
"""The ``tiny`` preset's dims, with tied embeddings."""


def write_config(folder: Path, config: dict[str, object]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "config.json"
    path.write_text(json.dumps(config))
    return path


def tied_tiny() -> Transformer:
    shape = replace(preset("tiny"), tie_embeddings=True)
    model = Transformer(shape)
    init_weights(model, model=shape, seed=0, device=torch.device("cpu"))
    return model


def test_a_llama_3_2_1b_config_gives_its_shape_with_the_tied_matrix_counted_once(tmp_path: Path) -> None:
    shape = load_model_config(str(write_config(tmp_path / "Llama-3.2-1B", LLAMA_3_2_1B)))
    assert shape == replace(preset("1b"), name="Llama-3.2-1B", default_seq_len=4096, tie_embeddings=True)
    assert shape.parameter_count() == 1_235_814_400  # what transformers counts for Llama-3.2-1B
    assert shape.norm_eps == 1e-5 and shape.rope_theta == 500000.0


def test_left_out_fields_take_llama_config_defaults_and_a_mistral_is_accepted(tmp_path: Path) -> None:
    config = {
        "model_type": "mistral",
        "hidden_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "intermediate_size": 256,
        "vocab_size": 1000,
        "sliding_window": 4096,
        "head_dim": None,
    }
    shape = load_model_config(str(write_config(tmp_path / "m", config)))
    assert (shape.n_kv_heads, shape.norm_eps, shape.rope_theta) == (4, 1e-6, 10000.0)
    assert (shape.default_seq_len, shape.tie_embeddings) == (2048, False)


@pytest.mark.parametrize(
    ("config", "file", "name"),
    [
        ({"_name_or_path": "meta-llama/Llama-3.2-1B"}, "snapshot/config.json", "Llama-3.2-1B"),
        ({}, "Llama-3.2-1B/config.json", "Llama-3.2-1B"),
        ({}, "configs/my-model.json", "my-model"),
    ],
)
def test_the_shape_is_named_by_the_config_its_folder_or_its_file(
    config: dict[str, object], file: str, name: str, tmp_path: Path
) -> None:
    path = tmp_path / file
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({**TINY_TIED, **config}))
    assert load_model_config(str(path)).name == name


def test_a_folder_is_read_by_its_config_json(tmp_path: Path) -> None:
    write_config(tmp_path / "Llama-3.2-1B", LLAMA_3_2_1B)
    assert load_model_config(str(tmp_path / "Llama-3.2-1B")).name == "Llama-3.2-1B"


def test_a_config_error_is_a_plan_error() -> None:
    assert issubclass(ModelConfigError, PlanError)


BAD_CONFIGS = {
    "not JSON": ("{hidden_size: 64", "is not JSON (line 1"),
    "not an object": ("[1, 2]", "holds a JSON array, not an object"),
    "not UTF-8": (b"\xff\xfe\x00binary", "is not JSON (not UTF-8 text)"),
    "another family": (
        {**TINY_TIED, "model_type": "gpt2", "architectures": ["GPT2LMHeadModel"]},
        "meshtop builds Llama-family decoders (llama, mistral); got model_type 'gpt2', architecture 'GPT2LMHeadModel'",
    ),
    "another architecture": (
        {**TINY_TIED, "architectures": ["LlamaForSequenceClassification"]},
        "got architecture 'LlamaForSequenceClassification'",
    ),
    "no family": (
        {k: v for k, v in TINY_TIED.items() if k not in ("model_type", "architectures")},
        "names no model_type or architectures",
    ),
    "missing field": ({k: v for k, v in TINY_TIED.items() if k != "intermediate_size"}, "has no intermediate_size"),
    "string field": ({**TINY_TIED, "hidden_size": "64"}, 'hidden_size must be a positive integer, got "64"'),
    "zero layers": ({**TINY_TIED, "num_hidden_layers": 0}, "num_hidden_layers must be a positive integer, got 0"),
    "float field": ({**TINY_TIED, "vocab_size": 256.0}, "vocab_size must be a positive integer, got 256.0"),
    "heads do not divide": (
        {**TINY_TIED, "num_attention_heads": 3, "num_key_value_heads": 3},
        "hidden_size 64 is not a multiple of num_attention_heads 3",
    ),
    "kv heads do not divide": (
        {**TINY_TIED, "num_key_value_heads": 3},
        "num_attention_heads 4 is not a multiple of num_key_value_heads 3",
    ),
    "wider heads": ({**TINY_TIED, "head_dim": 32}, "head_dim 32 differs from hidden_size / num_attention_heads = 16"),
    "odd heads": ({**TINY_TIED, "hidden_size": 60, "num_attention_heads": 4}, "are odd"),
    "attention bias": ({**TINY_TIED, "attention_bias": True}, "attention_bias is true, but the built-in model has no"),
    "mlp bias": ({**TINY_TIED, "mlp_bias": True}, "mlp_bias is true"),
    "tie not a flag": ({**TINY_TIED, "tie_word_embeddings": "yes"}, "tie_word_embeddings must be true or false"),
    "negative eps": ({**TINY_TIED, "rms_norm_eps": -1}, "rms_norm_eps must be a number above 0"),
}


@pytest.mark.parametrize(("content", "message"), BAD_CONFIGS.values(), ids=BAD_CONFIGS.keys())
def test_a_bad_config_is_one_line_naming_the_file_and_nothing_is_recorded(
    content: object, message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "bad.json"
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content if isinstance(content, str) else json.dumps(content))
    out = tmp_path / "out"
    line = one_line_error(["record", str(out), "--model-config", str(path), "--device", "cpu"], capsys)
    assert f"--model-config {path}" in line
    assert message in line
    assert not out.exists()


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--model-config", "{missing}"], "no such file: give the path of a Hugging Face style config.json"),
        (["--model-config", "{folder}"], "is a folder without a config.json"),
        (["--model", "1b", "--model-config", "{config}"], "--model 1b and --model-config"),
        (["--model-config", "{config}", "--tp", "3"], "--tp 3 does not divide the 4 attention heads of model tied"),
        (["--model-config", "{config}", "--", "train.py"], "--model-config sets up the built-in model"),
    ],
)
def test_model_config_command_line_errors_are_one_line(
    argv: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = write_config(tmp_path / "tied", TINY_TIED)
    (tmp_path / "empty").mkdir()
    paths = {"missing": tmp_path / "nope.json", "folder": tmp_path / "empty", "config": config}
    out = tmp_path / "out"
    line = one_line_error(["record", str(out), "--device", "cpu", *(a.format(**paths) for a in argv)], capsys)
    assert message in line
    assert not out.exists()


def test_a_tied_model_holds_one_matrix_for_both_ends_through_meta_build_and_init() -> None:
    shape = replace(preset("tiny"), tie_embeddings=True)
    with torch.device("meta"):
        model = Transformer(shape)
    assert model.output.weight is model.tok_embeddings.weight
    assert sum(p.numel() for p in model.parameters()) == shape.parameter_count()
    assert shape.parameter_count() == preset("tiny").parameter_count() - shape.vocab_size * shape.dim
    model.to_empty(device="cpu")
    model.tie_weights()
    init_weights(model, model=shape, seed=0, device=torch.device("cpu"))
    assert model.output.weight is model.tok_embeddings.weight
    untied = Transformer(preset("tiny"))
    init_weights(untied, model=preset("tiny"), seed=0, device=torch.device("cpu"))
    assert torch.equal(model.tok_embeddings.weight, untied.tok_embeddings.weight)


TIE_THROUGH_WRAPPERS = """
from dataclasses import replace
import torch, torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from meshtop.runner.rank.data_parallel import apply_fsdp, apply_replicate
from meshtop.runner.rank.model import Transformer
from meshtop.runner.presets import preset
from meshtop.runner.rank.tensor_parallel import apply_tensor_parallel
from tests.kit.commands import meshtop

dist.init_process_group("gloo", rank=0, world_size=1, store=dist.HashStore())
mesh = init_device_mesh("cpu", (1, 1), mesh_dim_names=("dp", "tp"))
shape = replace(preset("tiny"), tie_embeddings=True)
for tp in (True, False):
    for wrap in (apply_fsdp, apply_replicate, None):
        with torch.device("meta"):
            model = Transformer(shape)
        if tp:
            apply_tensor_parallel(model, tp_mesh=mesh["tp"])
        if wrap is not None:
            wrap(model, dp_mesh=mesh["dp"])
        model.to_empty(device="cpu")  # no tie_weights after it: DTensor parameters are swapped in place
        if tp or wrap is not None:
            assert model.output.weight is model.tok_embeddings.weight, (tp, wrap)
            assert sum(p.numel() for p in model.parameters()) == shape.parameter_count()
        if wrap is not None:  # the root manages the shared matrix once, beside the final norm
            state = model._get_fsdp_state()
            groups = getattr(state, "_fsdp_param_groups", None)  # torch 2.13; 2.11 holds one group or none
            if groups is None:
                groups = [state._fsdp_param_group] if state._fsdp_param_group is not None else []
            assert [len(g.fsdp_params) for g in groups] == [2]
dist.destroy_process_group()
print("tied")
"""


@pytest.mark.slow  # starts a rank (a 1-rank gloo world)
def test_the_tie_survives_tensor_parallelism_fsdp_replicate_and_to_empty() -> None:
    """One DTensor for both ends after ``parallelize_module`` (tied back) and after FSDP2's or replicate's
    sharding and ``to_empty`` (which keep it), in a 1-rank gloo world of its own process."""
    done = subprocess.run([sys.executable, "-c", TIE_THROUGH_WRAPPERS], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "tied"


def test_a_pipelines_last_stage_starts_its_own_copy_as_the_embedding() -> None:
    whole = tied_tiny()
    run = resolve(RunSpec(pp=2, device="cpu"), gpus_visible=0)
    run = replace(run, shape=whole.shape)
    first, last = (cut_stage(whole, run=run, stage_index=s) for s in (0, 1))
    assert first.output is None and last.tok_embeddings is None
    init_weights(last, model=whole.shape, seed=0, device=torch.device("cpu"))
    assert torch.equal(last.output.weight, whole.tok_embeddings.weight)


def test_a_resolved_run_carries_the_configs_shape_to_the_workers(tmp_path: Path) -> None:
    config = write_config(tmp_path / "Llama-3.2-1B", LLAMA_3_2_1B)
    run = resolve(RunSpec(dp=1, model_config=str(config), device="cpu"), gpus_visible=0)
    assert ResolvedRun.from_json(json.loads(json.dumps(run.to_json()))) == run
    model = run.describe().model
    assert model is not None and model.tie_embeddings is True


def test_tying_moves_the_losses_beyond_the_parity_tolerance() -> None:
    """So the parity tests below would see a plan that lost the tie (or a pipeline that did not sum the
    two ends' gradients: about 7e-4 relative at step 2, seen with the all-reduce taken out)."""
    tied = tied_tiny()
    untied = Transformer(preset("tiny"))
    untied.load_state_dict({k: v for k, v in tied.state_dict().items()})  # output starts as the embedding
    losses = []
    for model in (tied, untied):
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.0)
        trace = []
        for step in range(2):
            tokens = synthetic_tokens(step=step, seed=0, batch_size=8, seq_len=64, vocab_size=256)
            loss = next_token_loss(model(tokens[:, :-1]), tokens[:, 1:])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            trace.append(loss.item())
        losses.append(trace)
    assert losses[0][0] == pytest.approx(losses[1][0], rel=1e-6)
    assert abs(losses[0][1] - losses[1][1]) > 20 * RTOL * losses[0][1]


@pytest.mark.slow  # launches ranks
def test_record_writes_the_configs_shape_into_the_manifest(tmp_path: Path) -> None:
    config = write_config(tmp_path / "tied-tiny", TINY_TIED)
    out = tmp_path / "rec"
    done = run_meshtop(
        "record", str(out), "--model-config", str(config), "--dp", "1", "--steps", "1", "--device", "cpu", timeout_s=300
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "model tied-tiny (0.2M params)" in done.stdout
    model = open_recording(out).manifest.run.model
    assert model is not None
    assert (model.name, model.tie_embeddings, model.parameters) == ("tied-tiny", True, 164_416)


STEPS = 4
BATCH = 8
PLANS = {
    "dp2": dict(dp=2),
    "fsdp2": dict(dp=2, fsdp=True),
    "tp2": dict(tp=2),
    "pp2-1f1b": dict(pp=2, schedule="1f1b", microbatches=4),
    "tp2-pp2": dict(tp=2, pp=2, microbatches=2),
}


@pytest.fixture(scope="module")
def tied_config(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_config(tmp_path_factory.mktemp("config") / "tied-tiny", TINY_TIED)


@pytest.fixture(scope="module")
def tied_single_process(tied_config: Path, tmp_path_factory: pytest.TempPathFactory) -> LaunchedRun:
    return launch(tmp_path_factory.mktemp("single"), dp=1, steps=STEPS, batch_size=BATCH, model_config=str(tied_config))


@pytest.mark.slow
@pytest.mark.parametrize("plan", PLANS.values(), ids=PLANS.keys())
def test_tied_parallel_losses_match_one_process(
    plan: dict[str, object], tied_config: Path, tied_single_process: LaunchedRun, tmp_path: Path
) -> None:
    """Tensor parallelism shares one DTensor between the ends, FSDP2 and DDP one parameter, and a pipeline
    sums the gradients of its two copies: each gives the single process's losses."""
    assert tied_single_process.result.status == "completed", tied_single_process.result
    assert tied_single_process.started[0].local_parameters == tied_single_process.run.shape.parameter_count()
    parallel = launch(tmp_path, steps=STEPS, batch_size=BATCH, model_config=str(tied_config), **plan)
    assert parallel.result.status == "completed", parallel.result
    assert len(parallel.losses) == STEPS
    assert parallel.losses == pytest.approx(tied_single_process.losses, rel=RTOL)
    shape, run = parallel.run.shape, parallel.run
    local = sum(started.local_parameters for started in parallel.started)
    if run.plan.pp > 1:  # each end holds its own copy of the matrix, summed over each (dp, tp) pair of ends
        sums = [e for e in parallel.events if isinstance(e, CollectiveTiming) and e.group == "embedding"]
        ends = 2 * run.plan.dp * run.plan.tp
        assert len(sums) == STEPS * ends
        assert {(e.op, e.bytes) for e in sums} == {("all_reduce", shape.vocab_size * shape.dim * 4 // run.plan.tp)}
        assert local == run.plan.dp * (
            shape.parameter_count()
            + shape.vocab_size * shape.dim
            + (2 * shape.n_layers + 1) * shape.dim * (run.plan.tp - 1)
        )
    elif run.plan.fsdp:
        assert local == shape.parameter_count()


INFER = [
    "--mode",
    "infer",
    "--requests",
    "6",
    "--concurrency",
    "3",
    "--max-batch",
    "3",
    "--prompt-len",
    "3-12",
    "--output-len",
    "2-6",
    "--seed",
    "5",
    "--device",
    "cpu",
]


@pytest.mark.slow
@pytest.mark.parametrize("plan", [["--pp", "2"], ["--tp", "2"]], ids=["pp2", "tp2"])
def test_tied_inference_generates_the_single_process_tokens(plan: list[str], tied_config: Path, tmp_path: Path) -> None:
    """Serving ties too: a pipeline's last stage starts its output as the embedding, tensor parallelism
    shares the DTensor."""
    out = tmp_path / "rec"
    done = run_meshtop(
        "record", str(out), "--model-config", str(tied_config), "--dp", "1", *INFER, *plan, timeout_s=300
    )
    assert done.returncode == 0, done.stdout + done.stderr
    model = tied_tiny()
    init_weights(model, model=model.shape, seed=5, device=torch.device("cpu"))
    load = Load(
        requests=6, concurrency=3, request_rate_per_s=None, prompt_len=(3, 12), output_len=(2, 6), max_batch=3, seed=5
    )
    expected = {
        r.id: greedy_without_cache(model.eval(), r.prompt, r.output_len)
        for r in token_requests(load, vocab_size=model.shape.vocab_size)
    }
    table = pd.read_parquet(out / "events" / "request.parquet")
    assert {int(r.request): [int(t) for t in r.output_ids] for r in table.itertuples()} == expected
