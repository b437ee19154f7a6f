"""``meshtop replay OUT`` on a capacity sweep: the configurations ranked by capacity, the latency-versus-rate chart of
the one under the cursor, and every run, each run's recording one key away.

Keys: up/down move in the focused table (the chart follows: a configuration's curves, or the run's configuration
with the run's point drawn reversed); tab moves between the configurations and the runs; Enter replays the run
under the cursor (on a configuration, its run at capacity); q quits. The app ends with the recording the user
opened, or ``None``: the command line replays that recording in the dashboard and comes back here when it is
closed.

It reads the capacity report (``meshtop.recordings.capacity.capacity_report``) as the dict ``summary OUT --json``
prints under ``sweep``: ``slo``, ``attainment``, ``search``, ``users``, ``capacity`` (a row a configuration,
best first) and ``runs`` (every run in the order run, its ``recording`` relative to the sweep's folder).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

from rich.text import Text
from textual import events
from textual.app import App, ComposeResult, RenderResult
from textual.binding import Binding, BindingType
from textual.reactive import reactive
from textual.widget import Widget
from textual.widgets import DataTable, Footer, Static

from meshtop.tui.rate_chart import MARKS, RatePoint, latency_top, rate_chart, rate_label, run_mark
from meshtop.tui.summary_text import human_seconds

LATENCIES = (("ttft", "TTFT"), ("tpot", "TPOT"))
"""The two latencies a capacity's SLO names, the run's ``<key>_p99_s`` and the SLO's ``<key>_s``."""
PANEL_MIN_WIDTH = 34
"""Narrower than two of these side by side, the TTFT and TPOT charts stack (each keeps its axis labels and
some 25 columns of plot)."""
BAD_LIMITS = ("fit", "failed")
"""What stopped a configuration that reads as an error (red); the rest (queue, latency, client) as a warning."""


def _cell(value: float | None, form: str = ",.2f") -> str:
    return "-" if value is None else format(value, form)


def _yes(flag: bool | None, yes: str, no: str = "dim") -> Text:
    """A flag's cell: ``yes`` and ``no`` in their styles, ``-`` where the run has no figures."""
    return Text("-", style="dim") if flag is None else Text("yes", style=yes) if flag else Text("no", style=no)


def capacity_title(report: dict[str, Any]) -> Text:
    """Two lines: ``capacity sweep · 2 configurations, 9 runs, by rate · OUT``, then ``SLO TTFT ≤ 500.0 ms, TPOT ≤
    50.0 ms for 95% of requests`` and the offered load with ``--users``."""
    slo = report.get("slo") or {}
    targets = [f"{name} ≤ {human_seconds(slo[f'{key}_s'])}" for key, name in LATENCIES if slo.get(f"{key}_s")]
    text = Text()
    text.append("capacity sweep", style="bold")
    text.append(f" · {len(report['capacity'])} configurations, {len(report['runs'])} runs, by {report['search']}")
    text.append(f" · {report['sweep']}", style="dim")  # last: a long path is what the ellipsis cuts
    text.append(f"\nSLO {', '.join(targets) or 'none'} for {report['attainment']:.0%} of requests")
    if (users := report.get("users")) is not None:
        text.append(
            f" · offered {users['offered_per_s']:,.2f} req/s ({users['users']:,} users x "
            f"{rate_label(users['rate_per_user'])} req/s)",
            style="bold",
        )
    return text


def config_columns(report: dict[str, Any]) -> list[str]:
    """The configurations table's titles: a concurrency search adds the concurrency at capacity, ``--users``
    how many of the configuration (and GPUs) the offered load needs."""
    columns = ["#", "config", "req/s", "per GPU", "GPUs"]
    if report["search"] == "concurrency":
        columns.append("at concurrency")
    columns += ["TTFT p99", "TPOT p99", "limited by"]
    if report.get("users") is not None:
        columns += ["needed", "GPUs needed"]
    return columns


def config_cells(report: dict[str, Any], rank: int, row: dict[str, Any]) -> list[Text]:
    """One configuration's cells under :func:`config_columns`; a configuration without capacity has no rank."""
    has = bool(row["requests_per_s"])
    cells = [
        Text(str(rank) if has else "-", justify="right"),
        Text(row["config"], style="bold"),
        Text(_cell(row["requests_per_s"]), justify="right", style="bold green" if has else "bold red"),
        Text(_cell(row["per_gpu"]), justify="right"),
        Text(_cell(row["gpus"], "d"), justify="right"),
    ]
    if report["search"] == "concurrency":
        cells.append(Text("-" if row["rate"] is None else rate_label(row["rate"]), justify="right"))
    cells += [Text(human_seconds(row.get(f"{key}_p99_s")), justify="right") for key, _ in LATENCIES]
    limit = row.get("limited_by")  # a reason is long: it is under the charts
    cells.append(Text(limit or "-", style="bold red" if limit in BAD_LIMITS else "yellow"))
    if report.get("users") is not None:
        cells += [Text(_cell(row.get(key), "d"), justify="right") for key in ("needed", "needed_gpus")]
    return cells


def run_columns(report: dict[str, Any]) -> list[str]:
    return (
        ["", "config", report["search"], "achieved", "SLO met", "met", "saturated", "client-limited"]
        + [f"{name} p99" for _, name in LATENCIES]
        + ["why"]
    )


def run_cells(run: dict[str, Any]) -> list[Text]:
    """One run's cells under :func:`run_columns`: its point's mark, the figures, and why it did not pass (or its
    status, where it did not complete)."""
    mark = run_mark(run)
    glyph, style = MARKS[mark] if mark is not None else (" ", "")
    why = run.get("why") or (run["status"] if run.get("status") not in (None, "completed") else "")
    attainment = run.get("attainment")
    return [
        Text(glyph, style=style),
        Text(run["config"]),
        Text(rate_label(run["rate"]), justify="right"),
        Text(_cell(run.get("achieved_rate")), justify="right"),
        Text("-" if attainment is None else f"{attainment:.0%}", justify="right"),
        _yes(run.get("met"), "green", "bold red"),
        _yes(run.get("saturated"), "yellow"),
        _yes(run.get("client_limited"), "magenta"),
        *(Text(human_seconds(run.get(f"{key}_p99_s")), justify="right") for key, _ in LATENCIES),
        Text(why, style="yellow" if mark not in (None, "passed") else ""),
    ]


def legend(config: str) -> Text:
    text = Text(no_wrap=True, overflow="ellipsis")
    text.append(f"{config} ", style="bold reverse")
    for name, (glyph, style) in MARKS.items():
        text.append(f" {glyph}", style=style)
        text.append(f" {name}")
    text.append("  ─", style="red")
    text.append(" SLO")
    text.append("  │", style="green")
    text.append(" capacity")
    return text


def detail(report: dict[str, Any], config: str, run: int | None) -> Text:
    """The line under the charts: the run under the cursor (its figures, why, its blocker's suggestion), or the
    configuration's capacity and what limited it."""
    text = Text(no_wrap=True, overflow="ellipsis")
    if run is not None:
        this = report["runs"][run]
        text.append(f"{report['search']} {rate_label(this['rate'])}", style="bold")
        if this.get("status") != "completed":
            text.append(f" · {this.get('status')}", style="bold red")
        if this.get("why"):
            text.append(f" · {this['why']}", style="yellow")
        if (blocker := this.get("blocker")) is not None:
            text.append(f" · blocker {blocker['kind']}: {blocker['evidence']}; try {blocker['suggestion']}")
        return text
    row = next((row for row in report["capacity"] if row["config"] == config), None)
    if row is None:
        return text
    if row["requests_per_s"]:
        text.append(f"capacity {row['requests_per_s']:,.2f} req/s", style="bold green")
        text.append(f" ({row['per_gpu']:,.2f} per GPU, {report['search']} {rate_label(row['rate'])})")
    else:
        text.append("no capacity", style="bold red")
    if row.get("limited_by"):
        text.append(f" · limited by {row['limited_by']}")
    if row.get("reason"):
        text.append(f" · {row['reason']}", style="yellow")
    return text


def config_charts(report: dict[str, Any], config: str, *, width: int, height: int, run: int | None = None) -> Text:
    """``config``'s TTFT p99 and TPOT p99 against the asked rate, side by side (stacked where narrower than
    two :data:`PANEL_MIN_WIDTH`), under a legend and over :func:`detail`; run ``run`` (an index of the report's
    runs) is the point drawn reversed. Every configuration's charts share their axes (0 to the sweep's largest
    rate; each latency's top over all runs), so that moving between configurations compares them."""
    runs = report["runs"]
    slo = report.get("slo") or {}
    mine = [index for index, this in enumerate(runs) if this["config"] == config and run_mark(this) is not None]
    row = next((row for row in report["capacity"] if row["config"] == config), None)
    capacity = row["rate"] if row is not None and row["requests_per_s"] else None
    rates = (0.0, max((this["rate"] for this in runs), default=0.0))
    side = width >= 2 * PANEL_MIN_WIDTH + 2
    panel_width, panel_height = ((width - 2) // 2, height - 2) if side else (width, (height - 2) // 2)
    panels = []
    for key, name in LATENCIES:
        points = [RatePoint(runs[i]["rate"], runs[i].get(f"{key}_p99_s"), run_mark(runs[i]) or "") for i in mine]
        panels.append(
            rate_chart(
                f"{name} p99 (ms) by {report['search']}{' (req/s)' if report['search'] == 'rate' else ''}",
                points,
                width=panel_width,
                height=panel_height,
                slo_s=slo.get(f"{key}_s"),
                capacity=capacity,
                rates=rates,
                top_s=latency_top([this.get(f"{key}_p99_s") for this in runs], slo.get(f"{key}_s")),
                highlight=mine.index(run) if run in mine else None,
            )
        )
    lines = [legend(config)]
    if side:
        lines += [Text("  ").join(pair) for pair in zip(*panels, strict=True)]
    else:
        lines += [line for panel in panels for line in panel]
    lines.append(detail(report, config, run))
    for line in (lines[0], lines[-1]):
        line.truncate(width, overflow="ellipsis")
    return Text("\n", no_wrap=True, overflow="ellipsis").join(lines)


def run_index(report: dict[str, Any], path: Path) -> int | None:
    """The index of the run whose recording is at ``path``."""
    out = Path(report["sweep"])
    return next(
        (index for index, run in enumerate(report["runs"]) if run.get("recording") and out / run["recording"] == path),
        None,
    )


class RateCharts(Widget):
    """The latency-versus-rate charts of one configuration, as large as the widget."""

    config: reactive[str | None] = reactive(None)
    """The configuration drawn."""
    run: reactive[int | None] = reactive(None)
    """The run under the cursor (an index of the report's runs), drawn reversed; ``None`` on a configuration."""

    def __init__(self, report: dict[str, Any]) -> None:
        super().__init__()
        self.report = report

    def render(self) -> RenderResult:
        if self.config is None:
            return Text("no run of this sweep has finished yet", style="dim")
        return config_charts(
            self.report, self.config, width=self.content_size.width, height=self.content_size.height, run=self.run
        )


class CapacityApp(App[Path | None]):
    """A capacity sweep: the configurations ranked, the charts of the one under the cursor, and its runs; Enter
    replays a run (see the module's docstring for the keys)."""

    TITLE = "meshtop capacity sweep"
    CSS = """
    #head { height: auto; padding: 0 1; background: $boost; text-wrap: nowrap; text-overflow: ellipsis; }
    #configs { height: auto; max-height: 40%; }
    RateCharts { height: 3fr; min-height: 8; padding: 0 1; }
    #runs { height: 2fr; }
    """
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("q,ctrl+c", "quit", "Quit", key_display="q", priority=True),
        # above the tables' own Enter and the screen's Tab, so that the footer shows them
        Binding("enter", "open", "Replay this run", priority=True),
        Binding("tab", "focus_next", "Configurations / runs", priority=True),
    ]

    def __init__(self, report: dict[str, Any], *, cursor: int | None = None) -> None:
        """``cursor``: a run (an index of the report's runs) to open on, with the runs focused; by default the
        best configuration, with the configurations focused."""
        super().__init__()
        self.report = report
        self.cursor = cursor

    def compose(self) -> ComposeResult:
        yield Static(capacity_title(self.report), id="head")
        yield DataTable(zebra_stripes=True, cursor_type="row", id="configs")
        yield RateCharts(self.report)
        yield DataTable(zebra_stripes=True, cursor_type="row", id="runs")
        yield Footer()

    def on_mount(self) -> None:
        configs, runs = self.query_one("#configs", DataTable), self.query_one("#runs", DataTable)
        configs.add_columns(*config_columns(self.report))
        rank = 0
        for row in self.report["capacity"]:
            rank += bool(row["requests_per_s"])
            configs.add_row(*config_cells(self.report, rank, row), key=row["config"])
        runs.add_columns(*run_columns(self.report))
        for index, run in enumerate(self.report["runs"]):
            runs.add_row(*run_cells(run), key=str(index))
        if self.cursor is not None and 0 <= self.cursor < runs.row_count:
            runs.move_cursor(row=self.cursor)
            runs.focus()
        else:
            configs.focus()
        self.follow(self.focused)

    def follow(self, table: Widget | None) -> None:
        """Point the charts at what the cursor of ``table`` is on."""
        charts = self.query_one(RateCharts)
        if not isinstance(table, DataTable) or not table.row_count:
            charts.config = self.report["capacity"][0]["config"] if self.report["capacity"] else None
            return
        if table.id == "runs":
            charts.config, charts.run = self.report["runs"][table.cursor_row]["config"], table.cursor_row
        else:
            charts.config, charts.run = self.report["capacity"][table.cursor_row]["config"], None

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        if event.data_table is self.focused:
            self.follow(event.data_table)

    def on_descendant_focus(self, event: events.DescendantFocus) -> None:
        self.follow(event.widget)

    def recording(self) -> str | None:
        """The recording under the cursor, relative to the sweep: the run's, or the configuration's at capacity."""
        table = self.focused
        if not isinstance(table, DataTable) or not table.row_count:
            return None
        rows = self.report["runs"] if table.id == "runs" else self.report["capacity"]
        recording: str | None = rows[table.cursor_row].get("recording")
        return recording

    def action_open(self) -> None:
        recording = self.recording()
        if recording is None:
            self.notify("no recording here: no run at capacity, or a run not started")
            return
        path = Path(self.report["sweep"]) / recording
        if not path.is_dir():
            self.notify(f"{recording}: the run left no recording", severity="warning")
            return
        self.exit(path)

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        self.action_open()
