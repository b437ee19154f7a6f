"""Open a recording (finished, interrupted or still being written) as pandas DataFrames."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow

from recordings.events_log import EVENTS_DIR
from recordings.manifest import RecordingError, read_manifest
from recordings.tables import columns_of, read_json_lines


@dataclass
class Recording:
    """A recording directory: its manifest and its event tables, loaded on first use."""

    path: Path
    manifest: dict[str, Any]
    problems: list[str] = field(default_factory=list)
    """What could not be read, in words (empty for an intact recording)."""
    _tables: dict[str, pd.DataFrame] = field(default_factory=dict, repr=False)

    @property
    def status(self) -> str:
        """completed, failed or interrupted; ``running`` while (or if killed while) being written."""
        return str(self.manifest.get("status", "running"))

    def kinds(self) -> list[str]:
        events = self.path / EVENTS_DIR
        return sorted({p.stem for p in events.glob("*.parquet")} | {p.stem for p in events.glob("*.jsonl")})

    def table(self, kind: str) -> pd.DataFrame:
        """The events of ``kind`` (empty, with the right columns, if there are none)."""
        if kind not in self._tables:
            self._tables[kind] = self._load(kind)
        return self._tables[kind]

    def _load(self, kind: str) -> pd.DataFrame:
        events = self.path / EVENTS_DIR
        parquet, lines = events / f"{kind}.parquet", events / f"{kind}.jsonl"
        if parquet.exists():
            try:
                return pd.read_parquet(parquet)
            except (OSError, pyarrow.ArrowException) as error:
                self.problems.append(f"{parquet.name} is damaged ({error}); its events were not loaded")
        if lines.exists():
            loaded = read_json_lines(lines, kind)
            if loaded.lost_lines:
                self.problems.append(f"{lines.name}: {loaded.lost_lines} line(s) unreadable and skipped")
            return loaded.frame
        return pd.DataFrame(columns=columns_of(kind))


def open_recording(path: Path) -> Recording:
    """The recording at ``path``; a :class:`RecordingError` (one line) if it is not one meshtop can read."""
    if not path.exists():
        raise RecordingError(f"{path} does not exist")
    if not path.is_dir():
        raise RecordingError(f"{path} is not a recording directory")
    return Recording(path=path, manifest=read_manifest(path))
