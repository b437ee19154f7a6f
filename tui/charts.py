"""Drawing in text: sparklines, column charts, memory bars, and how numbers read (no Textual here)."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Sequence
from itertools import islice

from rich.text import Span, Text

BLOCKS = " ▁▂▃▄▅▆▇█"
MAX_COLUMNS_PER_VALUE = 8
"""A chart widens each value to at most this many columns (a short history on a wide screen)."""

MEMORY_PARTS = (
    ("weights", "#5f87d7"),
    ("grads", "#d7875f"),
    ("optimizer", "#af87d7"),
    ("activations", "#87af5f"),
    ("kv cache", "#d7af5f"),
    ("other", "#808080"),
)
"""Memory categories in bar order, with their colours."""

STEP_PARTS = (
    ("data", "#d7af5f"),
    ("forward", "#5f87d7"),
    ("backward", "#87afd7"),
    ("optimizer", "#af87d7"),
    ("communication", "#d7875f"),
    ("bubble", "#d75f5f"),
    ("other", "#808080"),
)
"""The step's parts (recordings/metrics/breakdown.py) in bar order, with their colours."""


def human_rate(value: float | None, unit: str = "") -> str:
    if value is None:
        return "-"
    for scale, prefix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= scale:
            return f"{value / scale:.1f}{prefix}{unit}"
    return f"{value:.0f}{unit}"


def sparkline(values: Sequence[float], width: int, *, low: float | None = None, high: float | None = None) -> str:
    """The last ``width`` values as one row of eighth blocks, scaled to [low, high] (their range by default)."""
    recent = list(islice(values, max(0, len(values) - width), None)) if width > 0 else []
    if not recent:
        return " " * max(width, 0)
    low = min(recent) if low is None else low
    high = max(recent) if high is None else high
    span = high - low
    if span <= 0:
        return (BLOCKS[8] * len(recent)).rjust(width)
    # one comprehension, no calls per cell: a view draws a sparkline per rank every frame
    levels = [round((value - low) / span * 8) for value in recent]
    return "".join([BLOCKS[1 if level < 1 else 8 if level > 8 else level] for level in levels]).rjust(width)


def column_chart(values: Sequence[float], width: int, height: int, *, low: float = 0.0) -> list[str]:
    """The last ``width`` values as columns ``height`` rows tall, from ``low`` to the largest; top row first."""
    recent = list(values)[-width:] if width > 0 else []
    top = max(recent, default=0.0) - low
    columns = [_column(_eighths(value - low, top, height), height) for value in recent]
    if not columns:
        return [" " * max(width, 0)] * height
    return ["".join(row).rjust(width) for row in zip(*columns, strict=True)]


def _eighths(value: float, top: float, height: int) -> int:
    """How many eighths of a cell a column of ``value`` fills, of ``height`` cells for ``top`` (a value above
    zero fills one at least)."""
    eighths = 0 if top <= 0 else round(max(value, 0.0) / top * height * 8)
    return max(eighths, 1) if value > 0 else eighths


@functools.lru_cache(maxsize=4096)
def _column(eighths: int, height: int) -> tuple[str, ...]:
    """A column's cells, top first, filled ``eighths`` eighths from the bottom (a chart's columns repeat: one
    drawn per height, not a cell at a time a frame)."""
    return tuple(BLOCKS[min(8, max(0, eighths - row * 8))] for row in reversed(range(height)))


def chart(
    title: str,
    values: Sequence[float],
    *,
    width: int,
    height: int,
    format_value: Callable[[float], str],
    from_zero: bool = True,
) -> Text:
    """A titled column chart: the latest value by the title, the axis from zero (or the smallest) to the largest.

    Fewer values than columns are widened, up to :data:`MAX_COLUMNS_PER_VALUE` columns each, so that a short
    history fills a wide screen.
    """
    text = Text()
    latest = format_value(values[-1]) if values else "-"
    text.append(f"{title} ", style="bold")
    text.append(f"{latest}\n", style="bold cyan")
    if not values:
        text.append(" " * 9 + " (no data yet)\n", style="dim")
        return text
    shown = list(values)[-max(4, width - 10) :]
    low = 0.0 if from_zero else min(shown)
    top_label, low_label = format_value(max(shown)), ("0" if from_zero else format_value(low))
    label_width = max(9, len(top_label), len(low_label))
    plot_width = max(4, width - label_width - 1)
    shown = shown[-plot_width:]
    repeat = max(1, min(MAX_COLUMNS_PER_VALUE, plot_width // len(shown)))
    widened = [value for value in shown for _ in range(repeat)]
    floor = low if from_zero else low - (max(shown) - low) / (height * 8)  # the smallest keeps a sliver
    rows = column_chart(widened, plot_width, height, low=floor)
    for index, row in enumerate(rows):
        label = top_label if index == 0 else (low_label if index == height - 1 else "")
        text.append(label.rjust(label_width) + " ", style="dim")
        text.append(row + "\n", style="cyan")
    return text


def memory_bar(parts: dict[str, int | None], capacity: int | None, width: int, *, largest: int | None = None) -> Text:
    """Memory as one bar: a run of cells per category (MEMORY_PARTS), then the headroom left. Without a
    ``capacity`` (a CPU rank) the bar is drawn against ``largest``, the most any rank shown uses, so that
    the bars compare; a category above zero takes a cell at least."""
    total = sum(v for v in parts.values() if v)
    scale = capacity if capacity and capacity >= total else max(total, largest or 0)
    if width <= 0:
        return Text()
    if not scale:
        return Text("·" * width, style="dim")
    values = [(parts.get(name) or 0, colour) for name, colour in MEMORY_PARTS]
    runs = [(max(round(value / scale * width), 1 if value > 0 else 0), colour) for value, colour in values]
    # the headroom after the parts; a CPU rank's bar (no capacity) just ends where it uses less
    return stacked_bar(runs, width, rest="░" if capacity else " ", rest_style="#303030" if capacity else None)


def parts_bar(shares: dict[str, float], width: int) -> Text:
    """A step's parts as one bar: a run of cells per part (STEP_PARTS order), as long as its share."""
    if width <= 0:
        return Text()
    return stacked_bar([(round(shares.get(name, 0.0) * width), colour) for name, colour in STEP_PARTS], width)


def stacked_bar(runs: Iterable[tuple[int, str]], width: int, *, rest: str = " ", rest_style: str | None = None) -> Text:
    """Runs of full cells, (cells, colour) each, one after the other up to ``width``; the rest of the width
    ``rest`` in ``rest_style``. One string and its spans: a bar per rank per frame, so no Text.append."""
    spans, used = [], 0
    for cells, colour in runs:
        cells = min(cells, width - used)
        if cells > 0:
            spans.append(Span(used, used + cells, colour))
            used += cells
    if used < width and rest_style:
        spans.append(Span(used, width, rest_style))
    return Text("█" * used + rest * (width - used), spans=spans)


def legend(parts: Iterable[tuple[str, str]], present: set[str] | None = None, *, headroom: bool = False) -> Text:
    """A bars' key: a swatch and the name of each of ``parts`` (name, colour) ``present`` (every one when
    ``None``), and the headroom where the bars have a capacity."""
    text = Text()
    for name, colour in parts:
        if present is None or name in present:
            text.append("█", style=colour)
            text.append(f" {name} ")
    if headroom:
        text.append("░", style="#606060")
        text.append(" headroom")
    return text
