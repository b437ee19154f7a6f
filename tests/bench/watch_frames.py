"""Frame time of ``meshtop watch`` against ``meshtop run``'s: the same job, the same dashboard, side by side.

``python -m tests.bench.watch_frames [--seconds 6] [--rounds 3] [--ranks 64] [--sizes 200x60,80x24]
[--rate 10000] [--follow-s 0.2] [--json PATH]``

About 25 s a pair of rounds at 64 ranks on 2 cores (76 s with the defaults).

``run``'s rounds are :mod:`tests.bench.tui_frames`' own (:class:`~tests.bench.tui_frames.SyntheticSource`: the
job's events folded on a thread of the dashboard's process, as a live session's fold thread does). In
``watch``'s rounds the same job (the same mix, rate and history) is written to a real recording by another
process, as a ``record`` or a detached ``run`` writes it: a manifest that says running, ``writer.json``, and
:class:`~meshtop.recordings.events_log.EventWriter` appending each 50 ms shipment's encoded blocks. The writer
is a process, not a thread, because in reality it is another meshtop: a thread would take the viewer's
interpreter lock for the encoding and writing that the viewer never pays. It writes the job's history
first; the viewer (:class:`~meshtop.tui.following.WatchSource` on ``open_recording``) folds it from the
recording's start, the screen taking its share frame by frame, and the job goes on once it has caught up,
so both sources are measured in the same steady state. The dashboard and its measure are
:func:`tests.bench.tui_frames.measure`'s; rounds alternate (run, watch, run, watch...) because the machine's
noise drifts.

Reported a row a round: tui_frames' figures, the CPU share of the thread that feeds the screen (run: the
producer's fold; watch: the viewer's read, decode and fold), and for watch the viewer's lag: how far its fold
is behind what the writer has written, after each read (mean, max; it reads every ``--follow-s``, so it is
up to that much further behind just before a read), and the steps written and folded when the round ends.
Then, a rank count and size at a time, the medians over the rounds of the full frame's p50 and p99, and
watch / run: the target is watch's p99 within 10 % of run's (:data:`WITHIN`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import platform
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from meshtop.probes.arrivals import Arrivals
from meshtop.recordings.events_log import EventWriter
from meshtop.recordings.follow import Batch
from meshtop.recordings.manifest import Manifest, host_description, write_manifest
from meshtop.recordings.reader import open_recording
from meshtop.recordings.writers import claim_recording
from meshtop.tui.following import FOLLOW_S, WatchSource
from meshtop.tui.sources import SCREEN_BACKLOG
from meshtop.tui.state import DashboardState
from tests.bench.tui_frames import RATE, WARM_EVENTS, SyntheticSource, encoded, measure

WITHIN = 0.10
"""watch's full-frame p99 may be at most this much above run's (issue 49)."""
RANKS = (64,)
SIZES = ((200, 60),)
ROUNDS = 3
WRITER_READY_S = 300.0
"""The longest the writer may take to write the history and encode ahead before the viewer gives up."""
CATCH_UP_S = 300.0
"""The longest the viewer may take to fold the history."""


# -- the writer: another process ----------------------------------------------------------


class RecordedJob(SyntheticSource):
    """The synthetic job's shipments written to a recording, as a session's recorder writes them."""

    def __init__(self, folder: Path, written: Any, ranks: int, *, rate: float, warm_events: int) -> None:
        super().__init__(ranks, rate=rate, warm_events=warm_events)
        self.events = EventWriter(folder)
        self.written = written
        """Shared with the viewer: events written, step events written."""

    def _take(self, count: int, arrivals: Arrivals) -> None:
        self.produced += count
        self.largest_batch = max(self.largest_batch, count)
        self.events.write(arrivals.items)
        self.written[1] += sum(block.count for block in arrivals.items if block.kind == "step")
        self.written[0] += count  # once on disk: what a reader can find


def write_job(
    folder: Path,
    ranks: int,
    rate: float,
    warm_events: int,
    written: Any,
    figures: Any,
    ready: Any,
    go: Any,
    halt: Any,
) -> None:
    """The writer process: manifest and history, then a shipment every 50 ms until ``halt``."""
    job = RecordedJob(folder, written, ranks, rate=rate, warm_events=warm_events)
    claim_recording(folder)
    started = time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(job.started_ns() / 1e9))  # type: ignore[operator]
    command = ("meshtop", "record", str(folder), "--", "synthetic")
    write_manifest(
        folder, Manifest(started_at=started, command_line=command, run=job.description, host=host_description())
    )
    history = len(job.warm_history)
    job._take(history, encoded(job.warm_history))
    job.warm_history, job.produced = [], 0
    figures[0], figures[1] = history, job.steps_per_s
    job.encode_ahead()
    ready.set()
    go.wait()
    job._stop = halt
    job._produce()
    figures[2] = job.producer_cpu_s
    job.events.close()


# -- the viewer ------------------------------------------------------------------------------


class FollowedJob(WatchSource):
    """``meshtop watch`` on a recording that a writer process fills with the synthetic job, with the figures
    :func:`tests.bench.tui_frames.measure` reads and the viewer's lag."""

    def __init__(
        self, ranks: int, *, rate: float, backlog: int, follow_s: float = FOLLOW_S, warm_events: int = WARM_EVENTS
    ) -> None:
        self.ranks, self.rate = ranks, rate
        self.folder = Path(tempfile.mkdtemp(prefix="meshtop-watch-bench-"))
        context = multiprocessing.get_context("spawn")  # the viewer's process holds threads: never fork it
        self.written = context.RawArray("q", 2)
        self.figures = context.RawArray("d", 3)
        """The writer's: events of history, steps a second, its CPU seconds once halted."""
        ready, self._go, self._halt = context.Event(), context.Event(), context.Event()
        self._writer = context.Process(
            target=write_job,
            args=(self.folder, ranks, rate, warm_events, self.written, self.figures, ready, self._go, self._halt),
            name="synthetic-writer",
            daemon=True,
        )
        self._writer.start()
        deadline = time.monotonic() + WRITER_READY_S
        while not ready.wait(0.2):
            if not self._writer.is_alive() or time.monotonic() > deadline:
                self._end_writer()
                raise RuntimeError(f"the writer process did not get ready (exit code {self._writer.exitcode})")
        super().__init__(open_recording(self.folder), backlog=backlog, follow_s=follow_s)
        self.steps_per_s = self.figures[1]
        self.taken = 0
        """Events the viewer has read and folded."""
        self.largest_batch = 0
        self.producer_cpu_s = 0.0
        """The follow thread's CPU seconds since the job went on."""
        self.lags_s: list[float] = []
        """After each read once the job went on: events written that the viewer had not folded, in seconds."""
        self.ended: dict[str, float] = {}
        self._live_cpu: float | None = None
        self._stopped = False

    @property
    def produced(self) -> int:
        return int(self.written[0])

    def _take(self, tables: list[Batch]) -> None:
        super()._take(tables)
        count = sum(len(table) for _, table in tables)
        self.taken += count
        if self._go.is_set():
            if self._live_cpu is None:
                self._live_cpu = time.thread_time()
            self.producer_cpu_s = time.thread_time() - self._live_cpu
            self.largest_batch = max(self.largest_batch, count)
            self.lags_s.append((self.written[0] - self.taken) / self.rate)

    def warm_up(self, state: DashboardState) -> int:
        """Follow the recording from its start until the history is folded, the screen taking its share as
        frames would; then let the job go on. The events of history."""
        history = int(self.figures[0])
        super().start()
        deadline = time.monotonic() + CATCH_UP_S
        while self.taken < history:
            if self.error is not None or self.finished or time.monotonic() > deadline:
                raise RuntimeError(f"the viewer did not fold the history: {self.error or 'too slow'}")
            time.sleep(0.05)
            self.poll(state)
        self._go.set()
        self.poll(state)
        return history

    def start(self) -> None:
        """Already following (:meth:`warm_up`)."""

    def stop(self) -> None:
        """Note how far behind the viewer is, stop it, then the writer; the recording goes."""
        if self._stopped:
            return
        self._stopped = True
        written_steps = int(self.written[1]) // self.ranks
        self.ended = {
            "steps_written": written_steps,
            "steps_folded": self.session.steps_completed,
            "events_behind": int(self.written[0]) - self.taken,
        }
        super().stop()
        self.wait(30)
        self._end_writer()
        shutil.rmtree(self.folder, ignore_errors=True)

    def _end_writer(self) -> None:
        self._halt.set()
        self._writer.join(30)
        if self._writer.is_alive():
            self._writer.kill()
            self._writer.join()


# -- the rounds -------------------------------------------------------------------------------


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


async def one_round(
    name: str,
    ranks: int,
    size: tuple[int, int],
    seconds: float,
    rate: float,
    backlog: int,
    follow_s: float,
    warm_events: int = WARM_EVENTS,
) -> dict[str, Any]:
    """One measured row of ``run`` (the synthetic live source) or ``watch`` (a viewer of its recording)."""
    viewers: list[FollowedJob] = []

    def followed(ranks: int, rate: float, backlog: int) -> FollowedJob:
        viewers.append(FollowedJob(ranks, rate=rate, backlog=backlog, follow_s=follow_s, warm_events=warm_events))
        return viewers[-1]

    def synthetic(ranks: int, rate: float, backlog: int) -> SyntheticSource:
        return SyntheticSource(ranks, rate=rate, backlog=backlog, warm_events=warm_events)

    source = followed if name == "watch" else synthetic
    row = await measure(ranks, size, seconds, rate, backlog, None, make_source=source)
    row["source"] = name
    if viewers:
        viewer = viewers[0]
        row.update(
            viewer.ended,
            lag_s={
                "mean": statistics.fmean(viewer.lags_s) if viewer.lags_s else float("nan"),
                "max": max(viewer.lags_s, default=float("nan")),
            },
            reads=len(viewer.lags_s),
            follow_s=follow_s,
            writer_cpu_share=viewer.figures[2] / max(row["seconds"], 1e-9),
        )
    return row


def pair_summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """watch against run at one rank count and size: medians over the rounds, and the verdict."""
    of = {name: [r for r in rows if r["source"] == name] for name in ("run", "watch")}
    summary: dict[str, Any] = {"ranks": rows[0]["ranks"], "size": rows[0]["size"], "rounds": len(of["run"])}
    for name, group in of.items():
        summary[name] = {
            "p50_ms": median([r["full_ms"]["p50"] for r in group]),
            "p99_ms": median([r["full_ms"]["p99"] for r in group]),
            "frame_p99_ms": median([r["frame_ms"]["p99"] for r in group]),
            "offered_per_s": median([r["offered_per_s"] for r in group]),
            "applied_per_s": median([r["applied_per_s"] for r in group]),
            "feeder_cpu_share": median([r["producer_cpu_share"] for r in group]),
            "poll_ms": median([r["parts_ms"]["poll"] for r in group]),
        }
    summary["p50_ratio"] = summary["watch"]["p50_ms"] / summary["run"]["p50_ms"]
    summary["p99_ratio"] = summary["watch"]["p99_ms"] / summary["run"]["p99_ms"]
    summary["within"] = summary["p99_ratio"] <= 1 + WITHIN
    return summary


HEADER = (
    f"{'source':<6} {'round':>5} {'ranks':>5} {'size':>7} {'offer/s':>8} {'apply/s':>8} {'dropped':>7}  "
    f"{'full ms p50/p99/max':^20}  {'poll':>5} {'busy':>5} {'feeder':>6}  viewer lag (after reads) / steps"
)


def table_row(row: dict[str, Any], round_: int) -> str:
    g = row["full_ms"]
    line = (
        f"{row['source']:<6} {round_:>5} {row['ranks']:>5} {row['size']:>7} {row['offered_per_s']:>8,.0f} "
        f"{row['applied_per_s']:>8,.0f} {row['dropped']:>7,}  {g['p50']:>6.1f} {g['p99']:>6.1f} {g['max']:>6.1f}  "
        f"{row['parts_ms']['poll']:>5.1f} {row['ui_busy_share']:>5.0%} {row['producer_cpu_share']:>6.0%}"
    )
    if row["source"] == "watch":
        line += (
            f"  {row['lag_s']['mean'] * 1e3:.0f} ms mean, {row['lag_s']['max'] * 1e3:.0f} max; "
            f"{row['steps_folded']} of {row['steps_written']} steps"
        )
    return line


async def run_rounds(
    ranks: list[int],
    sizes: list[tuple[int, int]],
    seconds: float,
    rate: float,
    backlog: int,
    rounds: int,
    follow_s: float,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    rows: list[dict[str, Any]] = []
    summaries = []
    print(HEADER, flush=True)
    for count in ranks:
        for size in sizes:
            pair = []
            for round_ in range(1, rounds + 1):
                for name in ("run", "watch"):
                    row = await one_round(name, count, size, seconds, rate, backlog, follow_s)
                    row["round"] = round_
                    pair.append(row)
                    print(table_row(row, round_), flush=True)
            rows += pair
            summaries.append(pair_summary(pair))
    return rows, summaries


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=6.0, help="measured seconds a round")
    parser.add_argument("--rounds", type=int, default=ROUNDS, help="rounds of each, alternating run and watch")
    parser.add_argument("--ranks", default=",".join(map(str, RANKS)))
    parser.add_argument("--sizes", default=",".join(f"{w}x{h}" for w, h in SIZES))
    parser.add_argument("--rate", type=float, default=RATE, help="events per second offered")
    parser.add_argument("--backlog", type=int, default=SCREEN_BACKLOG, help="cap on events pending for the screen")
    parser.add_argument("--follow-s", type=float, default=FOLLOW_S, help="how often the viewer reads the recording")
    parser.add_argument("--json", type=Path, help="also write the rows and the comparisons as JSON")
    args = parser.parse_args()
    ranks = [int(r) for r in args.ranks.split(",")]
    sizes = [(int(w), int(h)) for w, h in (s.split("x") for s in args.sizes.split(","))]
    started = time.perf_counter()
    rows, summaries = asyncio.run(
        run_rounds(ranks, sizes, args.seconds, args.rate, args.backlog, args.rounds, args.follow_s)
    )
    print(f"medians over {args.rounds} rounds, full frame ms (watch / run):")
    for s in summaries:
        run, watch = s["run"], s["watch"]
        print(
            f"{s['ranks']:>5} {s['size']:>7}  p50 {run['p50_ms']:.1f} / {watch['p50_ms']:.1f} ({s['p50_ratio']:.2f})  "
            f"p99 {run['p99_ms']:.1f} / {watch['p99_ms']:.1f} ({s['p99_ratio']:.2f}): "
            f"{'within' if s['within'] else 'NOT within'} {WITHIN:.0%}; applied/s {run['applied_per_s']:,.0f} / "
            f"{watch['applied_per_s']:,.0f} of {watch['offered_per_s']:,.0f}; feeding thread CPU "
            f"{run['feeder_cpu_share']:.0%} / {watch['feeder_cpu_share']:.0%} of a core"
        )
    watched = [r for r in rows if r["source"] == "watch"]
    keeps_up = all(r["applied_per_s"] >= 0.95 * r["offered_per_s"] and not r["dropped"] for r in watched)
    print(
        f"viewer keeps up (applied >= 95% offered, nothing dropped): {'yes' if keeps_up else 'NO'}; writer process "
        f"CPU {statistics.fmean(r['writer_cpu_share'] for r in watched):.0%} of a core; "
        f"{platform.python_implementation()} {platform.python_version()}, {os.cpu_count()} CPUs; "
        f"{time.perf_counter() - started:.0f} s in all"
    )
    if args.json:
        args.json.write_text(
            json.dumps({"rate": args.rate, "follow_s": args.follow_s, "rows": rows, "pairs": summaries}, indent=2)
        )


if __name__ == "__main__":
    main()
