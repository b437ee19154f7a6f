"""The panels' tables are one Text each (``plain_table``), drawn as Rich draws a Table of the same cells: the
same characters and styles cell for cell, whether the table fits its width or its columns must be cut."""

from __future__ import annotations

from random import Random

from rich.console import Console
from rich.table import Table
from rich.text import Text

from meshtop.tui.views import plain_table


def rich_table(columns: list[tuple[str, str]], rows: list[tuple[list[tuple[str, str]], str]]) -> Table:
    table = Table(box=None, padding=(0, 1), header_style="bold")
    for name, justify in columns:
        table.add_column(name, justify=justify, no_wrap=True)  # type: ignore[arg-type]
    for cells, style in rows:
        table.add_row(*(Text(value, style=cell_style) for value, cell_style in cells), style=style)
    return table


def cells(renderable: Table | Text, width: int) -> list[list[tuple[str, object]]]:
    console = Console(width=width, color_system="truecolor", legacy_windows=False)
    lines = console.render_lines(renderable, console.options.update_width(width), pad=False)
    drawn = [[(char, segment.style or None) for segment in line for char in segment.text] for line in lines]
    for line in drawn:  # Rich pads a table's rows to its width with unstyled blanks; a Text's row ends with it
        while line and line[-1][0] == " " and not line[-1][1]:
            line.pop()
    return drawn


def test_a_plain_table_draws_what_rich_draws_whether_it_fits_or_is_cut() -> None:
    rng = Random(3)
    words = ["rank", "cuda:0", "12.5 ms", "all_reduce", "running", "exited 1", "▁▂▃▅▇", "dp0/pp1", "-"]
    cut = 0
    for _ in range(400):
        columns = [(rng.choice(words), rng.choice(["left", "right"])) for _ in range(rng.randrange(1, 9))]
        rows = [
            (
                [(rng.choice(words) * rng.randrange(1, 3), rng.choice(["", "red", "bold green"])) for _ in columns],
                rng.choice(["", "reverse"]),
            )
            for _ in range(rng.randrange(1, 6))  # a header alone Rich measures otherwise: not drawn here
        ]
        natural = sum(max([len(name)] + [len(r[0][i][0]) for r in rows]) + 2 for i, (name, _) in enumerate(columns))
        width = max(len(columns) * 4, natural - rng.randrange(0, natural // 3 + 1))  # some fit, some are cut
        cut += width < natural
        ours, theirs = cells(plain_table(columns, rows, width), width), cells(rich_table(columns, rows), width)
        assert ours == theirs, (columns, rows, width)
    assert cut > 150  # most cases cut their columns
