"""Events another node streamed, put on the head's clock where they are read.

A node forwards its ranks' blocks as they were written, on its own clock,
with the offset it last measured against the head's
(:class:`meshtop.probes.events.NodeClock`; docs/multinode.md): decoding and
encoding each event there to move its times cost 28 us an event, more than a
node's meshtop can give a thousand ranks. The head keeps the blocks so
(:mod:`meshtop.recordings.events_log`), and what reads them moves the times
here, a column at a time: every ``*_ns`` time stamp (not a duration) plus the
offset, and ``node`` set where the kind has one, as
:func:`meshtop.probes.events.on_node` does for one event.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from meshtop.probes.events import EVENT_TYPES, clock_fields


def on_head(kind: str, table: pa.Table, *, offset_ns: int | np.ndarray, node: int | np.ndarray) -> pa.Table:
    """``table`` of ``kind``, streamed from ``node`` with its clock ``offset_ns`` behind the head's, on the
    head's clock (nulls stay null). ``offset_ns`` and ``node`` are the table's, or arrays of one a row (several
    nodes' blocks parsed together, moved at once). A column the table was read without stays so."""
    times, tuples, has_node = clock_fields(EVENT_TYPES[kind])
    per_row = isinstance(offset_ns, np.ndarray)
    offset = pa.array(offset_ns, pa.int64()) if per_row else pa.scalar(offset_ns, pa.int64())
    for name in times:
        if (index := table.schema.get_field_index(name)) < 0:
            continue
        column = table.column(name).combine_chunks() if per_row else table.column(name)
        table = table.set_column(index, name, pc.add(column, offset))
    for name in tuples:
        if (index := table.schema.get_field_index(name)) < 0:
            continue
        table = table.set_column(index, name, _moved_lists(table.column(name), offset_ns))
    if has_node:
        index = table.schema.get_field_index("node")
        nodes = (
            pa.array(node, pa.int64()) if isinstance(node, np.ndarray) else pa.array([node] * len(table), pa.int64())
        )
        table = table.set_column(index, "node", nodes)
    return table


def _moved_lists(column: pa.ChunkedArray, offset_ns: int | np.ndarray) -> pa.ChunkedArray:
    """Each list of time stamps in ``column`` moved by ``offset_ns`` (or by each row's); a null list stays null
    (offsets rebuilt from the lists' lengths: a chunk may be a slice of a bigger one)."""
    per_row = isinstance(offset_ns, np.ndarray)
    chunks = []
    for chunk in [column.combine_chunks()] if per_row else column.chunks:
        lengths = pc.fill_null(pc.list_value_length(chunk), 0).to_numpy(zero_copy_only=False)
        offsets = pa.array(np.concatenate([[0], np.cumsum(lengths)]), pa.int32())
        moved = pa.array(np.repeat(offset_ns, lengths), pa.int64()) if per_row else pa.scalar(offset_ns, pa.int64())
        values = pc.add(chunk.flatten(), moved)
        chunks.append(pa.ListArray.from_arrays(offsets, values, type=chunk.type, mask=chunk.is_null()))
    return pa.chunked_array(chunks, type=column.type)
