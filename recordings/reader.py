"""Open a recording (finished, interrupted or still being written): its typed manifest and event tables."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
import pyarrow as pa

from probes.events import EVENT_TYPES
from recordings.events_log import EVENTS_DIR
from recordings.manifest import Manifest, RecordingError, read_manifest
from recordings.schema import empty
from recordings.tables import read_json_lines, read_parquet, to_frame


@dataclass
class Recording:
    """A recording directory: its manifest and its event tables, loaded on first use."""

    path: Path
    manifest: Manifest
    problems: list[str] = field(default_factory=list)
    """What could not be read, in words (empty for an intact recording)."""
    _tables: dict[str, pa.Table] = field(default_factory=dict, repr=False)

    @property
    def status(self) -> str:
        """completed, failed or interrupted; ``running`` while (or if killed while) being written."""
        return self.manifest.status

    def kinds(self) -> list[str]:
        """The event kinds this recording holds a table of (those this meshtop knows)."""
        events = self.path / EVENTS_DIR
        found = {p.stem for p in events.glob("*.parquet")} | {p.stem for p in events.glob("*.jsonl")}
        for kind in sorted(found - set(EVENT_TYPES)):
            note = f"events/{kind}: not an event kind this meshtop knows; skipped"
            if note not in self.problems:
                self.problems.append(note)
        return sorted(found & set(EVENT_TYPES))

    def arrow(self, kind: str) -> pa.Table:
        """The events of ``kind`` in its typed schema (empty, with its columns, if there are none)."""
        if kind not in self._tables:
            self._tables[kind] = self._load(kind)
        return self._tables[kind]

    def table(self, kind: str) -> pd.DataFrame:
        """The events of ``kind`` as pandas (integers stay integers; ``Int64`` where one may be missing)."""
        return to_frame(kind, self.arrow(kind))

    def _load(self, kind: str) -> pa.Table:
        events = self.path / EVENTS_DIR
        parquet, lines = events / f"{kind}.parquet", events / f"{kind}.jsonl"
        if parquet.exists():
            try:
                return read_parquet(parquet, kind)
            except (OSError, pa.ArrowException) as error:
                self.problems.append(f"{parquet.name} is damaged ({error}); its events were not loaded")
        if lines.exists():
            loaded = read_json_lines(lines, kind)
            if loaded.lost_lines:
                self.problems.append(f"{lines.name}: {loaded.lost_lines} line(s) unreadable and skipped")
            return loaded.table
        return empty(kind)


def open_recording(path: Path) -> Recording:
    """The recording at ``path``; a :class:`RecordingError` (one line) if it is not one meshtop can read."""
    if not path.exists():
        raise RecordingError(f"{path} does not exist")
    if not path.is_dir():
        raise RecordingError(f"{path} is not a recording directory")
    return Recording(path=path, manifest=read_manifest(path))
