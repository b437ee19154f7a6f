"""What blocks a training run (recordings/metrics/blocker.py), worked out by hand: each kind from hand-made
figures at and around the threshold, the fallback without a breakdown, and the blocker in summary, compare
and the dashboard's alerts of the shipped sample (its figures worked out below). Real jobs held by each kind:
tests/runner/test_blocker_in_jobs.py."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

import pytest

from meshtop.recordings.metrics.blocker import MATERIAL_SHARE, SUGGESTIONS, Blocker, blocker_of
from meshtop.recordings.metrics.breakdown import PARTS, Breakdown
from meshtop.recordings.metrics.collectives import CollectiveRow
from meshtop.recordings.metrics.figures import RunFigures
from meshtop.recordings.metrics.mfu import Mfu
from meshtop.recordings.metrics.pipeline import StageRow
from meshtop.recordings.metrics.steps import StepFigures
from meshtop.recordings.samples import INFER_SAMPLE, SAMPLE
from meshtop.tui.alerts import alerts_of
from meshtop.tui.cli import main
from tests.kit.screen import replayed

STEP_S = 0.2
"""Every hand-made run's step: a part's seconds per step are its share x 0.2 s."""
TRY = {
    "fit": "make the most loaded rank fit: shard more (FSDP, a larger tp or pp), a smaller microbatch, activation "
    "checkpointing or a lower precision; `meshtop plan --device-memory` checks a layout before launch",
    "data": "more DataLoader workers (num_workers) and prefetch (prefetch_factor, pin_memory), so that the next "
    "batch is ready when the step asks for it",
    "communication": "overlap it with compute: a larger DDP bucket (bucket_cap_mb) or FSDP's forward and backward "
    "prefetch; or keep the largest group within the fastest links",
    "bubble": "more microbatches, or an interleaved schedule (virtual stages), to fill the pipeline",
    "compute": "nothing to fix in the parallel layout: the step is the model's own work",
}
"""What each kind suggests, in the words a user reads."""


def figures(
    shares: dict[str, float] | None = None,
    *,
    steps: int = 10,
    collectives: tuple[CollectiveRow, ...] = (),
    stages: tuple[StageRow, ...] = (),
) -> RunFigures:
    """A training run's figures of ``steps`` closed steps of :data:`STEP_S`: its breakdown's shares where
    given (the parts not named share nothing), else no breakdown."""
    breakdown = None
    if shares is not None:
        parts = {part: {"share": shares.get(part, 0.0), "s_per_step": shares.get(part, 0.0) * STEP_S} for part in PARTS}
        breakdown = Breakdown(parts=parts, per_rank={}, steps=steps * 2, slowest_in={})
    return RunFigures(
        steps=StepFigures(count=steps, time_s={"p50": STEP_S}, tokens_per_s=None, first_loss=None, last_loss=None),
        collectives=collectives,
        stages=stages,
        memory=(),
        most_loaded_rank=None,
        headroom_bytes=None,
        requests=None,
        mfu=Mfu(value=None, why_not="cpu"),
        stragglers=(),
        breakdown=breakdown,
    )


def collective(group: str, op: str, share: float, per_step_s: float) -> CollectiveRow:
    return CollectiveRow(
        group=group,
        op=op,
        count=10,
        bytes=1 << 20,
        in_flight_total_s=1.0,
        in_flight_p50_s=0.1,
        in_flight_p99_s=0.1,
        busbw_p50_gbps=None,
        busbw_ops=0,
        exposed_per_step_s=per_step_s,
        exposed_share=share,
        exposed_measured=True,
    )


def test_each_kind_suggests_what_to_try() -> None:
    assert SUGGESTIONS == TRY


def test_a_part_beyond_compute_blocks_at_a_tenth_of_the_step_and_not_below() -> None:
    """data 10 % (20.0 ms of 0.2 s), communication 5 %: data blocks; 9.99 %: no part does (compute)."""
    at = blocker_of(figures({"data": 0.10, "communication": 0.05, "forward": 0.85}), {})
    assert at == Blocker(
        kind="data",
        evidence="data 10 % of the step (20.0 ms a step), the largest beyond compute (communication 5 %, bubble 0 %)",
        suggestion=TRY["data"],
    )
    assert MATERIAL_SHARE == 0.10
    below = blocker_of(figures({"data": 0.0999, "communication": 0.05, "forward": 0.8501}), {})
    assert below is not None and below.kind == "compute"
    for part in ("communication", "bubble"):
        assert blocker_of(figures({part: 0.10, "forward": 0.9}), {}).kind == part  # type: ignore[union-attr]
        assert blocker_of(figures({part: 0.0999, "forward": 0.9001}), {}).kind == "compute"  # type: ignore[union-attr]


def test_the_largest_part_beyond_compute_blocks() -> None:
    """communication 30 % (60.0 ms) over bubble 20 % and data 12 %; bubble 25 % over communication 24 %;
    data and communication alike at 20 %: data, the first of the order."""
    found = blocker_of(figures({"data": 0.12, "communication": 0.30, "bubble": 0.20, "backward": 0.38}), {})
    assert found == Blocker(
        kind="communication",
        evidence="communication 30 % of the step (60.0 ms a step), the largest beyond compute (data 12 %, bubble 20 %)",
        suggestion=TRY["communication"],
    )
    bubble = blocker_of(figures({"bubble": 0.25, "communication": 0.24, "forward": 0.51}), {})
    assert bubble is not None and bubble.kind == "bubble"
    assert bubble.evidence.startswith("bubble 25 % of the step (50.0 ms a step)")
    assert bubble.suggestion == TRY["bubble"]
    tie = blocker_of(figures({"data": 0.2, "communication": 0.2, "forward": 0.6}), {})
    assert tie is not None and tie.kind == "data"


def test_compute_when_no_part_beyond_it_is_material() -> None:
    """data 9 %, communication 5 %, no bubble; forward 30 % + backward 40 % + optimizer 10 % = 80 % of 0.2 s
    = 160.0 ms; other 6 % is neither."""
    shares = {"data": 0.09, "communication": 0.05, "forward": 0.3, "backward": 0.4, "optimizer": 0.1, "other": 0.06}
    assert blocker_of(figures(shares), {}) == Blocker(
        kind="compute",
        evidence="data 9 %, communication 5 %, bubble 0 % of the step: each under 10 %; forward, backward and "
        "optimizer 80 % (160.0 ms a step)",
        suggestion=TRY["compute"],
    )


def test_a_rank_out_of_memory_is_fit_before_anything_else() -> None:
    """Two ranks of four out of memory (CUDA's words, torch's exception name): fit, with the first one's
    error, over a breakdown where communication would block; one rank of the CPU allocator's words; and with
    no step at all. Another error is no fit."""
    cuda = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"
    errors = {0: None, 1: "killed", 3: "OutOfMemoryError: boom", 2: cuda}
    found = blocker_of(figures({"communication": 0.5, "forward": 0.5}), errors)
    assert found == Blocker(kind="fit", evidence=f"ranks 2, 3 failed out of memory: {cuda}", suggestion=TRY["fit"])
    cpu = "RuntimeError: DefaultCPUAllocator: can't allocate memory: you tried to allocate 8589934592 bytes"
    one = blocker_of(figures(steps=0), {1: cpu})
    assert one is not None and (one.kind, one.evidence) == ("fit", f"rank 1 failed out of memory: {cpu}")
    hip = blocker_of(figures(steps=0), {0: "RuntimeError: HIP out of memory."})
    assert hip is not None and hip.kind == "fit"
    other = blocker_of(figures({"communication": 0.5, "forward": 0.5}), {1: "RuntimeError: boom", 2: None})
    assert other is not None and other.kind == "communication"


def test_nothing_is_judged_without_a_closed_step_or_a_measure() -> None:
    """No closed step, though a collective ran (its exposed time is decided when a step closes); no
    breakdown, no collectives, no stages."""
    opened = replace(collective("dp", "all_reduce", 0.0, 0.0), exposed_share=None, exposed_per_step_s=None)
    assert blocker_of(figures(steps=0, collectives=(opened,)), {}) is None
    assert blocker_of(figures(), {}) is None


def test_without_a_breakdown_the_collectives_and_stages_judge() -> None:
    """No phases measured: communication is the exposed share outside pp, dp 30 % + tp 5 % = 35 % at 60 + 10
    = 70.0 ms a step (pp's 50 % is the bubble's); bubble the stages' mean, (10 % + 20 %) / 2 = 15 % at (20 +
    40) / 2 = 30.0 ms idle; data not measured."""
    rows = (
        collective("dp", "all_reduce", 0.30, 0.060),
        collective("tp", "all_reduce", 0.05, 0.010),
        collective("pp", "recv", 0.50, 0.100),
    )
    stages = (StageRow(stage=0, busy_s=0.18, idle_s=0.02, bubble_fraction=0.1),)
    stages += (StageRow(stage=1, busy_s=0.16, idle_s=0.04, bubble_fraction=0.2),)
    assert blocker_of(figures(collectives=rows, stages=stages), {}) == Blocker(
        kind="communication",
        evidence="communication 35 % of the step (70.0 ms a step), the largest beyond compute (data not "
        "measured, bubble 15 %)",
        suggestion=TRY["communication"],
    )
    pipeline_only = blocker_of(figures(collectives=rows[2:], stages=stages), {})
    assert pipeline_only == Blocker(
        kind="bubble",
        evidence="bubble 15 % of the step (30.0 ms a step), the largest beyond compute (data not measured, "
        "communication 0 %)",
        suggestion=TRY["bubble"],
    )
    by_share = blocker_of(figures(collectives=(collective("dp", "all_reduce", 0.12, 0.040),), stages=stages), {})
    assert by_share is not None and by_share.kind == "bubble"  # 15 % of 30.0 ms over 12 % of 40.0 ms: by share
    calm = (StageRow(stage=0, busy_s=0.19, idle_s=0.01, bubble_fraction=0.05),)
    assert blocker_of(figures(stages=calm), {}) == Blocker(
        kind="compute",
        evidence="data not measured, communication not measured, bubble 5 % of the step: each under 10 %",
        suggestion=TRY["compute"],
    )


SAMPLE_BLOCKER = {
    "kind": "bubble",
    "evidence": "bubble 25 % of the step (399.1 ms a step), the largest beyond compute (data not measured, "
    "communication 6 %)",
    "suggestion": TRY["bubble"],
}
"""The shipped dp2 x pp2 1F1B sample (4 microbatches; no phases measured): its stages' bubble fractions
0.24960 and 0.25322 give a mean of 0.2514 (the (p - 1) / (m + p - 1) = 1 / 5 = 20 % of balanced stages, and
more), their idle 396.27 and 402.02 ms a mean of 399.1 ms; its one collective outside pp, dp's all_reduce,
is 6.47 % of the step exposed (pp's send and receive, 16 % and 12 %, are the bubble's)."""


def test_summary_of_the_sample_says_the_bubble_blocks_it(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["summary", str(SAMPLE), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["blocker"] == SAMPLE_BLOCKER
    assert main(["summary", str(SAMPLE)]) == 0
    text = capsys.readouterr().out.splitlines()
    at = text.index("blocker: bubble")
    assert text[at + 1 : at + 3] == [f"  {SAMPLE_BLOCKER['evidence']}", f"  try: {SAMPLE_BLOCKER['suggestion']}"]
    assert main(["summary", str(INFER_SAMPLE), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["blocker"]["kind"] == "none"  # test_serving_blocker_by_hand.py


def test_compare_says_when_the_blocker_changed(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The sample against itself: bubble in both; against a copy whose rank 1 failed out of memory: fit in B."""
    assert main(["compare", str(SAMPLE), str(SAMPLE), "--json"]) == 0
    same = json.loads(capsys.readouterr().out)["blocker"]
    assert same == {"a": SAMPLE_BLOCKER, "b": SAMPLE_BLOCKER, "changed": False}
    assert main(["compare", str(SAMPLE), str(SAMPLE)]) == 0
    assert "  blocker: bubble in both" in capsys.readouterr().out.splitlines()
    failed = shutil.copytree(SAMPLE, tmp_path / "failed")
    manifest = json.loads((failed / "manifest.json").read_text())
    error = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"
    manifest["ranks"][1].update(exit_code=1, error=error)
    (failed / "manifest.json").write_text(json.dumps(manifest))
    assert main(["compare", str(SAMPLE), str(failed), "--json"]) == 0
    changed = json.loads(capsys.readouterr().out)["blocker"]
    assert changed["changed"] is True and changed["a"] == SAMPLE_BLOCKER
    assert changed["b"]["kind"] == "fit" and changed["b"]["evidence"] == f"rank 1 failed out of memory: {error}"
    assert main(["compare", str(SAMPLE), str(failed)]) == 0
    lines = capsys.readouterr().out.splitlines()
    at = lines.index("  blocker changed: bubble in A, fit in B")
    assert lines[at + 1] == f"    B: rank 1 failed out of memory: {error}"


def test_the_dashboards_alerts_say_what_blocks_the_sample() -> None:
    texts = [(alert.severity, alert.text) for alert in alerts_of(replayed(SAMPLE))]
    blocker = SAMPLE_BLOCKER
    assert ("info", f"blocker: bubble\n  {blocker['evidence']}\n  try: {blocker['suggestion']}") in texts
