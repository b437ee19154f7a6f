"""Bus bandwidth as nccl-tests defines it.

algbw = S / t. busbw = algbw x factor, where the factor makes the figure
comparable to the hardware's link speed whatever the algorithm: 2(n-1)/n for
all-reduce, (n-1)/n for all-gather, reduce-scatter and all-to-all, 1 for
broadcast, reduce and point-to-point. S is the whole buffer; n is the size of
the collective's own process group. t is the operation's in-flight time, and
busbw is only taken of operations that ran alone on their group
(:mod:`meshtop.recordings.metrics.collectives`): one queued behind another would count
the wait as transfer.
"""

from __future__ import annotations

import numpy as np

ONE_HOP_OPS = {"broadcast", "reduce", "send", "recv"}
GATHER_LIKE_OPS = {"all_gather", "reduce_scatter", "all_to_all", "gather", "scatter"}


def bus_factor(op: str, group_size: int) -> float | None:
    """nccl-tests' bus factor for ``op`` over ``group_size`` ranks; ``None`` where bandwidth means nothing."""
    n = group_size
    if op == "all_reduce":
        return 2 * (n - 1) / n
    if op in GATHER_LIKE_OPS:
        return (n - 1) / n
    if op in ONE_HOP_OPS:
        return 1.0
    return None


def algbw_gbps(nbytes: int, duration_s: float) -> float | None:
    """Algorithm bandwidth in GB/s (1e9 bytes per second)."""
    return nbytes / duration_s / 1e9 if duration_s > 0 else None


def busbw_gbps(op: str, group_size: int, nbytes: int, duration_s: float) -> float | None:
    """Bus bandwidth in GB/s."""
    factor = bus_factor(op, group_size)
    algbw = algbw_gbps(nbytes, duration_s)
    return algbw * factor if factor is not None and algbw is not None else None


def busbw_column(nbytes: np.ndarray, duration_s: np.ndarray, factor: np.ndarray) -> np.ndarray:
    """:func:`busbw_gbps` of many operations at once (``factor`` per operation, NaN where undefined); NaN
    where it is undefined or the time is not positive."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(duration_s > 0, nbytes / duration_s / 1e9 * factor, np.nan)
