"""The manifest of a recording: its schema version and the full run description."""

from __future__ import annotations

import json
import os
import platform
import socket
import sys
import time
from importlib import metadata
from pathlib import Path
from typing import Any

from probes.errors import MeshtopError

SCHEMA_VERSION = 1
MANIFEST_NAME = "manifest.json"


class RecordingError(MeshtopError):
    """A recording cannot be written or read as asked."""


def software_versions() -> dict[str, str | None]:
    """Versions of what the run depends on (CUDA / NCCL when torch was built with them)."""
    import torch

    versions: dict[str, str | None] = {
        "meshtop": _version("meshtop"),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "nccl": None,
    }
    if torch.cuda.is_available():
        versions["nccl"] = ".".join(str(part) for part in torch.cuda.nccl.version())
    return versions


def _version(distribution: str) -> str | None:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


def host_description() -> dict[str, Any]:
    return {
        "hostname": socket.gethostname(),
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
    }


def new_recording(directory: Path) -> None:
    """Make ``directory`` for a new recording; refuses one that already holds files."""
    if directory.exists() and not directory.is_dir():
        raise RecordingError(f"{directory} is a file: give record a new directory")
    if directory.is_dir() and any(directory.iterdir()):
        raise RecordingError(f"{directory} is not empty: give record a new directory (nothing was overwritten)")
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise RecordingError(f"cannot create {directory}: {error.strerror}") from None


def write_manifest(directory: Path, manifest: dict[str, Any]) -> None:
    """Write (or replace) the manifest atomically: a reader sees the old or the new one whole."""
    path = directory / MANIFEST_NAME
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(manifest, indent=2, sort_keys=False) + "\n")
    os.replace(tmp, path)


def start_manifest(description: dict[str, Any], *, command_line: list[str]) -> dict[str, Any]:
    """The manifest of a run that is starting: description, software, host, status ``running``."""
    return {
        "schema_version": SCHEMA_VERSION,
        "status": "running",
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "command_line": ["meshtop", *command_line] if command_line else [Path(sys.argv[0]).name],
        **description,
        "software": software_versions(),
        "host": host_description(),
    }


def read_manifest(directory: Path) -> dict[str, Any]:
    """The manifest of the recording in ``directory``; a :class:`RecordingError` if it is missing or foreign."""
    path = directory / MANIFEST_NAME
    try:
        manifest = json.loads(path.read_text())
    except FileNotFoundError:
        raise RecordingError(f"{directory} is not a meshtop recording: no {MANIFEST_NAME}") from None
    except json.JSONDecodeError as error:
        raise RecordingError(f"{path} is damaged: {error.msg} at line {error.lineno}") from None
    version = manifest.get("schema_version") if isinstance(manifest, dict) else None
    if version != SCHEMA_VERSION:
        raise RecordingError(
            f"{directory} has recording schema version {version!r}; this meshtop reads version {SCHEMA_VERSION}"
        )
    return manifest
