"""Drawing in text: sparklines, column charts, memory bars, and how numbers read (no Textual here)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from itertools import islice

from rich.text import Span, Text

from tui.summary_text import human_bytes, human_seconds

__all__ = ["human_bytes", "human_seconds", "human_rate", "sparkline", "column_chart", "chart", "memory_bar", "legend"]

BLOCKS = " ▁▂▃▄▅▆▇█"

MEMORY_PARTS = (
    ("weights", "W", "#5f87d7"),
    ("grads", "G", "#d7875f"),
    ("optimizer", "O", "#af87d7"),
    ("activations", "A", "#87af5f"),
    ("kv cache", "K", "#d7af5f"),
    ("other", "·", "#808080"),
)
"""Memory categories in bar order: name, legend letter, colour."""


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
    cells = []
    for value in recent:
        level = 8 if span <= 0 else round((value - low) / span * 8)
        cells.append(BLOCKS[max(1, min(8, level))])
    return "".join(cells).rjust(width)


def column_chart(values: Sequence[float], width: int, height: int, *, low: float = 0.0) -> list[str]:
    """The last ``width`` values as columns ``height`` rows tall, from ``low`` to the largest; top row first."""
    recent = list(values)[-width:] if width > 0 else []
    rows = [[" "] * len(recent) for _ in range(height)]
    top = max(recent, default=0.0) - low
    for column, value in enumerate(recent):
        value -= low
        eighths = 0 if top <= 0 else round(max(value, 0.0) / top * height * 8)
        eighths = max(eighths, 1) if value > 0 else eighths
        for row in range(height):
            fill = min(8, max(0, eighths - row * 8))
            rows[height - 1 - row][column] = BLOCKS[fill]
    return ["".join(row).rjust(width) for row in rows]


def chart(title: str, values: Sequence[float], *, width: int, height: int,
          format_value: Callable[[float], str], from_zero: bool = True) -> Text:
    """A titled column chart: the latest value by the title, the axis from zero (or the smallest) to the largest."""
    label_width = 9
    plot_width = max(4, width - label_width - 1)
    text = Text()
    latest = format_value(values[-1]) if values else "-"
    text.append(f"{title} ", style="bold")
    text.append(f"{latest}\n", style="bold cyan")
    if not values:
        text.append(" " * label_width + " (no data yet)\n", style="dim")
        return text
    shown = list(values)[-plot_width:]
    low = 0.0 if from_zero else min(shown) - (max(shown) - min(shown)) / (height * 8)
    rows = column_chart(shown, plot_width, height, low=low)
    for index, row in enumerate(rows):
        label = format_value(max(shown)) if index == 0 else (format_value(low) if index == height - 1 else "")
        text.append(label.rjust(label_width) + " ", style="dim")
        text.append(row + "\n", style="cyan")
    return text


def memory_bar(parts: dict[str, int | None], capacity: int | None, width: int) -> Text:
    """Memory as one bar: a run of cells per category (MEMORY_PARTS), then the headroom left."""
    total = sum(v for v in parts.values() if v)
    scale = capacity if capacity and capacity >= total else total
    if width <= 0:
        return Text()
    if not scale:
        return Text("·" * width, style="dim")
    spans, used_cells = [], 0  # one string and its spans: a bar per rank per frame, so no Text.append
    for name, _, colour in MEMORY_PARTS:
        value = parts.get(name) or 0
        cells = min(max(round(value / scale * width), 1 if value > 0 else 0), width - used_cells)
        if cells:
            spans.append(Span(used_cells, used_cells + cells, colour))
            used_cells += cells
    if used_cells < width:
        spans.append(Span(used_cells, width, "#303030" if capacity else "dim"))
    return Text("█" * used_cells + "░" * (width - used_cells), spans=spans)


def legend() -> Text:
    text = Text()
    for name, _, colour in MEMORY_PARTS:
        text.append("█", style=colour)
        text.append(f" {name} ")
    text.append("░", style="#606060")
    text.append(" headroom")
    return text
