"""``OUT/sweep.json`` read typed, as the manifest is: a file the sweep writes reads back field by field, and a
field unknown, of the wrong type or missing, or another version, is refused in one line that names it."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from meshtop.recordings.sweep import SWEEP_FILE, SWEEP_VERSION, read_sweep, write_sweep
from meshtop.recordings.typed_json import RecordingError
from meshtop.runner.plan import RunSpec
from meshtop.runner.planner.plans import Question, candidates
from meshtop.runner.planner.report import Budget, report
from meshtop.runner.planner.sweep import entries


def written_sweep(out: Path) -> dict[str, Any]:
    """The ``sweep.json`` ``meshtop sweep`` writes before its first plan runs, for 4 ranks of the tiny model with
    80 GiB of device memory (built from the planner's own report and entries, as the sweep builds it)."""
    question = Question(base=RunSpec(model="tiny", device="cpu"), ranks=4, gpus=False, with_fsdp=True, plans=())
    found = candidates(question)
    budget = Budget(device_memory_bytes=80 << 30)
    sweep = {
        "version": SWEEP_VERSION,
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "command_line": ["sweep", str(out), "--ranks", "4"],
        "report": report(question, found, budget),
        "plans": entries(question, found, budget),
    }
    out.mkdir()
    write_sweep(out, sweep)
    return json.loads((out / SWEEP_FILE).read_text())


def test_a_written_sweep_reads_back_typed(tmp_path: Path) -> None:
    data = written_sweep(tmp_path / "sweep")
    sweep = read_sweep(tmp_path / "sweep")
    assert sweep.command_line == ("sweep", str(tmp_path / "sweep"), "--ranks", "4")
    assert [(plan.key, plan.status) for plan in sweep.plans] == [(row["key"], row["status"]) for row in data["plans"]]
    assert ("tp4", "cannot run") in [(plan.key, plan.status) for plan in sweep.plans]  # tiny has 2 kv heads
    assert sweep.report.model is not None and sweep.report.model.name == "tiny" and sweep.report.ranks == 4
    predicted = {plan.key: plan for plan in sweep.report.plans}
    assert not predicted["tp4"].runs and predicted["tp4"].peak is None
    pp4, raw = predicted["pp4"], next(row for row in data["report"]["plans"] if row["key"] == "pp4")
    assert pp4.runs and (pp4.pp, pp4.microbatches, pp4.in_flight) == (4, raw["microbatches"], tuple(raw["in_flight"]))
    assert pp4.peak is not None and pp4.peak.total_bytes == raw["peak"]["total_bytes"]
    assert [rank.rank for rank in pp4.ranks] == [0, 1, 2, 3]
    assert {(t.rank, t.group, t.op, t.bytes) for t in pp4.traffic} == {
        (t["rank"], t["group"], t["op"], t["bytes"]) for t in raw["traffic"]
    }
    assert pp4.fits is True and pp4.headroom_bytes == (80 << 30) - raw["peak"]["total_bytes"]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda d: d["plans"][0].update(colour="red"), "unknown field plans[0].colour"),
        (lambda d: d["report"].update(ranks="four"), "report.ranks must be an integer, not 'four'"),
        (lambda d: d["plans"][1].pop("status"), "field plans[1].status is missing"),
        (lambda d: d["report"]["plans"][0]["peak"].update(total_bytes=1.5), "must be an integer, not 1.5"),
        (lambda d: d.update(version=SWEEP_VERSION + 1), f"has sweep version {SWEEP_VERSION + 1}"),
        (lambda d: d["report"]["plans"][0].pop("peak"), "runs, but its prediction is missing"),
    ],
)
def test_a_sweep_file_not_this_meshtops_is_refused_in_one_line(tmp_path: Path, change: Any, message: str) -> None:
    data = written_sweep(tmp_path / "sweep")
    assert data["report"]["plans"][0]["runs"]
    change(data)
    (tmp_path / "sweep" / SWEEP_FILE).write_text(json.dumps(data))
    with pytest.raises(RecordingError) as refused:
        read_sweep(tmp_path / "sweep")
    assert message in str(refused.value) and "\n" not in str(refused.value)
    assert str(refused.value).startswith(str(tmp_path / "sweep" / SWEEP_FILE))


def test_a_folder_without_a_sweep_file_is_not_a_sweep(tmp_path: Path) -> None:
    with pytest.raises(RecordingError, match="is not a sweep"):
        read_sweep(tmp_path)
