"""The typed schema of every event table, derived from the event dataclasses, and the one decoder.

Each event kind's table has one Arrow schema, built from its dataclass's field
types: ``int`` is int64, ``float`` float64, ``str`` string, ``bool`` bool,
``tuple[int, ...]`` a list of int64, and ``X | None`` the same type, nullable.
A nullable integer stays an integer (Arrow keeps a validity mask beside it),
so nothing downstream repairs floats back into nanoseconds.

Everything that turns bytes into events goes through :func:`decode_lines`: the
live dashboard's blocks from the wire, a recording's JSON-lines tables, and
compaction into Parquet. Parquet tables come back through :func:`conform`, so
every reader sees the same columns and types, whichever form a recording is in.
"""

from __future__ import annotations

import json
import math
import types
import typing
from collections.abc import Iterable, Sequence
from dataclasses import MISSING, dataclass, fields
from functools import cache
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pa_json

from meshtop.probes.events import EVENT_TYPES, Event, event_from_record
from meshtop.probes.kinds import FOLD_ORDER

INT64_RANGE = (-(1 << 63), (1 << 63) - 1)
ARROW_JSON_FROM_BYTES = 256 << 10
"""Blocks at least this big are parsed by Arrow's JSON reader (fast per line, slow to start); smaller ones
by Python's ``json`` in one call."""
ARROW_JSON_BLOCK = 1 << 20
"""Arrow's JSON reader parses blocks of this size on its thread pool (40,000 collectives at 830,000 lines/s
on 2 cores, against 550,000 in one thread), but needs a line to fit in one block: a body that does not
parse so is parsed again in one block of :data:`ARROW_JSON_BLOCK_MAX` on one thread, and what does not
parse then takes the careful path."""
ARROW_JSON_BLOCK_MAX = 16 << 20
NEWLINE = ord("\n")


@dataclass(frozen=True, slots=True)
class Column:
    """One field of an event kind as a table column."""

    name: str
    arrow: pa.DataType
    python: type
    """``int``, ``float``, ``str``, ``bool`` or ``tuple`` (of ints)."""
    nullable: bool
    required: bool
    """The event cannot be made without it (the field has no default)."""
    default: Any = None
    """What a missing value of a field with a default reads as."""
    finite: bool = True
    """A float column refuses NaN and infinity (the row is dropped and counted), unless its field's metadata
    says they are measurements (:data:`~meshtop.probes.events.NOT_FINITE_KEPT`: a diverged loss)."""


def _column(name: str, hint: Any, required: bool, default: Any = None, finite: bool = True) -> Column:
    nullable = False
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        members = [arg for arg in typing.get_args(hint) if arg is not type(None)]
        nullable = len(members) < len(typing.get_args(hint))
        if len(members) != 1:
            raise TypeError(f"{name}: a union of {members} has no column type")
        hint = members[0]
    if typing.get_origin(hint) is tuple:
        return Column(name, pa.list_(pa.int64()), tuple, nullable, required, default)
    arrow = {int: pa.int64(), float: pa.float64(), str: pa.string(), bool: pa.bool_()}.get(hint)
    if arrow is None:
        raise TypeError(f"{name}: {hint!r} has no column type")
    return Column(name, arrow, hint, nullable, required, default, finite or hint is not float)


@cache
def columns(kind: str) -> tuple[Column, ...]:
    """The columns of ``kind``'s table, in field order."""
    cls = EVENT_TYPES[kind]
    hints = typing.get_type_hints(cls)
    return tuple(
        _column(
            f.name,
            hints[f.name],
            f.default is MISSING and f.default_factory is MISSING,
            None if f.default is MISSING else f.default,
            f.metadata.get("finite", True),
        )
        for f in fields(cls)
    )


@cache
def schema(kind: str) -> pa.Schema:
    """The Arrow schema of ``kind``'s table. Every Arrow field may hold nulls: which may not is the
    dataclass's to say, and the decoder drops (and counts) a row without a value it needs."""
    return pa.schema([pa.field(c.name, c.arrow) for c in columns(kind)])


@cache
def _with_kind(kind: str, without: frozenset[str] = frozenset()) -> pa.Schema:
    kept = schema(kind)
    for name in without:
        kept = kept.remove(kept.get_field_index(name))
    return kept.append(pa.field("kind", pa.string()))


def empty(kind: str) -> pa.Table:
    return schema(kind).empty_table()


@dataclass(frozen=True, slots=True)
class Decoded:
    """A block of lines as a typed table, and how many lines were not an event of its kind."""

    table: pa.Table
    bad: int


def decode_lines(kind: str, lines: bytes, without: frozenset[str] = frozenset()) -> Decoded:
    """``kind``'s events in ``lines`` (one JSON object per line, as workers send and recordings keep), the
    columns ``without`` not read (a live fold's: a column it does not need costs Arrow's parse all the same if
    read; a line is then judged on the columns read).

    A line counts as one event or as bad: not JSON, not an object, another kind's, a field of the wrong
    type, or without a field the kind cannot do without. Clean blocks are parsed in one call (Arrow's
    reader for big ones, Python's ``json`` for small ones); a block that does not parse so is read line
    by line.
    """
    end = len(lines)
    while end and lines[end - 1] == NEWLINE:
        end -= 1
    if not end:
        return Decoded(empty(kind), 0)
    if end >= ARROW_JSON_FROM_BYTES:  # read in place: a copy of a big body would take the interpreter's lock
        table = _arrow_json(kind, pa.py_buffer(lines).slice(0, end), without)
    else:
        table = _python_json(kind, lines[:end], without)
    if table is None:
        decoded = _line_by_line(kind, lines[:end])
        return Decoded(decoded.table.drop_columns(list(without)), decoded.bad)
    return _checked(kind, table)


def _arrow_json(kind: str, body: pa.Buffer, without: frozenset[str] = frozenset()) -> pa.Table | None:
    options = pa_json.ParseOptions(explicit_schema=_with_kind(kind, without), unexpected_field_behavior="ignore")
    # Threads help a body of several blocks only; one with a line longer than a block fails there.
    blocks = [ARROW_JSON_BLOCK_MAX] if len(body) <= ARROW_JSON_BLOCK else [ARROW_JSON_BLOCK, ARROW_JSON_BLOCK_MAX]
    for block in blocks:
        read = pa_json.ReadOptions(use_threads=block == ARROW_JSON_BLOCK, block_size=block)
        try:
            return pa_json.read_json(pa.BufferReader(body), parse_options=options, read_options=read)
        except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError):
            continue  # a line longer than the block, or not JSON: once more in one big block
    return None


def _python_json(kind: str, body: bytes, without: frozenset[str] = frozenset()) -> pa.Table | None:
    try:
        records = json.loads(b"[" + body.replace(b"\n", b",") + b"]")
    except (ValueError, RecursionError):  # not JSON, not UTF-8, too deep, a huge integer
        return None
    if len(records) != body.count(b"\n") + 1 or not all(isinstance(r, dict) for r in records):
        return None
    if not _types_fit(kind, records):  # Arrow would coerce (1.5 into an int column): read line by line
        return None
    try:
        return pa.Table.from_pylist(records, schema=_with_kind(kind, without))
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, OverflowError, UnicodeEncodeError):
        return None


ALLOWED_TYPES: dict[type, set[type]] = {int: {int}, float: {int, float}, str: {str}, bool: {bool}, tuple: {list}}
"""The Python types a JSON value of each column type may have (``type()``, exactly: a bool is no int)."""


def _types_fit(kind: str, records: list[dict[str, Any]]) -> bool:
    """Whether every value of ``records`` has a type its column takes, one set of types a column (as strict
    as Arrow's own JSON reader, which the line-by-line path matches; ranges are Arrow's to refuse)."""
    for column in columns(kind):
        found = {type(record.get(column.name)) for record in records} - {type(None)}
        if not found <= ALLOWED_TYPES[column.python]:
            return False
        if column.python is tuple and not all(type(v) is int for r in records for v in r.get(column.name) or ()):
            return False
    return True


def _checked(kind: str, table: pa.Table) -> Decoded:
    """Drop the rows of another kind or with a required field missing; the table without ``kind``."""
    keep = pc.equal(pc.fill_null(table.column("kind"), kind), kind)
    bad = len(table) - pc.sum(keep).as_py() if len(table) else 0
    if bad:
        table = table.filter(keep)
    completed = _completed(kind, table.drop_columns(["kind"]))
    return Decoded(completed.table, bad + completed.bad)


def _completed(kind: str, table: pa.Table) -> Decoded:
    """A missing value of a field with a default takes the default; a row missing a value it cannot be
    without, or with a number that is not finite (JSON's NaN and Infinity) where its column refuses one, is
    dropped (and counted)."""
    keep = None
    for column in columns(kind):
        index = table.schema.get_field_index(column.name)
        if index < 0:  # a table of some of the kind's columns
            continue
        if column.python is float and column.finite and len(table):
            finite = pc.fill_null(pc.is_finite(table.column(index)), True)
            if not pc.all(finite).as_py():
                keep = finite if keep is None else pc.and_(keep, finite)
        if column.python is tuple and len(table):
            whole = _no_null_inside(table.column(index))
            if whole is not None:
                keep = whole if keep is None else pc.and_(keep, whole)
        if column.nullable or not table.column(index).null_count:
            continue
        if not column.required:
            table = table.set_column(index, column.name, pc.fill_null(table.column(index), column.default))
            continue
        valid = pc.is_valid(table.column(index))
        keep = valid if keep is None else pc.and_(keep, valid)
    if keep is None:
        return Decoded(table, 0)
    return Decoded(table.filter(keep), len(table) - pc.sum(keep).as_py())


def _no_null_inside(lists: pa.ChunkedArray) -> pa.Array | None:
    """Which rows' lists hold no null (``None``: none does), as the line-by-line path and Python's reader take
    a list of numbers: Arrow's reader takes ``[1, null]`` into a list column."""
    joined = lists.combine_chunks()
    inside = pc.list_flatten(joined)
    if not inside.null_count:
        return None
    holding = pc.list_parent_indices(joined).to_numpy()[pc.is_null(inside).to_numpy(zero_copy_only=False)]
    whole = np.ones(len(joined), dtype=bool)
    whole[holding] = False
    return pa.array(whole)


def _line_by_line(kind: str, body: bytes) -> Decoded:
    records, bad = [], 0
    check = _validator(kind)
    floats = [c.name for c in columns(kind) if c.python is float]
    for line in body.split(b"\n"):
        try:
            record = json.loads(line)
        except (ValueError, RecursionError):
            bad += 1
            continue
        if isinstance(record, dict) and record.get("kind", kind) == kind and check(record):
            for name in floats:
                if type(record.get(name)) is int:
                    record[name] = float(record[name])
            records.append(record)
        else:
            bad += 1
    try:
        completed = _completed(kind, pa.Table.from_pylist(records, schema=schema(kind)))
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, OverflowError, UnicodeEncodeError):
        return Decoded(empty(kind), bad + len(records))  # the checks above should make this unreachable
    return Decoded(completed.table, bad + completed.bad)


def _validator(kind: str) -> typing.Callable[[dict[str, Any]], bool]:
    specs = columns(kind)

    def fits(column: Column, value: Any) -> bool:
        if value is None:
            return column.nullable or not column.required
        if column.python is float:  # an integer too, as Arrow's reader takes one (1e400 overflows: not finite)
            if type(value) is float and not column.finite:
                return True
            return type(value) in (int, float) and math.isfinite(float(value) if abs(value) < 1e308 else math.inf)
        if column.python is int:
            return type(value) is int and INT64_RANGE[0] <= value <= INT64_RANGE[1]
        if column.python is tuple:
            return isinstance(value, list) and all(
                type(v) is int and INT64_RANGE[0] <= v <= INT64_RANGE[1] for v in value
            )
        if column.python is str:
            return type(value) is str and _utf8(value)
        return type(value) is column.python

    def check(record: dict[str, Any]) -> bool:  # a missing field is a null, as in the one-call parsers
        return all(fits(c, record.get(c.name)) for c in specs)

    return check


def _utf8(text: str) -> bool:
    """Whether ``text`` can be stored (JSON may carry lone surrogates, which UTF-8 cannot)."""
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True


def conform(kind: str, table: pa.Table, names: Sequence[str] | None = None) -> pa.Table:
    """A table read back from disk in ``kind``'s current schema (its columns ``names`` only, where given): a
    column an older recording lacks is all nulls, extra columns are left out, types are cast."""
    target = schema(kind) if names is None else pa.schema([schema(kind).field(name) for name in names])
    arrays = []
    for field in target:
        if field.name in table.column_names:
            arrays.append(table.column(field.name).cast(field.type))
        else:
            arrays.append(pa.nulls(len(table), field.type))
    return _completed(kind, pa.Table.from_arrays(arrays, schema=target)).table


def table_of(events: Sequence[Event]) -> pa.Table:
    """Events of one kind as their table: the door where event objects come in (meshtop's own events, tests);
    the fold and every reader past it take tables only."""
    kind = events[0].kind
    records = [event.to_record() for event in events]
    return pa.Table.from_pylist(records, schema=schema(kind))


def tables_of(events: Iterable[Event]) -> list[tuple[str, pa.Table]]:
    """Events of any kinds as one table a kind (:func:`table_of`), in the fold's order
    (:data:`~meshtop.probes.kinds.FOLD_ORDER`): a rank's start before its work, a step after the work it
    closes."""
    by_kind: dict[str, list[Event]] = {}
    for event in events:
        by_kind.setdefault(event.kind, []).append(event)
    return [(kind, table_of(by_kind[kind])) for kind in sorted(by_kind, key=FOLD_ORDER.__getitem__)]


def events_of(kind: str, table: pa.Table) -> list[Event]:
    """The rows of ``kind``'s table as event objects (for a reader that handles a few rows one at a time)."""
    events = []
    for record in table.to_pylist():
        record["kind"] = kind
        events.append(event_from_record(record))
    return events
