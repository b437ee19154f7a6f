"""The capacity sweep against a real ``transformers serve`` on the CPU (tests/kit/hf_server.py's tiny random
Llama, served without continuous batching), started and stopped by meshtop: two settings of the server command
(the model of 2 layers and the same with 16, some 3 times slower) over rates doubling from 4 to 64, then
``--rates auto`` over the slower one. Run under ``flock /tmp/meshtop-serve.lock`` (one server at a time here).

A random model answers some prompts with byte tokens that are no text on their own (a part of a UTF-8
character): a stream of them shows no first token, and the request misses its TTFT objective for that alone.
Both models suppress those tokens (``suppress_tokens`` of their generation config), so every answer streams
text and the SLO (TTFT within 1 s, met by 90 % of the requests) is missed only by waiting."""

from __future__ import annotations

import json
import math
import re
import sys
from pathlib import Path

import psutil
import pytest

from meshtop.recordings.capacity import capacity_report
from meshtop.recordings.reader import open_recording
from meshtop.recordings.summary import fold_recording, recording_blocker
from meshtop.runner.planner.capacity import RESOLUTION
from meshtop.tui.cli import main
from tests.kit.hf_server import build_tiny_model, needs_serving

pytestmark = [pytest.mark.slow, needs_serving]

SERVE = [sys.executable, "-c", "from transformers.cli.transformers import main; main()", "serve"]
OPTIONS = ["--host", "127.0.0.1", "--port", "{port}", "--device", "cpu"]
LOAD = ["--slo", "ttft=1s", "--attainment", "0.9", "--duration", "3", "--output-len", "8", "--burstiness", "50"]


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``layers-2``, the tiny model, and ``layers-16``, the same with 14 more layers (seeded), both suppressing
    the tokens that decode to no text."""
    import torch
    from transformers import LlamaForCausalLM, PreTrainedTokenizerFast

    root = tmp_path_factory.mktemp("models")
    small = build_tiny_model(root / "layers-2")
    tokenizer = PreTrainedTokenizerFast.from_pretrained(small)
    silent = [
        token
        for token in range(len(tokenizer))
        if tokenizer.decode([token], skip_special_tokens=True) in ("", "\ufffd")
    ]
    torch.manual_seed(0)
    LlamaForCausalLM.from_pretrained(small, num_hidden_layers=16).save_pretrained(root / "layers-16")
    tokenizer.save_pretrained(root / "layers-16")
    for model in ("layers-2", "layers-16"):
        path = root / model / "generation_config.json"
        path.write_text(json.dumps({**json.loads(path.read_text()), "suppress_tokens": silent}))
    return root


@pytest.fixture(autouse=True)
def offline(monkeypatch: pytest.MonkeyPatch) -> None:
    """One torch thread for the server (a core left to the load generator), the model local."""
    for name, value in (("OMP_NUM_THREADS", "1"), ("HF_HUB_OFFLINE", "1"), ("HF_HUB_DISABLE_UPDATE_CHECK", "1")):
        monkeypatch.setenv(name, value)


def servers_left(output: str) -> list[psutil.Process]:
    ports = set(re.findall(r"starting server \d+: .* --port (\d+)", output))
    assert ports, output
    return [
        process
        for process in psutil.process_iter(["cmdline"])
        if "serve" in (process.info["cmdline"] or []) and ports & set(process.info["cmdline"] or [])
    ]


def test_two_settings_ranked_by_capacity_and_auto_within_a_tenth(
    models: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "vary"
    code = main(
        ["sweep", str(out), "--endpoint", "http://127.0.0.1:{port}", "--rates", "4,8,16,32,64",
         "--vary", "layers=2,16", *LOAD, "--", *SERVE, f"{models}/layers-{{layers}}", *OPTIONS]
    )  # fmt: skip
    output = capsys.readouterr().out
    assert code == 0, output
    report = capacity_report(out)
    rows = {row["config"]: row for row in report["capacity"]}
    fast, slow = rows["layers=2"], rows["layers=16"]
    assert [row["config"] for row in report["capacity"]] == ["layers=2", "layers=16"], report["capacity"]
    assert slow["requests_per_s"] > 0 and fast["requests_per_s"] > slow["requests_per_s"]
    for row in (fast, slow):
        above = next(
            run
            for run in report["runs"]
            if run["config"] == row["config"] and run["rate"] > row["requests_per_s"] and run["status"] == "completed"
        )
        assert not above["passed"] and (not above["met"] or above["saturated"]), above
        recording = open_recording(out / above["recording"])  # the run above capacity, in its own recording
        blocker = recording_blocker(recording, fold_recording(recording))
        assert blocker is not None and blocker.kind == "queue", (above, blocker)
        assert row["limited_by"] == "queue"
    assert not servers_left(output)

    auto = tmp_path / "auto"
    code = main(
        ["sweep", str(auto), "--endpoint", "http://127.0.0.1:{port}", "--start-rate", "2", *LOAD,
         "--", *SERVE, f"{models}/layers-16", *OPTIONS]
    )  # fmt: skip
    output = capsys.readouterr().out
    assert code == 0, output
    found = capacity_report(auto)
    (row,) = found["capacity"]
    rates = [run["rate"] for run in found["runs"]]
    passed = [run["rate"] for run in found["runs"] if run["passed"]]
    failed = [run["rate"] for run in found["runs"] if not run["passed"] and run["rate"] > row["requests_per_s"]]
    fixed = f"fixed: {fast['requests_per_s']} and {slow['requests_per_s']} req/s"
    print(f"{fixed}; auto: {row['requests_per_s']} req/s in {len(rates)} runs: {rates}", file=sys.stderr)
    # resolved to within a tenth, and the fixed rates' capacity of the same server (its bracket: a pass at c, a
    # failure at 2 c) agrees with it, give or take a tenth for the run-to-run spread
    assert row["requests_per_s"] == max(passed) and (min(failed) - max(passed)) / max(passed) <= RESOLUTION
    assert (
        slow["requests_per_s"] * (1 - RESOLUTION)
        <= row["requests_per_s"]
        < 2 * slow["requests_per_s"] * (1 + RESOLUTION)
    )
    tenth_by_tenth = math.ceil(math.log(row["requests_per_s"] / 2) / math.log(1 + RESOLUTION)) + 1
    assert len(rates) < tenth_by_tenth  # fewer runs than a list rising by 10 % from 2 would take to reach it
    assert not servers_left(output)
