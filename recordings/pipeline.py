"""Pipeline stage analysis: busy, idle and bubble per pipeline rank and step.

For each step, the pipeline's span is the slowest pipeline rank's forward +
backward time (the schedule's step; the optimizer is not part of the
pipeline). A rank's busy time is the sum of its stage actions in that step;
its idle time is the span minus that, and its bubble fraction idle / span.
Copies of a stage (its dp and tp ranks) are averaged. For balanced stages,
GPipe and 1F1B give (p - 1) / (m + p - 1).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable

import pandas as pd

from probes.events import Event
from recordings.tables import columns_of

STAGE_COLUMNS = ["step", "pp_rank", "busy_s", "idle_s", "span_s", "bubble_fraction"]


def frames(events: Iterable[Event]) -> dict[str, pd.DataFrame]:
    """In-memory events as the tables a recording would hold."""
    records: dict[str, list[dict[str, object]]] = defaultdict(list)
    for event in events:
        record = event.to_record()
        records[record.pop("kind")].append(record)
    return {kind: pd.DataFrame.from_records(rows, columns=columns_of(kind)) for kind, rows in records.items()}


def stage_table(actions: pd.DataFrame, steps: pd.DataFrame, started: pd.DataFrame) -> pd.DataFrame:
    """One row per (step, pipeline rank): busy, idle, span and bubble fraction."""
    if actions.empty or steps.empty or started.empty:
        return pd.DataFrame(columns=STAGE_COLUMNS)
    actions = actions.dropna(subset=["step"]).assign(seconds=lambda t: (t.end_ns - t.start_ns) / 1e9)
    busy = actions.groupby(["rank", "step"], as_index=False)["seconds"].sum()
    busy = busy.merge(started[["rank", "pp_rank"]], on="rank")
    per_stage = busy.groupby(["step", "pp_rank"], as_index=False)["seconds"].mean().rename(columns={"seconds": "busy_s"})
    span = steps.dropna(subset=["forward_backward_s"]).groupby("step", as_index=False)["forward_backward_s"].max()
    table = per_stage.merge(span.rename(columns={"forward_backward_s": "span_s"}), on="step")
    table["span_s"] = table[["span_s", "busy_s"]].max(axis=1)
    table["idle_s"] = table.span_s - table.busy_s
    table["bubble_fraction"] = (table.idle_s / table.span_s).where(table.span_s > 0, 0.0)
    return table[STAGE_COLUMNS].astype({"step": int, "pp_rank": int})


def theoretical_bubble(p: int, m: int, virtual_stages: int = 1) -> float:
    """(p - 1) / (v m + p - 1): the idle share of a balanced GPipe / 1F1B (v = 1) or interleaved step."""
    return (p - 1) / (virtual_stages * m + p - 1)
