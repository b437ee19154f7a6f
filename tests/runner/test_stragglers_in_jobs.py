"""The straggler alert on real healthy jobs (issue 47: a false alarm on ``meshtop run``'s dp2): the built-in
job on 2, 4 and 8 CPU ranks of this machine, with whatever else runs on it, folded as its events come in as
the dashboard folds them, names no straggler. A rank slowed on purpose is named:
tests/runner/test_step_breakdown.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from meshtop.recordings.metrics.stragglers import HOLD_S
from tests.kit.jobs import launch
from tests.kit.recordings import description
from tests.kit.straggler_watch import StragglerWatch

SECONDS = 30.0
"""Each job's length: three times the rule's hold (the 5-minute runs of the issue are a benchmark's:
python -m tests.bench.straggler_alarms, docs/benchmarks.md)."""


@pytest.mark.slow
@pytest.mark.parametrize("ranks", [2, 4, 8])
def test_a_healthy_job_names_no_straggler(tmp_path: Path, ranks: int) -> None:
    spec = {"dp": ranks, "time_limit_s": SECONDS}
    watch = StragglerWatch.of(description(**spec))
    launched = launch(tmp_path, on_events=watch.take_events, **spec)
    assert launched.result.status == "completed", launched.result
    assert watch.seconds > 2 * HOLD_S and watch.closed_steps >= 100, watch.report()
    assert watch.named == {}, (watch.report(), watch.verdicts)
