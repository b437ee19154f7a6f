"""How ranks' step reports are kept and folded (recordings/metrics/steps.py): a rank's spans, a step table's phase
times read back to the nanosecond, and a whole table of reports folded into the job's steps, against values
worked out by hand."""

from __future__ import annotations

import pyarrow as pa
import pytest

from meshtop.recordings.metrics.steps import JobStep, StepFolder, StepRows, StepSpans, Windows
from meshtop.recordings.schema import schema, table_of
from tests.kit.events import reported, step

MS = 1_000_000
T0 = 1_700_000_000_000_000_001
"""A wall clock of today's size: past 2**53, so a float would round it (to 256 ns)."""


def test_a_ranks_later_report_replaces_its_earlier_one_when_reports_come_together() -> None:
    """Rank 0 reported (start 1,000, 0.5 s, forward + backward 0.4); then rank 1 and rank 0 again together:
    rank 0's second report (start 3,000, 0.125 s, 0.1, its windows) takes its first's place; rank 1 comes after
    it. The slowest forward + backward is rank 1's 0.2 (not the replaced 0.4)."""
    windows = Windows("f", (3_000,), (4_000,), None)
    spans = StepSpans()
    spans.add(0, 1_000, 0.5, 0.4)
    spans.extend([1, 0], [2_000, 3_000], [0.25, 0.125], [0.2, 0.1], [None, windows])
    assert (spans.ranks, spans.rows([1, 0])) == ([0, 1], [1, 0])
    assert (spans.start_ns, spans.end_ns) == ([3_000, 2_000], [3_000 + 125 * MS, 2_000 + 250 * MS])
    assert (spans.forward_backward_s, spans.forward_backward_max_s()) == ([0.1, 0.2], 0.2)
    assert spans.durations_s() == {0: 0.125, 1: 0.25}
    assert spans.windows == {0: windows}


def test_a_rank_twice_in_one_batch_of_reports_keeps_its_last() -> None:
    spans = StepSpans()
    spans.extend([5, 5], [10, 20], [0.5, 0.25], [0.4, 0.2], [None, None])
    assert (spans.ranks, spans.start_ns, spans.forward_backward_max_s()) == ([5], [20], 0.2)


def test_new_ranks_reported_together_follow_the_ranks_already_there() -> None:
    """Rank 0 at position 0; ranks 2 and 1 together after it: positions 1 and 2."""
    spans = StepSpans()
    spans.add(0, 0, 0.1, None)
    spans.extend([2, 1], [20, 10], [0.3, 0.2], [None, None], [None, None])
    assert spans.rows([0, 1, 2]) == [0, 2, 1]
    assert spans.durations_s() == {0: 0.1, 2: 0.3, 1: 0.2}


def test_columns_of_reports_of_different_lengths_are_refused() -> None:
    """Two ranks and one window, whether a rank is new (nothing taken) or reported again."""
    fresh = StepSpans()
    with pytest.raises(ValueError, match="zip"):
        fresh.extend([0, 1], [0, 0], [0.1, 0.1], [None, None], [None])
    assert fresh.ranks == []
    again = StepSpans()
    again.add(0, 0, 0.1, None)
    with pytest.raises(ValueError, match="zip"):
        again.extend([0, 1], [0, 0], [0.1, 0.1], [None, None], [None])


def test_a_step_tables_phase_times_read_back_to_the_nanosecond_past_a_row_without_them() -> None:
    """Three rows: rank 0's forward T0-T0 + 10 ms + 1 and backward to T0 + 30 ms + 3; rank 1's row from an
    older recording, no phases and null times; rank 2's optimizer T0 + 5 - T0 + 7. Each row's times are its own
    (the null row takes none of the list's)."""
    records = [
        step(
            0,
            1,
            start_ns=T0,
            phases="fb",
            phase_start_ns=(T0, T0 + 10 * MS + 1),
            phase_end_ns=(T0 + 10 * MS + 1, T0 + 30 * MS + 3),
        ).to_record(),
        {**step(1, 1, start_ns=T0).to_record(), "phase_start_ns": None, "phase_end_ns": None},
        step(2, 1, start_ns=T0, phases="o", phase_start_ns=(T0 + 5,), phase_end_ns=(T0 + 7,)).to_record(),
    ]
    rows = StepRows.of(pa.Table.from_pylist(records, schema=schema("step")))
    first, missing, last = rows.windows([0, 1, 2])
    assert missing is None
    assert (first.phases, list(first.start_ns), list(first.end_ns)) == (
        "fb",
        [1_700_000_000_000_000_001, 1_700_000_000_010_000_002],
        [1_700_000_000_010_000_002, 1_700_000_000_030_000_004],
    )
    assert (last.phases, list(last.start_ns), list(last.end_ns)) == (
        "o",
        [1_700_000_000_000_000_006],
        [1_700_000_000_000_000_008],
    )
    assert all(type(ns) is int for ns in [*first.start_ns.tolist(), *last.end_ns.tolist()])


def test_a_table_that_repeats_a_pending_ranks_report_replaces_it() -> None:
    """Two ranks; rank 0's step 1 came alone, then a table with rank 0's step 1 again: the later report replaces
    the first, and the step still waits for rank 1."""
    folder = StepFolder(2)
    assert not reported(folder, step(0, 1, duration_s=0.5))
    assert folder.add(StepRows.of(table_of([step(0, 1, duration_s=0.25)]))) == []
    assert folder.pending[1][0].duration_s == 0.25


def test_a_table_of_reports_folds_the_steps_it_completes_with_their_losses() -> None:
    """Two ranks. Rank 1's step 2 came before (loss 3.0, made of 2 losses). The table: step 1 of rank 0 (0.1 s,
    loss 2.0 of 4 losses) and rank 1 (0.2 s, a first stage: no loss), 64 tokens; step 2 of rank 0 (0.25 s,
    loss 1.0 of 3), 64 tokens.
    Step 1: time 0.2 (the slowest), loss 2.0 (one rank of two had one), 64 / 0.2 = 320 tokens/s, 4 losses a step.
    Step 2: time max(0.5, 0.25) = 0.5, loss (3.0 + 1.0) / 2 = 2.0, 128 tokens/s, max(2, 3) = 3 losses a step."""
    folder = StepFolder(2)
    assert not reported(folder, step(1, 2, duration_s=0.5, loss=3.0, losses=2, tokens=64))
    table = table_of(
        [
            step(0, 1, duration_s=0.1, loss=2.0, losses=4, tokens=64),
            step(1, 1, duration_s=0.2, loss=None, tokens=64),
            step(0, 2, duration_s=0.25, loss=1.0, losses=3, tokens=64),
        ]
    )
    assert folder.add(StepRows.of(table)) == [
        JobStep(
            step=1, loss=2.0, duration_s=0.2, tokens=64, tokens_per_s=320.0, loss_ranks=1, ranks=2, losses_per_step=4
        ),
        JobStep(
            step=2, loss=2.0, duration_s=0.5, tokens=64, tokens_per_s=128.0, loss_ranks=2, ranks=2, losses_per_step=3
        ),
    ]
    assert folder.pending == {}
