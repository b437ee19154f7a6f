"""``meshtop compare A B --tui``: two recordings side by side, the changes beyond noise highlighted; ``g``
shows the two runs' rank grids side by side (what stood out before and after, on the measure ``m`` picks)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from rich.console import Group
from rich.text import Text
from textual.app import App, ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal
from textual.widgets import ContentSwitcher, DataTable, Footer, Static

from meshtop.recordings.compare import grid_attention
from meshtop.recordings.metrics.attention import MEASURES, Attention
from meshtop.recordings.metrics.run import RunFold
from meshtop.tui.rank_grid import grid_text, header_text, standing_out, top_text
from meshtop.tui.state import node_label
from meshtop.tui.summary_text import figure, run_words
from meshtop.tui.views import section

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


@dataclass(frozen=True)
class RunGrid:
    """One run's rank grid at its end: each measure's attention (the metrics core's), and its ranks by node."""

    attention: dict[str, Attention]
    nodes: dict[int, list[int]]
    """Node -> its ranks, in order (every rank of the job; one not heard from on node 0)."""
    hosts: dict[int, str]

    @classmethod
    def of(cls, fold: RunFold) -> RunGrid:
        nodes: dict[int, list[int]] = {}
        for rank in range(fold.run.world_size):
            nodes.setdefault(fold.nodes.get(rank, 0), []).append(rank)
        return cls(grid_attention(fold), nodes, dict(fold.hosts))

    def node_label(self, node: int) -> str:
        return node_label(node, self.hosts)


class CompareApp(App[None]):
    """A read-only table: each metric of A and B, the change, and whether it is real; with ``grids``, ``g``
    switches to the two runs' rank grids."""

    TITLE = "meshtop compare"
    CSS = """
    #runs { height: auto; padding: 0 1; background: $boost; }
    #warnings { height: auto; padding: 0 1; color: $warning; }
    ContentSwitcher { height: 1fr; }
    DataTable { height: 1fr; }
    #grids { height: 1fr; }
    #grids Static { width: 1fr; height: auto; padding: 0 1; }
    """
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("q,ctrl+c", "quit", "Quit", priority=True),
        Binding("c", "only_changes", "Only real changes"),
        Binding("g", "grids", "Rank grids"),
        Binding("m", "measure", "Measure", show=False),
        Binding("a", "attention", "Attention only", show=False),
    ]

    def __init__(
        self,
        comparison: dict[str, Any],
        summary_a: dict[str, Any],
        summary_b: dict[str, Any],
        grids: tuple[RunGrid, RunGrid] | None = None,
    ) -> None:
        super().__init__()
        self.comparison, self.summary_a, self.summary_b = comparison, summary_a, summary_b
        self.grids = grids
        self.only_changes = False
        self.only_attention = False
        measured = [m for m in MEASURES if grids and any(m in grid.attention for grid in grids)]
        self.measures = measured or [next(iter(MEASURES))]
        self.measure = self.measures[0]

    def compose(self) -> ComposeResult:
        yield Static(Text("\n").join([run_line("A", self.summary_a), run_line("B", self.summary_b)]), id="runs")
        warnings = [f"⚠ {w}: the comparison is unfair" for w in self.comparison["warnings"]]
        warnings += [f"⚠ {p}" for p in self.comparison["problems"]]
        yield Static("\n".join(warnings), id="warnings")
        with ContentSwitcher(initial="table"):
            yield DataTable(zebra_stripes=True, cursor_type="row", id="table")
            with Horizontal(id="grids"):
                yield Static(id="grid-a")
                yield Static(id="grid-b")
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

    def action_grids(self) -> None:
        """The metrics' table, or the two runs' rank grids."""
        switcher = self.query_one(ContentSwitcher)
        switcher.current = "grids" if switcher.current == "table" else "table"
        self.paint_grids()

    def action_measure(self) -> None:
        self.measure = self.measures[(self.measures.index(self.measure) + 1) % len(self.measures)]
        self.paint_grids()

    def action_attention(self) -> None:
        self.only_attention = not self.only_attention
        self.paint_grids()

    def on_resize(self) -> None:
        self.paint_grids()

    def paint_grids(self) -> None:
        """Each run's grid on the chosen measure, in its half of the screen, and the ranks that stand out most
        in it."""
        if self.query_one(ContentSwitcher).current != "grids":
            return
        width = max(24, self.size.width // 2 - 2)
        for label, grid, widget in zip("AB", self.grids or (None, None), ("#grid-a", "#grid-b"), strict=True):
            heading = Text(f"{label} ", style="bold reverse")
            found = grid.attention.get(self.measure) if grid is not None else None
            if grid is None or found is None:
                body: Text | Group = Text(f"\nno rank measured {self.measure} in this run", style="dim")
            else:
                node_of = {rank: node for node, ranks in grid.nodes.items() for rank in ranks}
                body = Group(
                    header_text(found, only_attention=self.only_attention, keys=False),
                    grid_text(found, grid.nodes, grid.node_label, width, only_attention=self.only_attention),
                    section("stand out most"),
                    top_text(self.measure, standing_out(found), node_of),
                )
            self.query_one(widget, Static).update(Group(heading, body))
