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
from collections.abc import Callable, Iterable, Sequence

import numpy as np

from meshtop.recordings.lazy_pandas import pandas

QUANTILES = {"p50": 0.5, "p90": 0.9, "p99": 0.99}
EXACT_LIMIT = 200_000
"""Values kept exactly per distribution (1.6 MB); beyond it, buckets."""
SUB_BUCKETS = 128


def factorize(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each of ``values``' code and the distinct values, in the order they first come (``pandas.factorize``,
    hashed, not sorted). pandas is imported on the first call, not with the metrics (:mod:`lazy_pandas`)."""
    codes, uniques = pandas().factorize(values)
    return codes, np.asarray(uniques)


def quantile(values: np.ndarray, q: float) -> float | None:
    """The ``q`` quantile of ``values`` by linear interpolation (``None`` for no values)."""
    return float(np.quantile(values, q)) if len(values) else None


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

    def values(self) -> np.ndarray:
        """Every value: exactly, or (past the limit) each bucket's middle as many times as it was hit."""
        if self._exact is not None:
            return np.frombuffer(self._exact, dtype=float).copy()
        ordered = sorted(self._buckets)
        middles = np.array([_middle(b) for b in ordered], dtype=float)
        return np.concatenate([np.zeros(self._zeros), np.repeat(middles, [self._buckets[b] for b in ordered])])

    def ordered(self) -> np.ndarray:
        """Every value kept exactly, sorted (exact mode only)."""
        assert self._exact is not None
        if len(self._sorted) < len(self._exact):  # merge the new values in: two sorted runs, one pass
            fresh = np.sort(np.frombuffer(self._exact, dtype=float)[len(self._sorted) :])
            self._sorted = np.sort(np.concatenate([self._sorted, fresh]), kind="stable")
        return self._sorted

    def _ranked(self) -> Callable[[int], float]:
        """The value of each rank (0 = the smallest): exact, or past the limit the middle of its bucket, found
        from the buckets' running counts (a cost of the buckets, not of the values)."""
        if self._exact is not None:
            ordered = self.ordered()
            return lambda rank: float(ordered[rank])
        keys = sorted(self._buckets)
        ends = np.cumsum([self._buckets[key] for key in keys]) + self._zeros

        def value(rank: int) -> float:
            if rank < self._zeros:
                return 0.0
            return _middle(keys[int(np.searchsorted(ends, rank, side="right"))])

        return value

    def quantile(self, q: float) -> float | None:
        return self.quantiles_at(q)[0] if self.count else None

    def quantiles_at(self, *qs: float) -> list[float]:
        ranked = self._ranked()
        return [_lerp(ranked, q, self.count) for q in qs]

    def mean(self) -> float | None:
        """The mean (exactly rounded, whatever the order the values came in; past the limit, of the buckets'
        middles)."""
        if not self.count:
            return None
        return self.total() / self.count

    def total(self) -> float:
        """The sum (exactly rounded; past the limit, of the buckets' middles)."""
        if not self.count:
            return 0.0
        if self._exact is not None:
            return math.fsum(np.frombuffer(self._exact, dtype=float))
        return math.fsum(_middle(key) * count for key, count in self._buckets.items())

    def counts_at_most(self, bounds: Sequence[float]) -> list[int]:
        """How many values are at most each of ``bounds`` (a Prometheus histogram's cumulative buckets):
        exactly; past the limit, by the middles of the values' buckets."""
        if self._exact is not None:
            return [int(n) for n in np.searchsorted(self.ordered(), bounds, side="right")]
        keys = sorted(self._buckets)
        middles = np.array([_middle(key) for key in keys], dtype=float)
        below = np.concatenate([[0], np.cumsum([self._buckets[key] for key in keys])])
        return [self._zeros + int(below[at]) for at in np.searchsorted(middles, bounds, side="right")]

    def quantiles(self, *names: str) -> dict[str, float | None]:
        """``{"p50": ..., "p99": ...}`` for the names of :data:`QUANTILES` given."""
        if not self.count:
            return {name: None for name in names}
        return dict(zip(names, self.quantiles_at(*(QUANTILES[name] for name in names)), strict=True))


def _lerp(ranked: Callable[[int], float], q: float, count: int) -> float:
    """The ``q`` quantile of ``count`` ranked values as numpy's default (linear) method computes it: between
    the values at ranks floor and ceil of q (n - 1), without sorting again."""
    position = q * (count - 1)
    low = int(position)
    high = min(low + 1, count - 1)
    weight = position - low
    a, b = ranked(low), ranked(high)
    return b - (b - a) * (1 - weight) if weight >= 0.5 else a + (b - a) * weight
