"""Plain-text following of a job: progress lines while it runs, a verdict at the end."""

from __future__ import annotations

import signal
import statistics
import time
from pathlib import Path
from typing import Any, TextIO

from probes.events import Event, EventsDropped, HangDetected, StackDump
from recordings.steps import JobStep
from runner.launch import JobControl, JobResult, NodeProbes
from runner.plan import ResolvedRun
from tui.session import run_session

PROGRESS_LINES = 20
"""About this many step lines per run, evenly spaced..."""
QUIET_LIMIT_S = 5.0
"""...but never longer than this without one."""


def headline(run: ResolvedRun) -> str:
    params = run.shape.parameter_count()
    size = f"{params / 1e9:.1f}B" if params >= 1e9 else f"{params / 1e6:.1f}M"
    return (f"meshtop: {run.plan_label()} · model {run.shape.name} ({size} params) · {run.device} {run.dtype} · "
            f"{run.world_size} ranks · {run.steps} steps of {run.batch_size} x {run.seq_len} tokens")


def step_line(step: JobStep, total: int) -> str:
    loss = f"loss {step.loss:.4f}" if step.loss is not None else "loss -"
    return f"step {step.step + 1:>4}/{total}  {loss}  {step.duration_s:.3f} s  {step.tokens_per_s:,.0f} tok/s"


def clock(seconds: float) -> str:
    minutes, secs = divmod(int(seconds), 60)
    return f"{minutes}:{secs:02d}" if minutes else f"{seconds:.1f} s"


class Progress:
    """Step progress: a bar redrawn in place on a terminal, evenly spaced lines in a file."""

    BAR = 24
    REDRAW_S = 0.1

    def __init__(self, run: ResolvedRun, out: TextIO) -> None:
        self.run = run
        self.out = out
        self.live = out.isatty()
        self.started = time.monotonic()
        self._last = 0.0
        self._drawn = False
        self._step_s = 0.0

    def update(self, step: JobStep, events: int) -> None:
        now = time.monotonic()
        done, total = step.step + 1, self.run.steps
        elapsed = now - self.started
        self._step_s += step.duration_s
        eta = self._step_s / done * (total - done)  # steps to go at the mean step time so far
        extra = f"  elapsed {clock(elapsed)}  ETA {clock(eta)}  {events:,} events"
        if self.live:
            if now - self._last >= self.REDRAW_S or done == total:
                filled = self.BAR * done // total
                bar = "#" * filled + "." * (self.BAR - filled)
                self.out.write(f"\r[{bar}] {step_line(step, total)}{extra}\x1b[K")
                self.out.flush()
                self._last, self._drawn = now, True
            return
        evenly = step.step % max(1, total // PROGRESS_LINES) == 0
        if evenly or now - self._last >= QUIET_LIMIT_S or done == total:
            print(step_line(step, total) + extra, file=self.out, flush=True)
            self._last = now

    def message(self, text: str) -> None:
        """A line that must not be drawn over by the bar."""
        self.finish()
        print(text, file=self.out, flush=True)

    def finish(self) -> None:
        if self._drawn:
            self.out.write("\n")
            self.out.flush()
            self._drawn = False


def verdict(result: JobResult, steps: list[JobStep]) -> list[str]:
    """The closing lines: what happened, and for a failure which rank and why."""
    if result.status == "completed":
        median = statistics.median(s.duration_s for s in steps) if steps else 0.0
        rate = statistics.median(s.tokens_per_s for s in steps) if steps else 0.0
        loss = steps[-1].loss if steps else None
        final = f", final loss {loss:.4f}" if loss is not None else ""
        return [f"completed in {result.duration_s:.1f} s: {len(steps)} steps, median step {median:.3f} s, "
                f"{rate:,.0f} tok/s{final}"]
    if result.status == "interrupted":
        return [f"interrupted after {result.duration_s:.1f} s: every rank stopped"]
    if result.hang is not None:
        return [f"failed after {result.duration_s:.1f} s: the job hung and was stopped",
                *("  " + line for line in result.hang.splitlines())]
    lines = [f"failed after {result.duration_s:.1f} s"]
    for rank in result.failed:
        how = f"signal {rank.signal}" if rank.signal else f"exit code {rank.exit_code}"
        if rank.rank == result.root_cause:
            lines.append(f"  rank {rank.rank} failed first: {how}: {rank.error or 'no error message'}")
        else:
            lines.append(f"  rank {rank.rank}: {how} (after rank {result.root_cause} failed)")
    if not result.failed:
        lines.append(f"  {result.ranks[0].error}")
    return lines


def stack_dump_lines(dump: StackDump) -> list[str]:
    if dump.error is not None:
        return [f"stack of rank {dump.rank} (pid {dump.pid}): {dump.error}"]
    return [f"stack of rank {dump.rank} (pid {dump.pid}):", *("  " + line for line in (dump.text or "").splitlines())]


def follow_job(run: ResolvedRun, *, session_dir: Path, out: TextIO,
               manifest: dict[str, Any] | None = None, node_probes: NodeProbes = NodeProbes(),
               hang_timeout_s: float | None = None) -> JobResult:
    """Run the job, printing progress to ``out``; record it when a ``manifest`` is given.

    SIGUSR1 to meshtop dumps every rank's Python stack (py-spy) to ``out``
    and, when recording, into the recording.
    """
    print(headline(run), file=out, flush=True)
    control = JobControl()
    previous_usr1 = signal.signal(signal.SIGUSR1, lambda signum, frame: control.ask_stacks())
    steps: list[JobStep] = []
    received = 0
    progress = Progress(run, out)

    def on_events(events: list[Event], completed: list[JobStep]) -> None:
        nonlocal received
        received += len(events)
        for event in events:
            if isinstance(event, StackDump):
                progress.message("\n".join(stack_dump_lines(event)))
            elif isinstance(event, HangDetected):
                progress.message(f"no rank made progress for {event.silent_s:.0f} s (hang timeout "
                                 f"{event.timeout_s:.0f} s): {event.report}\nstack dumps of every rank follow; "
                                 "stopping the job")
            elif isinstance(event, EventsDropped):
                where = f"rank {event.rank}" if event.rank is not None else "the collector"
                progress.message(f"warning: {event.count} telemetry events dropped by {where} (buffer full)")
        for step in completed:
            steps.append(step)
            progress.update(step, received)

    try:
        result = run_session(run, directory=session_dir, manifest=manifest, on_events=on_events,
                             node_probes=node_probes, control=control, hang_timeout_s=hang_timeout_s)
    finally:
        progress.finish()
        signal.signal(signal.SIGUSR1, previous_usr1)
    for line in verdict(result, steps):
        print(line, file=out, flush=True)
    return result
