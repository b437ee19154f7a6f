"""Latency against the asked rate, in text: a capacity sweep's runs as points, the SLO as a row, the capacity as
a column (no Textual here: the block is a list of lines, a function of its points and its size)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import groupby, pairwise
from typing import Any

from rich.text import Text

MARKS: dict[str, tuple[str, str]] = {
    "passed": ("●", "bold green"),
    "missed": ("×", "bold red"),
    "saturated": ("▲", "bold yellow"),
    "client-limited": ("○", "bold magenta"),
}
"""A run's point by what the run came to: its glyph and colour, the dashboard's (green fine, red an error, yellow
a warning, magenta what is not the server's doing)."""
ABOVE = "↑"
"""A point above the chart's top, drawn on the top row in its mark's colour."""
CURVE = ("·", "cyan")
"""The line joining a configuration's points, in the dashboard's colour for charts."""
SLO_LINE = ("─", "red")
CAPACITY_LINE = ("│", "green")
AXIS_STYLE = "dim"
ABOVE_SLO = 1.25
"""The latency axis reaches a quarter above the SLO at least, so that the points just above its line show."""
CLIP_SLO = 3.0
"""The latency axis stops at 3 x the SLO: an overloaded run's TTFT grows with its queue to many times the rest,
and an axis up to it would press the points below the SLO, the ones the capacity is read from, into a row."""


@dataclass(frozen=True, slots=True)
class RatePoint:
    """One run on the chart."""

    rate: float
    """The asked rate (req/s), or the concurrency of a concurrency search."""
    latency_s: float | None
    """The run's latency percentile; ``None`` (no request answered) is not drawn."""
    mark: str
    """What the run came to: a key of :data:`MARKS`."""


def run_mark(run: dict[str, Any]) -> str | None:
    """A capacity report's run as a key of :data:`MARKS`: ``client-limited`` first (such a run says nothing of
    the server), then ``saturated``, ``missed`` (the SLO's attainment not met), else ``passed``; ``None`` for a
    run without figures (not run yet, or running)."""
    if run.get("met") is None:
        return None
    if run.get("client_limited"):
        return "client-limited"
    if run.get("saturated"):
        return "saturated"
    return "passed" if run["met"] else "missed"


def latency_top(values: Sequence[float | None], slo_s: float | None) -> float:
    """The top of a latency axis: the largest value; with an SLO, at least :data:`ABOVE_SLO` and at most
    :data:`CLIP_SLO` times it."""
    top = max((value for value in values if value is not None), default=0.0)
    if slo_s:
        top = min(max(top, slo_s * ABOVE_SLO), slo_s * CLIP_SLO)
    return top


def rate_label(rate: float) -> str:
    """``2.75``, ``6``, ``1,200``: a rate as short as it reads exactly to two decimals."""
    return f"{rate:,.2f}".rstrip("0").rstrip(".")


def ms_label(seconds: float) -> str:
    """A latency in ms for an axis: whole ms from 10 ms, one decimal below."""
    ms = seconds * 1e3
    return f"{ms:,.0f}" if ms >= 10 or ms == 0 else f"{ms:.1f}"


def _half_up(value: float) -> int:
    return int(value + 0.5)


def rate_chart(
    title: str,
    points: Sequence[RatePoint],
    *,
    width: int,
    height: int,
    slo_s: float | None = None,
    capacity: float | None = None,
    rates: tuple[float, float] | None = None,
    top_s: float | None = None,
    highlight: int | None = None,
) -> list[Text]:
    """Latency against asked rate: ``height`` lines of ``width`` cells each.

    The lines are the title, ``h = height - 3`` rows of plot, the axis and the rates under it. Left of the plot
    sit the latency labels in ms (the top's, the SLO's and 0, right-aligned to the longest) and the axis; the
    plot is the other ``w`` columns. The rules (rounding half up):

    - x: a rate ``r`` sits in column ``round((r - lo) / (hi - lo) x (w - 1))``, ``(lo, hi)`` being ``rates``
      (by default 0 to the largest point's rate), column 0 when ``hi == lo``;
    - y: a latency ``v`` sits ``round(min(v, top) / top x (h - 1))`` rows above the plot's bottom row, ``top``
      being ``top_s`` (by default :func:`latency_top` of the points); a point above ``top`` is :data:`ABOVE`
      on the top row, in its mark's colour;
    - the points in rate order are joined by the curve: a column strictly between two neighbours takes a
      :data:`CURVE` dot at the row rounded from the straight line between their cells;
    - the SLO is a row of :data:`SLO_LINE` at its height when within the axis; the capacity a column of
      :data:`CAPACITY_LINE` at its rate (``┼`` where the two cross, ``┴`` on the axis), its rate in green below;
    - on a shared cell the later wins, in this order: the lines, the curve, the points that passed, those that
      did not (a failure is never hidden behind a pass); point ``highlight`` (an index of ``points``) is drawn
      reversed.

    Too small for a plot (fewer than 2 rows or 4 columns), the block is the title and blank lines.
    """
    head = Text(title[:width].ljust(width), style="bold")
    rows = height - 3
    drawn = [point for point in points if point.latency_s is not None]
    top = top_s if top_s is not None else latency_top([point.latency_s for point in drawn], slo_s)
    slo_label = ms_label(slo_s) if slo_s is not None and 0 < slo_s <= top else None
    labels_width = max(len(ms_label(top)), len(slo_label or ""), 1)
    columns = width - labels_width - 1
    if rows < 2 or columns < 4:
        return [head] + [Text(" " * width) for _ in range(max(height - 1, 0))]
    lo, hi = rates if rates is not None else (0.0, max((point.rate for point in points), default=0.0))

    def column(rate: float) -> int:
        return 0 if hi <= lo else min(max(_half_up((rate - lo) / (hi - lo) * (columns - 1)), 0), columns - 1)

    def row(latency: float) -> int:
        return 0 if top <= 0 else _half_up(min(latency, top) / top * (rows - 1))

    cells = [[(" ", "")] * columns for _ in range(rows)]  # cells[0] is the bottom row
    slo_row = row(slo_s) if slo_label is not None and slo_s is not None else None
    cap_column = column(capacity) if capacity is not None and lo <= capacity <= hi else None
    if slo_row is not None:
        cells[slo_row] = [SLO_LINE] * columns
    if cap_column is not None:
        for y in range(rows):
            cells[y][cap_column] = ("┼", SLO_LINE[1]) if y == slo_row else CAPACITY_LINE
    placed = [(column(p.rate), row(p.latency_s), p) for p in drawn if p.latency_s is not None]
    placed.sort(key=lambda cell: cell[2].rate)
    for (x0, y0, _), (x1, y1, _) in pairwise(placed):
        for x in range(x0 + 1, x1):
            cells[_half_up(y0 + (y1 - y0) * (x - x0) / (x1 - x0))][x] = CURVE
    for x, y, point in sorted(placed, key=lambda cell: cell[2].mark != "passed"):
        glyph, style = MARKS[point.mark]
        if point.latency_s is not None and point.latency_s > top:
            glyph = ABOVE
        if highlight is not None and 0 <= highlight < len(points) and point is points[highlight]:
            style += " reverse"
        cells[y][x] = (glyph, style)

    labels = {rows - 1: ms_label(top), 0: "0"}
    if slo_row is not None and slo_label is not None:
        labels[slo_row] = slo_label
    lines = [head]
    for y in reversed(range(rows)):
        line = Text()
        line.append(labels.get(y, "").rjust(labels_width) + ("┤" if y in labels else "│"), style=AXIS_STYLE)
        for style, run in groupby(cells[y], key=lambda cell: cell[1]):
            line.append("".join(glyph for glyph, _ in run), style=style)
        lines.append(line)
    axis = ["─"] * columns
    if cap_column is not None:
        axis[cap_column] = "┴"
    lines.append(Text(" " * labels_width + "└" + "".join(axis), style=AXIS_STYLE))
    lines.append(_ticks(labels_width + 1, columns, lo, hi, cap_column, capacity))
    return lines


def _ticks(indent: int, columns: int, lo: float, hi: float, cap_column: int | None, capacity: float | None) -> Text:
    """The rates under the axis: the capacity's centred under its column (green), then ``lo`` from the first
    column and ``hi`` up to the last, each left out where it would touch one already placed."""
    wanted: list[tuple[str, int, str]] = []
    if cap_column is not None and capacity is not None:
        label = rate_label(capacity)
        wanted.append((label, min(max(cap_column - (len(label) - 1) // 2, 0), columns - len(label)), "green"))
    wanted.append((rate_label(lo), 0, AXIS_STYLE))
    wanted.append((rate_label(hi), columns - len(rate_label(hi)), AXIS_STYLE))
    taken: list[tuple[int, int, str, str]] = []
    for label, start, style in wanted:
        end = start + len(label)
        if start >= 0 and end <= columns and all(end < s or start > e for s, e, _, _ in taken):
            taken.append((start, end, label, style))
    ticks, at = Text(" " * indent), 0
    for start, end, label, style in sorted(taken):
        ticks.append(" " * (start - at))
        ticks.append(label, style=style)
        at = end
    ticks.append(" " * (columns - at))
    return ticks
