"""``record``'s console: the progress a file gets."""

from __future__ import annotations

import io

import pytest

from meshtop.runner.session.console import PROGRESS_LINES, Progress


@pytest.mark.parametrize("jump", [1, 7, 30])
def test_a_file_gets_evenly_spaced_progress_lines_however_done_jumps(jump: int) -> None:
    """One line in each even stretch of the total that ``done`` reaches (requests arrive in batches, so
    ``done`` can jump several at a time), and the last: not one a QUIET_LIMIT_S only."""
    out = io.StringIO()
    progress = Progress(None, out)
    total = 200
    reached = [*range(jump, total, jump), total]
    for done in reached:
        progress.show(done, total, f"done {done}", events=0, eta_s=None)
    printed = [int(line.split()[1]) for line in out.getvalue().splitlines()]
    stretch = total // PROGRESS_LINES
    assert printed[-1] == total
    assert {(done - 1) // stretch for done in printed} == {(done - 1) // stretch for done in reached}
    assert len(printed) <= len({(done - 1) // stretch for done in reached}) + 1  # the last may share a stretch
