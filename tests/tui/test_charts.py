"""The column chart's cells: eighths of a cell from the bottom, each column up to its share of the largest."""

from __future__ import annotations

from meshtop.tui.charts import column_chart


def test_a_column_fills_its_share_of_the_largest_in_eighths_from_the_bottom() -> None:
    assert column_chart([0.0, 4.0, 8.0, 3.0], 4, 2) == ["  █ ", " ██▆"]  # 3 of 8: 6 eighths of 16
    assert column_chart([0.01, 8.0], 3, 1) == [" ▁█"]  # above zero: one eighth at least; right-aligned
    assert column_chart([1.0, 2.0, 3.0], 2, 1, low=1.0) == ["▄█"]  # the last two, from ``low``
    assert column_chart([], 3, 2) == ["   ", "   "] and column_chart([-1.0], 1, 1) == [" "]
