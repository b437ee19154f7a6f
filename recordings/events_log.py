"""The events of a recording, kept as one JSON-lines file per event kind.

A simple, append-only format: each batch is written and flushed as it
arrives, so a crash loses at most the batch in flight, and a reader can
follow the files while the run goes on. A clean close compacts them to
Parquet (:mod:`meshtop.recordings.tables`). What another node streamed on its
own clock goes to that node's part as it came (:mod:`meshtop.recordings.node_parts`).
"""

from __future__ import annotations

import errno
import os
from collections.abc import Iterable
from pathlib import Path
from typing import IO

from meshtop.probes.arrivals import Arrival, EncodedEvents, encode_lines
from meshtop.recordings.manifest import RecordingError
from meshtop.recordings.node_parts import frame, part_name

EVENTS_DIR = "events"


IOV_MAX = 1024
"""The most buffers one ``writev`` takes (Linux's ``IOV_MAX``)."""


def write_all(fd: int, blocks: list[bytes]) -> None:
    """Append ``blocks`` to ``fd`` in as few ``writev`` calls as the kernel takes them: neither joined (a take's
    blocks are hundreds of MB at a thousand ranks) nor written one by one. Each write lets go of the
    interpreter's lock and waits to take it back from the thread folding the events (5 ms at worst): a take of
    460 blocks written apart took 1.6 s so, against 0.04 s in one ``writev``."""
    views = [memoryview(block) for block in blocks if block]
    while views:
        written = os.writev(fd, views[:IOV_MAX])
        if not written:
            raise OSError(errno.EIO, "the file took none of the bytes written")
        done = 0
        while done < len(views) and written >= len(views[done]):
            written -= len(views[done])
            done += 1
        views = views[done:]
        if views and written:
            views[0] = views[0][written:]


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
                part += frame(item.kind, item.count, item.offset_ns, item.lines)
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
                    file = self._files[name] = (self.directory / name).open("ab", buffering=0)
                write_all(file.fileno(), blocks)
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
