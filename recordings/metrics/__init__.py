"""The metrics core: every figure meshtop reports, defined once.

The dashboard, ``summary``, ``compare``, ``export`` and the metrics endpoint
read these; none computes a figure of its own.

- :mod:`~recordings.metrics.stats`: the quantile rule (linear interpolation)
  and :class:`~recordings.metrics.stats.Distribution`;
- :mod:`~recordings.metrics.bandwidth`: algbw and busbw (nccl-tests);
- :mod:`~recordings.metrics.collectives`: per (group, op) count, bytes,
  in-flight p50 / p99, busbw of the operations that ran alone, and exposed
  time per step and its share of the step;
- :mod:`~recordings.metrics.steps`: job steps, step time, tokens/s, loss;
- :mod:`~recordings.metrics.pipeline`: stage busy / idle and the bubble, in
  training and in inference;
- :mod:`~recordings.metrics.memory`: peak per rank, the most loaded rank,
  headroom;
- :mod:`~recordings.metrics.requests`: TTFT, TPOT, ITL, e2e, rates, goodput;
- :mod:`~recordings.metrics.mfu`: model FLOPs utilisation and the GPU peaks;
- :mod:`~recordings.metrics.run`: :class:`~recordings.metrics.run.RunFold`,
  which folds a run's event tables into all of them.
"""
