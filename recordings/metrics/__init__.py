"""The metrics core: every figure meshtop reports, defined once.

The dashboard, ``summary``, ``compare``, ``export`` and the metrics endpoint
read these; none computes a figure of its own.

- :mod:`~meshtop.recordings.metrics.stats`: the quantile rule (linear interpolation)
  and :class:`~meshtop.recordings.metrics.stats.Distribution`;
- :mod:`~meshtop.recordings.metrics.bandwidth`: algbw and busbw (nccl-tests);
- :mod:`~meshtop.recordings.metrics.collectives`: per (group, op) count, bytes,
  in-flight p50 / p99, busbw of the operations that ran alone, and exposed
  time per step and its share of the step; the run's communication share,
  typical busbw and one step's traffic per (rank, group, op);
- :mod:`~meshtop.recordings.metrics.steps`: job steps, step time, tokens/s, loss;
- :mod:`~meshtop.recordings.metrics.pipeline`: stage busy / idle and the bubble, in
  training and in inference, and the run's mean bubble;
- :mod:`~meshtop.recordings.metrics.stragglers`: each rank's compute time and the
  straggler rule, with its cause where the phases were measured;
- :mod:`~meshtop.recordings.metrics.breakdown`: where each rank's step goes (data,
  forward, backward, optimizer, communication, bubble, other), adding up to it;
- :mod:`~meshtop.recordings.metrics.memory`: peak per rank, the most loaded rank,
  headroom, accounted bytes and the peak a plan is checked against;
- :mod:`~meshtop.recordings.metrics.requests`: TTFT, TPOT, ITL, e2e, rates, goodput;
- :mod:`~meshtop.recordings.metrics.mfu`: model FLOPs utilisation and the GPU peaks;
- :mod:`~meshtop.recordings.metrics.rates`: the bus bandwidth and FLOP/s a run
  measured, for the planner;
- :mod:`~meshtop.recordings.metrics.run`: :class:`~meshtop.recordings.metrics.run.RunFold`,
  which folds a run's event tables into all of them;
- :mod:`~meshtop.recordings.metrics.figures`: what it gives,
  :class:`~meshtop.recordings.metrics.figures.RunFigures` (every figure at one moment) and its JSON.
"""
