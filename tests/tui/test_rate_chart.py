"""The latency-versus-rate chart's cells, worked out by hand from the rules in ``rate_chart``'s docstring."""

from __future__ import annotations

import pytest
from rich.text import Text

from meshtop.tui.rate_chart import RatePoint, latency_top, rate_chart, rate_label, run_mark


def plain(lines: list[Text]) -> list[str]:
    return [line.plain for line in lines]


def style_at(line: Text, offset: int) -> str:
    """The style of the cell at ``offset`` (each run of the chart is one span)."""
    return " ".join(str(span.style) for span in line.spans if span.start <= offset < span.end)


def test_points_sit_at_their_rounded_column_and_row_joined_by_the_curve_with_the_slo_and_capacity_lines() -> None:
    # 14 x 7: 4 rows of plot; labels "300" (the top) and "200" (the SLO) take 3 columns, the axis 1: 10 columns.
    # x: rate r in column round(r / 9 x 9) = r; y: latency v in row round(v / 0.3 x 3) from the bottom.
    points = [
        RatePoint(0.0, 0.0, "passed"),  # column 0, row 0
        RatePoint(3.0, 0.1, "passed"),  # column 3, row 1
        RatePoint(6.0, 0.3, "missed"),  # column 6, row 3 (the top)
        RatePoint(9.0, 0.6, "saturated"),  # above the top: ↑ on row 3, column 9
    ]
    lines = rate_chart("TTFT", points, width=14, height=7, slo_s=0.2, capacity=3.0, rates=(0.0, 9.0), top_s=0.3)
    assert plain(lines) == [
        "TTFT          ",
        "300┤   │  ×··↑",  # the curve from (6, 3) to (9, 3): columns 7 and 8 on row 3
        "200┤───┼··────",  # the SLO on row round(0.2 / 0.3 x 3) = 2; the curve (3, 1) -> (6, 3) at 1 + 2/3 x 1, 2
        "   │  ·●      ",  # (3, 1) covers the capacity's column; the curve (0, 0) -> (3, 1) at 2/3 -> row 1
        "  0┤●· │      ",  # ... and at 1/3 -> row 0
        "   └───┴──────",
        "    0  3     9",  # the capacity's rate under its column, 0 and the highest at the ends
    ]
    assert style_at(lines[1], 4 + 6) == "bold red"  # missed
    assert style_at(lines[1], 4 + 9) == "bold yellow"  # above the top, in the saturated run's colour
    assert style_at(lines[3], 4 + 3) == "bold green"  # passed
    assert style_at(lines[2], 4 + 0) == "red" and style_at(lines[2], 4 + 4) == "cyan"  # SLO line, curve
    assert style_at(lines[4], 4 + 3) == "green" and style_at(lines[6], 4 + 3) == "green"  # capacity, its rate


def test_a_failure_is_never_hidden_behind_a_pass_and_the_highlighted_point_is_reversed() -> None:
    # 12 x 5: 2 rows; the top 0.2 labels "200", 8 columns; rates 0..7: column = r.
    points = [RatePoint(7.0, 0.2, "client-limited"), RatePoint(7.0, 0.19, "passed"), RatePoint(0.0, 0.0, "passed")]
    lines = rate_chart("TPOT", points, width=12, height=5, rates=(0.0, 7.0), top_s=0.2, highlight=2)
    assert plain(lines) == [
        "TPOT        ",
        "200┤    ···○",  # the pass on the same cell is drawn first; the curve (0, 0) -> (7, 1): 4/7 .. 6/7 -> row 1
        "  0┤●···    ",  # ... 1/7 .. 3/7 -> row 0
        "   └────────",
        "    0      7",
    ]
    assert style_at(lines[1], 4 + 7) == "bold magenta"
    assert style_at(lines[2], 4 + 0) == "bold green reverse"


def test_one_rate_sits_in_the_first_column_and_a_run_without_latency_is_not_drawn() -> None:
    points = [RatePoint(2.0, 0.1, "passed"), RatePoint(2.0, None, "missed")]
    lines = rate_chart("x", points, width=8, height=5, rates=(2.0, 2.0), top_s=0.1)
    assert plain(lines)[1:3] == ["100┤●   ", "  0┤    "]


def test_the_rates_under_the_axis_leave_out_one_that_would_touch_the_capacity() -> None:
    # 10 columns: rate r in column round(r / 10 x 9)
    lines = rate_chart("x", [], width=14, height=5, capacity=10.0, rates=(0.0, 10.0), top_s=0.1)
    assert lines[-1].plain == "    0       10"  # the highest is the capacity's: written once, in green
    assert style_at(lines[-1], 12) == "green"
    lines = rate_chart("x", [], width=14, height=5, capacity=0.5, rates=(0.0, 10.0), top_s=0.1)
    assert lines[-1].plain == "    0.5     10"  # 0 would overlap the capacity's 0.5 (column 0): left out


@pytest.mark.parametrize(("width", "height"), [(39, 8), (80, 24), (200, 60), (12, 4), (3, 9), (30, 0)])
def test_the_block_is_height_lines_of_width_cells_and_too_small_a_block_is_its_title(width: int, height: int) -> None:
    points = [RatePoint(rate, latency, "passed") for rate, latency in ((1.0, 0.01), (2.5, 0.4), (4.0, 12.0))]
    lines = rate_chart("TTFT p99 (ms) by rate (req/s)", points, width=width, height=height, slo_s=0.5, capacity=2.5)
    assert len(lines) == max(height, 1)
    assert all(line.cell_len == width for line in lines)
    if height < 5 or width < 10:  # 2 rows of plot; the labels (1,500) and the axis take 6 columns, the plot 4
        assert all(not line.plain.strip() for line in lines[1:])


def test_the_latency_axis_reaches_above_the_slo_and_stops_at_three_times_it() -> None:
    assert latency_top([0.1, 0.2, None], 0.5) == 0.625  # 1.25 x the SLO
    assert latency_top([0.8], 0.5) == 0.8
    assert latency_top([9.5], 0.5) == 1.5  # 3 x the SLO
    assert latency_top([0.3], None) == 0.3 and latency_top([], None) == 0.0


def test_a_run_is_marked_client_limited_before_saturated_before_missed() -> None:
    run = {"met": False, "saturated": True, "client_limited": True}
    assert run_mark(run) == "client-limited"
    assert run_mark(run | {"client_limited": False}) == "saturated"
    assert run_mark(run | {"client_limited": False, "saturated": False}) == "missed"
    assert run_mark({"met": True, "saturated": False, "client_limited": False}) == "passed"
    assert run_mark({"met": None, "saturated": None, "client_limited": None}) is None  # not run yet
    assert [rate_label(r) for r in (2.75, 6.0, 12.5, 1200.0)] == ["2.75", "6", "12.5", "1,200"]
