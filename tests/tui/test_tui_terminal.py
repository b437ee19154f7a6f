"""The dashboard in a real terminal (:mod:`tests.kit.terminal`): what a user sees and what the process does.
The whole module skips where tmux is not installed."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest

from meshtop.runner.plan import DEFAULT_STEPS
from tests.kit.commands import CLI_MODULE, run_meshtop, summary_json
from tests.kit.terminal import (
    JOB_S,
    POLL_S,
    REPO,
    STARTUP_S,
    TAB_ROW,
    TMUX,
    Terminal,
    header_rows,
    live_env,
    manifest_status,
    only_session,
    python_module,
    still_running,
)

pytestmark = pytest.mark.screen

if TMUX is None:
    pytest.skip(
        "tmux is not installed: the real-terminal tests need it (apt-get install tmux)", allow_module_level=True
    )

# -- replay ------------------------------------------------------------------------------


def test_replay_of_the_sample_shows_the_dashboard_switches_view_and_quits(terminal: Callable[..., Terminal]) -> None:
    term = terminal(["replay"], width=80, height=24)
    screen = term.wait_text(TAB_ROW)
    assert screen.startswith(" meshtop  ● replaying"), screen
    assert any(TAB_ROW in row for row in screen.splitlines()[:4]), screen  # just under the header
    replay_bar = re.compile(r"^ [▶⏸] [━─]+ step \d+/40  \d+\.\d s  1x$", re.MULTILINE)
    term.wait_for(replay_bar.search, "the replay bar", STARTUP_S)
    assert "collectives by group and op" not in screen  # the Overview opens first

    term.press("3")
    comms = term.wait_text("collectives by group and op", timeout_s=10)
    assert TAB_ROW in comms and replay_bar.search(comms), comms

    term.press("q")
    assert term.wait_exit() == 0, term.everything()
    after = term.everything()
    assert "Traceback" not in after and "meshtop: error" not in after, after
    assert "meshtop  ●" not in term.screen()  # the dashboard is gone: the shell's screen is back


def test_the_header_keeps_its_step_row_in_a_narrow_terminal(terminal: Callable[..., Terminal]) -> None:
    # The sample's first header row is about 80 characters: 64 columns cannot hold it.
    term = terminal(["replay", "--paused-at", "10"], width=64, height=24)
    term.wait_for(
        lambda screen: screen.startswith(" meshtop  ● ") and "step 10/40  " in screen,
        "the header and the replay bar",
        STARTUP_S,
    )
    deadline = time.monotonic() + 15  # a loaded CI lays the narrow header out in its own time
    while not (rows := header_rows(term.screen()))[1].startswith(" step ") and time.monotonic() < deadline:
        time.sleep(POLL_S)
    assert rows[0].startswith(" meshtop  ● replaying "), rows
    assert rows[1].startswith(" step 10/40 "), rows


def test_the_overview_and_summary_print_the_same_collective_p50_and_p99(terminal: Callable[..., Terminal]) -> None:
    """The same recording in the dashboard's overview (at its end) and in ``meshtop summary``: the same
    in-flight p50 / p99 per (group, op), as printed."""
    done = run_meshtop("summary", "recordings/samples/dp2-pp2-1f1b", cwd=REPO, timeout_s=120, check=True)
    row = re.compile(r"^  (\w+)\s+(\w+)\s+[\d,]+\s+\S+ \S+\s+\S+ \S+\s+(\S+ \S+)\s+(\S+ \S+)", re.MULTILINE)
    printed = {(g, o): (p50, p99) for g, o, p50, p99 in row.findall(done.stdout)}
    assert len(printed) == 3, done.stdout
    term = terminal(["replay", "--paused-at", "40"], width=120, height=40)
    cells = re.compile(r"^  (\w+)\s+(\w+)\s+[\d,]+\s+\S+ \S+\s+(\S+ \S+)\s+(\S+ \S+)", re.MULTILINE)

    def same_as_printed(screen: str) -> bool:
        """The overview's collectives as summary printed them (the seek to step 40 folds over a few frames, and
        the screen may be read between two of its updates: a row missing, a p99 of fewer steps)."""
        shown = {(g, o): (p50, p99) for g, o, p50, p99 in cells.findall(screen)}
        return "collectives (busiest)" in screen and shown == printed

    term.wait_for(
        same_as_printed, f"the overview's collectives as summary printed them, {printed}", timeout_s=STARTUP_S
    )
    term.press("q")
    assert term.wait_exit() == 0


# -- live jobs -----------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("how", ["q", "C-c", "SIGTERM"])
def test_quitting_a_live_job_stops_every_rank_and_keeps_the_recording(
    terminal: Callable[..., Terminal], tmp_path: Path, how: str
) -> None:
    runs = tmp_path / "runs"
    # Far more steps than the test waits for, so that the job is surely still running when q arrives.
    term = terminal(
        ["run", "--steps", "2000", "--model", "tiny", "--runs-dir", str(runs)], width=100, height=30, env=live_env()
    )

    def running_step(screen: str) -> int | None:
        first, second = header_rows(screen)
        found = re.match(r" step (\d+)/2000\b", second)
        return int(found.group(1)) if "● running" in first and found and int(found.group(1)) > 0 else None

    term.wait_for(running_step, "'● running' with a step above 0", JOB_S)
    job = term.job_processes()
    workers = [p for p in job if python_module(p) == "meshtop.runner.rank.worker"]
    assert len(workers) == 2, [p.cmdline() for p in job]  # dp2: one per rank

    if how == "SIGTERM":  # to the pid the shell knows: the process that waits for meshtop's (tui/detach.py)
        [meshtop] = [p for p in job if python_module(p) == CLI_MODULE and python_module(p.parent()) != CLI_MODULE]
        meshtop.terminate()
    else:
        term.press(how)
    assert term.wait_exit() == 130, term.everything()
    assert still_running(job) == []
    after = term.everything()
    assert "Traceback" not in after, after
    session = only_session(runs)
    assert re.search(r"^interrupted after \d", after, re.MULTILINE), after
    assert f"recording: {session}" in after, after
    assert manifest_status(session) == "interrupted"


def meshtop_process(term: Terminal) -> psutil.Process:
    """The process that runs the session: a recorded ``run`` is the child of the one the shell waits for
    (:mod:`meshtop.tui.detach`)."""
    meshtops = [p for p in term.job_processes() if python_module(p) == CLI_MODULE]
    [meshtop] = [p for p in meshtops if python_module(p.parent()) == CLI_MODULE] or meshtops
    return meshtop


def lose_the_terminal(term: Terminal) -> None:
    """Close the terminal as a dropped SSH connection does: the tmux server goes, and with it the pty. What
    meshtop leaves is killed when the test ends, whatever it asserted (the terminal's own cleanup finds the
    processes through the pane, which is gone)."""
    left = term.job_processes()
    term.tmux("kill-server", check=False)
    term.job_processes = lambda: left  # type: ignore[method-assign]


def terminal_lost(manifest: dict[str, object]) -> bool:
    """The manifest says when the terminal went, and how: its hangup, or the first write that failed."""
    note = str(manifest.get("terminal_lost"))
    return (
        re.fullmatch(r"\d{4}-\d\d-\d\dT[\d:]+[+-]\d{4}: (SIGHUP|a write to the terminal failed .*)", note) is not None
    )


def cpu_share(process: psutil.Process, seconds: float = 3.0) -> float:
    """The share of one core ``process`` and its threads used over ``seconds``."""
    return float(process.cpu_percent(interval=seconds)) / 100


@pytest.mark.slow  # launches ranks
def test_a_lost_terminal_mid_run_leaves_the_job_running_headless_until_sigterm(
    terminal: Callable[..., Terminal], tmp_path: Path
) -> None:
    """The terminal of `meshtop run` closes mid-run: meshtop neither spins nor hangs, the job goes on and is
    recorded, SIGTERM ends it within seconds, and the manifest says when the terminal was lost."""
    runs = tmp_path / "runs"
    term = terminal(
        ["run", "--steps", "100000", "--model", "tiny", "--runs-dir", str(runs)], width=100, height=30, env=live_env()
    )
    # before the first step, the header says what the job does (the launcher's phase, then the ranks' starts)
    term.wait_for(
        lambda screen: re.search(r"starting the ranks|ranks? started", header_rows(screen)[1]),
        "the startup phase in the header",
        STARTUP_S,
    )
    term.wait_for(
        lambda screen: "● running" in screen and re.search(r" step [1-9]\d*/100000", screen), "a running step", JOB_S
    )
    meshtop = meshtop_process(term)
    job = [meshtop, *meshtop.children(recursive=True)]
    lose_the_terminal(term)
    session = only_session(runs)
    steps = session / "events" / "step.jsonl"
    time.sleep(2.0)
    assert meshtop.is_running() and meshtop.status() != psutil.STATUS_ZOMBIE, "meshtop died with its terminal"
    assert cpu_share(meshtop) < 0.5, "meshtop spins on the lost terminal"
    before = steps.stat().st_size
    deadline = time.monotonic() + 30  # the next step's line, however slow the machine's steps are
    while steps.stat().st_size <= before and time.monotonic() < deadline:
        time.sleep(POLL_S)
    assert steps.stat().st_size > before, "the job stopped, or is no longer recorded"
    meshtop.terminate()
    started = time.monotonic()
    meshtop.wait(timeout=30)
    assert time.monotonic() - started < 30
    # interrupted, as SIGTERM asks: a write to the dead terminal after the dashboard closed (the swap for
    # /dev/null missing) would end it with a traceback and exit code 1
    assert term.wait_exit() == 130
    psutil.wait_procs(job, timeout=30)
    assert still_running(job) == []
    manifest = json.loads((session / "manifest.json").read_text())
    assert manifest["status"] == "interrupted"
    assert terminal_lost(manifest)
    assert manifest["steps_completed"] > 0


@pytest.mark.slow
def test_a_terminal_lost_as_the_job_completes_never_leaves_meshtop_behind(
    terminal: Callable[..., Terminal], tmp_path: Path
) -> None:
    """The race seen after completion, tried again and again: the terminal closes just as the job completes,
    and each time meshtop exits by itself, at rest, the recording complete; without a recording (--no-record)
    a job whose terminal closes mid-run is stopped."""
    for attempt in range(2):
        runs = tmp_path / f"runs{attempt}"
        term = terminal(
            ["run", "--steps", "3", "--model", "tiny", "--runs-dir", str(runs)], width=100, height=30, env=live_env()
        )
        term.wait_text("● completed", timeout_s=JOB_S)
        meshtop = meshtop_process(term)
        job = [meshtop, *meshtop.children(recursive=True)]
        time.sleep(0.5 * attempt)  # the dashboard mid-frame, or at rest
        lose_the_terminal(term)
        meshtop.wait(timeout=30)
        assert term.wait_exit() == 0  # its last lines to a dead terminal, and no error for it
        assert still_running(job) == []
        manifest = json.loads((only_session(runs) / "manifest.json").read_text())
        assert manifest["status"] == "completed" and terminal_lost(manifest)

    term = terminal(
        ["run", "--steps", "100000", "--model", "tiny", "--no-record"], width=100, height=30, env=live_env()
    )
    term.wait_for(
        lambda screen: "● running" in screen and re.search(r" step [1-9]\d*/100000", screen), "a running step", JOB_S
    )
    meshtop = meshtop_process(term)
    job = [meshtop, *meshtop.children(recursive=True)]
    lose_the_terminal(term)
    meshtop.wait(timeout=60)
    psutil.wait_procs(job, timeout=30)
    assert still_running(job) == []


@pytest.mark.slow
def test_a_completed_live_job_keeps_the_dashboard_until_q(terminal: Callable[..., Terminal], tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    term = terminal(
        ["run", "--steps", "5", "--model", "tiny", "--runs-dir", str(runs)], width=100, height=30, env=live_env()
    )
    screen = term.wait_text("● completed", timeout_s=JOB_S)
    first, second = header_rows(screen)
    assert first.startswith(" meshtop  ● completed"), screen
    assert second.startswith(" step 5/5 "), screen
    job = term.job_processes()
    assert not [p for p in job if python_module(p) == "meshtop.runner.rank.worker"], "the ranks outlived the job"
    elapsed = re.search(r"elapsed (\S+ s)", header_rows(term.screen())[1])
    time.sleep(1.5)  # completed is not an exit: the dashboard stays open, its clock stopped with the job
    assert term.exit_code() is None and "● completed" in term.screen()
    assert elapsed is not None and f"elapsed {elapsed.group(1)}" in header_rows(term.screen())[1]

    after, session = quit_completed(term, job, runs)
    assert f"recording: {session}" in after, after


def quit_completed(term: Terminal, job: list[psutil.Process], runs: Path) -> tuple[str, Path]:
    """q on a job that completes: exit 0, no process of the job left, no traceback, ``completed in`` said and
    the one recorded session's manifest ``completed``; what the terminal shows after, and the session."""
    term.press("q")
    assert term.wait_exit() == 0, term.everything()
    assert still_running(job) == []
    after = term.everything()
    assert "Traceback" not in after, after
    session = only_session(runs)
    assert re.search(r"^completed in \d", after, re.MULTILINE), after
    assert manifest_status(session) == "completed"
    return after, session


@pytest.mark.slow  # launches ranks
def test_the_default_run_trains_until_q_and_then_completes_on_every_rank(
    terminal: Callable[..., Terminal], tmp_path: Path
) -> None:
    runs = tmp_path / "runs"
    term = terminal(["run", "--model", "tiny", "--runs-dir", str(runs)], width=100, height=30, env=live_env())

    def running_step(screen: str) -> int | None:
        first, second = header_rows(screen)
        found = re.match(r" step (\d+) ", second)  # no "/N": the run has no fixed length
        return int(found.group(1)) if "● running" in first and found else None

    term.wait_for(lambda screen: (running_step(screen) or 0) > DEFAULT_STEPS, f"a step past {DEFAULT_STEPS}", JOB_S)
    assert "q ends the run" in header_rows(term.screen())[1], term.screen()
    _, session = quit_completed(term, term.job_processes(), runs)
    summary = summary_json(session)
    assert summary["steps"]["count"] > DEFAULT_STEPS  # every rank reported each of them (folded steps)


LIVE_VIEWS = {
    "train": (
        ["run", "--model", "tiny", "--dp", "2", "--pp", "2", "--no-record"],
        {
            "1": ["step time", "memory per rank", "collectives (busiest)"],
            "2": ["memory per rank (resident set)", "█ weights"],
            "3": ["collectives by group and op", "all_reduce", "send", "recv"],
            "4": ["stage 0", "stage 1", "bubble per stage over the run (ideal"],
            "5": ["step time", "throughput", "loss"],
            "6": ["pp/dp/tp", "running"],
            "7": ["alerts"],
        },
    ),
    "infer": (
        ["run", "--mode", "infer", "--pp", "2", "--requests", "2000", "--no-record"],
        {
            "1": ["requests", "TTFT", "TPOT", "memory per rank", "collectives (busiest)"],
            "2": ["memory per rank (resident set)", "█ kv cache"],
            "3": ["collectives by group and op", "send", "recv"],
            "4": ["stage 0", "stage 1", "bubble per stage"],
            "5": ["iteration time (rank 0)", "throughput (rank 0)"],
            "6": ["pp/dp/tp", "running"],
            "7": ["alerts"],
        },
    ),
}
COLLECTIVE_ROW = re.compile(
    r"^  (dp|tp|pp) +\w+ +[\d,]+ +[\d.]+ [KMG]?i?B +\S+ \S+ +\S+ \S+ "
    r"+([\d.]+ [kMGT]?B/s|-) +(≤?\d+%|-)( +[ ▁▂▃▄▅▆▇█]+)?$"
)
"""A collectives row with every cell whole: count, bytes, p50, p99, busbw with its unit (``-`` where no
operation ran alone on its group), % step (and the history of a wide screen)."""


@pytest.mark.slow
@pytest.mark.parametrize("size", [(80, 24), (200, 60)], ids=["80x24", "200x60"])
@pytest.mark.parametrize("work", sorted(LIVE_VIEWS))
def test_every_view_of_a_live_job_reads_whole_at_80x24_and_200x60(
    terminal: Callable[..., Terminal], work: str, size: tuple[int, int], tmp_path: Path
) -> None:
    """A live training job (dp2 x pp2) and a live inference load (pp2) in a real terminal: every view shows
    what it is for, the header keeps its two rows and the tab row, numbers keep their units, and nothing
    reads None or nan."""
    args, marks = LIVE_VIEWS[work]
    scratch = tmp_path / "scratch"  # where an unrecorded session keeps its launcher log while it runs
    scratch.mkdir()
    term = terminal(args, width=size[0], height=size[1], env={**live_env(), "TMPDIR": str(scratch)})
    progress = re.compile(r" step [1-9]\d* " if work == "train" else r" requests [1-9][\d,]*/2,000 ")
    term.wait_for(
        lambda screen: "● running" in screen and progress.match(header_rows(screen)[1]),
        "the job running with progress in the header",
        JOB_S,
    )
    for key, wanted in marks.items():
        term.press(key)
        screen = term.wait_for(
            lambda screen, wanted=wanted: screen if all(mark in screen for mark in wanted) else None,
            f"view {key} showing {wanted}",
            15,
        )
        rows = screen.splitlines()
        assert len(rows) <= size[1] and all(len(row) <= size[0] for row in rows), screen
        first, second = header_rows(screen)
        assert first.startswith(" meshtop  ● running ") and progress.match(second), screen
        assert any(TAB_ROW in row for row in rows[:4]), screen
        assert not re.search(r"\b(None|nan|inf)\b", screen), screen
        if key == "3":
            table = [row for row in rows if re.match(r"^  (dp|tp|pp) ", row)]
            assert table and all(COLLECTIVE_ROW.match(row) for row in table), screen
    job = term.job_processes()
    term.press("q")
    assert term.wait_exit() == (0 if work == "train" else 130), term.everything()  # train: until q
    assert still_running(job) == []
    assert list(scratch.glob("meshtop-run-*")) == []  # quit mid-load (130) too: no scratch folder left


@pytest.mark.slow  # launches ranks
def test_a_users_own_script_runs_live_with_its_collectives_and_steps(
    terminal: Callable[..., Terminal], tmp_path: Path
) -> None:
    runs = tmp_path / "runs"
    term = terminal(
        [
            "run",
            "--runs-dir",
            str(runs),
            "--",
            "torchrun",
            "--standalone",
            "--nproc-per-node=2",
            str(REPO / "examples" / "ddp.py"),
            "--steps",
            "6",
        ],
        width=120,
        height=32,
        env=live_env(),
    )
    screen = term.wait_text("● completed", timeout_s=JOB_S)
    first, second = header_rows(screen)
    assert "torchrun ddp.py (2 ranks) · 2× cpu" in first, screen
    assert second.startswith(" step 6 "), screen  # no total: the script alone knows how many it takes
    term.press("3")
    comms = term.wait_text("all_reduce")
    assert re.search(r"world\s+all_reduce", comms), comms
    term.press("q")
    assert term.wait_exit() == 0, term.everything()
    sessions = [path for path in runs.iterdir() if path.is_dir()]
    assert len(sessions) == 1 and sessions[0].name.endswith("-ddp"), sessions
    assert manifest_status(sessions[0]) == "completed"


@pytest.mark.slow
def test_a_hang_in_a_live_job_shows_the_report_and_s_stops_the_job(
    terminal: Callable[..., Terminal], tmp_path: Path
) -> None:
    runs = tmp_path / "runs"
    term = terminal(
        ["run", "--steps", "50", "--model", "tiny", "--runs-dir", str(runs), "--hang-timeout", "3"],
        width=110,
        height=32,
        env={**live_env(), "MESHTOP_FAULT": "hang:1:3"},
    )
    screen = term.wait_text("No rank made progress", timeout_s=JOB_S)
    assert "rank 0 waits in a collective; rank 1 is not in one: look there first" in screen
    assert "rank 0: inside all_reduce on dp for " in screen
    assert "rank 1 never entered all_reduce" in screen  # torch's flight recorder, beside meshtop's report
    job = term.job_processes()
    term.press("s")
    term.wait_text("● failed", timeout_s=JOB_S)  # stopped; the dashboard stays open to be read
    assert (
        still_running(
            [p for p in job if python_module(p) in ("meshtop.runner.rank.worker", "meshtop.runner.job.agent")]
        )
        == []
    )
    term.press("q")
    assert term.wait_exit() == 1, term.everything()
    assert still_running(job) == []
    after = term.everything()
    assert "the job hung and was stopped" in after, after
    session = only_session(runs)
    assert manifest_status(session) == "failed"
    assert json.loads((session / "manifest.json").read_text())["hang"].startswith("rank 0 waits")
