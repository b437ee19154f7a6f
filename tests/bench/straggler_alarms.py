"""The straggler alert on real CPU jobs (recordings/metrics/stragglers.py): false alarms on healthy runs, and
how soon a rank slowed on purpose is named.

``python -m tests.bench.straggler_alarms [--ranks 2] [--seconds 300]``: the built-in job (dp N, model tiny,
CPU ranks), as ``meshtop run`` trains it until stopped, folded as its events come, a table a kind per delivery,
as the dashboard folds them. The run is healthy: every straggler named is a false alarm.

``python -m tests.bench.straggler_alarms --busy-rank R [--busy-ms 50] [--ranks 2] [--steps 400]``: ``meshtop
record -- torchrun`` of tests/kit/breakdown_script.py with rank R spinning that long in each forward, played
back a step at a time: when rank R is named, in seconds of the job.

Prints the closed steps and job seconds watched, the ranks named and when, and the longest any rank was a
suspect (what :data:`~meshtop.recordings.metrics.stragglers.HOLD_S` must stay above). Results and the machine
they came from go to docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

from tests.kit.commands import run_meshtop
from tests.kit.jobs import launch
from tests.kit.recordings import description
from tests.kit.straggler_watch import StragglerWatch, watch_recording

REPO = Path(__file__).resolve().parents[2]


def healthy(ranks: int, seconds: float, session_dir: Path) -> StragglerWatch:
    """The built-in job on ``ranks`` CPU ranks for ``seconds``, watched live."""
    spec = {"dp": ranks, "time_limit_s": seconds}
    watch = StragglerWatch.of(description(**spec))
    launched = launch(session_dir, on_events=watch.take_events, **spec)
    assert launched.result.status == "completed", launched.result
    return watch


def slowed(ranks: int, busy_rank: int, busy_ms: float, steps: int, out: Path) -> StragglerWatch:
    """The breakdown script on ``ranks`` CPU ranks, ``busy_rank`` spinning ``busy_ms`` a forward, recorded and
    played back."""
    command = ["torchrun", "--standalone", f"--nproc-per-node={ranks}", "tests/kit/breakdown_script.py"]
    script = ["--out", str(out / "written"), "--steps", str(steps)]
    script += ["--busy-rank", str(busy_rank), "--busy-ms", str(busy_ms)]
    done = run_meshtop(
        "record", str(out / "rec"), "--", *command, *script, env={"CUDA_VISIBLE_DEVICES": ""}, cwd=REPO, timeout_s=None
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return watch_recording(out / "rec")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.bench.straggler_alarms")
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=300.0)
    parser.add_argument("--busy-rank", type=int, default=None)
    parser.add_argument("--busy-ms", type=float, default=50.0)
    parser.add_argument("--steps", type=int, default=400)
    args = parser.parse_args(argv)
    began = time.monotonic()
    with tempfile.TemporaryDirectory() as scratch:
        if args.busy_rank is None:
            watch = healthy(args.ranks, args.seconds, Path(scratch))
            what = f"healthy dp{args.ranks}, {args.seconds:.0f} s"
        else:
            watch = slowed(args.ranks, args.busy_rank, args.busy_ms, args.steps, Path(scratch))
            what = f"{args.ranks} ranks, rank {args.busy_rank} +{args.busy_ms:.0f} ms a forward"
    print(f"{what}: {watch.report()} ({time.monotonic() - began:.0f} s wall)")
    for verdict in sorted(watch.verdicts):
        print(f"  {verdict}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
