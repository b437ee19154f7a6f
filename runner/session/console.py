"""Plain-text following of a job (``meshtop record``): progress lines while it runs, a verdict at the end, both
read from the session's fold (the one the manifest, ``/metrics`` and the recording's summary agree with)."""

from __future__ import annotations

import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import TextIO

from meshtop.probes.arrivals import Arrivals
from meshtop.probes.kinds import FOLDED_KINDS, PRINTED_KINDS, PROGRESS_KINDS
from meshtop.recordings.manifest import Manifest
from meshtop.recordings.metrics.requests import RequestFigures
from meshtop.recordings.metrics.steps import JobStep, StepFigures
from meshtop.recordings.notices import Notices
from meshtop.recordings.session_fold import Folded, SessionFold
from meshtop.runner.job.control import JobControl
from meshtop.runner.results import JobResult
from meshtop.runner.session.session import SessionOptions, Work, run_session

PROGRESS_LINES = 20
"""About this many step lines per run, evenly spaced..."""
QUIET_LIMIT_S = 5.0
"""...but never longer than this without one."""


def step_line(step: JobStep, total: int | None) -> str:
    loss = f"loss {step.loss:.4f}" if step.loss is not None else "loss -"
    rate = f"{step.tokens_per_s:,.0f} tok/s" if step.tokens else "- tok/s"
    return f"step {step.step + 1:>4}/{total or '?'}  {loss}  {step.duration_s:.3f} s  {rate}"


def clock(seconds: float) -> str:
    minutes, secs = divmod(int(seconds), 60)
    return f"{minutes}:{secs:02d}" if minutes else f"{seconds:.1f} s"


class Progress:
    """Step progress: a bar redrawn in place on a terminal, evenly spaced lines in a file."""

    BAR = 24
    REDRAW_S = 0.1

    def __init__(self, total_steps: int | None, out: TextIO, *, running_s: float = 0.0) -> None:
        self.total_steps = total_steps
        """``None`` where the job does not say (a user's script)."""
        self.out = out
        self.live = out.isatty()
        self.started = time.monotonic() - running_s
        """When the job started (``running_s`` ago: a detached run's progress goes on from there)."""
        self._last = 0.0
        self._drawn = False
        self._step_s = 0.0
        self._steps = 0
        """Steps seen, and their time (``_step_s``): from the first this follows, not the job's first."""
        self._stretch = -1
        """The last of the :data:`PROGRESS_LINES` even stretches of the total a line was printed in (in a file):
        ``done`` can jump several at a time (an inference load's requests come in batches)."""

    def update(self, step: JobStep, events: int) -> None:
        """A training step is complete."""
        done, total = step.step + 1, self.total_steps
        self._step_s += step.duration_s
        self._steps += 1
        eta_s = self._step_s / self._steps * (total - done) if total else None  # steps to go at the mean step time
        self.show(done, total, step_line(step, total), events=events, eta_s=eta_s)

    def request_done(self, session: SessionFold, events: int) -> None:
        """Requests of an inference load were answered (or failed), as the session's fold has them."""
        with session.reading() as fold:
            if fold.requests is None or not fold.requests.reported:
                return
            done, total = fold.requests.reported, fold.requests.total

        def line() -> str:
            with session.reading() as fold:
                assert fold.requests is not None
                return requests_line(fold.requests.figures())

        elapsed = time.monotonic() - self.started
        self.show(done, total, line, events=events, eta_s=elapsed / done * (total - done))

    def show(
        self, done: int, total: int | None, text: str | Callable[[], str], *, events: int, eta_s: float | None
    ) -> None:
        """Draw the progress (``text`` made only if drawn: a request's figures take a fold of the load);
        without a ``total``, no bar and no ETA."""
        now = time.monotonic()
        eta = f"  ETA {clock(eta_s)}" if eta_s is not None else ""
        extra = f"  elapsed {clock(now - self.started)}{eta}  {events:,} events"
        if self.live:
            if now - self._last >= self.REDRAW_S or done == total:
                filled = self.BAR * done // max(1, total or 1)
                bar = f"[{'#' * filled + '.' * (self.BAR - filled)}] " if total else ""
                self.out.write(f"\r{bar}{text if isinstance(text, str) else text()}{extra}\x1b[K")
                self.out.flush()
                self._last, self._drawn = now, True
            return
        stretch = (done - 1) // max(1, (total or 1) // PROGRESS_LINES)
        if stretch > self._stretch or now - self._last >= QUIET_LIMIT_S or done == total:
            print((text if isinstance(text, str) else text()) + extra, file=self.out, flush=True)
            self._last, self._stretch = now, max(self._stretch, stretch)

    def message(self, text: str) -> None:
        """A line that must not be drawn over by the bar."""
        self.finish()
        print(text, file=self.out, flush=True)

    def finish(self) -> None:
        if self._drawn:
            self.out.write("\n")
            self.out.flush()
            self._drawn = False


def requests_line(figures: RequestFigures) -> str:
    """``requests   12/64 (1 failed)  TTFT p50 35.2 ms  1,234 tok/s``: the load so far (and the requests a stopped
    load never sent: not failed)."""
    ttft = figures.latencies["ttft_s"]["p50"]
    ttft_text = f"TTFT p50 {ttft * 1e3:.1f} ms" if ttft is not None else "TTFT -"
    rate = figures.output_tokens_per_s
    rate_text = f"{rate:,.0f} tok/s" if rate is not None else "- tok/s"
    said = [f"{figures.failed} failed"] if figures.failed else []
    if figures.not_sent:
        said.append(f"{figures.not_sent} not sent")
    failed = f" ({', '.join(said)})" if said else ""
    return f"requests {figures.completed + figures.failed:>4}/{figures.count}{failed}  {ttft_text}  {rate_text}"


def verdict(result: JobResult, steps: StepFigures | None, requests: RequestFigures | None = None) -> list[str]:
    """The closing lines: what happened, and for a failure which rank and why."""
    if result.status == "completed" and requests is not None:
        return [f"completed in {result.duration_s:.1f} s: {requests_line(requests).removeprefix('requests').strip()}"]
    if result.status == "completed":
        median = (steps.time_s["p50"] if steps else None) or 0.0
        rate = steps.tokens_per_s if steps else None
        loss = steps.last_loss if steps else None
        final = f", final loss {loss:.4f}" if loss is not None else ""
        throughput = f", {rate:,.0f} tok/s" if rate is not None else ""
        return [
            f"completed in {result.duration_s:.1f} s: {steps.count if steps else 0} steps, median step "
            f"{median:.3f} s{throughput}{final}"
        ]
    if result.status == "interrupted":
        stopped = [f"interrupted after {result.duration_s:.1f} s: every rank stopped"]
        return stopped + ([f"  {requests_line(requests)}"] if requests is not None else [])
    if result.node_lost is not None:
        return [f"failed after {result.duration_s:.1f} s: {result.node_lost}; the job was stopped"]
    if result.failure is not None:
        return [f"failed after {result.duration_s:.1f} s: {result.failure}"]
    if result.node_failed is not None:
        return [f"failed after {result.duration_s:.1f} s: {result.node_failed}; the job was stopped"]
    if result.hang is not None:
        return [
            f"failed after {result.duration_s:.1f} s: the job hung and was stopped",
            *("  " + line for line in result.hang.splitlines()),
        ]
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


class ProgressPrinter:
    """What ``record`` prints while a job runs, from each batch the session's fold took: the notices (warnings,
    a stack dump's place) and the progress of its steps or requests."""

    def __init__(self, total_steps: int | None, session: SessionFold, out: TextIO, *, running_s: float = 0.0) -> None:
        self.session = session
        self.progress = Progress(total_steps, out, running_s=running_s)
        self.notices = Notices()
        self.received = 0
        """Events received so far."""

    def take(self, arrivals: Arrivals, folded: Folded) -> None:
        self.received += arrivals.count
        for notice in self.notices.take(arrivals.events(PRINTED_KINDS)):
            self.progress.message(("warning: " if notice.severity == "warning" else "") + notice.text)
        if self.session.run.inference:
            if any(kind == "request" for kind, _ in folded.tables):
                self.progress.request_done(self.session, self.received)
            return
        for step in folded.steps:
            self.progress.update(step, self.received)


def follow_job(
    run: Work,
    *,
    session_dir: Path,
    out: TextIO,
    manifest: Manifest | None = None,
    options: SessionOptions = SessionOptions(),
) -> JobResult:
    """Run the job, printing progress to ``out``; record it when a ``manifest`` is given.

    SIGUSR1 to meshtop dumps every rank's Python stack (py-spy) to ``out``
    and, when recording, into the recording.
    """
    print(run.headline(), file=out, flush=True)
    control = JobControl()
    previous_usr1 = signal.signal(signal.SIGUSR1, lambda signum, frame: control.ask_stacks())
    # /metrics reads every figure live; without it the console and the manifest read steps and requests only
    kinds = FOLDED_KINDS if options.metrics is not None else PROGRESS_KINDS
    session = SessionFold(manifest.run if manifest is not None else run.describe(), kinds=kinds)
    printer = ProgressPrinter(run.total_steps(), session, out)

    try:
        result = run_session(
            run,
            directory=session_dir,
            manifest=manifest,
            on_events=printer.take,
            options=options,
            control=control,
            session=session,
        )
    finally:
        printer.progress.finish()
        signal.signal(signal.SIGUSR1, previous_usr1)
    figures = session.figures()  # the job's end is folded: every step decided, unserved requests counted
    for line in verdict(result, figures.steps, figures.requests):
        print(line, file=out, flush=True)
    return result
