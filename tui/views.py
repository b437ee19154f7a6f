"""The dashboard's panels: each takes the analysis state and draws itself; none reads probes or files.

A panel redraws only when the app calls ``show`` (at the frame rate, and for
the visible view only), so a busy job costs the screen nothing extra.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import lru_cache

from rich.cells import cell_len, set_cell_size
from rich.console import Group
from rich.text import Span, Text
from textual.widget import Widget

from meshtop.recordings.metrics.breakdown import PARTS
from meshtop.recordings.metrics.memory import MemoryRow, other_bytes
from meshtop.recordings.metrics.pipeline import theoretical_bubble
from meshtop.tui.alerts import alerts_of
from meshtop.tui.charts import MEMORY_PARTS, STEP_PARTS, chart, human_rate, legend, memory_bar, parts_bar, sparkline
from meshtop.tui.line_view import LineView
from meshtop.tui.requests_lines import output_rate, requests_lines
from meshtop.tui.state import DashboardState
from meshtop.tui.summary_text import (
    breakdown_line,
    busbw_text,
    exposed_share,
    human_bytes,
    human_seconds,
    link_rates_text,
)
from meshtop.tui.view_records import PipelineStep, RankView

RankFilter = Callable[[RankView], bool]

MAX_RANK_ROWS = 64
"""Per-rank rows a view draws at most (the most loaded rank always among them); / narrows the ranks."""

ACTION_STYLE = {"forward": ("F", "on #2a6f97"), "backward": ("B", "on #a23e48"), "backward_weight": ("W", "on #c77d30")}
SEVERITY_STYLE = {"error": "bold red", "warning": "yellow", "info": "dim"}
STATUS_STYLE = {"running": "green", "exited 0": "green", "stopped": "yellow", "starting": "yellow"}
"""A rank's status cell; any other status (a failure) is bold red."""
COLLECTIVE_COLUMNS = (
    ("group", "left"),
    ("op", "left"),
    ("count", "right"),
    ("bytes", "right"),
    ("p50", "right"),
    ("p99", "right"),
    ("busbw", "right"),
    ("% step", "right"),
)
"""The collectives table's columns, (title, justify) each; a history column follows where there is room."""


def memory_parts(row: MemoryRow | None) -> tuple[dict[str, int | None], int | None]:
    """A rank's memory as the core has it: its peak over the run, split into what held it at its last snapshot
    (the rest is "other"), and the capacity it is drawn against (its GPU's memory; ``None`` on CPU). What is
    left of the capacity is the core's headroom."""
    if row is None:
        return {"other": None}, None
    if row.weights_bytes is None or row.grads_bytes is None or row.optimizer_bytes is None:  # no snapshot
        return {"other": row.peak_bytes}, row.device_total_bytes
    parts: dict[str, int | None] = {
        "weights": row.weights_bytes,
        "grads": row.grads_bytes,
        "optimizer": row.optimizer_bytes,
        "activations": row.activations_bytes or 0,
        "kv cache": row.kv_cache_bytes or 0,
        "other": other_bytes(row) or 0,
    }
    return parts, row.device_total_bytes


def rank_label(view: RankView) -> str:
    return f"rank {view.rank:<3}"


class Panel(LineView):
    """A view of the dashboard; ``show`` redraws it from the state (``paint``: only the rows that changed)."""

    def show(self, state: DashboardState, ranks: RankFilter) -> None:
        raise NotImplementedError

    @property
    def usable_width(self) -> int:
        return max(20, self.draw_width - 2)

    @property
    def usable_height(self) -> int:
        """The height of the view around the panel (the panel itself is as tall as its content)."""
        container = self.parent
        return max(10, container.size.height if isinstance(container, Widget) else self.size.height)


def memory_lines(
    state: DashboardState, ranks: RankFilter, width: int, limit: int | None, *, with_legend: bool = False
) -> Text:
    """:func:`memory_rows` as one text (a row a line, then a blank line)."""
    return Text("\n").join(memory_rows(state, ranks, width, limit, with_legend=with_legend))


def memory_rows(
    state: DashboardState, ranks: RankFilter, width: int, limit: int | None, *, with_legend: bool = False
) -> list[Text]:
    """A memory bar per rank shown (at most ``limit``, the most loaded among them), and ``with_legend`` the
    key of the parts those bars hold, a text a row (shared: not to be changed). Bars and marker read the same
    figure: each rank's peak over the run."""
    loaded = state.most_loaded_rank()
    rows = state.memory_rows()
    views = state.rank_views(ranks)
    shown = views if limit is None else views[:limit]
    # The most loaded rank keeps its bar when the limit cuts rows, if it is among the ranks shown at all: the
    # core may know its memory before the dashboard has its view (no rank_started read yet), or a filter hides it.
    loaded_view = next((v for v in views if v.rank == loaded), None)
    if loaded_view is not None and limit is not None and loaded_view not in shown:
        shown = [*shown[:-1], loaded_view] if shown else [loaded_view]
    bar_width = max(8, width - 30)
    drawn = [(view, *memory_parts(rows.get(view.rank))) for view in shown]
    largest = max((sum(v for v in parts.values() if v) for _, parts, _ in drawn), default=0)
    lines = [
        rank_memory_row(
            rank_label(view), view.rank == loaded and len(views) > 1, tuple(parts.items()), capacity, bar_width, largest
        )
        for view, parts, capacity in drawn
    ]
    if limit is not None and len(views) > len(shown):
        hint = "view 2" if limit < MAX_RANK_ROWS else "/ to filter"
        lines.append(Text(f"  … {len(views) - len(shown)} more ranks ({hint})", style="dim"))
    lines.append(Text())
    if with_legend:
        present = {name for _, parts, _ in drawn for name, value in parts.items() if value}
        lines.append(legend(MEMORY_PARTS, present, headroom=any(capacity for _, _, capacity in drawn)))
    return lines


@lru_cache(maxsize=4096)
def rank_memory_row(
    label: str, loaded: bool, parts: tuple[tuple[str, int | None], ...], capacity: int | None, width: int, largest: int
) -> Text:
    """One rank's memory row: marker, label, bar and size. Kept for the same figures (the figure is a peak over
    the run: it rarely moves), so a frame draws only the rows whose rank's memory changed."""
    text = Text()
    text.append("▶" if loaded else " ", style="bold magenta")
    text.append(f"{label} ", style="bold magenta" if loaded else "")
    text.append_text(memory_bar(dict(parts), capacity, width, largest=largest))
    used = sum(v for _, v in parts if v)
    text.append((f" {human_bytes(used)}" + (f"/{human_bytes(capacity)}" if capacity else ""))[:20])
    return text


def collectives_table(state: DashboardState, *, limit: int | None, history_width: int, width: int) -> Text:
    """Per (group, op): count, bytes, in-flight p50 / p99, busbw, exposed share of the step and its history."""
    columns = list(COLLECTIVE_COLUMNS)
    if history_width:
        columns.append(("exposed per step", "left"))
    rows = state.collective_rows()
    lines: list[tuple[list[tuple[str, str]], str]] = []
    for line in rows if limit is None else rows[:limit]:
        row = line.figures
        cells = [
            row.group,
            row.op,
            f"{row.count:,}",
            human_bytes(row.bytes),
            human_seconds(row.in_flight_p50_s),
            human_seconds(row.in_flight_p99_s),
            busbw_text(row.busbw_p50_gbps),
            exposed_share(row.exposed_share, row.exposed_measured),
        ]
        if history_width:
            cells.append(sparkline(line.history, history_width, low=0.0))
        lines.append(([(cell, "") for cell in cells], ""))
    if not rows:  # no header over nothing
        return Text(
            "no collectives recorded" if state.info.instrumented else "hooks off (--no-instrument)", style="dim"
        )
    return plain_table(columns, lines, width)


def alert_lines(state: DashboardState, limit: int | None) -> Text:
    alerts = alerts_of(state)
    text = Text()
    if not alerts:
        text.append("no alerts", style="green")
        return text
    for alert in alerts if limit is None else alerts[:limit]:
        text.append(f"{alert.severity.upper():<8}", style=SEVERITY_STYLE[alert.severity])
        text.append(alert.text + "\n")
    if limit is not None and len(alerts) > limit:
        text.append(f"… {len(alerts) - limit} more (view 7)", style="dim")
    return text


def section(title: str) -> Text:
    return Text(title, style="bold underline")


def plain_table(columns: list[tuple[str, str]], rows: list[tuple[list[tuple[str, str]], str]], width: int) -> Text:
    """What ``Table(box=None, padding=(0, 1), header_style="bold")`` draws for no-wrap columns of
    (name, justify) and rows of ((text, style) cells, row style), as one Text: Rich measures and pads
    every cell of a Table, which takes a frame's budget at a few dozen rows (docs/benchmarks.md); this is
    one string. A table wider than ``width`` is cut as Rich cuts columns that do not
    wrap: each column by an even share of the excess (its padding included), its cells then cut with an
    ellipsis (tests/tui/test_plain_table.py: the same cells as Rich's on 400 random tables)."""
    widths = [cell_len(name) for name, _ in columns]
    for cells, _ in rows:
        for index, (value, _) in enumerate(cells):
            widths[index] = max(widths[index], cell_len(value))
    padded = [w + 2 for w in widths]  # a cell's padding: a blank each side
    if sum(padded) > width:
        padded = cut_evenly(padded, width)
        widths = [max(0, w - 2) for w in padded]
    parts: list[str] = []
    spans: list[Span] = []
    offset = 0
    for cells, row_style in [([(name, "") for name, _ in columns], "bold"), *rows]:
        start, cell_spans = offset, []
        for (value, style), (_, justify), column_width, cell_width in zip(cells, columns, widths, padded, strict=False):
            value = ellipsized(value, column_width)
            pad = " " * (column_width - cell_len(value))
            left, right = (pad, "") if justify == "right" else ("", pad)
            if style:
                cell_spans.append(Span(offset + 1, offset + 1 + len(left) + len(value) + len(right), style))
            piece = f" {left}{value}{right} "[:cell_width]  # a column cut to under its padding: blanks, or none
            parts.append(piece)
            offset += len(piece)
        if row_style:
            spans.append(Span(start, offset, row_style))
        spans.extend(cell_spans)
        parts.append("\n")
        offset += 1
    return Text("".join(parts)[:-1], spans=spans, no_wrap=True)


def cut_evenly(widths: list[int], total: int) -> list[int]:
    """``widths`` made to sum to ``total`` (when larger) as Rich's table cuts columns that do not wrap: the
    excess shared out evenly, column by column, each share rounded from what is left (``ratio_reduce`` with
    equal ratios)."""
    excess, left, cut = sum(widths) - total, len(widths), []
    for width in widths:
        share = min(width, round(excess / left)) if excess > 0 else 0
        cut.append(width - share)
        excess, left = excess - share, left - 1
    return cut


def ellipsized(value: str, width: int) -> str:
    """``value`` cut to ``width`` cells, its last an ellipsis, as a Text's ``ellipsis`` overflow cuts it."""
    if cell_len(value) <= width:
        return value
    return set_cell_size(value, width - 1) + "…" if width > 0 else ""


class OverviewPanel(Panel):
    """The one-screen summary: step time (inference: the requests), memory per rank, top collectives, alerts."""

    def show(self, state: DashboardState, ranks: RankFilter) -> None:
        width = self.usable_width
        height = max(18, self.usable_height)
        memory_count = max(1, min(16, (height - 14) // 2))
        chart_rows = max(3, min(12, height - 15 - memory_count))
        durations = [s.duration_s for s in state.steps]
        top: Text | Group = (
            requests_lines(state, width)
            if state.info.inference
            else chart("step time", durations, width=width, height=chart_rows, format_value=human_seconds)
        )
        breakdown = None if state.info.inference else state.figures().breakdown
        if breakdown is not None and (line := breakdown_line(breakdown.parts, "the step")) is not None:
            top = Group(top, Text(f" {line}"[: width - 1]))
        if state.info.endpoint is not None:  # the server's own ranks are not meshtop's: no memory or collectives
            self.paint(Group(top, section("alerts"), alert_lines(state, 4)))
            return
        self.paint(
            Group(
                top,
                section("memory per rank"),
                *memory_rows(state, ranks, width, memory_count),
                section("collectives (busiest)"),
                collectives_table(state, limit=3, history_width=0, width=self.draw_width),  # tables: to the edge
                section("alerts"),
                alert_lines(state, 2),
            )
        )


class DevicesPanel(Panel):
    """Per GPU (or per CPU rank): memory by category, utilisation and power history, clocks, temperature."""

    def show(self, state: DashboardState, ranks: RankFilter) -> None:
        width = self.usable_width
        parts: list[Text] = []
        if not state.gpus:
            why = "no GPU" if state.nvml is None or state.nvml.state != "no_library" else "no NVML library"
            parts.append(Text(f"process metrics only ({why}): memory is the rank's resident set", style="yellow"))
        else:
            spark = max(8, (width - 56) // 2)  # two histories on the first row, the readings on the second
            hosts = state.hosts()
            rows = {(row.node, row.gpu): row for row in state.figures().gpus}  # the run's, the metrics core's
            node = None
            for gpu in sorted(state.gpus.values(), key=lambda g: (g.node, g.gpu)):
                if len(hosts) > 1 and gpu.node != node:
                    node = gpu.node
                    parts.append(section(f"node {node} · {hosts.get(node, '?')}"))
                s = gpu.sample
                line = Text()
                line.append(f"GPU {gpu.gpu} ", style="bold")
                line.append(f"{(s.name or '?')[:22]:<22} ")
                line.append(f"util {sparkline(gpu.utilization, spark, low=0, high=100)} ", style="green")
                line.append(f"{s.utilization_pct or 0:>3.0f}%  ")
                line.append(f"power {sparkline(gpu.power_w, spark, low=0)} ", style="yellow")
                line.append(f"{s.power_w or 0:>4.0f} W\n")
                line.append(f"      {s.sm_clock_mhz or 0:.0f} MHz  {s.temperature_c or 0:.0f}°C")
                if s.memory_total_bytes:
                    line.append(f"  mem {human_bytes(s.memory_used_bytes)}/{human_bytes(s.memory_total_bytes)}")
                for link, tx, rx in (
                    ("NVLink", s.nvlink_tx_bytes_per_s, s.nvlink_rx_bytes_per_s),
                    ("PCIe", s.pcie_tx_bytes_per_s, s.pcie_rx_bytes_per_s),
                ):
                    if tx is not None:
                        line.append(f"  {link} tx {human_rate(tx, 'B/s')} rx {human_rate(rx, 'B/s')}")
                row = rows.get((gpu.node, gpu.gpu))
                if row is not None and (rates := link_rates_text(row.links, row.links_over)) is not None:
                    line.append(f"\n      {rates}", style="dim")
                parts.append(line)
        measure = "allocator's peak" if state.info.device == "cuda" else "resident set"  # the peak over the run
        parts.append(section(f"memory per rank ({measure})"))
        parts.extend(memory_rows(state, ranks, width, MAX_RANK_ROWS, with_legend=True))
        self.paint(Group(*parts))


class CollectivesPanel(Panel):
    """Per process group and op: count, bytes, p50 / p99, busbw, share of the step, history."""

    def show(self, state: DashboardState, ranks: RankFilter) -> None:
        history = max(0, min(40, self.usable_width - 100))
        self.paint(
            Group(
                section("collectives by group and op"),
                Text("p50/p99: in flight, over the run · % step: exposed (≤: no wait seen)", style="dim"),
                collectives_table(state, limit=None, history_width=history, width=self.draw_width),
            )
        )


class PipelinePanel(Panel):
    """The last steps per pipeline rank: forward, backward and idle; each stage's bubble."""

    def show(self, state: DashboardState, ranks: RankFilter) -> None:
        info = state.info
        pp = info.plan.pp
        steps = state.pipeline_steps()
        bubbles = state.bubble_history()
        note = None  # why there is no timeline to draw
        if info.script is not None and not steps:
            note = "no pipeline stage seen (the script has run no torch.distributed.pipelining stage)"
        elif pp <= 1 and info.script is None:
            note = "no pipeline in this plan (pp 1)"
        elif not steps and not (info.inference and bubbles):
            note = "waiting for the first step"
            if not info.instrumented:
                note = "stage timing needs the hooks (run without --no-instrument)"
        if note is not None:
            self.paint(Text(note, style="dim"))
            return
        width = self.usable_width - 8
        text = Text()
        if steps:
            self._timeline(text, steps, width)
        if info.inference:
            title = "bubble per stage (share of iteration time spent waiting; recent: replica 0's)"
        elif info.script is not None:
            title = "bubble fraction per stage over the run; recent steps"
        else:
            m, v = info.plan.microbatches or 1, info.plan.virtual_stages
            title = (
                f"bubble per stage over the run (ideal {theoretical_bubble(pp, m, v):.1%} at {pp} stages "
                f"x {m} mb); recent"
            )
        text.append(title + "\n", style="bold")
        run = {row.stage: row.bubble_fraction for row in state.figures().stages}
        for stage in sorted(set(run) | set(bubbles)):
            figure = f"{run[stage]:6.1%}" if stage in run else "     -"
            text.append(f"stage {stage} {figure} ")
            text.append(
                sparkline(bubbles.get(stage, ()), max(10, width - 20), low=0.0, high=1.0) + "\n", style="magenta"
            )
        self.paint(text)

    @staticmethod
    def _timeline(text: Text, steps: list[PipelineStep], width: int) -> None:
        """The last steps' stage actions per pipeline rank, each step scaled to its span."""
        per_step = max(10, width // len(steps) - 1)
        stages = sorted({stage for step in steps for stage in step.lanes})
        text.append(" " * 8)
        for step in steps:
            label = f"step {step.step + 1} span {human_seconds(step.span_s)}"  # first action to last: not the step time
            text.append(label[:per_step].ljust(per_step) + " ", style="bold")
        text.append("\n")
        for stage in stages:
            text.append(f"stage {stage} ", style="bold")
            for step in steps:
                cells = [" "] * per_step
                styles = ["on #262626"] * per_step
                for segment in step.lanes.get(stage, ()):
                    first = int(segment.start_s / step.span_s * per_step)
                    last = max(first + 1, int(segment.end_s / step.span_s * per_step))
                    letter, style = ACTION_STYLE.get(segment.action, ("?", "on grey50"))
                    for cell in range(first, min(last, per_step)):
                        cells[cell], styles[cell] = letter if cell == first else " ", style
                for glyph, style in zip(cells, styles, strict=False):
                    text.append(glyph, style=style)
                text.append(" ")
            text.append("\n")
        text.append("F forward  B backward  W weight grad  dark: idle\n\n", style="dim")


def breakdown_lines(state: DashboardState, ranks: RankFilter, width: int, limit: int) -> Text:
    """Where the step goes: a bar of its parts per rank shown (at most ``limit``), each with the part it spends
    most above the job's mean share, and the job's parts over the last steps."""
    breakdown = state.figures().breakdown
    if breakdown is None:
        return Text("  none yet: no rank has a closed step with its phases timed\n", style="dim")
    views = [view for view in state.rank_views(ranks) if view.rank in breakdown.per_rank]
    text = Text()
    bar_width = max(10, width - 42)
    for view in views[:limit]:
        shares = {part: row["share"] for part, row in breakdown.per_rank[view.rank].items()}
        text.append(f" {rank_label(view)} ")
        text.append_text(parts_bar(shares, bar_width))
        above = breakdown.above_mean(view.rank)
        said = "as the mean" if above is None else f"{above[0]} {above[1]:.0%} (mean {above[2]:.0%})"
        text.append(f"  {said}\n".replace("%", " %"))
    if len(views) > limit:
        text.append(f"  … {len(views) - limit} more ranks (/ to filter)\n", style="dim")
    text.append_text(legend(STEP_PARTS))
    line = "\n per step:"
    for part in PARTS:  # each part's mean over the ranks in the last closed steps, wrapped to the width
        values = breakdown.history.get(part, ())
        if values and max(values) > 0:
            item = f" {part} {sparkline(values, min(len(values), 12), low=0.0)}"
            if cell_len(line.rsplit("\n", 1)[-1] + item) > width:
                line += "\n          "
            line += item
    text.append(line + "\n")
    return text


class StepsPanel(Panel):
    """Step time, throughput and loss over the run, as charts (inference: iteration time and throughput; nothing
    is trained, so there is no loss to chart); training: where each rank's step goes."""

    def show(self, state: DashboardState, ranks: RankFilter) -> None:
        width, inference = self.usable_width, state.info.inference
        rank_rows = 0 if inference else min(8, max(2, len(state.ranks)))
        breakdown_rows = rank_rows + 3 if rank_rows else 0
        height = max(2, (self.usable_height - 7 - breakdown_rows) // (2 if inference else 3))
        steps = list(state.steps)
        charts: list[tuple[str, list[float], Callable[[float], str]]] = [
            ("iteration time (rank 0)" if inference else "step time", [s.duration_s for s in steps], human_seconds),
            ("throughput (rank 0)" if inference else "throughput", [s.tokens_per_s for s in steps], output_rate),
        ]
        if not inference:  # the loss's axis from its smallest: its changes are small beside its size
            finite = [s.loss for s in steps if s.loss is not None and math.isfinite(s.loss)]
            charts.append(("loss", finite, lambda v: f"{v:.4f}"))
        shown = [
            chart(title, values, width=width, height=height, format_value=fmt, from_zero=title != "loss")
            for title, values, fmt in charts
        ]
        if not inference:
            shown += [
                section("where the step goes (each rank's share)"),
                breakdown_lines(state, ranks, width, rank_rows),
            ]
        self.paint(Group(*shown))


class ProcessesPanel(Panel):
    """Per rank: host (on many nodes), pid, device, mesh position, CPU, RSS, threads, exit status; the last stack
    dump."""

    selected: int | None = None

    COLUMNS = (
        ("rank", "right"),
        ("host", "left"),
        ("pid", "right"),
        ("device", "left"),
        ("pp/dp/tp", "left"),
        ("cpu", "right"),
        ("cpu history", "left"),
        ("rss", "right"),
        ("thr", "right"),
        ("status", "left"),
    )

    def show(self, state: DashboardState, ranks: RankFilter) -> None:
        history = max(0, min(32, self.usable_width - 66))
        many_hosts = len(state.hosts()) > 1  # on one machine the host is the same on every row: no column
        columns = [
            (name, justify)
            for name, justify in self.COLUMNS
            if (history or name != "cpu history") and (many_hosts or name != "host")
        ]
        views = state.rank_views(ranks)
        if self.selected is None and views:
            self.selected = views[0].rank
        order = [v.rank for v in views]
        at = order.index(self.selected) if self.selected in order else 0
        rows_shown = max(4, min(MAX_RANK_ROWS, self.usable_height - 4))  # the chosen rank on the screen
        first = max(0, min(at - rows_shown // 2, len(views) - rows_shown))
        window = views[first : first + rows_shown]  # the rows around the chosen rank
        rows: list[tuple[list[tuple[str, str]], str]] = []
        for view in window:
            gone = view.exited is not None  # its last samples are no reading of now
            cells = [
                str(view.rank),
                *([state.host_label(view.node)] if many_hosts else []),
                str(view.pid or "-"),
                view.device or "-",
                f"{view.pp_rank}/{view.dp_rank}/{view.tp_rank}",
                "-" if view.cpu_pct is None or gone else f"{view.cpu_pct:.0f}%",
            ]
            if history:
                cells.append(sparkline(view.cpu_history, history, low=0.0))
            cells += ["-" if gone else human_bytes(view.rss_bytes), "-" if gone else str(view.threads or "-")]
            rows.append(
                (
                    [(cell, "") for cell in cells] + [(view.status, STATUS_STYLE.get(view.status, "bold red"))],
                    "reverse" if view.rank == self.selected else "",
                )
            )
        table = plain_table(columns, rows, self.draw_width)  # to the edge, as Rich's Table was drawn
        hint = "↑/↓ rank · s: its stack (py-spy) · S: every rank's stack"
        if len(window) < len(views):
            hint = f"ranks {window[0].rank}-{window[-1].rank} of {len(views)} · " + hint
        parts: list[Text] = [table, Text(hint, style="dim")]
        chosen = state.ranks.get(self.selected) if self.selected is not None else None
        dump = state.notices.stacks.get(chosen.rank) if chosen is not None else None
        if dump is not None:
            parts.append(section(f"stack of rank {dump.rank} (pid {dump.pid})"))
            parts.append(Text(dump.error, style="red") if dump.error else Text(dump.text or "", overflow="ellipsis"))
        self.paint(Group(*parts))

    def move(self, state: DashboardState, ranks: RankFilter, delta: int) -> None:
        order = [view.rank for view in state.rank_views(ranks)]
        if not order:
            return
        index = order.index(self.selected) if self.selected in order else 0
        self.selected = order[max(0, min(len(order) - 1, index + delta))]


class AlertsPanel(Panel):
    """Everything that needs attention: failed ranks, stragglers, memory headroom, dropped telemetry."""

    def show(self, state: DashboardState, ranks: RankFilter) -> None:
        self.paint(Group(section("alerts"), alert_lines(state, None)))
