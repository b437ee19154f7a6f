"""A recording's summary: its run, how it ended, and every figure of the metrics core, as plain data.

This is the JSON of ``meshtop summary --json``; its keys are listed in
docs/recordings.md.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict
from typing import Any

from meshtop.probes.kinds import FOLDED_KINDS
from meshtop.recordings.metrics.blocker import Blocker, blocker_of
from meshtop.recordings.metrics.memory import MemoryRow
from meshtop.recordings.metrics.rates import measured_rates as rates_of
from meshtop.recordings.metrics.run import COLUMNS_READ, RunFold, fold_tables
from meshtop.recordings.reader import Recording
from meshtop.recordings.tables import BATCH_ROWS


def job_status(recording: Recording) -> str:
    """completed, failed or interrupted (a manifest still saying ``running`` was cut short)."""
    return recording.status if recording.status != "running" else "interrupted"


def fold_recording(recording: Recording, *, batch_rows: int = BATCH_ROWS) -> RunFold:
    """The recording's tables folded by the metrics core (the job taken as ended, as it was recorded), each
    ``batch_rows`` rows at a time: a long run of many ranks does not fit in memory whole."""
    kinds = [kind for kind in recording.kinds() if kind in FOLDED_KINDS]
    fold = fold_tables(
        recording.manifest.run,
        ((kind, recording.batches(kind, COLUMNS_READ.get(kind), rows=batch_rows)) for kind in kinds),
        status=job_status(recording),
    )
    fold.know_gpus(recording.manifest.gpus)
    return fold


def run_section(recording: Recording) -> dict[str, Any]:
    run = recording.manifest.run
    plan = run.plan
    return {
        "label": plan.label,
        "dp": plan.dp,
        "tp": plan.tp,
        "pp": plan.pp,
        "fsdp": plan.fsdp,
        "world_size": plan.world_size,
        "mode": run.mode,
        "schedule": plan.schedule,
        "microbatches": plan.microbatches,
        "model": run.model.name if run.model is not None else None,
        "device": run.device,
        "dtype": run.dtype,
        "precision": run.precision,
        "checkpoint": run.checkpoint,
        "instrumented": run.instrumented,
        "status": job_status(recording),
        "hang": recording.manifest.hang,
        "script": asdict(run.script) if run.script is not None else None,
        "endpoint": asdict(run.endpoint) if run.endpoint is not None else None,
        "reason": recording.manifest.reason,
    }


def ranks_section(recording: Recording) -> list[dict[str, Any]]:
    where = {rank: node for node in recording.manifest.nodes for rank in node.ranks}
    return [
        {
            "rank": r.rank,
            "node": where[r.rank].node if r.rank in where else None,
            "host": where[r.rank].host if r.rank in where else None,
            "exit_code": r.exit_code,
            "signal": r.signal,
            "error": r.error,
        }
        for r in recording.manifest.ranks
    ]


def hosts_section(recording: Recording, memory: Iterable[MemoryRow]) -> list[dict[str, Any]]:
    """Per node: its host, ranks and GPUs, its clock against the head's, and the highest memory peak of its
    ranks (``memory``: the figures' per-rank rows)."""
    peaks = {row.rank: row.peak_bytes for row in memory if row.peak_bytes is not None}
    return [
        {
            "node": node.node,
            "host": node.host,
            "ranks": list(node.ranks),
            "gpus": list(node.gpus),
            "clock_offset_ns": node.clock_offset_ns,
            "clock_rtt_ns": node.clock_rtt_ns,
            "peak_bytes": max((peaks[r] for r in node.ranks if r in peaks), default=None),
        }
        for node in recording.manifest.nodes
    ]


def rejected_problems(fold: RunFold) -> list[str]:
    """What the fold left out, in words."""
    problems = [
        f"events/{kind}: {count} row(s) that cannot be this job's (a rank outside it, a group of no "
        f"rank, an end before the start) were left out"
        for kind, count in sorted(fold.rejected.items())
    ]
    if fold.requests is not None and fold.requests.duplicates:
        problems.append(
            f"events/request: {fold.requests.duplicates} second report(s) of a request left out (its first counts)"
        )
    return problems


def summarize(recording: Recording) -> dict[str, Any]:
    """The whole summary as plain data (the JSON of ``meshtop summary --json``)."""
    fold = fold_recording(recording)
    figures = fold.figures()
    return {
        "recording": str(recording.path),
        "run": run_section(recording),
        **figures.to_json(),
        "ranks": ranks_section(recording),
        "hosts": hosts_section(recording, figures.memory),
        "starts": [
            {"restart": restart, "world_size": world, "first_step": first}
            for restart, (world, first) in sorted(fold.starts.items())
        ],
        "problems": [*recording.problems, *rejected_problems(fold)],
        "blocker": blocker_json(recording_blocker(recording, fold)),
    }


def recording_blocker(recording: Recording, fold: RunFold) -> Blocker | None:
    """What blocks the recorded run (:mod:`meshtop.recordings.metrics.blocker`), from its figures, its
    ranks' errors and, where the server meshtop started failed, why and its log's last lines."""
    manifest = recording.manifest
    endpoint = manifest.run.endpoint
    server_failure: tuple[str, ...] = ()
    if manifest.status == "failed" and endpoint is not None and endpoint.server is not None:
        server_failure = (*([manifest.reason] if manifest.reason else []), *endpoint.server.log_tail)
    return blocker_of(fold.figures(), {rank.rank: rank.error for rank in manifest.ranks}, server_failure)


def blocker_json(blocker: Blocker | None) -> dict[str, str] | None:
    return blocker.to_json() if blocker is not None else None


def measured_rates(recording: Recording) -> tuple[float | None, float | None]:
    """What ``meshtop plan --from REC`` takes from a recording: its bus bandwidth in GB/s and the FLOP/s one rank
    achieved (:mod:`meshtop.recordings.metrics.rates`)."""
    rates = rates_of(recording.manifest.run, fold_recording(recording).figures())
    return rates.busbw_gbps, rates.flops_per_s
