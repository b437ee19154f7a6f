"""The one quantile rule, and :class:`Distribution`: every value of a figure over a run.

Quantiles interpolate linearly between the two nearest ranks, as numpy's
default does (for [1, 2, 3, 4], p50 = 2.5). A :class:`Distribution` keeps its
values exactly up to :data:`EXACT_LIMIT`; past it, it keeps them in
log-linear buckets (:data:`SUB_BUCKETS` per power of two, so a quantile is
then within 1 / (2 x 128) = 0.4 % of the exact one) and memory stays bounded
however long a run goes. Both the dashboard (a value at a time) and the
summary (a whole column at once) fill the same class, and the result depends
on the values only, never on their order: the two read the same figure.
"""

from __future__ import annotations

import math
from array import array
from collections import Counter
from collections.abc import Iterable

import numpy as np

QUANTILES = {"p50": 0.5, "p90": 0.9, "p99": 0.99}
EXACT_LIMIT = 200_000
"""Values kept exactly per distribution (1.6 MB); beyond it, buckets."""
SUB_BUCKETS = 128


def quantile(values: np.ndarray, q: float) -> float | None:
    """The ``q`` quantile of ``values`` by linear interpolation (``None`` for no values)."""
    return float(np.quantile(values, q)) if len(values) else None


def sorted_quantile(ordered: np.ndarray, q: float) -> float:
    """The ``q`` quantile of sorted ``ordered``, computed as numpy's default (linear) method does, without
    sorting again: between the values at ranks floor and ceil of q (n - 1)."""
    position = q * (len(ordered) - 1)
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    weight = position - low
    a, b = float(ordered[low]), float(ordered[high])
    return b - (b - a) * (1 - weight) if weight >= 0.5 else a + (b - a) * weight


def _bucket(value: float) -> int:
    """The log-linear bucket of a positive value (exact: frexp does not round)."""
    mantissa, exponent = math.frexp(value)
    return exponent * SUB_BUCKETS + int((mantissa - 0.5) * 2 * SUB_BUCKETS)


def _buckets(values: np.ndarray) -> np.ndarray:
    mantissa, exponent = np.frexp(values)
    return exponent.astype(np.int64) * SUB_BUCKETS + ((mantissa - 0.5) * 2 * SUB_BUCKETS).astype(np.int64)


def _middle(bucket: int) -> float:
    """The value in the middle of ``bucket``."""
    exponent, sub = divmod(bucket, SUB_BUCKETS)
    return math.ldexp(0.5 + (sub + 0.5) / (2 * SUB_BUCKETS), exponent)


class Distribution:
    """The values of one figure over a run (non-negative numbers: durations, rates, fractions)."""

    __slots__ = ("_buckets", "_exact", "_sorted", "_zeros", "count")

    def __init__(self, values: Iterable[float] = ()) -> None:
        self._exact: array[float] | None = array("d")
        self._sorted = np.empty(0)
        """The first values of ``_exact``, sorted (merged with the rest when a quantile is asked)."""
        self._buckets: Counter[int] = Counter()
        self._zeros = 0
        """Values at or below 0 (once bucketed: they have no logarithm)."""
        self.count = 0
        self.extend(np.fromiter(values, dtype=float))

    def add(self, value: float) -> None:
        self.count += 1
        if self._exact is not None:
            self._exact.append(value)
            if len(self._exact) > EXACT_LIMIT:
                self._to_buckets()
        elif value > 0:
            self._buckets[_bucket(value)] += 1
        else:
            self._zeros += 1

    def extend(self, values: np.ndarray) -> None:
        if not len(values):
            return
        self.count += len(values)
        if self._exact is not None and len(self._exact) + len(values) <= EXACT_LIMIT:
            self._exact.frombytes(np.ascontiguousarray(values, dtype=float).tobytes())
            return
        if self._exact is not None:
            self._to_buckets()
        self._add_buckets(values)

    def _to_buckets(self) -> None:
        exact, self._exact, self._sorted = self._exact, None, np.empty(0)
        self._add_buckets(np.frombuffer(exact, dtype=float))  # type: ignore[arg-type]

    def _add_buckets(self, values: np.ndarray) -> None:
        positive = values[values > 0]
        self._zeros += len(values) - len(positive)
        found, counts = np.unique(_buckets(positive), return_counts=True)
        self._buckets.update(dict(zip(found.tolist(), counts.tolist(), strict=True)))

    @property
    def exact(self) -> bool:
        """Whether every value is kept as it is (quantiles exact)."""
        return self._exact is not None

    def values(self) -> np.ndarray:
        """Every value: exactly, or (past the limit) each bucket's middle as many times as it was hit."""
        if self._exact is not None:
            return np.frombuffer(self._exact, dtype=float).copy()
        ordered = sorted(self._buckets)
        middles = np.array([_middle(b) for b in ordered], dtype=float)
        return np.concatenate([np.zeros(self._zeros), np.repeat(middles, [self._buckets[b] for b in ordered])])

    def ordered(self) -> np.ndarray:
        """Every value, sorted (exactly, or the buckets' middles past the limit)."""
        if self._exact is None:
            return self.values()
        if len(self._sorted) < len(self._exact):  # merge the new values in: two sorted runs, one pass
            fresh = np.sort(np.frombuffer(self._exact, dtype=float)[len(self._sorted):])
            self._sorted = np.sort(np.concatenate([self._sorted, fresh]), kind="stable")
        return self._sorted

    def quantile(self, q: float) -> float | None:
        return sorted_quantile(self.ordered(), q) if self.count else None

    def mean(self) -> float | None:
        """The mean (exactly rounded, whatever the order the values came in)."""
        if not self.count:
            return None
        return math.fsum(self.values()) / self.count

    def total(self) -> float:
        """The sum (exactly rounded)."""
        return math.fsum(self.values()) if self.count else 0.0

    def quantiles(self, *names: str) -> dict[str, float | None]:
        """``{"p50": ..., "p99": ...}`` for the names of :data:`QUANTILES` given."""
        if not self.count:
            return {name: None for name in names}
        ordered = self.ordered()
        return {name: sorted_quantile(ordered, QUANTILES[name]) for name in names}
