"""What blocks a training run: the one limit to lift before any other tuning, with the figures that show it
and what to try.

The rule, over a run's figures (:class:`~meshtop.recordings.metrics.figures.RunFigures`) and its ranks'
errors, the first that holds:

1. **fit**: a rank failed out of memory (its error matches :data:`OUT_OF_MEMORY`). Nothing else matters
   while the job does not fit. The planner's prediction is no part of a recording (``meshtop plan
   --device-memory`` says before launch whether a layout fits, and a sweep runs only the plans that fit),
   so a recording's fit rests on what its ranks ran into.
2. No closed step: nothing to judge (``None``).
3. Of the step's parts **beyond compute** (compute: forward + backward + optimizer, the model's own work),
   in :data:`BEYOND_COMPUTE` order: **data** (waiting for the next batch), **communication** (exposed: what
   the ranks waited in collectives, not what overlapped compute) and **bubble** (a pipelined rank idle
   between its stage actions), the one of the largest share of the step (of equal shares, the first) is
   the blocker where its share is at least :data:`MATERIAL_SHARE`; else **compute**: none of them is worth
   a change of layout.

   The shares are the step breakdown's (:mod:`~meshtop.recordings.metrics.breakdown`: every rank's closed
   steps, each moment of a step in one part). Where no rank measured its phases (a script not
   instrumented for phases, ``--no-instrument``) there is no breakdown, and the rule falls back to what
   the run still measured: where the probes saw collectives, communication is the exposed share of those
   outside the pipeline group (:func:`~meshtop.recordings.metrics.collectives.communication_share` of the
   rows whose group is not ``pp``, 0 where there are none: a pipeline's sends and receives are its bubble,
   as in the breakdown), at their mean exposed seconds per step summed; bubble is the run's mean bubble
   (:func:`~meshtop.recordings.metrics.pipeline.mean_bubble`: of the schedule's span, the step less its
   optimizer, so a little above its share of the whole step), at the stages' mean idle seconds per step;
   data is not measured and is left out. Where none of the three is known (no collectives, no stages and
   no breakdown), there is nothing to judge (``None``).

The evidence says the blocker's share of the step and its seconds per step, and the other parts'
shares beside it: ``bubble 25 % of the step (399.1 ms a step), the largest beyond compute (data not
measured, communication 6 %)``. Serving runs (a run with requests) are not judged by this rule: ``None``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from meshtop.recordings.metrics.collectives import communication_share
from meshtop.recordings.metrics.figures import RunFigures
from meshtop.recordings.metrics.pipeline import mean_bubble

MATERIAL_SHARE = 0.10
"""A part beyond compute blocks the run where it takes at least this share of the step: a tenth of the step
is what a change of layout (more loader workers, a larger bucket, more microbatches) can win back at best,
and below it the run-to-run spread of a step on a shared machine is of the same size, so a change would
not show."""
OUT_OF_MEMORY = re.compile(r"out of memory|OutOfMemoryError|can't allocate memory")
"""A rank's error that says it ran out of memory: CUDA's ``CUDA out of memory. Tried to allocate ...``,
torch's exception ``torch.OutOfMemoryError`` by name, and the CPU allocator's ``DefaultCPUAllocator: can't
allocate memory``."""
BEYOND_COMPUTE = ("data", "communication", "bubble")
"""The step's parts that are not the model's own work, in the order a tie is broken: the breakdown's
order."""
COMPUTE = ("forward", "backward", "optimizer")
"""The model's own work."""
SUGGESTIONS = {
    "fit": "make the most loaded rank fit: shard more (FSDP, a larger tp or pp), a smaller microbatch, "
    "activation checkpointing or a lower precision; `meshtop plan --device-memory` checks a layout before launch",
    "data": "more DataLoader workers (num_workers) and prefetch (prefetch_factor, pin_memory), so that the next "
    "batch is ready when the step asks for it",
    "communication": "overlap it with compute: a larger DDP bucket (bucket_cap_mb) or FSDP's forward and backward "
    "prefetch; or keep the largest group within the fastest links",
    "bubble": "more microbatches, or an interleaved schedule (virtual stages), to fill the pipeline",
    "compute": "nothing to fix in the parallel layout: the step is the model's own work",
}
"""What to try, per kind."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Blocker:
    """What blocks a run, the figures that show it, and what to try."""

    kind: str
    """fit, data, communication, bubble or compute."""
    evidence: str
    suggestion: str

    def to_json(self) -> dict[str, str]:
        return {"kind": self.kind, "evidence": self.evidence, "suggestion": self.suggestion}


Part = tuple[float, float]
"""A part's share of the step and its seconds per step."""


def blocker_of(figures: RunFigures, errors: Mapping[int, str | None]) -> Blocker | None:
    """What blocks the run of ``figures`` by the module's rule (``errors``: each rank's error, where it
    failed); ``None`` where the rule judges nothing."""
    if figures.requests is not None:
        return None
    out_of_memory = sorted(rank for rank, error in errors.items() if error and OUT_OF_MEMORY.search(error))
    if out_of_memory:
        first = out_of_memory[0]
        ranks = ", ".join(map(str, out_of_memory))
        evidence = f"rank{'s' * (len(out_of_memory) > 1)} {ranks} failed out of memory: {errors[first]}"
        return Blocker(kind="fit", evidence=evidence, suggestion=SUGGESTIONS["fit"])
    if not figures.steps.count:
        return None
    parts = step_parts(figures)
    if not parts:
        return None
    kind = max(parts, key=lambda part: parts[part][0])
    share, seconds = parts[kind]
    if share < MATERIAL_SHARE:
        return Blocker(kind="compute", evidence=compute_evidence(figures, parts), suggestion=SUGGESTIONS["compute"])
    others = ", ".join(part_words(part, parts) for part in BEYOND_COMPUTE if part != kind)
    evidence = f"{kind} {percent(share)} of the step{per_step(seconds)}, the largest beyond compute ({others})"
    return Blocker(kind=kind, evidence=evidence, suggestion=SUGGESTIONS[kind])


def step_parts(figures: RunFigures) -> dict[str, Part]:
    """The known parts beyond compute (of :data:`BEYOND_COMPUTE`): the breakdown's, else the fallback of the
    module's rule."""
    breakdown = figures.breakdown
    if breakdown is not None:
        return {part: (breakdown.parts[part]["share"], breakdown.parts[part]["s_per_step"]) for part in BEYOND_COMPUTE}
    parts: dict[str, Part] = {}
    if figures.collectives:
        outside = [row for row in figures.collectives if row.group != "pp"]
        exposed = [row.exposed_per_step_s for row in outside if row.exposed_per_step_s is not None]
        parts["communication"] = (communication_share(outside) or 0.0, sum(exposed))
    if (bubble := mean_bubble(figures.stages)) is not None:
        parts["bubble"] = (bubble, sum(row.idle_s for row in figures.stages) / len(figures.stages))
    return parts


def compute_evidence(figures: RunFigures, parts: Mapping[str, Part]) -> str:
    """``data 2 %, communication 5 %, bubble 0 % of the step: each under 10 %; forward, backward and optimizer
    85 % (212.0 ms a step)`` (the compute part where the breakdown has it)."""
    said = ", ".join(part_words(part, parts) for part in BEYOND_COMPUTE)
    evidence = f"{said} of the step: each under {percent(MATERIAL_SHARE)}"
    breakdown = figures.breakdown
    if breakdown is not None:
        share = sum(breakdown.parts[part]["share"] for part in COMPUTE)
        seconds = sum(breakdown.parts[part]["s_per_step"] for part in COMPUTE)
        evidence += f"; forward, backward and optimizer {percent(share)}{per_step(seconds)}"
    return evidence


def part_words(part: str, parts: Mapping[str, Part]) -> str:
    """``communication 6 %``, or ``data not measured``."""
    return f"{part} {percent(parts[part][0])}" if part in parts else f"{part} not measured"


def percent(share: float) -> str:
    """``25 %`` (a share, rounded to a whole percent)."""
    return f"{share:.0%}".replace("%", " %")


def per_step(seconds: float) -> str:
    """`` (399.1 ms a step)``."""
    return f" ({seconds * 1e3:.1f} ms a step)"
