"""The launcher's side of torch's flight recorder: ask every rank for its dump, and run torch's analyzer.

At a hang (and with every stack dump asked for: the dashboard's key, ``record``'s SIGUSR1) the launcher
writes a new request into the job's flight folder; each rank answers with its dump
(:mod:`meshtop.probes.flight`). Once every rank of this node has answered, torch's own analyzer
(``torch.distributed.flight_recorder``, what ``torchfrtrace`` runs) matches the ranks' records collective
by collective and says where they diverge: the ranks that never entered a collective the others are in,
and collectives whose sizes, types or ops differ between ranks. It runs in a child process
(``python -m meshtop.runner.job.flight FOLDER``) with a time limit: it prints and logs as it goes, and a
failure or a hang of it must not reach the session. Its findings become a :class:`FlightVerdict`, shown
beside meshtop's own hang report (its heartbeats and py-spy's stacks).

The dumps stay in the recording's ``flight/`` folder, where ``torchfrtrace`` reads them as they are.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any

import psutil

from meshtop.probes.events import FlightVerdict
from meshtop.probes.flight import REQUEST_NAME, dump_path

FLIGHT_DIR = "flight"
"""The folder of a session's flight-recorder request and dumps."""
COLLECT_S = 10.0
"""How long the launcher waits for every rank's dump (a rank's shipper answers within a quarter second)."""
ANALYZE_S = 120.0
"""The analyzer's time limit (it takes about 3 s for two ranks here, most of it importing torch)."""


RUNNING_NOTE = (
    "torch's flight recorder: (dumped while the job ran: a rank's last collectives may be missing from "
    "its peers' dumps only because they had not issued them yet)"
)


class FlightTriage:
    """Asks this node's ranks for their flight-recorder dumps and runs the analyzer on them."""

    def __init__(self, folder: Path, *, on_one_node: bool = True, collect_s: float = COLLECT_S) -> None:
        self.folder = folder
        self.on_one_node = on_one_node
        """The analyzer needs every rank's dump; a node holds its own ranks' only."""
        self.collect_s = collect_s
        self._asked = 0

    def triage(self, pids: Mapping[int, int], *, hung: bool = True) -> FlightVerdict:
        """Ask the ranks of ``pids`` (rank -> its process) for their dumps, wait for them, and analyze them: the
        verdict, or why there is none.

        Dumps of a job that is not ``hung`` are taken while it runs, each rank at its own moment: a collective
        one rank had issued and another not yet shows as entered by some ranks only; the verdict says so."""
        if not self.on_one_node:
            return self._verdict(
                None, "torch's flight-recorder analysis covers jobs on one node (each node keeps its own ranks' dumps)"
            )
        missing = self.collect(sorted(pids), timeout_s=self.collect_s, pids=pids)
        if missing:
            stopped = sorted(rank for rank in missing if is_stopped(pids[rank]))
            why = f"within {self.collect_s:g} s" if len(stopped) < len(missing) else ""
            if stopped:
                why += f" ({_ranks(stopped)} {'is' if len(stopped) == 1 else 'are'} stopped: SIGSTOP or a debugger)"
            return self._verdict(None, f"no flight-recorder dump from {_ranks(sorted(missing))} {why.strip()}")
        verdict, error = run_analyzer(self.folder)
        if verdict is not None and not hung:
            verdict += f"\n{RUNNING_NOTE}"
        return self._verdict(verdict, error)

    def collect(
        self, ranks: Collection[int], *, timeout_s: float = COLLECT_S, pids: Mapping[int, int] | None = None
    ) -> set[int]:
        """Ask for a dump and wait for one from each of ``ranks``; those that did not answer. With the ranks'
        ``pids``, the wait ends once every rank still silent is a stopped process, which cannot answer."""
        self.folder.mkdir(parents=True, exist_ok=True)
        for rank in ranks:
            dump_path(self.folder, rank).unlink(missing_ok=True)  # an earlier request's
        self._asked += 1
        request = self.folder / REQUEST_NAME
        partial = request.with_name(f".{REQUEST_NAME}.partial")
        partial.write_text(f"{time.time_ns()} {self._asked}")
        partial.replace(request)
        deadline = time.monotonic() + timeout_s
        missing = set(ranks)
        while missing and time.monotonic() < deadline:
            missing = {rank for rank in missing if not dump_path(self.folder, rank).exists()}
            if missing and pids is not None and all(is_stopped(pids.get(rank)) for rank in missing):
                break
            if missing:
                time.sleep(0.05)
        return missing

    def _verdict(self, verdict: str | None, error: str | None) -> FlightVerdict:
        return FlightVerdict(wall_ns=time.time_ns(), verdict=verdict, error=error, dumps=str(self.folder))


def run_analyzer(folder: Path, *, timeout_s: float = ANALYZE_S) -> tuple[str | None, str | None]:
    """(verdict, ``None``) or (``None``, why not): :func:`analyze` in a child process."""
    try:
        done = subprocess.run(
            [sys.executable, "-m", __name__, str(folder)], capture_output=True, text=True, timeout=timeout_s
        )
    except subprocess.TimeoutExpired:
        return None, f"torch's flight-recorder analyzer did not finish in {timeout_s:.0f} s"
    try:
        answer = json.loads(done.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return None, f"torch's flight-recorder analyzer failed (exit {done.returncode}): {last}"
    return answer.get("verdict"), answer.get("error")


def analyze(folder: Path) -> str:
    """torch's analyzer on the dumps in ``folder``: a line per collective where the ranks diverge, or one
    line saying every collective matched. Raises ``ImportError`` where this torch has no analyzer."""
    from torch.distributed.flight_recorder.components.builder import build_db
    from torch.distributed.flight_recorder.components.config_manager import JobConfig
    from torch.distributed.flight_recorder.components.loader import read_dir

    args = JobConfig().parse_args(["--prefix", "rank_", str(folder)])
    details, version = read_dir(args)
    database = build_db(details, args, version)
    lines = [line for collective in database.collectives if (line := finding(collective)) is not None]
    if not lines:
        return f"torch's flight recorder: the {len(database.collectives)} collectives recorded match on every rank"
    return "\n".join(f"torch's flight recorder: {line}" for line in lines)


def finding(collective: Any) -> str | None:
    """One collective of the analyzer's database in a line, where the ranks diverge on it."""
    op = str(collective.collective_name).split(":", 1)[-1]
    sequence = collective.collective_seq_id or collective.p2p_seq_id
    what = f"{op} #{sequence} of group {collective.pg_desc}"
    if collective.missing_ranks:
        ranks = sorted(collective.missing_ranks)
        return f"{_ranks(ranks)} never entered {what} ({'its' if len(ranks) == 1 else 'their'} peers did)"
    if collective.mismatch_collectives:  # by the rank whose record differs: its own record, and why
        return f"{what}: " + "; ".join(
            f"rank {rank} {mismatch(other.type_of_mismatch)}"
            for rank, other in sorted(collective.mismatch_collectives.items())
        )
    if collective.type_of_mismatch is not None:
        return f"{what}: {mismatch(collective.type_of_mismatch)}"
    return None if collective.pass_check else f"{what}: the ranks' records of it differ"


def mismatch(info: Any) -> str:
    """The analyzer's ``MatchInfo``: its state (``collective type mismatch``), and what it found."""
    if info is None:
        return "differs"
    state = info.state.name.lower().replace("_", " ")
    culprit = getattr(info, "culprit", None)
    return f"{state} ({culprit})" if culprit else state


def is_stopped(pid: int | None) -> bool:
    """Whether process ``pid`` is stopped (by SIGSTOP, or held by a debugger): it runs no code until continued."""
    if pid is None:
        return False
    try:
        return psutil.Process(pid).status() in (psutil.STATUS_STOPPED, psutil.STATUS_TRACING_STOP)
    except psutil.Error:
        return False


def _ranks(ranks: list[int]) -> str:
    return f"rank {ranks[0]}" if len(ranks) == 1 else "ranks " + ", ".join(str(rank) for rank in ranks)


def main(argv: list[str]) -> None:
    """``python -m meshtop.runner.job.flight FOLDER``: the verdict as one JSON line, last on stdout."""
    try:
        answer: dict[str, str | None] = {"verdict": analyze(Path(argv[0])), "error": None}
    except ImportError as error:
        answer = {"verdict": None, "error": f"this torch has no flight-recorder analyzer ({error})"}
    except Exception as error:  # torch's analyzer on dumps it cannot read: its error, in one line
        message = str(error).splitlines()[0] if str(error) else ""
        answer = {
            "verdict": None,
            "error": f"torch's flight-recorder analyzer failed: {type(error).__name__}: {message}",
        }
    print(json.dumps(answer), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
