"""A widget drawn line by line (Textual's line API) that redraws only the lines whose content changed.

A ``Static`` given new content renders all of it again, every line, to strips,
and the compositor redraws its whole region: at the frame rate, on a
200 x 60 screen, that was most of a frame. A :class:`LineView` keeps the
lines of what it was last given; ``paint`` compares the new lines with them,
renders only the changed ones (when Textual asks for them) and marks only
their rows dirty, so the compositor and the terminal see those rows alone.
It lays the screen out again only when its number of lines changes.

Each line is rendered as a ``Static`` renders Rich content (``RichVisual``:
the console renders it under the widget's base style, cut to the width), so
the screen reads and looks the same.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Hashable, Iterable, Iterator
from dataclasses import dataclass
from itertools import islice

from rich.console import Group, RenderableType
from rich.segment import Segment
from rich.text import Span, Text
from textual.geometry import Region
from textual.strip import Strip
from textual.widget import Widget


@dataclass(frozen=True, slots=True)
class Line:
    """One row of a :class:`LineView`: what identifies its look, and how to draw it."""

    key: Hashable
    """Equal keys draw equal rows: a text's characters, spans and styles; a table row's segments."""
    text: Text | None = None
    """A row of text, drawn when first shown."""
    strip: Strip | None = None
    """A row drawn already (a row of a table, which is drawn whole)."""
    cut: RowCut | None = None
    """A row of a longer text, made a text of its own only if it is drawn."""

    def row_text(self) -> Text | None:
        return self.text if self.cut is None else self.cut.text()


@dataclass(frozen=True, slots=True)
class RowCut:
    """Characters ``start:end`` of a text (a row: no newline), with their spans."""

    source: Text
    start: int
    end: int
    spans: tuple[Span, ...]

    def key(self) -> Hashable:
        """What :func:`text_key` says of the row's text, without making it."""
        return (self.source.plain[self.start : self.end], self.spans, self.source.style, self.source.justify)

    def text(self) -> Text:
        """The row as ``Text.split`` makes it."""
        source = self.source
        return Text(
            source.plain[self.start : self.end],
            style=source.style,
            justify=source.justify,
            overflow=source.overflow,
            no_wrap=source.no_wrap,
            end=source.end,
            tab_size=source.tab_size,
            spans=list(self.spans),
        )


def cut_rows(text: Text) -> list[RowCut]:
    """``text``'s rows (split at each newline, a blank row after a last one) as ``Text.split`` cuts them (each
    span clipped to each row it covers, in the text's order; a span on a newline alone dropped), without making
    a text a row: most rows of a frame are the last frame's, and only their keys are needed (a Text a row is what
    made splitting a whole view a frame costly)."""
    plain = text.plain
    starts = [0]
    newline = plain.find("\n")
    while newline != -1:
        starts.append(newline + 1)
        newline = plain.find("\n", newline + 1)
    ends = [start - 1 for start in starts[1:]]
    ends.append(len(plain))
    spans: list[list[Span]] = [[] for _ in starts]
    for span_start, span_end, style in text.spans:
        if span_end <= span_start:
            continue
        for row in range(bisect_right(starts, span_start) - 1, bisect_right(starts, span_end - 1)):
            start, end = starts[row], ends[row]
            clipped = Span(max(span_start, start) - start, min(span_end, end) - start, style)
            if clipped.end > clipped.start:
                spans[row].append(clipped)
    return [RowCut(text, start, end, tuple(row)) for start, end, row in zip(starts, ends, spans, strict=True)]


def text_key(text: Text) -> Hashable:
    """What a row of text looks like in a :class:`LineView` (``Text.__eq__`` leaves out its base style; the
    view cuts every row with an ellipsis, whatever its overflow)."""
    return (text.plain, tuple(text.spans), text.style, text.justify)


class LineView(Widget):
    """Rich content drawn line by line; ``paint`` redraws only the lines that changed."""

    DEFAULT_CSS = """
    LineView { height: auto; }
    """

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self._content: list[RenderableType] = []
        """The parts of the content last painted (a ``Group``'s renderables), to draw again at a new width."""
        self._lines: list[Line] = []
        self._strips: dict[Hashable, Strip] = {}
        """The rows drawn for :attr:`_look`, by key: a row that moved up or down is not drawn again."""
        self._look: tuple[int, object] | None = None
        """The width and the widget's style the rows were drawn for."""
        self._laid_out_rows = -1
        """The height the screen was last laid out for (Textual asked :meth:`get_content_height`)."""
        self.hidden_width = 0
        """The width to draw at while the widget is hidden (it has no width then): the width it will be shown at,
        so that content painted before it is shown is drawn once, when shown, and not again a frame later."""

    @property
    def draw_width(self) -> int:
        """The width content is drawn for: the widget's own, or :attr:`hidden_width` while it has none."""
        return self.size.width or self.hidden_width

    @property
    def line_count(self) -> int:
        return len(self._lines)

    def paint(self, content: RenderableType) -> None:
        """Show ``content`` (texts are cut at the edge, not wrapped); refresh the rows that changed, and lay
        the screen out again only when the number of rows did."""
        width = self.draw_width
        self._content = list(parts_of(content))
        lines = list(self._lines_of(self._content, width))
        old, self._lines = self._lines, lines
        if not self._same_look(width) or len(lines) != self._laid_out_rows:
            self.refresh(layout=len(lines) != self._laid_out_rows)
            return
        changed = [y for y, (new, was) in enumerate(zip(lines, old, strict=False)) if new.key != was.key]
        if changed:
            shown = {line.key for line in lines}
            self._strips = {key: strip for key, strip in self._strips.items() if key in shown}
            self.refresh(*rows_regions(changed, width))

    def _same_look(self, width: int) -> bool:
        """Whether the rows drawn are for ``width`` and the widget's style now; if not, forget them."""
        look = (width, self.visual_style)
        if look == self._look:
            return True
        self._look, self._strips = look, {}
        return False

    def _lines_of(self, parts: list[RenderableType], width: int) -> Iterator[Line]:
        for part in parts:
            if isinstance(part, Text):  # a row as it is (not copied: it is not changed here), or cut into rows
                if "\n" in part.plain:
                    for cut in cut_rows(part):
                        yield Line(key=cut.key(), cut=cut)
                else:
                    yield Line(key=text_key(part), text=part)
            else:  # a table: drawn whole now, each row a line
                for strip in self._strips_of(part, width, height=None):
                    yield Line(key=tuple(strip), strip=strip)

    def get_content_height(self, container: object, viewport: object, width: int) -> int:
        self._laid_out_rows = len(self._lines)
        return self._laid_out_rows

    def render_line(self, y: int) -> Strip:
        width = self.size.width
        if not self._same_look(width):  # resized (or restyled) since the last paint: tables drawn again
            self._lines = list(self._lines_of(self._content, width))
            if len(self._lines) != self._laid_out_rows:  # a table drawn at another width may take other rows
                self.refresh(layout=True)
        if y >= len(self._lines):
            return Strip.blank(width, self.visual_style.rich_style)
        line = self._lines[y]
        strip = self._strips.get(line.key)
        if strip is None:
            text = line.row_text()
            drawn = line.strip if text is None else self._draw_text(text, width)
            assert drawn is not None, "a line without text is drawn already"
            strip = self._strips[line.key] = drawn
        return strip

    def _draw_text(self, text: Text, width: int) -> Strip:
        """A row of text as :meth:`_strips_of` draws it: the text cut at ``width`` (its overflow), its spans under
        the widget's style. A left-aligned row without tabs (every row of the panels) is drawn straight from
        its spans, without the console's wrapping and its copies (the same strips, made faster)."""
        plain = text.plain
        if not plain or "\t" in plain or text.justify not in (None, "default") or self.app.console_options.justify:
            text = text.copy()
            text.no_wrap, text.overflow = True, "ellipsis"
            drawn = self._strips_of(text, width, height=1)
            return drawn[0] if drawn else Strip([], 0)
        if text.cell_len > width:
            text = text.copy()
            text.truncate(width, overflow="ellipsis")
        console = self.app.console
        if text.spans:
            segments: Iterable[Segment] = text.render(console, end="")  # its own style under its spans
        else:  # Text.render leaves a text's own style to the console where no span is there to lay it under
            segments = [Segment(text.plain, console.get_style(text.style) if text.style else None)]
        return Strip(Segment.apply_style(segments, self.visual_style.rich_style))

    def _strips_of(self, renderable: RenderableType, width: int, height: int | None) -> list[Strip]:
        """What a ``Static`` draws of ``renderable`` at ``width`` (textual.visual.RichVisual.render_strips)."""
        app = self.app
        options = app.console_options.update(highlight=False, width=width, height=height)
        styled = self.post_render(renderable, self.visual_style.rich_style)
        segments = app.console.render(styled, options.update_width(width))
        lines = Segment.split_and_crop_lines(segments, width, include_new_lines=False, pad=False)
        return [Strip(line) for line in islice(lines, None, height)]


def parts_of(content: RenderableType) -> Iterator[RenderableType]:
    """The renderables of ``content`` one after the other, groups opened."""
    if isinstance(content, Group):
        for part in content.renderables:
            yield from parts_of(part)
    else:
        yield content


def rows_regions(rows: list[int], width: int) -> Iterator[Region]:
    """One region for each run of consecutive ``rows``."""
    start = previous = rows[0]
    for row in rows[1:]:
        if row != previous + 1:
            yield Region(0, start, width, previous - start + 1)
            start = row
        previous = row
    yield Region(0, start, width, previous - start + 1)
