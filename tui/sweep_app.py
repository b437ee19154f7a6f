"""``meshtop replay OUT`` on a sweep: the ranked plans, each plan's recording one key away.

The app ends with the recording the user opened (Enter), or ``None`` (q): the command line replays that
recording in the dashboard and comes back here when it is closed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

from rich.text import Text
from textual.app import App, ComposeResult
from textual.binding import Binding, BindingType
from textual.widgets import DataTable, Footer, Static

from meshtop.tui.plan_text import SWEEP_COLUMNS, sweep_cells, sweep_notes, sweep_title


class SweepApp(App[Path | None]):
    """A read-only table of the sweep's plans, best first; Enter replays the highlighted plan."""

    TITLE = "meshtop sweep"
    CSS = """
    #head { height: auto; padding: 0 1; background: $boost; }
    #notes { height: auto; padding: 0 1; color: $text-muted; }
    DataTable { height: 1fr; }
    """
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("q,ctrl+c", "quit", "Quit", priority=True),
        Binding("enter", "open", "Replay this plan"),
    ]

    def __init__(self, ranking: dict[str, Any], *, cursor: int = 0) -> None:
        super().__init__()
        self.ranking = ranking
        self.cursor = cursor
        self.openable = [row for row in ranking["plans"] if row.get("recording") and row["measured"] is not None]

    def compose(self) -> ComposeResult:
        yield Static(Text(sweep_title(self.ranking), style="bold"), id="head")
        yield DataTable(zebra_stripes=True, cursor_type="row")
        yield Static("\n".join(sweep_notes(self.ranking)), id="notes")
        yield Footer()

    def on_mount(self) -> None:
        table = self.query_one(DataTable)
        mode = self.ranking["mode"]
        columns = SWEEP_COLUMNS[mode]
        for title, width in columns:
            table.add_column(title, width=abs(width))
        table.add_column("status")
        for row in self.openable:
            if row["rank"] is not None:
                cells = [
                    Text(cell, justify="left" if width < 0 else "right")
                    for cell, (_, width) in zip(sweep_cells(row, mode), columns, strict=True)
                ]
            else:
                cells = [Text("-"), Text(row["key"])] + [Text("")] * (len(columns) - 2)
            table.add_row(*cells, Text(row["status"], style="" if row["status"] == "completed" else "bold red"))
        if self.openable:
            table.move_cursor(row=min(self.cursor, len(self.openable) - 1))
        table.focus()

    def action_open(self) -> None:
        if not self.openable:
            return
        row = self.openable[self.query_one(DataTable).cursor_row]
        self.exit(Path(self.ranking["sweep"]) / row["recording"])

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        self.action_open()
