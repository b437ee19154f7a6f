"""``meshtop watch`` in real terminals (:mod:`tests.kit.terminal`): a headless ``record`` runs in the background,
viewers come and go, and the job neither knows nor cares."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pytest

from meshtop.runner.session.control_socket import ACTIONS_NAME, CONTROL_DIR
from tests.kit.commands import CLI_MODULE, meshtop, run_meshtop, summary_json
from tests.kit.terminal import (
    JOB_S,
    REPO,
    STARTUP_S,
    TMUX,
    Terminal,
    header_rows,
    live_env,
    manifest_status,
    python_module,
    still_running,
)

pytestmark = [pytest.mark.screen, pytest.mark.slow]  # every test launches ranks

if TMUX is None:
    pytest.skip("tmux is not installed: the real-terminal tests need it", allow_module_level=True)

STEPS = 150
PACED = REPO / "tests" / "paced_ddp.py"


class Writer:
    """``meshtop record OUT -- torchrun ... paced_ddp.py`` in the background, in a session of its own."""

    def __init__(self, out: Path, *, step_s: float) -> None:
        self.out = out
        self.log = out.with_suffix(".log").open("w")
        command = ["torchrun", "--standalone", "--nproc-per-node=2", str(PACED), "--steps", str(STEPS)]
        self.process = subprocess.Popen(
            meshtop("record", out, "--", *command, "--step-s", str(step_s)),
            stdout=self.log,
            stderr=subprocess.STDOUT,
            env={**os.environ, **live_env()},
            cwd=REPO,
            start_new_session=True,
        )

    def recording_started(self, timeout_s: float = STARTUP_S) -> None:
        """Wait for the manifest that says the recording runs (meshtop imports torch first)."""
        deadline = time.monotonic() + timeout_s
        while not (self.out / "manifest.json").exists():
            assert self.process.poll() is None, self.out.with_suffix(".log").read_text()
            assert time.monotonic() < deadline, f"no recording in {self.out} after {timeout_s:.0f} s"
            time.sleep(0.1)

    def job(self) -> list[psutil.Process]:
        try:
            return [psutil.Process(self.process.pid), *psutil.Process(self.process.pid).children(recursive=True)]
        except psutil.NoSuchProcess:
            return []

    def wait(self, timeout_s: float = JOB_S) -> int:
        try:
            return self.process.wait(timeout=timeout_s)
        finally:
            self.log.close()

    def kill(self) -> None:
        for process in self.job():
            process.kill()
        self.process.wait(timeout=30)


@pytest.fixture
def writer(tmp_path: Path) -> Iterator[Callable[..., Writer]]:
    started: list[Writer] = []

    def start(out: Path, *, step_s: float = 0.2) -> Writer:
        started.append(Writer(out, step_s=step_s))
        started[-1].recording_started()
        return started[-1]

    try:
        yield start
    finally:
        for each in started:
            if each.process.poll() is None:
                each.kill()


def watched_step(screen: str) -> int | None:
    """The step a viewer's header shows while the job runs (``None`` before its first)."""
    first, second = header_rows(screen)
    found = re.match(r" step (\d+)", second)
    return int(found.group(1)) if "● watching" in first and found else None


def viewer_process(term: Terminal) -> psutil.Process:
    [viewer] = [p for p in term.job_processes() if python_module(p) == CLI_MODULE]
    return viewer


def shm() -> set[str]:
    return set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()


def test_viewers_come_and_go_and_the_job_completes_every_step(
    terminal: Callable[..., Terminal], writer: Callable[..., Writer], tmp_path: Path
) -> None:
    shared_memory = shm()
    out = tmp_path / "rec"
    job = writer(out)
    stays = terminal(["watch", str(out)], width=120, height=40, env=live_env())
    first_seen = stays.wait_for(watched_step, "a step in the first viewer", STARTUP_S + JOB_S)
    [listed] = json.loads(run_meshtop("ls", "--json", tmp_path).stdout)
    assert (listed["path"], listed["status"], listed["pid"]) == (str(out), "running", job.process.pid)
    leaves = terminal(["watch", str(out)], width=120, height=40)
    killed = terminal(["watch", str(out)], width=100, height=30)
    lost = terminal(["watch", str(out)], width=100, height=30)
    for viewer in (leaves, killed, lost):
        viewer.wait_for(watched_step, "a step in every viewer", STARTUP_S)
    later = stays.wait_for(lambda s: (n := watched_step(s)) and n > first_seen and n, "steps going on", JOB_S)
    assert later > first_seen

    os.kill(viewer_process(killed).pid, signal.SIGKILL)
    lost_viewer = viewer_process(lost)
    lost.tmux("kill-server")  # its terminal is gone: the viewer is hung up on and exits
    leaves.press("q")
    assert leaves.wait_exit() == 0, leaves.everything()
    assert psutil.wait_procs([lost_viewer], timeout=30)[1] == [], "the viewer outlived its terminal"
    assert job.process.poll() is None, "the job ended with its viewers"

    screen = stays.wait_text("● completed", timeout_s=STEPS * 0.2 + JOB_S)
    shown = re.match(r" step (\d+)", header_rows(screen)[1])
    assert job.wait() == 0, out.with_suffix(".log").read_text()
    assert shown is not None and int(shown.group(1)) == STEPS == summary_json(out)["steps"]["count"], screen
    stays.press("q")
    assert stays.wait_exit() == 0, stays.everything()
    assert manifest_status(out) == "completed"
    assert still_running(job.job()) == []
    assert not (out / CONTROL_DIR).exists(), "nobody acted: the control folder goes with its socket"
    assert shm() <= shared_memory, f"left in /dev/shm: {shm() - shared_memory}"


def test_k_in_a_viewer_stops_the_job_as_q_in_run_would_and_is_kept_with_who_asked(
    terminal: Callable[..., Terminal], writer: Callable[..., Writer], tmp_path: Path
) -> None:
    out = tmp_path / "rec"
    job = writer(out)
    viewer = terminal(["watch", str(out)], width=120, height=40)
    viewer.wait_for(watched_step, "a step", STARTUP_S + JOB_S)
    viewer.press("k")
    viewer.wait_text("Stop the job for everyone?")
    viewer.press("y", "Enter")
    assert job.wait() == 130, out.with_suffix(".log").read_text()
    viewer.wait_text("● interrupted", timeout_s=JOB_S)
    assert manifest_status(out) == "interrupted"
    [action] = [json.loads(line) for line in (out / CONTROL_DIR / ACTIONS_NAME).read_text().splitlines()]
    assert action["action"] == "stop" and action["done"] is True
    assert action["pid"] == viewer_process(viewer).pid and action["uid"] == os.getuid()
    assert action["tty"] is not None and action["tty"].startswith("/dev/pts/")
    viewer.press("q")
    assert viewer.wait_exit() == 0


def test_a_finished_recording_opens_as_a_replay_and_says_so(
    terminal: Callable[..., Terminal], writer: Callable[..., Writer], tmp_path: Path
) -> None:
    out = tmp_path / "rec"
    job = writer(out, step_s=0.0)
    assert job.wait() == 0
    viewer = terminal(["watch", str(out)], width=120, height=40)
    screen = viewer.wait_text("the session has ended (completed): replaying it")
    assert header_rows(screen)[0].startswith(" meshtop  ● replaying"), screen
    viewer.press("q")
    assert viewer.wait_exit() == 0


def test_watch_finds_the_live_session_and_after_its_writer_is_killed_shows_what_it_wrote(
    terminal: Callable[..., Terminal], writer: Callable[..., Writer], tmp_path: Path
) -> None:
    runs = tmp_path / "runs"
    runs.mkdir()
    job = writer(runs / "20261206-000000-train")
    viewer = terminal(["watch", "--runs-dir", str(runs)], width=120, height=40)
    viewer.wait_for(watched_step, "a step of the only live session", STARTUP_S + JOB_S)
    job.kill()  # the writer dies without closing its recording: it still says running
    screen = viewer.wait_text("● writer gone", timeout_s=JOB_S)
    assert re.match(r" step [1-9]", header_rows(screen)[1]), screen
    viewer.press("q")
    assert viewer.wait_exit() == 0
    assert manifest_status(job.out) == "running"

    again = terminal(["watch", str(job.out)], width=120, height=40)
    again.wait_text(f"writer gone (pid {job.process.pid}")
    again.press("q")
    assert again.wait_exit() == 0
    none_live = terminal(["watch", "--runs-dir", str(runs)], width=120, height=40)
    assert none_live.wait_exit() == 2
    assert f"meshtop: error: no live session in {runs}" in none_live.everything()


def test_d_in_run_gives_the_shell_back_the_job_goes_on_headless_and_watch_comes_back_to_it(
    terminal: Callable[..., Terminal], tmp_path: Path
) -> None:
    runs = tmp_path / "runs"
    script = ["torchrun", "--standalone", "--nproc-per-node=2", str(PACED), "--steps", str(STEPS)]
    term = terminal(["run", "--runs-dir", str(runs), "--", *script], width=120, height=40, env=live_env())
    term.wait_for(lambda s: "● running" in s and re.search(r" step [1-9]", header_rows(s)[1]), "a step", JOB_S)
    term.press("d")
    assert term.wait_exit() == 0, term.everything()  # the shell has its prompt back
    [session] = list(runs.iterdir())
    assert "detached: the job goes on headless (pid " in term.everything()
    assert f"meshtop watch {session}" in term.everything()
    writer_pid = json.loads((session / "writer.json").read_text())["pid"]
    detached = psutil.Process(writer_pid)
    assert detached.is_running() and os.getsid(writer_pid) == writer_pid, "the job left the terminal's session"
    assert manifest_status(session) == "running"

    viewer = terminal(["watch", "--runs-dir", str(runs)], width=120, height=40)
    seen = viewer.wait_for(watched_step, "a step of the detached job", STARTUP_S)
    viewer.wait_for(lambda s: (n := watched_step(s)) and n > seen, "steps going on", JOB_S)
    viewer.wait_text("● completed", timeout_s=STEPS * 0.2 + JOB_S)
    assert psutil.wait_procs([detached], timeout=30)[1] == []
    assert manifest_status(session) == "completed"
    assert summary_json(session)["steps"]["count"] == STEPS
    console = (session / "console.log").read_text()
    assert re.search(rf"^step  {STEPS}/\?", console, re.MULTILINE), console  # record's progress lines, to its end
    assert "completed in" in console and f"recording: {session}" in console
    viewer.press("q")
    assert viewer.wait_exit() == 0
