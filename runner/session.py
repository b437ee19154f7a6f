"""One session of a job: run it, keep every event in its recording, and close the recording with how it ended.

The console (``record``) and the live dashboard (``run``) both drive a job
through :func:`run_session`, so a session is recorded the same way whichever
front end watches it.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from probes.arrivals import Arrivals
from recordings.manifest import Manifest, RankEnd, RunDescription
from recordings.metrics.steps import JobStep
from recordings.recorder import Ending, SessionRecorder
from runner.launch import JobControl, JobResult, NodeProbes, run_job
from runner.plan import ResolvedRun


def ending_of(result: JobResult) -> Ending:
    return Ending(status=result.status, duration_s=result.duration_s,
                  ranks=tuple(RankEnd(rank=r.rank, exit_code=r.exit_code, signal=r.signal, error=r.error)
                              for r in result.ranks),
                  root_cause_rank=result.root_cause, hang=result.hang)


def run_session(run: ResolvedRun, *, directory: Path, manifest: Manifest | None,
                on_events: Callable[[Arrivals, list[JobStep]], None],
                node_probes: NodeProbes = NodeProbes(), control: JobControl | None = None,
                hang_timeout_s: float | None = None) -> JobResult:
    """Run the job, recording into ``directory`` when a ``manifest`` is given (else it only holds the logs).

    ``on_events`` sees each batch after it is on disk, with the job steps it
    completed; it decodes the kinds it needs. The recording is closed however
    the session ends.
    """
    description = manifest.run if manifest is not None else RunDescription.from_json(run.describe())
    recorder = SessionRecorder(description, directory, manifest)
    result = None
    broken = Ending(status="failed", duration_s=None)

    def deliver(arrivals: Arrivals) -> None:
        on_events(arrivals, recorder.take(arrivals))

    try:
        result = run_job(run, session_dir=directory, on_events=deliver, node_probes=node_probes, control=control,
                         hang_timeout_s=hang_timeout_s)
    except KeyboardInterrupt:
        broken = Ending(status="interrupted", duration_s=None)
        raise
    except BaseException as error:
        broken = Ending(status="failed", duration_s=None, reason=str(error).splitlines()[0] if str(error) else None)
        raise
    finally:
        recorder.close(ending_of(result) if result is not None else broken)
    return result
