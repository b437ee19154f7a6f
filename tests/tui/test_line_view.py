"""The LineView draws a row of text as a Static would: its own quick path for a plain left-aligned row agrees
with the console's rendering cell by cell (character and style), however the row is styled or cut (the view
cuts every row with an ellipsis)."""

from __future__ import annotations

from rich.console import Group
from rich.text import Text
from textual.app import App, ComposeResult
from textual.strip import Strip

from meshtop.tui.line_view import LineView


class OneView(App[None]):
    def compose(self) -> ComposeResult:
        yield LineView(id="view")


def cells(strip: Strip) -> list[tuple[str, object]]:
    """Each cell's character and style (a zero-width segment draws nothing)."""
    return [(char, segment.style) for segment in strip for char in segment.text]


def texts() -> list[Text]:
    spans = Text("rank 7  ")
    spans.append("12.5 ms", style="bold #ff5f5f")
    spans.append("  ████████", style="#5faf5f")
    spans.stylize("reverse", 2, 12)  # overlapping spans
    wide = Text("漢字 wide ▶ cells 漢字漢字漢字", style="dim")
    styled = Text("memory per rank", style="bold underline")  # a style of its own and no span
    long = Text("x" * 150, overflow="ellipsis")
    long.append(" tail", style="red")
    cropped = Text("y" * 150, overflow="crop", style="italic")
    return [spans, wide, styled, long, cropped, Text("plain"), Text(""), Text("   ")]


async def test_a_row_of_text_is_drawn_as_the_console_draws_it() -> None:
    app = OneView()
    async with app.run_test(size=(80, 10)):
        view = app.query_one(LineView)
        for width in (80, 40, 3):
            for text in texts():
                fast = view._draw_text(text, width)
                text.no_wrap, text.overflow = True, "ellipsis"  # what the view does to every row
                slow = view._strips_of(text, width, height=1)
                assert cells(fast) == cells(slow[0] if slow else Strip([])), (text.plain[:20], width)
                assert fast.cell_length <= width


async def test_rows_given_one_by_one_are_drawn_as_rows_of_one_text_and_left_as_they_were() -> None:
    app = OneView()
    async with app.run_test(size=(20, 10)) as pilot:
        view = app.query_one(LineView)
        rows = [Text("a" * 30, overflow="fold"), Text("b", style="bold")]
        view.paint(Group(*rows))
        await pilot.pause()
        one_by_one = [cells(view.render_line(y)) for y in range(2)]
        view.paint(Text("\n").join(rows))
        await pilot.pause()
        assert [cells(view.render_line(y)) for y in range(2)] == one_by_one
        assert one_by_one[0][-1][0] == "…"  # cut, not folded onto a second row
        assert (rows[0].overflow, rows[0].no_wrap) == ("fold", None)  # the caller's rows (kept, shared) unchanged


def test_rows_are_cut_from_a_text_as_rich_splits_it() -> None:
    from random import Random

    from rich.text import Span

    from meshtop.tui.line_view import cut_rows, text_key

    rng = Random(7)
    styles = ["bold", "red", "on blue", "dim italic"]
    for _ in range(3000):
        plain = "".join(rng.choice("ab█ \n") for _ in range(rng.randrange(0, 40))) + "\n"  # cut: with a newline
        spans = []
        for _ in range(rng.randrange(0, 6)):
            start = rng.randrange(0, len(plain) + 1)
            spans.append(Span(start, min(len(plain), start + rng.randrange(0, 12)), rng.choice(styles)))
        text = Text(plain, style=rng.choice(["", "green"]), justify=rng.choice([None, "left"]), spans=spans)
        split = text.split("\n", allow_blank=True)
        cut = cut_rows(text)
        assert [(row.text().plain, row.text().spans, row.text().style, row.text().justify) for row in cut] == [
            (line.plain, line.spans, line.style, line.justify) for line in split
        ], (plain, spans)
        assert [row.key() for row in cut] == [text_key(line) for line in split]
