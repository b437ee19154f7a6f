"""Event tables on disk: JSON lines while recording, Parquet once closed cleanly.

While a run records, each event kind is appended to ``events/<kind>.jsonl``
and flushed with every batch (5 times a second), so killing meshtop or a rank
loses at most the last fraction of a second, and the files can be read while
they grow. A clean close compacts each table into ``events/<kind>.parquet``
(written beside, then renamed, then the JSON lines removed), so a crash in the
middle leaves either form whole. Both forms are read into the typed schema of
:mod:`meshtop.recordings.schema`.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from itertools import chain
from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.parquet as pq

from meshtop.probes.events import EVENT_TYPES
from meshtop.recordings.clock import on_head
from meshtop.recordings.events_log import EVENTS_DIR
from meshtop.recordings.lazy_pandas import pandas
from meshtop.recordings.node_parts import NodePart, part_frames, part_paths
from meshtop.recordings.schema import columns, conform, decode_lines, schema

BATCH_ROWS = 1 << 16
"""Rows a reader of a recording's table in batches takes at a time: 64 steps of a 1024-rank job's step table,
so that folding one batch closes its steps and frees what they held (a 1024-rank hour: 1.6 GiB at the
most, where 1M-row batches took 5 GiB; docs/benchmarks.md)."""

if TYPE_CHECKING:  # imported by to_frame, where a table is asked for as a frame (0.45 s a process)
    import pandas as pd


@dataclass(frozen=True, slots=True)
class LoadedTable:
    table: pa.Table
    lost_lines: int
    """Lines that could not be read (a torn last line, or damage)."""


def read_json_lines(path: Path, kind: str) -> LoadedTable:
    """Every whole line of ``path`` that is an event of ``kind``; the rest counted as lost (a torn last
    line, or a worker's line that is no such event: workers' lines are written as they came)."""
    data = path.read_bytes()
    end = data.rfind(b"\n") + 1
    torn = 1 if end < len(data) else 0  # a last line without its newline: cut short by a crash
    decoded = decode_lines(kind, data[:end])
    return LoadedTable(decoded.table, decoded.bad + torn)


def read_node_rows(parts: Sequence[NodePart], kind: str) -> LoadedTable | None:
    """The events of ``kind`` that other nodes streamed (their parts), on the head's clock; ``None`` when no
    part holds any."""
    loaded = [
        node_rows(kind, blocks, offset_ns=offset, node=part.node)
        for part in parts
        for offset, blocks in part.blocks.get(kind, {}).items()
    ]
    if not loaded:
        return None
    return LoadedTable(pa.concat_tables([got.table for got in loaded]), sum(got.lost_lines for got in loaded))


def node_rows(kind: str, blocks: list[bytes], *, offset_ns: int, node: int) -> LoadedTable:
    """Blocks of ``kind``'s lines that ``node`` streamed with its clock ``offset_ns`` ahead, as rows on the
    head's clock."""
    decoded = decode_lines(kind, b"".join(blocks))
    return LoadedTable(on_head(kind, decoded.table, offset_ns=offset_ns, node=node), decoded.bad)


def read_parquet(path: Path, kind: str, names: Sequence[str] | None = None) -> pa.Table:
    """A compacted table in ``kind``'s current schema (OSError or ArrowException if damaged); its columns
    ``names`` only, where given: read alone, unless a column left out could drop a row of the whole table
    (then the whole table is read, so the rows are the same)."""
    if names is None:
        return conform(kind, pq.read_table(path))
    file = pq.ParquetFile(path)
    if _may_drop_rows(kind, file, names):
        return conform(kind, pq.read_table(path)).select(list(names))
    stored = set(file.schema_arrow.names)
    return conform(kind, pq.read_table(path, columns=[name for name in names if name in stored]), names)


def read_parquet_batches(
    path: Path, kind: str, names: Sequence[str] | None = None, *, rows: int = BATCH_ROWS
) -> Iterator[pa.Table]:
    """:func:`read_parquet`'s table, ``rows`` rows at a time (a reader holds a batch and the row groups it
    spans, not the whole table: a 1024-rank hour is tens of GB in memory)."""
    file = pq.ParquetFile(path)
    whole = names is None or _may_drop_rows(kind, file, names)
    stored = set(file.schema_arrow.names)
    wanted = None if whole or names is None else [name for name in names if name in stored]
    for batch in file.iter_batches(batch_size=rows, columns=wanted):
        table = pa.Table.from_batches([batch])
        if whole:
            table = conform(kind, table)
            yield table if names is None else table.select(list(names))
        else:
            yield conform(kind, table, names)


def _may_drop_rows(kind: str, file: pq.ParquetFile, names: Sequence[str]) -> bool:
    """Whether a column of ``kind`` not in ``names`` could make :func:`conform` drop a row: a float (it may
    not be finite), or a value an event needs that the file lacks or whose statistics do not show it in
    every row."""
    groups = [file.metadata.row_group(index) for index in range(file.metadata.num_row_groups)]
    stored = [{group.column(i).path_in_schema: group.column(i) for i in range(group.num_columns)} for group in groups]
    for column in columns(kind):
        if column.name in names:
            continue
        if column.python is float:
            return True
        if column.nullable or not column.required:
            continue
        if column.name not in file.schema_arrow.names:
            return True
        for chunks in stored:
            statistics = chunks[column.name].statistics if column.name in chunks else None
            if statistics is None or not statistics.has_null_count or statistics.null_count:
                return True
    return False


def to_frame(kind: str, table: pa.Table) -> pd.DataFrame:
    """A table as pandas, integers as integers: ``Int64`` where the field may be missing."""
    nullable_int = {pa.int64(): pandas().Int64Dtype()}.get
    frame = table.to_pandas()
    for column in columns(kind):
        if column.python is int and column.nullable:
            frame[column.name] = table.column(column.name).to_pandas(types_mapper=nullable_int)
    return frame


def compact(directory: Path) -> list[str]:
    """Turn every JSON-lines table of a recording, with the other nodes' events of its kind (their parts,
    removed once every kind is written), into Parquet; the kinds compacted.

    A kind is written as it is read, :data:`ROW_GROUP_ROWS` rows at a time: its JSON lines, then each part's
    blocks a few MB at a time (:func:`node_row_batches`), so a close holds one row group and one block, not
    the recording (9 M events of a thousand ranks: 0.50 GB, where reading them whole took 3.08 GB;
    docs/recordings.md). A kind with a Parquet table and no JSON lines was compacted already (a close cut
    short after it): its table holds its rows of the parts, which are not read again."""
    events = directory / EVENTS_DIR
    parts = part_paths(events)
    lines = {path.stem for path in events.glob("*.jsonl")}
    streamed = {got.kind for _, path in parts for got in part_frames(path, kinds=()) if not got.lost}
    done = []
    for kind in sorted((lines | streamed) & set(EVENT_TYPES)):  # a kind this meshtop does not know: left as is
        path, target = events / f"{kind}.jsonl", events / f"{kind}.parquet"
        if kind not in lines and target.exists():
            continue
        own = [read_json_lines(path, kind).table] if kind in lines else []
        tmp = target.with_suffix(".parquet.tmp")
        try:
            write_row_groups(tmp, chain(own, node_row_batches(parts, kind)), schema(kind))
            os.replace(tmp, target)
        except BaseException:  # a table half written is not left beside the lines and parts, which stay whole
            tmp.unlink(missing_ok=True)
            raise
        path.unlink(missing_ok=True)
        done.append(kind)
    for _, part in parts:
        part.unlink()
    return done


ROW_GROUP_ROWS = 1 << 20
"""Rows a compacted table's row group holds (pyarrow's own default for a table written whole)."""
MERGE_BLOCK_BYTES = 8 << 20
"""Lines of one node and clock offset a clean close decodes at once."""


def node_row_batches(parts: Sequence[tuple[int, Path]], kind: str) -> Iterator[pa.Table]:
    """The events of ``kind`` in the node parts at ``parts`` ((node, path)), on the head's clock, in the order
    they came, a few MB of lines at a time (a run of frames of one clock offset, up to
    :data:`MERGE_BLOCK_BYTES`)."""
    for node, path in parts:
        run: list[bytes] = []
        size, offset = 0, 0
        for got in part_frames(path, kinds=(kind,)):
            if got.lines is None or got.kind != kind:
                continue
            if run and (got.offset_ns != offset or size >= MERGE_BLOCK_BYTES):
                yield node_rows(kind, run, offset_ns=offset, node=node).table
                run, size = [], 0
            run.append(got.lines)
            size += len(got.lines)
            offset = got.offset_ns
        if run:
            yield node_rows(kind, run, offset_ns=offset, node=node).table


def write_row_groups(path: Path, tables: Iterable[pa.Table], empty_schema: pa.Schema) -> None:
    """``tables`` (one schema: the first's) into a zstd Parquet file at ``path``, :data:`ROW_GROUP_ROWS` rows a
    row group; an empty table of ``empty_schema`` if there are none."""
    writer: pq.ParquetWriter | None = None
    waiting: list[pa.Table] = []
    rows = 0
    try:
        for table in tables:
            if writer is None:
                writer = pq.ParquetWriter(path, table.schema, compression="zstd")
            waiting.append(table)
            rows += table.num_rows
            if rows >= ROW_GROUP_ROWS:  # whole row groups out, the rest waits for more
                joined = pa.concat_tables(waiting)
                whole = rows - rows % ROW_GROUP_ROWS
                writer.write_table(joined.slice(0, whole), row_group_size=ROW_GROUP_ROWS)
                waiting, rows = [joined.slice(whole)], rows - whole
        if writer is None:
            pq.write_table(empty_schema.empty_table(), path, compression="zstd")
        elif waiting:
            writer.write_table(pa.concat_tables(waiting), row_group_size=ROW_GROUP_ROWS)
    finally:
        if writer is not None:
            writer.close()
