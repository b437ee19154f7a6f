"""``meshtop sweep OUT``: run each plan that fits for a short window with the same load, one recording each.

The loop is ordinary ``record`` sessions under one folder, with ``OUT/sweep.json``
(:mod:`meshtop.recordings.sweep`) rewritten after every plan: a plan that fails is a row with its error and the
sweep goes on; an interrupt keeps the finished plans, marks the one it cut and those that did not run.
"""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path
from typing import Any, TextIO

from meshtop.probes.errors import MeshtopError
from meshtop.recordings.manifest import new_recording
from meshtop.recordings.sweep import SWEEP_VERSION, write_sweep
from meshtop.runner.errors import PlanError
from meshtop.runner.job.supervise import NodeProbes
from meshtop.runner.planner.plans import SWEEP_STEPS, Candidate, Question
from meshtop.runner.planner.report import Budget, misfit, report
from meshtop.runner.session.console import follow_job, verdict
from meshtop.runner.session.session import BuiltinWork, SessionOptions, start_recording

MIN_SWEEP_STEPS = 3


def entries(question: Question, found: list[Candidate], budget: Budget) -> list[dict[str, Any]]:
    """What the sweep will do with each plan: run it, or say why not (cannot run, or predicted not to fit)."""
    rows = []
    for candidate in found:
        row: dict[str, Any] = {"key": candidate.label, "status": "pending", "reason": None, "recording": None}
        prediction = candidate.prediction
        if prediction is None:
            row.update(status="cannot run", reason=candidate.reason)
        elif not question.plans and (reason := misfit(prediction, budget.device_memory_bytes)) is not None:
            row.update(status="skipped", reason=reason)
        rows.append(row)
    return rows


def run_sweep(
    question: Question,
    found: list[Candidate],
    budget: Budget,
    *,
    out: Path,
    stream: TextIO,
    command_line: list[str],
    node_probes: NodeProbes = NodeProbes(),
    hang_timeout_s: float | None = None,
) -> str:
    """Run the sweep into the new directory ``out``; its status: completed (every plan that was to run
    completed) or failed (one or more failed). An interrupt is re-raised as ``KeyboardInterrupt`` once
    ``sweep.json`` says which plan it cut and which did not run."""
    plans = entries(question, found, budget)
    todo = [row for row in plans if row["status"] == "pending"]
    if not todo:
        reasons = "; ".join(f"{row['key']}: {row['reason']}" for row in plans)
        raise PlanError(f"no plan to run ({reasons})")
    new_recording(out, command="sweep")
    sweep = {
        "version": SWEEP_VERSION,
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "command_line": command_line,
        "report": report(question, found, budget),
        "plans": plans,
    }
    write_sweep(out, sweep)
    runs = {candidate.label: candidate.prediction.run for candidate in found if candidate.prediction is not None}
    failed = False
    for index, row in enumerate(todo, 1):
        try:
            run = runs[row["key"]]
            print(f"\n[{index}/{len(todo)}] {row['key']}: {run.plan.label}", file=stream, flush=True)
            row.update(status="running", recording=row["key"])
            write_sweep(out, sweep)
            directory = out / row["key"]
            work = BuiltinWork(run)
            manifest = start_recording(directory, work, node_probes, command_line)
            result = follow_job(
                work,
                session_dir=directory,
                out=stream,
                manifest=manifest,
                options=SessionOptions(node_probes=node_probes, hang_timeout_s=hang_timeout_s),
            )
            if result.status == "interrupted":  # Ctrl-C (or SIGTERM) reached meshtop while the job ran
                raise KeyboardInterrupt
            row["status"] = result.status
            if result.status != "completed":
                failed = True
                row["reason"] = "; ".join(line.strip() for line in verdict(result, None))
        except KeyboardInterrupt:
            row.update(status="interrupted", reason="the sweep was interrupted during this plan")
            for later in todo[index:]:
                later.update(status="not run", reason="the sweep was interrupted before this plan")
            write_sweep(out, sweep)
            raise
        except MeshtopError as error:
            row.update(status="failed", reason=str(error))
            failed = True
        write_sweep(out, sweep)
    return "failed" if failed else "completed"


def sweep_question(question: Question, *, steps: int | None) -> Question:
    """The question with the sweep's window: ``steps`` (default :data:`SWEEP_STEPS`), and training's
    activations measured so that each prediction is checked."""
    base = question.base
    if steps is not None and steps < MIN_SWEEP_STEPS:
        raise PlanError(
            f"--steps {steps}: a sweep checks each plan on its last step, and steps 0 and 1 hold "
            f"one-off work (FSDP's lazy initialisation, DDP's bucket rebuild): give --steps "
            f"{MIN_SWEEP_STEPS} or more"
        )
    if base.mode == "train":
        base = replace(base, steps=steps or SWEEP_STEPS, activations=base.instrument)
    return replace(question, base=base)
