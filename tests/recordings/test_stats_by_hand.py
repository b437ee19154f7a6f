"""The buckets of recordings/metrics/stats.py's Distribution past its exact limit, counted by hand: the values at
or below 0 (kept as a count, having no logarithm) are counted across every batch that brings some."""

from __future__ import annotations

import numpy as np

from meshtop.recordings.metrics.stats import EXACT_LIMIT, Distribution

# 2.0 = 0.5 x 2^2: bucket 2 x 128 + 0, whose middle is (0.5 + 0.5 / 256) x 4 = 2.0078125.
TWO = 2.0078125


def test_zeros_of_the_values_kept_exactly_and_of_the_batch_past_the_limit_are_all_counted() -> None:
    distribution = Distribution([0.0, 2.0])  # exact: one 0 and one 2
    distribution.extend(np.zeros(EXACT_LIMIT))  # 200,002 values: all to buckets, the first two and the batch
    assert distribution.count == EXACT_LIMIT + 2
    # zeros: 1 + 200,000; at most 3: every value
    assert distribution.counts_at_most([0.0, 1.0, 3.0]) == [200_001, 200_001, 200_002]
    assert distribution.total() == TWO


def test_zeros_of_each_batch_after_the_limit_add_to_those_before() -> None:
    distribution = Distribution(np.zeros(EXACT_LIMIT + 1))  # one past the limit: 200,001 zeros, bucketed
    distribution.extend(np.array([0.0, 2.0, 0.0]))  # two more zeros and a 2
    distribution.extend(np.array([-1.0]))  # below 0: counted with the zeros
    assert distribution.count == 200_005
    assert distribution.counts_at_most([0.0, 3.0]) == [200_004, 200_005]  # 200,001 + 2 + 1; and the 2
    # the largest value is the 2's bucket's middle; the 99th percentile, at rank 0.99 x 200,004, a zero
    assert distribution.quantiles_at(1.0, 0.99) == [TWO, 0.0]
    assert np.count_nonzero(distribution.values() == 0.0) == 200_004
