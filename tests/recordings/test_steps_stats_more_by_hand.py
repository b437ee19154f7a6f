"""More of recordings/metrics/steps.py, stats.py and attention.py against values worked out by hand: which steps
are closed and which are whole, a job that starts again with another number of ranks, the step figures of steps
that tie, a distribution at its exact limit, and the rounding of a quantile between two values."""

from __future__ import annotations

import numpy as np
import pytest

from meshtop.recordings.metrics.attention import WINDOW, RankRecent, attention
from meshtop.recordings.metrics.run import RunFold
from meshtop.recordings.metrics.stats import EXACT_LIMIT, Distribution
from meshtop.recordings.metrics.steps import (
    ClosedSteps,
    JobStep,
    StepFolder,
    StepRows,
    StepSpans,
    StepStats,
    step_end_ns,
)
from meshtop.recordings.schema import table_of
from tests.kit.events import reported, step
from tests.kit.recordings import description

# ---- steps.py: what a rank's report keeps, and its span


def test_a_ranks_report_keeps_its_rank_time_loss_tokens_and_count_of_losses() -> None:
    timing = step(3, 1, duration_s=0.5, loss=2.0, tokens=100, losses=4, pipeline_wait_s=0.25)
    rows = StepRows.of(table_of([timing]))
    assert rows.reports([0]) == [(3, 0.5, 2.0, 100, 4)]
    assert rows.reports([0])[0].rank == 3
    timing = step(3, 1, phases="f", phase_start_ns=(10,), phase_end_ns=(20,), pipeline_wait_s=0.25)
    (windows,) = StepRows.of(table_of([timing])).windows([0])
    assert windows is not None and (windows.phases, windows.pipeline_wait_s) == ("f", 0.25)
    assert (list(windows.start_ns), list(windows.end_ns)) == ([10], [20])


def test_a_one_rank_step_folds_with_its_count_of_losses() -> None:
    """One rank: its report completes the step; 64 tokens / 0.5 s = 128 tokens/s; its loss was made of 3."""
    folded = reported(StepFolder(1), step(0, 7, duration_s=0.5, loss=3.0, losses=3, tokens=64))
    assert folded == [
        JobStep(
            step=7, loss=3.0, duration_s=0.5, tokens=64, tokens_per_s=128.0, loss_ranks=1, ranks=1, losses_per_step=3
        )
    ]


def test_a_step_of_two_seconds_ends_two_billion_nanoseconds_after_it_started() -> None:
    assert step_end_ns(1_000, 2.0) == 2_000_001_000


def test_a_ranks_report_again_by_itself_replaces_its_first_and_its_time_reads_back_in_seconds() -> None:
    """Rank 0: 2 s from 1,000 ns, then again 1 s from 5,000 ns (forward + backward 0.5): one row, the second."""
    spans = StepSpans()
    spans.add(0, 1_000, 2.0, None)
    spans.add(0, 5_000, 1.0, 0.5)
    assert (spans.ranks, spans.start_ns, spans.end_ns) == ([0], [5_000], [1_000_005_000])
    assert spans.durations_s() == {0: 1.0}  # (1,000,005,000 - 5,000) / 1e9
    assert spans.forward_backward_max_s() == 0.5


def test_fresh_ranks_with_fewer_start_times_than_ranks_are_not_read_back_as_durations() -> None:
    """Two new ranks, one start time and one duration: the ranks' column and the times' columns differ in length,
    and their durations are refused rather than read for rank 0 only (at the latest when they are asked for)."""
    spans = StepSpans()
    with pytest.raises(ValueError, match="zip"):
        spans.extend([0, 1], [1_000], [0.5], [None, None], [None, None])
        spans.durations_s()


# ---- steps.py: closed steps


def test_a_fresh_set_of_closed_steps_has_none_and_a_step_added_is_closed() -> None:
    closed = ClosedSteps()
    assert 0 not in closed
    assert -1 not in closed
    closed.add(5)
    assert 5 in closed
    assert 4 not in closed
    assert "5" not in closed


def test_past_twice_the_kept_steps_the_latest_kept_stay_and_every_older_step_is_closed() -> None:
    """Steps 2, 4, ..., 2 x 8,193 = 16,386 (8,193 = 2 x KEPT + 1 of them). At 8,192 (2 x KEPT) nothing is dropped,
    so step 1, never added, is not closed. The 8,193rd keeps the latest 4,096 by number: 2 x 4,098 = 8,196 to
    16,386; every step below 8,196 is closed (1 and 8,195 too, never added); 8,197, above it, was never added."""
    assert ClosedSteps.KEPT == 4096
    closed = ClosedSteps()
    for number in range(2, 16_386, 2):  # 2 .. 16,384: 8,192 steps
        closed.add(number)
    assert 1 not in closed
    assert 8_195 not in closed
    closed.add(16_386)
    assert [n in closed for n in (1, 8_194, 8_195, 8_196, 8_197, 16_385, 16_386)] == [
        True,
        True,
        True,
        True,
        False,
        False,
        True,
    ]


# ---- run.py: steps a live batch without the bulk kinds tore


def test_a_step_open_during_a_torn_batch_and_the_next_are_torn_and_the_one_after_whole() -> None:
    """dp 2. Rank 0 reports step 0; a batch comes without its collectives (nothing else in it): step 0 is open,
    so torn, and step 1 (after the last reported) too. Steps 0 to 4 then complete in whole batches: closing
    steps 0 and 1 counts 2 torn, step 2 (its step before first reported after the torn batch) closes whole."""
    fold = RunFold(description(dp=2))
    fold.apply("step", table_of([step(0, 0)]))
    fold.apply_torn([])
    fold.apply("step", table_of([step(1, 0)]))
    for number in range(1, 5):
        fold.apply("step", table_of([step(0, number), step(1, number)]))
    assert (fold.closed_count, fold.closed_torn) == (3, 2)


def test_a_step_completed_before_a_torn_batch_is_whole_and_one_it_completes_is_torn() -> None:
    """dp 2. Step 0 completes in a whole batch; a batch without its collectives brings both reports of step 1:
    step 0 closes whole, step 1 (completed in it) and step 2 (after the last reported) torn."""
    fold = RunFold(description(dp=2))
    fold.apply("step", table_of([step(0, 0), step(1, 0)]))
    fold.apply_torn([("step", table_of([step(0, 1), step(1, 1)]))])
    for number in range(2, 5):
        fold.apply("step", table_of([step(0, number), step(1, number)]))
    assert (fold.closed_count, fold.closed_torn) == (3, 2)
    fold.apply("step", table_of([step(0, 5), step(1, 5)]))
    assert (fold.closed_count, fold.closed_torn) == (4, 2)


# ---- steps.py: a job that starts again


def test_the_ranks_of_each_start_report_the_steps_from_its_first_step() -> None:
    """Two ranks, then 3 ranks from step 5, then 4 from step 10: step 4 has 2 ranks, 5 to 9 have 3, 10 on 4."""
    folder = StepFolder(2)
    assert folder.started(3, first_step=5) == []
    assert folder.started(4, first_step=10) == []
    assert [folder.expected(n) for n in (0, 4, 5, 9, 10, 11)] == [2, 2, 3, 3, 4, 4]
    assert not reported(folder, step(0, 5))
    assert not reported(folder, step(1, 5))
    assert reported(folder, step(2, 5))


def test_a_job_started_again_with_one_rank_completes_the_step_that_rank_had_reported() -> None:
    """Two ranks; rank 0 reported step 0 (0.5 s, loss 3.0 of 2 losses, 64 tokens); the job starts again with one
    rank from step 0 (the default): step 0 has all its ranks now, 64 / 0.5 = 128 tokens/s."""
    folder = StepFolder(2)
    assert not reported(folder, step(0, 0, duration_s=0.5, loss=3.0, losses=2, tokens=64))
    assert folder.started(1) == [
        JobStep(
            step=0, loss=3.0, duration_s=0.5, tokens=64, tokens_per_s=128.0, loss_ranks=1, ranks=1, losses_per_step=2
        )
    ]
    assert folder.pending == {}


# ---- steps.py: the step figures


def test_a_step_of_one_token_has_a_rate() -> None:
    """1 token in 0.5 s: 2 tokens/s (0 tokens would be "not known")."""
    stats = StepStats()
    stats.add(JobStep(step=0, loss=None, duration_s=0.5, tokens=1, tokens_per_s=2.0))
    assert stats.figures().tokens_per_s == 2.0


def test_of_steps_that_tie_the_first_to_come_keeps_its_place() -> None:
    """Step 3 twice (a job numbering its steps again): losses 1.0 then 2.0, each of 2 of its ranks having one, of 4
    then 8 ranks, each rank's loss made of 0 losses. The first and last loss are the first step 3's, and so are its
    2 of 4 ranks. Then step 4, 3 of 8 ranks with a loss (more than 2): the last loss and 3 of 8."""
    stats = StepStats()
    stats.add(
        JobStep(step=3, loss=1.0, duration_s=1.0, tokens=0, tokens_per_s=0.0, loss_ranks=2, ranks=4, losses_per_step=0)
    )
    stats.add(
        JobStep(step=3, loss=2.0, duration_s=1.0, tokens=0, tokens_per_s=0.0, loss_ranks=2, ranks=8, losses_per_step=0)
    )
    figures = stats.figures()
    assert (figures.first_loss, figures.last_loss, figures.loss_ranks, figures.ranks) == (1.0, 1.0, 2, 4)
    assert figures.losses_per_step == 0
    stats.add(JobStep(step=4, loss=5.0, duration_s=1.0, tokens=0, tokens_per_s=0.0, loss_ranks=3, ranks=8))
    figures = stats.figures()
    assert (figures.first_loss, figures.last_loss, figures.loss_ranks, figures.ranks) == (1.0, 5.0, 3, 8)


# ---- stats.py


def test_no_values_sum_to_0() -> None:
    assert Distribution().total() == 0.0


def test_integers_extended_in_are_taken_as_their_values() -> None:
    distribution = Distribution()
    distribution.extend(np.array([4, 1, 2]))
    assert distribution.total() == 7.0
    assert distribution.ordered().tolist() == [1.0, 2.0, 4.0]


def test_a_batch_of_exactly_the_limit_is_kept_exactly() -> None:
    """200,000 values of 3.0: exactly, 600,000. Bucketed, each would be its bucket's middle: 3 = 0.75 x 2^2, bucket
    2 x 128 + 64, middle (0.5 + 64.5 / 256) x 4 = 3.0078125."""
    assert Distribution(np.full(EXACT_LIMIT, 3.0)).total() == 600_000.0


def test_a_value_added_up_to_the_limit_is_kept_exactly_and_those_past_it_below_1_are_not_zeros() -> None:
    """199,999 values of 3.0 and one more added: 200,000, still exact (600,000). One more, 0.5: past the limit,
    every value to its bucket: 200,000 x 3.0078125 = 601,562.5, and 0.5 = 0.5 x 2^0, bucket 0, middle
    0.5 + 0.5 / 256 = 0.501953125. Then 0.25 into the buckets: 0.5 x 2^-1, bucket -128, middle 0.2509765625.
    None is at or below 0."""
    distribution = Distribution(np.full(EXACT_LIMIT - 1, 3.0))
    distribution.add(3.0)
    assert distribution.total() == 600_000.0
    distribution.add(0.5)
    assert distribution.total() == 601_563.001953125
    distribution.add(0.25)
    assert distribution.total() == 601_563.2529296875  # 601,563.001953125 + 0.2509765625
    assert distribution.counts_at_most([0.0, 1.0]) == [0, 2]


def test_a_quantile_between_two_values_rounds_as_numpys() -> None:
    """0.3 and 1.0: p50 at weight 0.5 and p90 at weight 0.9 are taken down from the upper value, as numpy does:
    1.0 - 0.7 x 0.5 and 1.0 - 0.7 x 0.1 give the doubles nearest 0.65 and 0.93 (up from the lower value,
    0.3 + 0.7 x 0.5 and 0.3 + 0.7 x 0.9, they would round to 0.6499999999999999 and 0.9299999999999999)."""
    assert Distribution([0.3, 1.0]).quantiles("p50", "p90") == {"p50": 0.65, "p90": 0.93}


# ---- attention.py


def test_a_closed_steps_values_must_be_one_a_rank() -> None:
    recent = RankRecent()
    with pytest.raises(ValueError, match="zip"):
        recent.add_many("step", [0, 1], [0.5])


def test_attention_names_its_measure_and_no_rank_has_no_median() -> None:
    none = attention("data", {}, {})
    assert (none.measure, none.median, none.ranks, none.nodes) == ("data", None, (), ())
    two = attention("bubble", {0: 0.25, 1: 0.75}, {})
    assert (two.measure, two.median) == ("bubble", 0.5)


def test_a_ranks_steps_older_than_the_window_are_forgotten() -> None:
    """Rank 4: 20 steps of 1.0 s, then 20 of 0.25 s. Only the last 20 are kept: median 0.25 (all 40 would give
    (0.25 + 1.0) / 2 = 0.625)."""
    assert WINDOW == 20
    recent = RankRecent()
    for value in [1.0] * 20 + [0.25] * 20:
        recent.add_many("step", [4], [value])
    assert recent.medians("step") == {4: 0.25}
