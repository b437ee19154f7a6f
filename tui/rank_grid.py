"""The rank grid: one cell per rank, a row of cells per node, coloured by how far the rank stands out.

A cell's colour is its modified z-score on the chosen measure (the metrics core's attention rule,
:mod:`meshtop.recordings.metrics.attention`), not a colour scale of its own: green at or better than the
crowd, yellow above it, red where the core flags it. 1024 ranks on 16 nodes of 64 take 16 rows of 64 cells;
a node wider than the screen wraps its cells onto more rows. With the attention filter only the nodes that
stand out, or hold a rank that does, are drawn, and their other ranks are dimmed.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from itertools import groupby
from operator import itemgetter

from rich.console import Group
from rich.text import Text

from meshtop.recordings.metrics.attention import LABELS, STEP_MEASURES, Z_LIMIT, Attention, Scored
from meshtop.tui.state import DashboardState
from meshtop.tui.summary_text import human_bytes, human_seconds
from meshtop.tui.views import Panel, RankFilter, section

MEASURES = ("step", "communication", "data", "bubble", "headroom")
"""The grid's measures, in the order ``m`` cycles them."""
CELL = "█"
UNSCORED = "·"
GROUP = 8
"""Cells between two gaps, where the row has room for them."""
TOP_K = 8
LABEL_WIDTH = 14
CALM, ABOVE, FLAGGED = "#5faf5f", "#d7af5f", "bold #ff5f5f"


def value_text(measure: str, value: float) -> str:
    return human_seconds(value) if measure in STEP_MEASURES else human_bytes(value)


def cell_style(scored: Scored | None, *, chosen: bool = False) -> str:
    """The colour of a rank's cell: unscored (dim), calm (z at most 1), above the crowd, flagged; ``chosen``
    (the rank ↑/↓ chose) reversed."""
    if scored is None:
        return "dim"
    colour = FLAGGED if scored.flagged else CALM if scored.z <= 1 else ABOVE
    return f"reverse {colour}" if chosen else colour


def grid_text(
    attention: Attention,
    nodes: Mapping[int, Sequence[int]],
    node_label: Callable[[int], str],
    width: int,
    *,
    only_attention: bool = False,
    chosen: int | None = None,
) -> Group:
    """The grid: a row (or several) of cells per node in ``nodes`` (node -> its ranks, in order), a text each.

    A row's cells of one colour are one span (a gap takes the colour of the cell after it: a space shows no
    foreground): a calm row of 64 cells is one span, where a span a cell made a 1024-rank grid 1,024
    spans to build, compare and draw each frame."""
    by_rank = {scored.key: scored for scored in attention.ranks}
    flagged_nodes = set(attention.flagged_nodes)
    flagged_ranks = set(attention.flagged_ranks)
    room = max(8, width - LABEL_WIDTH)
    lines = []
    for node, ranks in sorted(nodes.items()):
        standing_out = node in flagged_nodes or any(rank in flagged_ranks for rank in ranks)
        if only_attention and not standing_out:
            continue
        per_row = _cells_per_row(len(ranks), room)
        gaps = per_row + per_row // GROUP <= room
        for start in range(0, len(ranks), per_row):
            label = node_label(node) if start == 0 else ""
            style = FLAGGED if node in flagged_nodes and start == 0 else "bold" if start == 0 else ""
            line = Text(no_wrap=True, overflow="ellipsis")
            line.append(f"{label[: LABEL_WIDTH - 1]:<{LABEL_WIDTH}}", style=style)
            cells: list[tuple[str, str]] = []
            for index, rank in enumerate(ranks[start : start + per_row]):
                scored = by_rank.get(rank)
                dim = only_attention and rank not in flagged_ranks and node not in flagged_nodes
                style = "dim" if dim else cell_style(scored, chosen=rank == chosen)
                if gaps and index and index % GROUP == 0:
                    cells.append((" ", "" if "reverse" in style else style))
                cells.append((UNSCORED if scored is None else CELL, style))
            for style, run in groupby(cells, key=itemgetter(1)):
                line.append("".join(char for char, _ in run), style=style)
            lines.append(line)
    if only_attention and not flagged_nodes and not flagged_ranks:
        lines.append(Text("no rank or node stands out", style="dim"))
    return Group(*lines, Text())  # a blank line under the grid


def _cells_per_row(ranks: int, room: int) -> int:
    """Cells a row holds: all of a node's where they fit (with a gap each :data:`GROUP` where that fits too)."""
    with_gaps = ranks + (ranks - 1) // GROUP
    if with_gaps <= room or ranks <= room:
        return max(1, ranks)
    return max(1, room - room // (GROUP + 1))


def standing_out(attention: Attention, k: int = TOP_K) -> list[Scored]:
    """The ``k`` ranks that stand out most: above the crowd (``z`` over 0), the worst first."""
    return [scored for scored in attention.top(k) if scored.z > 0]


def top_text(measure: str, shown: list[Scored], node_of: dict[int, int], *, chosen: int | None = None) -> Text:
    """The ranks that stand out most (``shown``, :func:`standing_out`'s), a line each: rank, node, value, z;
    ``chosen`` marked ▶."""
    text = Text()
    for scored in shown:
        z = "inf" if scored.z == float("inf") else f"{scored.z:.1f}"
        value = value_text(measure, scored.value)
        marker = "▶ " if scored.key == chosen else "  "
        line = f"{marker}rank {scored.key:<5} n{node_of.get(scored.key, 0):<3} {value:>10}"
        text.append(line, style=FLAGGED if scored.flagged else "")
        text.append(f"  z {z}\n", style="dim")
    if chosen is not None:
        text.append("↑/↓ choose · enter: its process and stack (Procs view)\n", style="dim")
    return text


def header_text(attention: Attention, *, only_attention: bool, keys: bool = True) -> Text:
    """What the grid shows and (``keys``) its keys: the measure, the crowd's median, what stands out."""
    text = Text()
    text.append(f"{LABELS[attention.measure]}", style="bold")
    if attention.median is not None:
        text.append(f" · median {value_text(attention.measure, attention.median)}")
    ranks, nodes = attention.flagged_ranks, attention.flagged_nodes
    text.append(" · ")
    if ranks or nodes:
        text.append(f"{len(ranks)} rank(s), {len(nodes)} node(s) stand out (z > {Z_LIMIT:g})", style=FLAGGED)
    else:
        text.append("nothing stands out", style=CALM)
    if keys:
        text.append(f"   m: measure · a: {'every rank' if only_attention else 'attention only'}", style="dim")
    text.append("\n")
    return text


class GridPanel(Panel):
    """The rank grid with the ranks that stand out most beside it; ``m`` cycles the measure, ``a`` shows only
    what needs attention."""

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.measure = MEASURES[0]
        self.only_attention = False
        self.chosen: int | None = None
        """The rank ↑/↓ chose among those that stand out most (``None``: none yet, the worst is)."""
        self._shown: list[int] = []

    def cycle_measure(self) -> None:
        self.measure = MEASURES[(MEASURES.index(self.measure) + 1) % len(MEASURES)]
        self.chosen = None

    def move(self, delta: int) -> None:
        """Choose the next (``delta`` 1) or previous rank of those that stand out most."""
        if not self._shown:
            return
        at = self._shown.index(self.chosen) if self.chosen in self._shown else 0
        self.chosen = self._shown[max(0, min(len(self._shown) - 1, at + delta))]

    def show(self, state: DashboardState, ranks: RankFilter) -> None:
        found = state.attention(self.measure)
        views = state.rank_views(ranks)
        nodes: dict[int, list[int]] = {}
        for view in views:
            nodes.setdefault(view.node, []).append(view.rank)
        node_of = {view.rank: view.node for view in views}
        shown = standing_out(found)
        self._shown = [scored.key for scored in shown if scored.key in node_of]
        if self.chosen not in self._shown:
            self.chosen = self._shown[0] if self._shown else None
        grid = grid_text(
            found, nodes, state.host_label, self.usable_width, only_attention=self.only_attention, chosen=self.chosen
        )
        self.paint(
            Group(
                header_text(found, only_attention=self.only_attention),
                grid,
                section(f"stand out most ({LABELS[self.measure]})"),
                top_text(self.measure, shown, node_of, chosen=self.chosen),
            )
        )
