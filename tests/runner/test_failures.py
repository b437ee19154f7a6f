"""Failures: a hung job is reported (where every rank is, their stacks) and stopped; an out-of-memory rank is named."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pandas as pd
import pytest

from meshtop.probes.arrivals import Arrivals
from meshtop.probes.events import CollectiveTiming, RankProgress
from meshtop.probes.stacks import py_spy_executable
from meshtop.runner.job.hangs import MIN_TIMEOUT_S, STARTUP_MIN_S, STARTUP_TIMEOUT_S, HangWatch, default_timeout_s
from tests.kit.commands import meshtop, one_line_error, run_meshtop, summary_json
from tests.kit.events import step
from tests.kit.jobs import alive


def beat(
    rank: int,
    *,
    step: int | None = 3,
    op: str | None = None,
    group: str | None = None,
    peer: int | None = None,
    start_ns: int | None = None,
) -> RankProgress:
    return RankProgress(
        rank=rank,
        wall_ns=0,
        step=step,
        in_flight=1 if op else 0,
        oldest_op=op,
        oldest_group=group,
        oldest_peer=peer,
        oldest_start_ns=start_ns,
    )


def test_default_timeout_is_generous_at_start_then_a_multiple_of_the_median_step() -> None:
    assert default_timeout_s([]) == STARTUP_TIMEOUT_S
    assert default_timeout_s([0.01, 0.02, 0.5]) == MIN_TIMEOUT_S
    assert default_timeout_s([3.0, 3.0, 90.0]) == 60.0


def test_hang_report_names_the_rank_outside_the_collective() -> None:
    now = [0.0]
    watch = HangWatch(4, timeout_s=5, clock=lambda: now[0])
    watch.observe(Arrivals([step(0)]))  # the first step: the user's timeout now applies as given
    now[0] = 4.0
    watch.observe(
        Arrivals(
            [
                beat(0, op="all_reduce", group="dp", start_ns=1),
                beat(1),
                beat(2, op="recv", group="pp", peer=3, start_ns=1),
            ]
        )
    )
    assert watch.check() is None  # 4 s < 5 s
    now[0] = 5.5
    hang = watch.check()
    assert hang is not None and hang.silent_s == 5.5 and hang.timeout_s == 5
    lines = hang.report.splitlines()
    assert (
        lines[0] == "ranks 0, 2 wait in a collective; rank 1 is not in one: look there first; rank 3 sent no heartbeat"
    )
    assert lines[1].startswith("rank 0: inside all_reduce on dp for ")
    assert lines[2] == "rank 1: not in a collective (step 4)"
    assert lines[3].startswith("rank 2: inside recv with rank 3 on pp for ")
    assert lines[4] == "rank 3: no heartbeat received (not started, or hooks unreachable)"
    assert watch.check() is None  # reported once, not every poll
    watch.observe(
        Arrivals(
            [
                CollectiveTiming(
                    rank=0,
                    step=3,
                    op="all_reduce",
                    group="dp",
                    group_size=2,
                    peer=None,
                    bytes=4,
                    dtype=None,
                    start_ns=0,
                    end_ns=1,
                    clock="completion",
                )
            ]
        )
    )
    assert not watch.reported  # progress again


def test_a_rank_whose_heartbeat_stopped_is_called_silent() -> None:
    now = [0.0]
    watch = HangWatch(2, timeout_s=5, clock=lambda: now[0])
    watch.observe(Arrivals([step(0), beat(0, op="all_reduce", group="dp", start_ns=1), beat(1)]))
    now[0] = 10.0
    watch.observe(Arrivals([beat(0, op="all_reduce", group="dp", start_ns=1)]))  # rank 1 froze (SIGSTOP, a debugger...)
    hang = watch.check()
    assert hang is not None
    assert "rank 1: silent for 10 s (frozen, stopped or gone; last in step 4)" in hang.report


def test_a_given_timeout_waits_at_least_a_minute_for_the_first_step() -> None:
    now = [0.0]
    watch = HangWatch(1, timeout_s=5, clock=lambda: now[0])
    now[0] = STARTUP_MIN_S - 1
    assert watch.check() is None
    now[0] = STARTUP_MIN_S + 1
    assert watch.check() is not None


def record(out: Path, fault: str, *extra: str) -> subprocess.CompletedProcess[str]:
    return run_meshtop(
        "record", str(out), "--device", "cpu", "--steps", "6", *extra, env={"MESHTOP_FAULT": fault}, timeout_s=300
    )


def py_spy_dumps_here() -> bool:
    """Whether py-spy can dump a Python process of this user here, tried on one that sleeps."""
    executable = py_spy_executable()
    if executable is None:
        return False
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        time.sleep(0.5)
        done = subprocess.run(
            [executable, "dump", "--pid", str(sleeper.pid)], capture_output=True, text=True, timeout=60
        )
        return done.returncode == 0 and "<module>" in done.stdout
    finally:
        sleeper.kill()
        sleeper.wait()


@pytest.mark.slow
def test_a_hung_job_is_reported_with_every_rank_stack_then_stopped(tmp_path: Path) -> None:
    out = tmp_path / "rec"
    done = record(out, "hang:1:2", "--hang-timeout", "3")
    assert done.returncode == 1, done.stdout + done.stderr
    assert "rank 0 waits in a collective; rank 1 is not in one: look there first" in done.stdout
    assert "rank 0: inside all_reduce on dp for " in done.stdout
    assert "failed after" in done.stdout and "the job hung and was stopped" in done.stdout
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["status"] == "failed"
    assert manifest["hang"].startswith("rank 0 waits in a collective")
    # torch's flight recorder agrees, beside it: DDP's bucket all-reduce of step 3 that rank 1 never entered
    flight = [line for line in manifest["hang"].splitlines() if line.startswith("torch's flight recorder: ")]
    assert len(flight) == 1 and re.fullmatch(
        r"torch's flight recorder: rank 1 never entered all_reduce #\d+ of group \S+ \(its peers did\)", flight[0]
    ), flight
    stacks = pd.read_parquet(out / "events" / "stack_dump.parquet")
    assert sorted(stacks["rank"]) == [0, 1]
    rank1 = stacks[stacks["rank"] == 1].iloc[0]
    if py_spy_dumps_here():
        assert pd.isna(rank1["error"]) and "Fault.maybe_fire" in rank1["text"], rank1["error"]  # the fault's frame
    else:  # no ptrace rights (a container's default): the dump says why instead
        assert isinstance(rank1["error"], str) and "ptrace" in rank1["error"] and pd.isna(rank1["text"])
    hangs = pd.read_parquet(out / "events" / "hang.parquet")
    assert len(hangs) == 1
    pids = pd.read_parquet(out / "events" / "rank_started.parquet")["pid"].tolist()
    assert alive(pids) == []


@pytest.mark.slow
def test_an_out_of_memory_rank_is_named_with_the_allocator_message(tmp_path: Path) -> None:
    out = tmp_path / "rec"
    done = record(out, "oom:1:2")
    assert done.returncode == 1, done.stdout + done.stderr
    assert "rank 1 failed first: exit code 1: OutOfMemoryError: CUDA out of memory." in done.stdout
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["status"] == "failed" and manifest["root_cause_rank"] == 1
    pids = pd.read_parquet(out / "events" / "rank_started.parquet")["pid"].tolist()
    assert alive(pids) == []


ROOT = Path(__file__).resolve().parents[2]
SMALL_DISK = "768k"
"""A tmpfs that a tiny dp2 run fills in some 200 steps; the recording keeps 256 KiB of it for its manifest.
(A file-size limit's EFBIG, the same stop, is the soak's full disk where no tmpfs can be mounted.)"""


def can_mount_in_a_namespace() -> str | None:
    """Why a tmpfs cannot be mounted in a user and mount namespace here, or ``None`` when it can."""
    unshare = shutil.which("unshare")
    if unshare is None:
        return "unshare (util-linux) is not installed"
    done = subprocess.run(
        [unshare, "--user", "--map-root-user", "--mount", "sh", "-c", "mount -t tmpfs -o size=64k tmpfs /mnt"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    return None if done.returncode == 0 else f"no tmpfs in a user namespace here: {done.stderr.strip()}"


@pytest.mark.slow
def test_a_really_full_disk_stops_the_job_and_the_manifest_says_why(tmp_path: Path) -> None:
    """record into a real small filesystem (a tmpfs of 768 KiB, mounted in a namespace of the test's own) until
    it fills: ENOSPC, not a file size limit. The job is stopped, exit 2, one line; the manifest is whole and
    says failed with the reason (it had room kept for it); summary reads what was written."""
    if (why := can_mount_in_a_namespace()) is not None:
        pytest.skip(why)
    disk = tmp_path / "disk"
    disk.mkdir()
    meshtop = f"{shlex.quote(sys.executable)} -m meshtop.tui.cli"
    script = (
        f"mount -t tmpfs -o size={SMALL_DISK} tmpfs {disk} || exit 99; "
        f"{meshtop} record {disk}/rec --device cpu --steps 100000 >{tmp_path}/out 2>{tmp_path}/err; "
        f"echo $? >{tmp_path}/code; df -k {disk} >{tmp_path}/df; "
        f"{meshtop} summary {disk}/rec --json >{tmp_path}/summary.json 2>{tmp_path}/summary.err; "
        f"cp {disk}/rec/manifest.json {tmp_path}/manifest.json; ls -a {disk}/rec >{tmp_path}/files"
    )
    subprocess.run(
        ["unshare", "--user", "--map-root-user", "--mount", "sh", "-c", script], cwd=ROOT, timeout=600, check=True
    )
    code, err = int((tmp_path / "code").read_text()), (tmp_path / "err").read_text()
    assert code == 2, (tmp_path / "out").read_text()[-2000:] + err
    assert err.splitlines() == [
        f"meshtop: error: cannot write the recording in {disk}/rec: No space left on "
        "device; the job was stopped, the events written so far are kept"
    ]
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    assert manifest["status"] == "failed" and "No space left on device" in manifest["reason"]
    assert ".manifest-room" not in (tmp_path / "files").read_text().split()
    report = json.loads((tmp_path / "summary.json").read_text())
    assert report["run"]["status"] == "failed" and report["steps"]["count"] > 10


def record_then(
    out: Path, steps: int, action: Callable[[], object], *, settle_s: float = 0.0
) -> tuple[int, str, list[int]]:
    """``meshtop record OUT`` until its first step is on disk (and ``settle_s`` more), then ``action``; its
    exit code, standard error and the ranks' pids."""
    process = subprocess.Popen(
        meshtop("record", str(out), "--device", "cpu", "--steps", str(steps)),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 120
        while not (out / "events" / "step.jsonl").exists() and time.monotonic() < deadline:
            time.sleep(0.2)
        time.sleep(settle_s)
        pids = [json.loads(line)["pid"] for line in (out / "events" / "rank_started.jsonl").read_text().splitlines()]
        action()
        _, stderr = process.communicate(timeout=120)
    finally:
        if process.poll() is None:
            process.kill()
    return process.returncode, stderr, pids


def ext4_that_can_fail(image: Path, mount_point: Path) -> str:
    """Mount a fresh 64 MiB ext4 image at ``mount_point`` with ``errors=remount-ro``; its sysfs name (ext4's
    ``trigger_fs_error`` there turns it read-only as a real error would). Skips where that cannot be done."""
    if os.geteuid() != 0:
        pytest.skip("needs root: a loop-mounted ext4 image (a user namespace cannot mount one)")
    for tool in ("mkfs.ext4", "mount", "umount", "findmnt"):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} is not installed")
    with image.open("wb") as file:
        file.truncate(64 << 20)
    subprocess.run(["mkfs.ext4", "-q", str(image)], check=True, timeout=60)
    mount_point.mkdir()
    mounted = subprocess.run(
        ["mount", "-o", "loop,errors=remount-ro", str(image), str(mount_point)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot loop-mount an ext4 image here: {mounted.stderr.strip()}")
    device = Path(
        subprocess.run(
            ["findmnt", "-no", "SOURCE", str(mount_point)], capture_output=True, text=True, check=True, timeout=30
        ).stdout.strip()
    ).name
    if not Path(f"/sys/fs/ext4/{device}/trigger_fs_error").exists():
        subprocess.run(["umount", str(mount_point)], timeout=60)
        pytest.skip("this kernel's ext4 has no trigger_fs_error")
    return device


@pytest.mark.slow
def test_a_recording_folder_turned_read_only_mid_run_stops_the_job_and_says_the_manifest_could_not_follow(
    tmp_path: Path,
) -> None:
    """The recording's filesystem turns read-only under a running job, as ext4 does on an error with
    ``errors=remount-ro`` (here the real thing, set off by ext4's own ``trigger_fs_error``): writes fail with
    EROFS. The job is stopped, exit 2, one line that also says the manifest could not be updated; what was
    written before stays readable by ``summary``."""
    disk = tmp_path / "disk"
    device = ext4_that_can_fail(tmp_path / "disk.img", disk)
    out = disk / "rec"
    try:
        code, stderr, pids = record_then(
            out, 100_000, lambda: Path(f"/sys/fs/ext4/{device}/trigger_fs_error").write_text("1"), settle_s=1.0
        )
        assert code == 2, stderr
        assert stderr.splitlines() == [
            f"meshtop: error: cannot write the recording in {out}: Read-only file system; the job was stopped, "
            "the events written so far are kept; the manifest could not be updated (Read-only file system): it "
            "still says running (`meshtop summary` reads it as interrupted)"
        ]
        assert alive(pids) == []
        assert json.loads((out / "manifest.json").read_text())["status"] == "running"  # whole, as it was
        report = summary_json(out)
        assert report["run"]["status"] == "interrupted" and report["steps"]["count"] > 0
    finally:
        subprocess.run(["umount", str(disk)], timeout=60)


@pytest.mark.slow
def test_a_recording_folder_removed_mid_run_stops_the_job_with_one_line(tmp_path: Path) -> None:
    out = tmp_path / "rec"
    code, stderr, pids = record_then(out, 5000, lambda: shutil.rmtree(out))
    assert code == 2
    assert stderr.splitlines() == [
        f"meshtop: error: cannot write the recording in {out}: No such file or directory; the job was stopped, "
        "the folder was removed, and what it held with it"
    ]
    assert alive(pids) == []


BAD_COMMAND_LINES = [
    (["run", "--gpu-sample-hz", "0"], "--gpu-sample-hz must be above 0"),
    (["run", "--process-sample-hz", "-2"], "--process-sample-hz must be above 0"),
    (["run", "--process-sample-hz", "fast"], "argument --process-sample-hz: invalid float value: 'fast'"),
    (["run", "--hang-timeout", "0"], "--hang-timeout must be above 0"),
    (["run", "--hang-timeout", "-5"], "--hang-timeout must be above 0"),
    (["record", "OUT", "--hang-timeout", "soon"], "argument --hang-timeout: invalid float value: 'soon'"),
    (["run", "--microbatches", "0", "--pp", "2"], "--microbatches must be at least 1"),
    (["run", "--steps", "x"], "argument --steps: invalid int value: 'x'"),
    (["run", "--no-such-option"], "unrecognized arguments: --no-such-option"),
    (["replay", "missing-recording"], "missing-recording does not exist"),
    (["replay", "--speed", "-1"], "--speed must be above 0"),
    (["replay", "--speed", "fast"], "argument --speed: invalid float value: 'fast'"),
    (["replay", "--paused-at", "0"], "no step 0 in this recording (it has steps 1 to 40)"),
    (["summary", "missing-recording"], "missing-recording does not exist"),
    (["summary"], "the following arguments are required: REC"),
    (["compare", "missing-a", "missing-b"], "missing-a does not exist"),
    (["export", "missing-recording", "--format", "csv", "-o", "out"], "missing-recording does not exist"),
    (["export", "REC", "--format", "pdf", "-o", "out"], "argument --format: invalid choice: 'pdf'"),
    (["bogus"], "argument command: invalid choice: 'bogus'"),
]


@pytest.mark.parametrize(("argv", "message"), BAD_COMMAND_LINES, ids=[" ".join(a) for a, _ in BAD_COMMAND_LINES])
def test_every_bad_command_line_is_one_line_and_exit_2(
    argv: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("meshtop.tui.options.gpus_visible", lambda: 0)
    line = one_line_error([str(tmp_path / "rec") if a == "OUT" else a for a in argv], capsys)
    assert message in line, line
    assert not (tmp_path / "rec").exists()  # nothing was recorded or launched


def damaged_copy_of_the_sample(tmp_path: Path) -> Path:
    from meshtop.recordings.samples import SAMPLE

    copy = tmp_path / "damaged"
    shutil.copytree(SAMPLE, copy)
    step_table = copy / "events" / "step.parquet"
    step_table.write_bytes(step_table.read_bytes()[: step_table.stat().st_size // 2])  # cut in half
    return copy


def test_a_replay_of_a_damaged_recording_plays_what_it_can_and_says_what_it_could_not(tmp_path: Path) -> None:
    from meshtop.recordings.reader import open_recording
    from meshtop.tui.sources import ReplaySource

    source = ReplaySource(open_recording(damaged_copy_of_the_sample(tmp_path)))
    kinds = {rows.kind for rows in source.timeline.kinds}
    assert "step" not in kinds and {"collective", "stage_action", "memory"} <= kinds
    assert len(source.problems) == 1 and source.problems[0].startswith("step.parquet is damaged")


@pytest.mark.parametrize("command", ["replay", "summary", "export"])
def test_a_newer_or_foreign_recording_is_refused_in_one_line(
    command: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from meshtop.tui.cli import main

    newer = tmp_path / "newer"
    newer.mkdir()
    (newer / "manifest.json").write_text(json.dumps({"schema_version": 99}))
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("not a recording")
    extra = ["--format", "csv", "-o", str(tmp_path / "csv")] if command == "export" else []
    assert main([command, str(newer), *extra]) == 2
    assert main([command, str(foreign), *extra]) == 2
    lines = capsys.readouterr().err.splitlines()
    assert lines == [
        f"meshtop: error: {newer} has recording schema version 99; this meshtop reads versions 1, 2, 3",
        f"meshtop: error: {foreign} is not a meshtop recording: no manifest.json",
    ]
