"""Recordings made by hand, the way meshtop writes them (shared by tests and benchmarks)."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from meshtop.probes.events import Event
from meshtop.recordings.events_log import EventWriter
from meshtop.recordings.manifest import Manifest, RunDescription, write_manifest
from meshtop.recordings.tables import compact
from meshtop.runner.plan import RunSpec, resolve


def description(*, device: str | None = None, dtype: str | None = None, **spec: Any) -> RunDescription:
    """The run description meshtop writes for ``RunSpec(**spec)`` on CPU, with the device and dtype
    changed afterwards where given (a CUDA run described without a GPU here)."""
    run = RunDescription.from_json(resolve(RunSpec(device="cpu", **spec), gpus_visible=0).describe())
    changes = {name: value for name, value in (("device", device), ("dtype", dtype)) if value is not None}
    return dataclasses.replace(run, **changes) if changes else run


def with_model(run: RunDescription, **changes: Any) -> RunDescription:
    return dataclasses.replace(run, model=dataclasses.replace(run.model, **changes))


def write_recording(
    directory: Path,
    events: Iterable[Event],
    *,
    run: RunDescription,
    status: str = "completed",
    parquet: bool = False,
    **manifest: Any,
) -> Path:
    """A recording of ``events`` in ``directory``, closed with ``status`` (compacted with ``parquet``)."""
    directory.mkdir(parents=True, exist_ok=True)
    write_manifest(directory, Manifest(run=run, status=status, **manifest))
    writer = EventWriter(directory)
    writer.write(list(events))
    writer.close()
    if parquet:
        compact(directory)
    return directory
