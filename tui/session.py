"""One session of a job: run it, keep every event in its recording, and close the recording with how it ended.

The console (``record``) and the live dashboard (``run``) both drive a job
through :func:`run_session`, so a session is recorded the same way whichever
front end watches it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from probes.arrivals import Arrivals
from probes.events import GpuLink, GpuSample, NvmlState, RankStarted, StepTiming
from recordings.events_log import EventWriter
from recordings.manifest import write_manifest
from recordings.steps import JobStep, StepFolder
from recordings.tables import compact
from runner.launch import JobControl, JobResult, NodeProbes, run_job
from runner.plan import ResolvedRun


class SessionRecorder:
    """Writes a session's events into its recording and notes what the manifest will need at the end.

    The workers' events go to disk as they came; of them it decodes only steps and rank starts.
    """

    KINDS = ("step", "rank_started", "nvml_state", "gpu", "gpu_link")
    """The kinds it reads."""

    def __init__(self, run: ResolvedRun, directory: Path, manifest: dict[str, Any] | None) -> None:
        self.directory = directory
        self.manifest = manifest
        self.writer = EventWriter(directory) if manifest is not None else None
        self.folder = StepFolder(run.world_size, replicas=run.dp if run.mode == "infer" else 1, tp=run.tp)
        self.steps: list[JobStep] = []
        self.received = 0
        self._devices: dict[int, str] = {}
        self._nvml: dict[str, Any] | None = None
        self._gpus: dict[int, dict[str, Any]] = {}
        self._topology: list[dict[str, Any]] = []

    def take(self, arrivals: Arrivals) -> list[JobStep]:
        """Record ``arrivals``; the job steps they completed."""
        self.received += arrivals.count
        if self.writer is not None:
            self.writer.write(arrivals.items)
        completed = []
        for event in arrivals.events(self.KINDS):
            if isinstance(event, StepTiming):
                if (step := self.folder.add(event)) is not None:
                    completed.append(step)
            elif isinstance(event, RankStarted):
                self._devices[event.rank] = event.device
            elif isinstance(event, NvmlState):
                self._nvml = {"state": event.state, "detail": event.detail,
                              "driver_version": event.driver_version, "gpu_count": event.gpu_count}
            elif isinstance(event, GpuSample):
                self._gpus.setdefault(event.gpu, {"gpu": event.gpu, "name": event.name,
                                                  "memory_total_bytes": event.memory_total_bytes})
            elif isinstance(event, GpuLink):
                self._topology.append({"gpu_a": event.gpu_a, "gpu_b": event.gpu_b, "path": event.path,
                                       "nvlinks": event.nvlinks})
        self.steps.extend(completed)
        return completed

    def close(self, result: JobResult | None, *, broken_status: str = "failed") -> None:
        """Compact the tables and write the final manifest (``result`` is ``None`` if the session broke)."""
        if self.writer is None or self.manifest is None:
            return
        self.writer.close()
        try:
            compact(self.directory)
        except OSError:  # no room for the Parquet copy, or the folder is gone: the JSON lines stay, readable
            pass
        self.manifest.update(
            status=result.status if result is not None else broken_status,
            ended_at=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            duration_s=round(result.duration_s, 3) if result is not None else None,
            steps_completed=len(self.steps),
            ranks=[{"rank": r.rank, "exit_code": r.exit_code, "signal": r.signal, "error": r.error}
                   for r in (result.ranks if result is not None else ())],
            root_cause_rank=result.root_cause if result is not None else None,
            hang=result.hang if result is not None else None,
            rank_devices={str(rank): device for rank, device in sorted(self._devices.items())},
            nvml=self._nvml,
            gpus=[self._gpus[gpu] for gpu in sorted(self._gpus)],
            topology=self._topology,
        )
        try:
            write_manifest(self.directory, self.manifest)
        except OSError:  # the manifest stays "running": readers take that as interrupted
            pass


def run_session(run: ResolvedRun, *, directory: Path, manifest: dict[str, Any] | None,
                on_events: Callable[[Arrivals, list[JobStep]], None],
                node_probes: NodeProbes = NodeProbes(), control: JobControl | None = None,
                hang_timeout_s: float | None = None) -> JobResult:
    """Run the job, recording into ``directory`` when a ``manifest`` is given (else it only holds the logs).

    ``on_events`` sees each batch after it is on disk, with the job steps it
    completed; it decodes the kinds it needs (``Arrivals.events``). The
    recording is closed however the session ends.
    """
    recorder = SessionRecorder(run, directory, manifest)
    result, broken = None, "failed"

    def deliver(arrivals: Arrivals) -> None:
        on_events(arrivals, recorder.take(arrivals))

    try:
        result = run_job(run, session_dir=directory, on_events=deliver, node_probes=node_probes, control=control,
                         hang_timeout_s=hang_timeout_s)
    except KeyboardInterrupt:
        broken = "interrupted"
        raise
    finally:
        recorder.close(result, broken_status=broken)
    return result
