"""Follow a recording another meshtop is writing: what each read finds added since the last, as typed tables.

The writer appends whole lines to ``events/<kind>.jsonl`` and whole frames to ``events/node<N>.frames``
(:mod:`meshtop.recordings.events_log`), flushed with every batch. A reader of the same files sees a write in
flight as a last line or frame cut short: it keeps those bytes and reads them whole at the next read, so
nothing is counted lost while the writer lives. Files are kept open from their first read: a clean close
compacts the lines into Parquet and removes them (:func:`meshtop.recordings.tables.compact`), and an open
file still reads to its end after that. A kind whose first lines came so late that its file was compacted
before this reader found it is read from its Parquet table once the writer has ended (:meth:`RecordingTail.read`
with ``to_end``), unless other nodes' parts brought rows of it, which were read there (its own rows are then
not told apart from theirs in the table, and only the parts' are shown).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import pyarrow as pa

from meshtop.probes.events import EVENT_TYPES
from meshtop.recordings.events_log import EVENTS_DIR
from meshtop.recordings.node_parts import frames_in, part_paths
from meshtop.recordings.replay import in_kind_order
from meshtop.recordings.schema import decode_lines
from meshtop.recordings.tables import node_rows, read_parquet

Batch = tuple[str, pa.Table]

READ_BYTES = 64 << 20
"""The most one read takes in, over every file: a viewer that opens a days-long recording catches up over
several reads (each a frame's worth of work for the thread that reads), not in one that holds the whole run."""


@dataclass
class _Followed:
    """A file followed from its first read: what is read of it, and the bytes of a line or frame cut short."""

    file: IO[bytes]
    pending: bytes = b""


@dataclass
class RecordingTail:
    """The events added to a recording's files since the last :meth:`read`, on the head's clock."""

    directory: Path
    read_bytes: int = READ_BYTES
    lost: int = 0
    """Lines or frames that were not events (damage, another kind's line), and those cut short at the writer's
    end."""
    _lines: dict[str, _Followed] = field(default_factory=dict)
    _parts: dict[int, _Followed] = field(default_factory=dict)
    _part_kinds: set[str] = field(default_factory=set)

    def read(self, *, to_end: bool = False) -> list[Batch]:
        """The events written since the last read, a table a kind in the fold's order; ``to_end`` once the
        writer has ended: everything left, and a line or frame still cut short counted lost."""
        events = self.directory / EVENTS_DIR
        for path in events.glob("*.jsonl"):
            if path.stem in EVENT_TYPES and path.stem not in self._lines:
                self._open(self._lines, path.stem, path)
        for node, path in part_paths(events):
            if node not in self._parts:
                self._open(self._parts, node, path)
        budget = None if to_end else max(1, self.read_bytes // max(1, len(self._lines) + len(self._parts)))
        batches = [
            batch for kind, followed in self._lines.items() if (batch := self._read_lines(kind, followed, budget))
        ]
        for node, followed in self._parts.items():
            batches += self._read_part(node, followed, budget)
        if to_end:
            batches += self._compacted_unseen(events)
            self.lost += sum(1 for followed in (*self._lines.values(), *self._parts.values()) if followed.pending)
            self.close()
        return in_kind_order(batches)

    def close(self) -> None:
        for followed in (*self._lines.values(), *self._parts.values()):
            followed.file.close()
            followed.pending = b""

    @staticmethod
    def _open(files: dict[Any, _Followed], key: str | int, path: Path) -> None:
        try:
            files[key] = _Followed(path.open("rb"))
        except OSError:  # compacted between the listing and the open: read from its table at the end
            pass

    def _read_lines(self, kind: str, followed: _Followed, budget: int | None) -> Batch | None:
        data = followed.pending + followed.file.read(budget if budget is not None else -1)
        end = data.rfind(b"\n") + 1
        followed.pending = data[end:]
        if not end:
            return None
        decoded = decode_lines(kind, data[:end])
        self.lost += decoded.bad
        return (kind, decoded.table) if len(decoded.table) else None

    def _read_part(self, node: int, followed: _Followed, budget: int | None) -> list[Batch]:
        data = followed.pending + followed.file.read(budget if budget is not None else -1)
        batches: list[Batch] = []
        taken = 0
        for frame in frames_in(data):
            if frame.lines is None and frame.end == taken and frame.lost:  # cut short: whole at a later read
                break
            taken = frame.end
            self.lost += frame.lost
            if frame.lines is not None:
                loaded = node_rows(frame.kind, [frame.lines], offset_ns=frame.offset_ns, node=node)
                self.lost += loaded.lost_lines
                batches.append((frame.kind, loaded.table))
                self._part_kinds.add(frame.kind)
        followed.pending = data[taken:]
        return batches

    def _compacted_unseen(self, events: Path) -> list[Batch]:
        """The kinds compacted before this reader found their lines (see the module's docstring)."""
        batches = []
        for path in sorted(events.glob("*.parquet")):
            kind = path.stem
            if kind in self._lines or kind in self._part_kinds or kind not in EVENT_TYPES:
                continue
            try:
                table = read_parquet(path, kind)
            except (OSError, pa.ArrowException):
                self.lost += 1
                continue
            if len(table):
                batches.append((kind, table))
        return batches
