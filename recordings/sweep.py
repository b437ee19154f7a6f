"""A sweep: one ordinary recording per plan under one folder, the planner's predictions beside them, and the
table that ranks the plans on what was measured and says how far each prediction was.

On disk: ``OUT/sweep.json`` (what was asked, the planner's report with every prediction, and each plan's
status and recording), read typed as the manifest is (:func:`read_sweep`: :class:`SweepFile`), and
``OUT/<plan>/``, a recording ``summary``, ``compare`` and ``replay`` read as any other. The ranking is
computed from those files whenever it is asked for, so an interrupted sweep ranks the plans that finished.

Each measured figure is the metrics core's: a rank's **accounted bytes** and the **peak** a plan is checked
against (:mod:`meshtop.recordings.metrics.memory`: the allocator's peak of the most loaded rank on CUDA, the
largest accounted bytes on CPU), the **traffic** per (rank, group, op) of the last step every rank completed
and the **communication share** (:mod:`meshtop.recordings.metrics.collectives`), the **mean bubble**
(:mod:`meshtop.recordings.metrics.pipeline`, predicted as (p - 1) / (v m + p - 1)). A sweep runs 3 steps or
more, since step 0 holds FSDP's lazy initialisation and step 1 DDP's bucket rebuild. Defined here: the
**prediction error**, (measured - predicted) / predicted of a plan's figure.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from meshtop.recordings.metrics.collectives import communication_share, last_full_step, step_traffic
from meshtop.recordings.metrics.memory import CATEGORIES, accounted_bytes, plan_peak
from meshtop.recordings.metrics.pipeline import mean_bubble, theoretical_bubble
from meshtop.recordings.predictions import PlanPrediction, PlanReport
from meshtop.recordings.reader import open_recording
from meshtop.recordings.summary import fold_recording, job_status
from meshtop.recordings.typed_json import RecordingError, dump, read_versioned

SWEEP_FILE = "sweep.json"
SWEEP_VERSION = 1


def is_sweep(path: Path) -> bool:
    return (path / SWEEP_FILE).is_file()


def write_sweep(out: Path, sweep: dict[str, Any], name: str = SWEEP_FILE) -> None:
    """Replace ``OUT/sweep.json`` (or ``OUT/name``: a capacity sweep's) whole (a reader sees the old file or the
    new one, never half of one)."""
    temporary = out / f".{name}.tmp"
    temporary.write_text(json.dumps(sweep, indent=1))
    os.replace(temporary, out / name)


@dataclass(frozen=True, kw_only=True, slots=True)
class PlanEntry:
    """What became of one plan of the sweep (``sweep.json``'s ``plans``)."""

    key: str
    """The plan's key (``dp2xpp2``): its recording's folder, and its row in the report."""
    status: str
    """pending, running, completed, failed, interrupted, not run, skipped or cannot run."""
    reason: str | None
    recording: str | None
    """Its recording's folder under the sweep's (``None`` before it ran)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class SweepFile:
    """``OUT/sweep.json``: what was asked, the planner's report, and what became of each plan."""

    version: int
    started_at: str
    command_line: tuple[str, ...]
    report: PlanReport
    plans: tuple[PlanEntry, ...]


def read_sweep(out: Path) -> SweepFile:
    """``OUT/sweep.json``, typed; a :class:`RecordingError` (one line) where it is missing, unreadable, of another
    version, or holds a field this meshtop does not know, one of the wrong type or a required one missing."""
    missing = f"{out} is not a sweep (no {SWEEP_FILE})"
    return read_versioned(out / SWEEP_FILE, SweepFile, version=SWEEP_VERSION, what="sweep", missing=missing)


def measure(directory: Path) -> dict[str, Any]:
    """The measured figures of one plan's recording (each defined in the metrics core)."""
    recording = open_recording(directory)
    figures = fold_recording(recording).figures()
    memory = {
        row.rank: {key: getattr(row, key) for key in CATEGORIES}
        | {"peak_bytes": row.peak_bytes, "accounted_bytes": accounted_bytes(row)}
        for row in figures.memory
    }
    cuda = recording.manifest.run.device == "cuda"
    peak = plan_peak(figures.memory, cuda=cuda)
    step = last_full_step(figures.steps.count)
    traffic: dict[tuple[int, str, str], tuple[int, int]] = {}
    if step is not None and "collective" in recording.kinds():
        traffic = step_traffic(recording.arrow("collective"), step)
    requests = figures.requests
    served: dict[str, float | None] = dict.fromkeys(("ttft_p50_s", "tpot_p50_s", "requests_per_s", "goodput_per_s"))
    if requests is not None:
        throughput = requests.request_throughput_per_s
        served = {
            "ttft_p50_s": requests.latencies["ttft_s"]["p50"],
            "tpot_p50_s": requests.latencies["tpot_s"]["p50"],
            "requests_per_s": throughput,
            "goodput_per_s": throughput if requests.goodput_per_s is None else requests.goodput_per_s,
        }
    return {
        "status": job_status(recording),
        "tokens_per_s": figures.steps.tokens_per_s,
        "step_s": figures.steps.time_s.get("p50"),
        "steps": figures.steps.count,
        "last_loss": figures.steps.last_loss,
        "memory": {str(rank): row for rank, row in sorted(memory.items())},
        "peak_rank": peak.rank if peak is not None else None,
        "peak_bytes": peak.bytes if peak is not None else None,
        "peak_kind": "allocator" if cuda else "accounted",
        "comm_share": communication_share(figures.collectives),
        "bubble": mean_bubble(figures.stages),
        "traffic_step": step if traffic else None,
        "traffic": [
            {"rank": rank, "group": group, "op": op, "bytes": nbytes, "count": count}
            for (rank, group, op), (nbytes, count) in sorted(traffic.items())
        ],
        **served,
        "problems": recording.problems,
    }


def error(measured: float | None, predicted: float | None) -> float | None:
    """(measured - predicted) / predicted; ``None`` where either is missing or the prediction is 0."""
    if measured is None or predicted is None or predicted == 0:
        return None
    return (measured - predicted) / predicted


def compare_prediction(predicted: PlanPrediction, measured: dict[str, Any]) -> dict[str, Any]:
    """Each predicted figure beside its measurement: the most loaded rank's categories, the step's traffic
    summed over ranks (and whether every (rank, group, op) matched exactly, bytes and count of operations),
    the bubble."""
    assert predicted.peak is not None and predicted.pp is not None  # a plan that runs (PlanPrediction says so)
    rank = measured["peak_rank"]
    predicted_rank = next((row for row in predicted.ranks if row.rank == rank), predicted.peak)
    measured_rank = measured["memory"].get(str(rank), {})
    errors: dict[str, Any] = {}
    for key in CATEGORIES:
        errors[key] = error(measured_rank.get(key), getattr(predicted_rank, key))
    errors["peak_bytes"] = error(measured["peak_bytes"], predicted.peak.total_bytes)
    if measured["traffic_step"] is not None:
        want = {(t.rank, t.group, t.op): (t.bytes, t.count) for t in predicted.traffic}
        got = {(t["rank"], t["group"], t["op"]): (t["bytes"], t.get("count")) for t in measured["traffic"]}
        errors["traffic_bytes"] = error(sum(b for b, _ in got.values()), sum(b for b, _ in want.values()))
        errors["traffic_exact"] = want == got
    else:
        errors["traffic_bytes"], errors["traffic_exact"] = None, None
    bubble = (
        theoretical_bubble(predicted.pp, predicted.microbatches, predicted.virtual_stages)
        if predicted.pp > 1 and predicted.schedule is not None and predicted.microbatches is not None
        else None
    )  # training pipelines
    errors["bubble_predicted"] = bubble
    errors["bubble"] = (measured["bubble"] - bubble) if bubble is not None and measured["bubble"] is not None else None
    return errors


def ranking(out: Path) -> dict[str, Any]:
    """Every plan of the sweep at ``out`` with its measured figures and prediction errors, best first:
    training by tokens/s, serving by goodput (completed requests/s within the SLOs; every completed request
    where no SLO was given). Plans that failed, did not run or were left out follow, with the reason."""
    sweep = read_sweep(out)
    predictions = {row.key: row for row in sweep.report.plans}
    rows = []
    for entry in sweep.plans:
        row: dict[str, Any] = {
            "key": entry.key,
            "status": entry.status,
            "reason": entry.reason,
            "recording": entry.recording,
            "predicted": None,
            "measured": None,
            "errors": None,
        }
        predicted = predictions.get(entry.key)
        if predicted is not None and predicted.runs and predicted.peak is not None:
            row["predicted"] = {
                "peak_bytes": predicted.peak.total_bytes,
                "peak_rank": predicted.peak_rank,
                "label": predicted.label,
            }
        directory = out / entry.recording if entry.recording else None
        if directory is not None and directory.is_dir() and entry.status in ("completed", "failed", "interrupted"):
            try:
                row["measured"] = measure(directory)
            except RecordingError as problem:
                row["reason"] = row["reason"] or str(problem)
            else:
                if predicted is not None and predicted.runs:
                    row["errors"] = compare_prediction(predicted, row["measured"])
        rows.append(row)
    infer = sweep.report.mode == "infer"
    key = "goodput_per_s" if infer else "tokens_per_s"

    def score(row: dict[str, Any]) -> tuple[int, float]:
        measured = row["measured"]
        value = measured.get(key) if measured is not None and row["status"] == "completed" else None
        return (0, -value) if value is not None else (1, 0.0)

    ranked = sorted(rows, key=score)
    for place, row in enumerate(ranked, 1):
        row["rank"] = place if score(row)[0] == 0 else None
    return {
        "sweep": str(out),
        "mode": sweep.report.mode,
        "ranked_by": key,
        "model": dump(sweep.report.model),
        "ranks": sweep.report.ranks,
        "device": sweep.report.device,
        "plans": ranked,
    }
