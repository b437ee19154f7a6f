"""The rank grid's attention filter (tui/rank_grid.py) on a node that stands out though none of its ranks does."""

from __future__ import annotations

from meshtop.recordings.metrics.attention import attention
from meshtop.tui.rank_grid import grid_text

MS = 1e-3


def test_the_filter_keeps_a_flagged_node_whose_ranks_are_not_flagged_and_does_not_dim_them() -> None:
    """8 nodes of 4 ranks: seven at 100, 104, 108 and 112 ms, node 3 at 108, 112, 116 and 120. Over the 32
    ranks the median is 108 ms and the MAD 4 ms, so node 3's slowest, 120 ms, scores 0.6745 x 12 / 4 = 2.0,
    under 3.5: no rank is flagged. The nodes' medians are 106 ms seven times and 114 ms: a MAD of 0, and 8 ms
    off is past 5 % of 106 (5.3 ms): node 3 is flagged, so the filtered grid shows its row alone, its cells
    not dimmed."""
    nodes = {node: list(range(node * 4, node * 4 + 4)) for node in range(8)}
    values = {rank: (100 + 4 * (rank % 4) + (8 if rank // 4 == 3 else 0)) * MS for rank in range(32)}
    found = attention("step", values, {rank: rank // 4 for rank in range(32)})
    assert found.flagged_ranks == () and found.flagged_nodes == (3,)
    grid = grid_text(found, nodes, lambda node: f"node {node}", 80, only_attention=True)
    lines = [line for line in grid.renderables if line.plain.strip()]
    assert [line.plain.split()[:2] for line in lines] == [["node", "3"]]
    assert not any("dim" in str(span.style) for span in lines[0].spans)
