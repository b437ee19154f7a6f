"""The sessions a folder holds (``meshtop ls``): each recording found, what runs in it, its status, how far it
got, how long it ran and its writer; live ones first.

Where recordings are looked for: the folder itself (a recording), its folders (the runs folder holds one a
session), and their folders (a sweep holds one recording a plan, in a folder of its own): two levels, no more,
so a runs folder of thousands of sessions is listed from their manifests alone, never walked into their
tables.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from meshtop.recordings.manifest import MANIFEST_NAME, read_manifest
from meshtop.recordings.typed_json import RecordingError
from meshtop.recordings.writers import read_progress, read_writer, running_status

UNREADABLE = "unreadable"
"""The status of a folder whose manifest cannot be read (its ``problem`` says why)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class SessionEntry:
    """One recording as ``ls`` lists it (``--json``: these fields, by these names)."""

    path: str
    """The recording's folder, as found under the folder listed."""
    run: str | None
    """What runs: the plan (and the built-in model), the script, or the endpoint, as the manifest's run
    description labels it."""
    status: str
    """running, completed, failed, interrupted, stale (running, its writer gone) or unreadable."""
    steps: int | None
    """Job steps done: the manifest's count once ended, the writer's last progress while running."""
    steps_total: int | None
    """Steps asked for (``None``: inference, a script, a run until stopped)."""
    requests: int | None
    """Requests done of an inference load, from the writer's last progress (its final one once ended)."""
    requests_total: int | None
    started_at: str | None
    """As the manifest says it (local time with its offset)."""
    started_unix_s: float | None
    """The writer's claim of the recording, else the manifest's ``started_at``."""
    elapsed_s: float | None
    """Running: since its start; ended: its duration; stale: from its start to its writer's last progress."""
    pid: int | None
    host: str | None
    """The writer's host (``None``: no ``writer.json``, a recording from before writers were recorded)."""
    problem: str | None
    """Why the recording cannot be read (``unreadable`` only)."""


def find_recordings(directory: Path) -> list[Path]:
    """The recordings in ``directory`` (the module's two levels): folders that hold a manifest."""
    if (directory / MANIFEST_NAME).is_file():
        return [directory]
    found = []
    for child in sorted(_folders(directory)):
        if (child / MANIFEST_NAME).is_file():
            found.append(child)
        else:
            found += sorted(inner for inner in _folders(child) if (inner / MANIFEST_NAME).is_file())
    return found


def _folders(directory: Path) -> list[Path]:
    """The folders in ``directory`` (none where it cannot be read)."""
    try:
        return [path for path in directory.iterdir() if path.is_dir()]
    except OSError:
        return []


def list_sessions(directory: Path, *, now_unix_s: float | None = None) -> list[SessionEntry]:
    """Every recording in ``directory`` as :class:`SessionEntry`: the running ones first, each group newest
    first (by start; a folder whose manifest cannot be read by the manifest file's time)."""
    now = time.time() if now_unix_s is None else now_unix_s
    entries = [(session_entry(path, now_unix_s=now), path) for path in find_recordings(directory)]
    entries.sort(key=lambda pair: (pair[0].status != "running", -_started(pair[1], pair[0])))
    return [entry for entry, _ in entries]


def session_entry(path: Path, *, now_unix_s: float) -> SessionEntry:
    """The recording in ``path`` as ``ls`` lists it; an unreadable one with its problem, never an error."""
    writer, progress = read_writer(path), read_progress(path)
    try:
        manifest = read_manifest(path)
    except (RecordingError, OSError, RecursionError) as error:  # a folder it may not read; a hostile file
        return SessionEntry(
            path=str(path),
            run=None,
            status=UNREADABLE,
            steps=None,
            steps_total=None,
            requests=None,
            requests_total=None,
            started_at=None,
            started_unix_s=None,
            elapsed_s=None,
            pid=writer.pid if writer is not None else None,
            host=writer.host if writer is not None else None,
            problem=str(error) if isinstance(error, RecordingError) else f"{path / MANIFEST_NAME}: {_why(error)}",
        )
    status = manifest.status if manifest.status != "running" else running_status(writer)
    started = writer.started_unix_s if writer is not None else _unix_s(manifest.started_at)
    if status == "running":
        elapsed = now_unix_s - started if started is not None else None
    elif status == "stale":
        elapsed = progress.updated_unix_s - started if progress is not None and started is not None else None
    else:
        elapsed = manifest.duration_s
    run = manifest.run
    ended = manifest.status != "running"
    return SessionEntry(
        path=str(path),
        run=run.plan.label + (f" · {run.model.name}" if run.model is not None else ""),
        status=status,
        steps=manifest.steps_completed if ended else (progress.steps if progress is not None else None),
        steps_total=run.steps,
        requests=progress.requests if progress is not None else None,
        requests_total=run.load.requests if run.load is not None else None,
        started_at=manifest.started_at,
        started_unix_s=started if started is not None and math.isfinite(started) else None,
        elapsed_s=round(elapsed, 3) if elapsed is not None and math.isfinite(elapsed) else None,
        pid=writer.pid if writer is not None else None,
        host=writer.host if writer is not None else None,
        problem=None,
    )


def _why(error: OSError | RecursionError) -> str:
    """Why a manifest could not be read, in a few words."""
    return error.strerror or str(error) if isinstance(error, OSError) else "nested too deep to be one"


def _unix_s(started_at: str | None) -> float | None:
    """A manifest's ``started_at`` as a Unix time (``None`` where it has none, or not in meshtop's form)."""
    if started_at is None:
        return None
    try:
        return datetime.strptime(started_at, "%Y-%m-%dT%H:%M:%S%z").timestamp()
    except ValueError:
        return None


def _started(path: Path, entry: SessionEntry) -> float:
    """When the session started, for the order: the writer's claim, else the manifest's start, else the
    manifest file's last change."""
    if entry.started_unix_s is not None:
        return entry.started_unix_s
    try:
        return (path / MANIFEST_NAME).stat().st_mtime
    except OSError:
        return 0.0
