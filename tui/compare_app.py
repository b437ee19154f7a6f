"""``meshtop compare A B --tui``: two recordings side by side, the changes beyond noise highlighted."""

from __future__ import annotations

from typing import Any, ClassVar

from rich.text import Text
from textual.app import App, ComposeResult
from textual.binding import Binding, BindingType
from textual.widgets import DataTable, Footer, Static

from meshtop.tui.summary_text import figure, run_words

HIGHER_IS_BETTER = ("throughput", "goodput", "busbw", "headroom")


def verdict(row: dict[str, Any]) -> Text:
    """better / worse / no real change, for a comparison row."""
    ratio = row["ratio"]
    if ratio is None:
        return Text("-", style="dim")
    change = f"{ratio - 1:+.1%}"
    if not row["significant"]:
        return Text(f"{change} (noise)", style="dim")
    higher_better = any(word in row["name"] for word in HIGHER_IS_BETTER)
    better = (ratio > 1) == higher_better
    return Text(f"{change} {'better' if better else 'worse'}", style="bold green" if better else "bold red")


def run_line(label: str, summary: dict[str, Any]) -> Text:
    run, steps, requests = summary["run"], summary["steps"], summary.get("requests")
    p50 = steps["time_s"]["p50"]
    work = f"{requests['completed']}/{requests['count']} requests" if requests else f"{steps['count']} steps"
    text = Text()
    text.append(f"{label} ", style="bold reverse")
    text.append(
        f" {summary['recording']}\n   {run_words(run)} · {run['status']} · {work}"
        + (f" · p50 {'iteration' if requests else 'step'} {p50 * 1e3:.2f} ms" if p50 else "")
    )
    return text


class CompareApp(App[None]):
    """A read-only table: each metric of A and B, the change, and whether it is real."""

    TITLE = "meshtop compare"
    CSS = """
    #runs { height: auto; padding: 0 1; background: $boost; }
    #warnings { height: auto; padding: 0 1; color: $warning; }
    DataTable { height: 1fr; }
    """
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("q,ctrl+c", "quit", "Quit", priority=True),
        Binding("c", "only_changes", "Only real changes"),
    ]

    def __init__(self, comparison: dict[str, Any], summary_a: dict[str, Any], summary_b: dict[str, Any]) -> None:
        super().__init__()
        self.comparison, self.summary_a, self.summary_b = comparison, summary_a, summary_b
        self.only_changes = False

    def compose(self) -> ComposeResult:
        yield Static(Text("\n").join([run_line("A", self.summary_a), run_line("B", self.summary_b)]), id="runs")
        warnings = [f"⚠ {w}: the comparison is unfair" for w in self.comparison["warnings"]]
        warnings += [f"⚠ {p}" for p in self.comparison["problems"]]
        yield Static("\n".join(warnings), id="warnings")
        yield DataTable(zebra_stripes=True, cursor_type="row")
        yield Footer()

    def on_mount(self) -> None:
        table = self.query_one(DataTable)
        table.add_columns("metric", "A", "B", "change")
        self.fill()

    def fill(self) -> None:
        table = self.query_one(DataTable)
        table.clear()
        for row in self.comparison["metrics"]:
            if self.only_changes and not row["significant"]:
                continue
            style = "bold" if row["significant"] else ""
            table.add_row(
                Text(row["name"], style=style),
                figure(row["name"], row["a"]),
                figure(row["name"], row["b"]),
                verdict(row),
            )

    def action_only_changes(self) -> None:
        self.only_changes = not self.only_changes
        self.fill()
