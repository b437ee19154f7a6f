"""The events of a recording, kept as one JSON-lines file per event kind.

A simple, append-only format: each batch is written and flushed as it
arrives, so a crash loses at most the batch in flight, and a reader can
follow the files while the run goes on. A clean close compacts them to
Parquet (:mod:`meshtop.recordings.tables`). What another node streamed on its
own clock goes to that node's part as it came (:mod:`meshtop.recordings.node_parts`).
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import IO

from meshtop.probes.arrivals import Arrival, EncodedEvents, encode_lines
from meshtop.recordings.manifest import RecordingError
from meshtop.recordings.node_parts import frame_header, part_name

EVENTS_DIR = "events"


class EventWriter:
    """Appends events to ``DIR/events/<kind>.jsonl``: a worker's encoded blocks as they came, and
    meshtop's own events encoded the same way; another node's blocks to ``DIR/events/node<N>.frames``."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory / EVENTS_DIR
        self.directory.mkdir(parents=True, exist_ok=True)
        self._files: dict[str, IO[bytes]] = {}
        self.written = 0

    def write(self, items: Iterable[Arrival]) -> None:
        """Append and flush ``items`` (events, or blocks of them); a :class:`RecordingError` when the disk
        refuses (full, folder gone)."""
        by_file: dict[str, list[bytes]] = {}
        written = 0
        for item in items:
            if isinstance(item, EncodedEvents) and item.node is not None:
                part = by_file.setdefault(part_name(item.node), [])
                part += (frame_header(item.kind, item.count, item.offset_ns, len(item.lines)), item.lines)
            elif isinstance(item, EncodedEvents):
                by_file.setdefault(f"{item.kind}.jsonl", []).append(item.lines)
            else:
                by_file.setdefault(f"{item.kind}.jsonl", []).append(encode_lines((item,)))
            written += item.count if isinstance(item, EncodedEvents) else 1
        try:
            if not self.directory.is_dir():  # open files would take writes into the void: stop here
                raise FileNotFoundError(2, "No such file or directory")
            for name, blocks in by_file.items():
                file = self._files.get(name)
                if file is None:
                    file = self._files[name] = (self.directory / name).open("ab")
                file.writelines(blocks)  # not joined first: a take's blocks are hundreds of MB at a thousand ranks
                file.flush()
        except OSError as error:
            kept = (
                "the events written so far are kept"
                if self.directory.exists()
                else "the folder was removed, and what it held with it"
            )
            raise RecordingError(
                f"cannot write the recording in {self.directory.parent}: "
                f"{error.strerror or error}; the job was stopped, {kept}"
            ) from None
        self.written += written

    def close(self) -> None:
        for file in self._files.values():
            try:
                file.close()
            except OSError:  # the last flush failed (disk full): what was flushed before stays
                pass
        self._files.clear()
