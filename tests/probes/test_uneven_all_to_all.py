"""An all-to-all whose ranks send and receive different amounts (the MoE case) is recorded by its input's
bytes, nccl-tests' S for all-to-all, by both collective kernels: two real gloo ranks under torchrun
(``tests/all_to_all_worker.py``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.kit.jobs import two_rank_reports

pytestmark = pytest.mark.slow


def test_an_uneven_all_to_all_is_recorded_by_the_bytes_each_rank_sends(
    tmp_path: Path, collective_kernel: tuple[str, str]
) -> None:
    """A row is 8 float32 values, 32 bytes. Rank 0 sends 3 rows to itself and 1 to rank 1: its input is
    4 rows, 4 * 32 = 128 bytes, its output the 3 it kept and rank 1's 2, 5 * 32 = 160 bytes. Rank 1 sends
    2 rows to rank 0 and 3 to itself: input 5 * 32 = 160 bytes, output 1 + 3 = 4 rows, 128 bytes. Both
    ``all_to_all_single`` (step 1) and the functional one (step 2) are recorded by the input's bytes."""
    kernel, native_env = collective_kernel
    ranks = two_rank_reports("tests.all_to_all_worker", tmp_path, native_env)
    sends = {0: 4 * 32, 1: 5 * 32}
    for rank, report in enumerate(ranks):
        assert (report["kernel"], report["errors"]) == (kernel, []), f"rank {rank}"
        recorded = [
            (e["step"], e["op"], e["group_size"], e["bytes"], e["dtype"])
            for e in sorted(report["collectives"], key=lambda e: e["start_ns"])
        ]
        assert recorded == [
            (1, "all_to_all", 2, sends[rank], "float32"),
            (2, "all_to_all", 2, sends[rank], "float32"),
        ], f"rank {rank}: the bytes of its input, not of its output"
