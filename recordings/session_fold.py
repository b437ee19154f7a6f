"""One session's fold: the :class:`~meshtop.recordings.metrics.run.RunFold` every reader of a session shares.

A session folds its event stream once. The thread that receives the events feeds the fold (live: the
fold thread, as each batch reaches meshtop, :mod:`meshtop.recordings.folding`; a replay: the replay source, as it
plays the recording); every
reader reads the same fold: ``record``'s progress lines and verdict, the manifest's step count, the
``/metrics`` endpoint (its scrapes come on the HTTP server's threads) and the dashboard. A lock keeps a
reader from seeing a batch half folded; :meth:`SessionFold.figures` and any read of the fold's own fields
hold it.

The thread that feeds the fold takes the job steps each batch completed (:meth:`SessionFold.take`,
:meth:`SessionFold.take_tables`) and hands them on with the batch: every step once, in order.
"""

from __future__ import annotations

import copy
import threading
from collections import Counter
from collections.abc import Collection, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from meshtop.probes.arrivals import Arrivals, EncodedEvents
from meshtop.probes.events import Event
from meshtop.probes.kinds import BULK_KINDS, FOLDED_KINDS
from meshtop.recordings.clock import on_head
from meshtop.recordings.manifest import RunDescription
from meshtop.recordings.metrics.figures import RunFigures
from meshtop.recordings.metrics.run import RunFold
from meshtop.recordings.metrics.steps import PHASE_TIMES, JobStep
from meshtop.recordings.replay import in_kind_order
from meshtop.recordings.schema import decode_lines, table_of

Batch = tuple[str, pa.Table]

Clock = tuple[int | None, int]
"""Where a block's times are: (the node that streamed it, its offset), ``(None, 0)`` on this machine's clock."""


def arrival_tables(
    arrivals: Arrivals, kinds: Collection[str], without: dict[str, frozenset[str]] | None = None
) -> list[Batch]:
    """The events of ``kinds`` in ``arrivals`` as typed tables: each kind's encoded blocks decoded together (one
    parse a kind; another node's rows then put on this one's clock, :mod:`meshtop.recordings.clock`), then the
    events made in meshtop's own process; kinds in the order they first came. ``without``: columns of a kind
    the encoded blocks are read without (:func:`meshtop.recordings.schema.decode_lines`)."""
    blocks: dict[str, dict[Clock, list[EncodedEvents]]] = {}
    made: dict[str, list[Event]] = {}
    order: list[str] = []
    for item in arrivals.items:
        if item.kind not in kinds:
            continue
        if item.kind not in blocks and item.kind not in made:
            order.append(item.kind)
        if isinstance(item, EncodedEvents):
            blocks.setdefault(item.kind, {}).setdefault((item.node, item.offset_ns), []).append(item)
        else:
            made.setdefault(item.kind, []).append(item)
    batches: list[Batch] = []
    for kind in order:
        left = (without or {}).get(kind, frozenset())
        batches += [(kind, table) for table in _decoded(kind, blocks.get(kind, {}), left)]
        if kind in made:
            batches.append((kind, table_of(made[kind]).drop_columns(list(left))))
    return batches


DECODE_BYTES = 8 << 20
"""The most of a kind's blocks parsed in one go. A live fold that fell behind takes seconds of a thousand
ranks' steps at once (40 MB and more): one buffer of them, past glibc's 32 MB ceiling for serving
allocations from its arenas, was a fresh mapping faulted in page by page, and its copies took the
interpreter's lock from every other thread of the head (the fleet benchmark's head spent 61 % of the time
it held the lock there)."""


def _decoded(
    kind: str, groups: dict[Clock, list[EncodedEvents]], without: frozenset[str] = frozenset()
) -> list[pa.Table]:
    """The blocks of ``kind`` as tables on this machine's clock, parsed :data:`DECODE_BYTES` at most at a
    time (whole blocks, in the order they came)."""
    tables: list[pa.Table] = []
    piece: dict[Clock, list[EncodedEvents]] = {}
    size = 0
    for clock, group in groups.items():
        for block in group:
            if size and size + len(block.lines) > DECODE_BYTES:
                tables += _decoded_piece(kind, piece, without)
                piece, size = {}, 0
            piece.setdefault(clock, []).append(block)
            size += len(block.lines)
    return tables + _decoded_piece(kind, piece, without)


def _decoded_piece(
    kind: str, groups: dict[Clock, list[EncodedEvents]], without: frozenset[str] = frozenset()
) -> list[pa.Table]:
    """The blocks of ``kind`` as tables on this machine's clock: one for every node's, or one a clock.

    Every node's blocks are parsed in one go (a thousand ranks' steps over 16 nodes make 16 small blocks
    a poll, which Python's ``json`` parses at a fifth of the speed of Arrow's reader on one big one), and
    their rows moved at once, each by its node's offset (cut by clock where this machine's rows are among
    them); where a line was bad or a block's count is not its lines, the rows no longer line up with
    the blocks, and each clock's blocks are parsed apart."""
    if not groups:
        return []
    if len(groups) > 1:
        decoded = decode_lines(kind, b"".join(block.lines for group in groups.values() for block in group), without)
        counts = [sum(block.count for block in group) for group in groups.values()]
        if not decoded.bad and decoded.table.num_rows == sum(counts) and None not in (node for node, _ in groups):
            nodes, offsets = zip(*groups, strict=True)  # every row moved at once, by its node's offset
            table = on_head(kind, decoded.table, offset_ns=np.repeat(offsets, counts), node=np.repeat(nodes, counts))
            return [table]
        if not decoded.bad and decoded.table.num_rows == sum(counts):
            tables, start = [], 0
            for clock, rows in zip(groups, counts, strict=True):
                tables.append(_on_this_clock(kind, decoded.table.slice(start, rows), clock))
                start += rows
            return tables
    return [
        _on_this_clock(kind, decode_lines(kind, b"".join(block.lines for block in group), without).table, clock)
        for clock, group in groups.items()
    ]


def _on_this_clock(kind: str, table: pa.Table, clock: Clock) -> pa.Table:
    node, offset = clock
    return table if node is None else on_head(kind, table, offset_ns=offset, node=node)


@dataclass(frozen=True, slots=True)
class Folded:
    """What one batch of a live session brought to the fold."""

    tables: list[Batch]
    """The batch's events of the fold's kinds, a table a kind, in the order they were folded."""
    steps: list[JobStep]
    """The job steps the batch completed, in order."""
    left_out: frozenset[str] = frozenset()
    """Kinds of the fold's left out of this batch to keep up (the bulk kinds, :mod:`meshtop.recordings.folding`;
    recorded all the same)."""


class SessionFold:
    """A run's one fold and the lock its readers share.

    It folds the kinds its readers read (``kinds``): every figure (:data:`~meshtop.probes.kinds.FOLDED_KINDS`)
    where a dashboard or ``/metrics`` reads it, only :data:`~meshtop.probes.kinds.PROGRESS_KINDS` for a
    headless ``record`` without ``/metrics``, whose figures are read from the recording when the job ends:
    decoding and folding the others (collectives above all) would halve what ``record`` takes in, for figures
    nobody reads until ``summary`` reads the recording."""

    def __init__(self, run: RunDescription, *, kinds: Collection[str] = FOLDED_KINDS) -> None:
        self.fold = RunFold(run)
        self.kinds = frozenset(kinds)
        self.left_out: Counter[str] = Counter()
        """Events of the bulk kinds left out of a live fold to keep up, by kind (the recording has them)."""
        self.lock = threading.RLock()
        self._steps_taken = 0
        """Job steps completed before the last :meth:`take_tables` returned (what it reports from)."""

    def __deepcopy__(self, memo: dict[int, Any]) -> SessionFold:
        """A copy with its own lock (a replay keeps copies of its state to seek back to)."""
        with self.lock:
            copied = SessionFold.__new__(SessionFold)
            memo[id(self)] = copied
            copied.fold = copy.deepcopy(self.fold, memo)
            copied.kinds = self.kinds
            copied.left_out = Counter(self.left_out)
            copied.lock = threading.RLock()
            copied._steps_taken = self._steps_taken
        return copied

    @property
    def run(self) -> RunDescription:
        """What runs (an elastic script's world size once its ranks said it)."""
        return self.fold.run

    @contextmanager
    def reading(self) -> Iterator[RunFold]:
        """The fold, held still while the ``with`` block reads it."""
        with self.lock:
            yield self.fold

    def take(self, arrivals: Arrivals, *, bulk_left_out: bool = False) -> Folded:
        """Fold a live session's batch: its events of :attr:`kinds`, decoded a table a kind and folded in kind
        order (a rank's start before its work, a step after the work it closes). A batch without the bulk kinds
        (``bulk_left_out``: left out to keep up, :mod:`meshtop.recordings.folding`; or a fold that reads none)
        does not break down the steps it may have torn (:meth:`RunFold.apply_torn`), and its steps are read
        without their phase times, the largest part of their lines."""
        torn = bulk_left_out or not self.kinds >= BULK_KINDS
        tables = in_kind_order(arrival_tables(arrivals, self.kinds, {"step": frozenset(PHASE_TIMES)} if torn else None))
        steps = self.take_tables(tables, torn=torn)
        return Folded(tables, steps, self.kinds & BULK_KINDS if bulk_left_out else frozenset())

    def take_tables(self, tables: list[Batch], *, torn: bool = False) -> list[JobStep]:
        """Fold ``tables`` (a live batch's; a replay's slice), in the order given; the job steps they completed.
        ``torn``: the batch may have lost its bulk kinds (:meth:`RunFold.apply_torn`)."""
        with self.lock:
            if torn:
                self.fold.apply_torn(tables)
            else:
                for kind, table in tables:
                    self.fold.apply(kind, table)
            return self._completed()

    def finish(self, status: str) -> list[JobStep]:
        """The run ended with ``status`` and no end event said so (a session that broke, a recording cut
        short): decide what is left; the job steps that completed."""
        with self.lock:
            self.fold.finish(status)
            return self._completed()

    def _completed(self) -> list[JobStep]:
        """The job steps completed since the last call (the caller holds the lock)."""
        steps = self.fold.steps_since(self._steps_taken)
        self._steps_taken = self.fold.steps_completed
        return steps

    def figures(self) -> RunFigures:
        """Every figure now."""
        with self.lock:
            return self.fold.figures()

    @property
    def steps_completed(self) -> int:
        return self.fold.steps_completed
