"""Event tables on disk: JSON lines while recording, Parquet once closed cleanly.

While a run records, each event kind is appended to ``events/<kind>.jsonl``
and flushed with every batch (5 times a second), so killing meshtop or a rank
loses at most the last fraction of a second, and the files can be read while
they grow. A clean close compacts each table into ``events/<kind>.parquet``
(written beside, then renamed, then the JSON lines removed), so a crash in the
middle leaves either form whole.
"""

from __future__ import annotations

import json
import os
from dataclasses import MISSING, dataclass, fields
from pathlib import Path

import pandas as pd

from probes.events import EVENT_TYPES
from recordings.events_log import EVENTS_DIR


@dataclass(frozen=True, slots=True)
class LoadedTable:
    frame: pd.DataFrame
    lost_lines: int
    """Lines that could not be read (a torn last line, or damage)."""


def columns_of(kind: str) -> list[str]:
    return [f.name for f in fields(EVENT_TYPES[kind])] if kind in EVENT_TYPES else []


def required_of(kind: str) -> frozenset[str]:
    """The fields an event of ``kind`` cannot be without (those with no default)."""
    if kind not in EVENT_TYPES:
        return frozenset()
    return frozenset(f.name for f in fields(EVENT_TYPES[kind]) if f.default is MISSING and f.default_factory is MISSING)


def read_json_lines(path: Path, kind: str) -> LoadedTable:
    """Every whole, valid line of ``path``; the rest counted as lost (not JSON, not an object, another
    kind's, or without a field the kind needs: the workers' lines are written as they came)."""
    required = required_of(kind)
    records, lost = [], 0
    data = path.read_bytes()
    lines = data.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    elif lines:  # a last line without its newline: cut short by a crash
        lines.pop()
        lost += 1
    for line in lines:
        try:
            record = json.loads(line)
        except (ValueError, RecursionError):  # not JSON, not UTF-8, too deep, a huge integer
            lost += 1
            continue
        if isinstance(record, dict) and record.pop("kind", kind) == kind and record.keys() >= required:
            records.append(record)
        else:
            lost += 1
    frame = pd.DataFrame.from_records(records, columns=columns_of(kind) or None)
    return LoadedTable(frame, lost)


def compact(directory: Path) -> list[str]:
    """Turn every JSON-lines table of a recording into Parquet; the kinds compacted."""
    events = directory / EVENTS_DIR
    done = []
    for path in sorted(events.glob("*.jsonl")):
        kind = path.stem
        table = read_json_lines(path, kind)
        target = events / f"{kind}.parquet"
        tmp = target.with_suffix(".parquet.tmp")
        table.frame.to_parquet(tmp, index=False, compression="zstd")
        os.replace(tmp, target)
        path.unlink()
        done.append(kind)
    return done
