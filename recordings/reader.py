"""Open a recording (finished, interrupted or still being written): its typed manifest and event tables."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow as pa

from meshtop.probes.events import EVENT_TYPES
from meshtop.recordings.events_log import EVENTS_DIR
from meshtop.recordings.manifest import Manifest, RecordingError, read_manifest
from meshtop.recordings.node_parts import NodePart, part_name, read_parts
from meshtop.recordings.schema import empty
from meshtop.recordings.tables import (
    BATCH_ROWS,
    read_json_lines,
    read_node_rows,
    read_parquet,
    read_parquet_batches,
    to_frame,
)

if TYPE_CHECKING:  # pandas is imported where a table is asked for as a frame (0.45 s a process)
    import pandas as pd


@dataclass
class Recording:
    """A recording directory: its manifest and its event tables, loaded on first use."""

    path: Path
    manifest: Manifest
    problems: list[str] = field(default_factory=list)
    """What could not be read, in words (empty for an intact recording)."""
    _tables: dict[str, pa.Table] = field(default_factory=dict, repr=False)
    _parts: list[NodePart] | None = field(default=None, repr=False)

    @property
    def status(self) -> str:
        """completed, failed or interrupted; ``running`` while (or if killed while) being written."""
        return self.manifest.status

    def kinds(self) -> list[str]:
        """The event kinds this recording holds a table of (those this meshtop knows)."""
        events = self.path / EVENTS_DIR
        found = {p.stem for p in events.glob("*.parquet")} | {p.stem for p in events.glob("*.jsonl")}
        found |= {kind for part in self._node_parts() for kind in part.blocks}
        for kind in sorted(found - set(EVENT_TYPES)):
            note = f"events/{kind}: not an event kind this meshtop knows; skipped"
            if note not in self.problems:
                self.problems.append(note)
        return sorted(found & set(EVENT_TYPES))

    def arrow(self, kind: str, columns: Sequence[str] | None = None) -> pa.Table:
        """The events of ``kind`` in its typed schema (empty, with its columns, if there are none); only
        ``columns``, where given (read alone if the whole table is not loaded yet: the same rows)."""
        if columns is not None and kind not in self._tables:
            return self._load(kind, columns)
        if kind not in self._tables:
            self._tables[kind] = self._load(kind)
        return self._tables[kind] if columns is None else self._tables[kind].select(list(columns))

    def batches(self, kind: str, columns: Sequence[str] | None = None, *, rows: int = BATCH_ROWS) -> Iterator[pa.Table]:
        """:meth:`arrow`'s rows ``rows`` at a time, for a reader that folds them as they come (its memory is a
        batch and the row groups it spans, not the table). A table not compacted yet comes whole."""
        parquet = self.path / EVENTS_DIR / f"{kind}.parquet"
        if kind in self._tables or not parquet.exists():
            yield self.arrow(kind, columns)
            return
        read = 0
        try:
            for batch in read_parquet_batches(parquet, kind, columns, rows=rows):
                read += len(batch)
                yield batch
            return
        except (OSError, pa.ArrowException) as error:
            if read:  # its first rows are folded already: say where it stopped, as arrow() cannot
                self._note(f"{parquet.name} is damaged ({error}) past its first {read} events; the rest not loaded")
                return
            self._note(f"{parquet.name} is damaged ({error}); its events were not loaded")
        yield self._unpacked(kind, columns)

    def table(self, kind: str) -> pd.DataFrame:
        """The events of ``kind`` as pandas (integers stay integers; ``Int64`` where one may be missing)."""
        return to_frame(kind, self.arrow(kind))

    def _load(self, kind: str, columns: Sequence[str] | None = None) -> pa.Table:
        parquet = self.path / EVENTS_DIR / f"{kind}.parquet"
        if parquet.exists():
            try:
                return read_parquet(parquet, kind, columns)
            except (OSError, pa.ArrowException) as error:
                self._note(f"{parquet.name} is damaged ({error}); its events were not loaded")
        return self._unpacked(kind, columns)

    def _unpacked(self, kind: str, columns: Sequence[str] | None = None) -> pa.Table:
        """The events of ``kind`` not compacted yet: its JSON lines and what other nodes streamed."""
        lines, tables = self.path / EVENTS_DIR / f"{kind}.jsonl", []
        if lines.exists():
            loaded = read_json_lines(lines, kind)
            if loaded.lost_lines:
                self._note(f"{lines.name}: {loaded.lost_lines} line(s) unreadable and skipped")
            tables.append(loaded.table)
        if (streamed := read_node_rows(self._node_parts(), kind)) is not None:
            if streamed.lost_lines:
                self._note(f"{kind}: {streamed.lost_lines} line(s) other nodes streamed unreadable and skipped")
            tables.append(streamed.table)
        table = pa.concat_tables(tables) if tables else empty(kind)
        return table if columns is None else table.select(list(columns))

    def _node_parts(self) -> list[NodePart]:
        """What other nodes streamed, until the recording is closed (read once: a reader of a recording being
        written sees it as it was then)."""
        if self._parts is None:
            self._parts = read_parts(self.path / EVENTS_DIR)
            for part in self._parts:
                if part.lost:
                    self._note(f"{part_name(part.node)}: {part.lost} event(s) in a frame cut short or damaged skipped")
        return self._parts

    def _note(self, problem: str) -> None:
        """Say a problem once (a table may be read more than once: some of its columns, then all)."""
        if problem not in self.problems:
            self.problems.append(problem)


def open_recording(path: Path) -> Recording:
    """The recording at ``path``; a :class:`RecordingError` (one line) if it is not one meshtop can read."""
    if not path.exists():
        raise RecordingError(f"{path} does not exist")
    if not path.is_dir():
        raise RecordingError(f"{path} is not a recording directory")
    return Recording(path=path, manifest=read_manifest(path))
