"""A soak of random faults: many in a row, on real jobs, each followed by the checks every fault must pass.

``python -m tests.soak [--seed N] [--faults 50] [--time-limit S]`` runs meshtop again and again, each time
with one fault of :data:`FAULTS` drawn by the seed: on the built-in runner, on an unmodified torchrun script
(``examples/ddp.py``), on two loopback nodes, under a terminal (a pty) that goes away. Every kind comes once
in a shuffled order, then again, so 50 faults cover each kind three times or more; the same seed draws the
same faults in the same order, with the same victims. After each, whatever the fault:

- meshtop ended within :data:`RUN_S` with the exit code the fault calls for;
- ``meshtop summary --json`` reads the recording, and its status is the fault's;
- one line of meshtop's output names the fault (a SIGKILLed meshtop cannot: there, the recording's status);
- no process of the job is left (the processes seen when the fault struck, and any naming the run's folder),
  nothing new in ``/dev/shm``, no half-written file in the recording, and nothing in the run's temporary
  folder that meshtop did not name (a SIGKILLed meshtop cannot clean up after itself: there, its own
  temporary folder is allowed);
- and the next run starts cleanly: each fault's run is the next run of the previous one, and one plain run
  ends the soak.

It prints a line per fault (with the seconds from the start to the fault, to meshtop's end, to the end of the
checks) and a table (fault, runs, passed), and exits 1 if any run failed a check, 2 if the
time limit left faults undrawn. Reproduce a failure with its seed (and ``--faults`` up to it).
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import io
import json
import os
import pty
import random
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import termios
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from meshtop.probes.wire import HEADER, pack
from meshtop.tui.cli import main as meshtop_main
from tests.kit.commands import meshtop
from tests.kit.ports import free_port
from tests.kit.recordings import recorded_so_far

ROOT = Path(__file__).resolve().parents[1]
RUN_S = 150.0
"""The longest one faulted run may take, start to end."""
LINGER_S = 20.0
"""How long the job's processes may take to go once meshtop ended (a SIGKILLed meshtop's launcher notices its
orphaning within a second; torchrun then stops its ranks)."""
STEPS_S = 120.0
"""The longest a run may take to its first steps (four ranks of two nodes starting on two cores)."""
DISK = "512k"
"""The small filesystem (a tmpfs) the full-disk fault records into; 256 KiB of it is kept for the manifest, so
the events fill the rest in some 120 steps."""
CACHES = ("torchinductor_",)
"""Folders torch keeps in the temporary folder on purpose, shared by every run (its compile cache)."""
HALF_WRITTEN = (".tmp", ".partial")


@dataclass
class Run:
    """One faulted run: its folder, its meshtop processes (the head's first), their output files."""

    folder: Path
    processes: list[subprocess.Popen[bytes]]
    logs: list[Path]
    out: Path
    """The recording (a terminal run's session, once it exists)."""
    seen: set[int] = field(default_factory=set)
    """Every process of the job seen so far."""
    terminal: int | None = None
    """A terminal run's pty (its controlling side), until the fault closes it."""

    def output(self, node: int = 0) -> str:
        return self.logs[node].read_text(errors="replace")

    def look(self) -> None:
        """Note the job's processes now (a process that is gone later must still be found gone)."""
        for process in self.processes:
            with contextlib.suppress(psutil.NoSuchProcess):
                self.seen.update([process.pid, *(c.pid for c in psutil.Process(process.pid).children(recursive=True))])

    def wait_for_steps(self, count: int = 2) -> None:
        """Until rank 0 has ``count`` steps on disk; every rank's process noted."""
        deadline = time.monotonic() + STEPS_S
        while time.monotonic() < deadline:
            if self.terminal is not None and not (self.out / "events").is_dir():
                sessions = sorted(self.out.glob("*/events"))
                if sessions:
                    self.out = sessions[0].parent
            if [row["rank"] for row in recorded_so_far(self.out, "step")].count(0) >= count:
                self.look()
                self.seen.update(rank["pid"] for rank in self.ranks().values())
                return
            if any(process.poll() is not None for process in self.processes):
                raise AssertionError(f"meshtop ended before {count} steps: {self.output()[-400:]!r}")
            time.sleep(0.1)
        raise AssertionError(f"no {count} steps within {STEPS_S:.0f} s")

    def ranks(self) -> dict[int, dict[str, int]]:
        """The job's ranks as they reported their start: rank -> its pid and node."""
        return {row["rank"]: row for row in recorded_so_far(self.out, "rank_started")}

    def launcher(self, node: int = 0) -> psutil.Process:
        """The launcher (meshtop's agent or torchrun) of node ``node``."""
        for child in psutil.Process(self.processes[node].pid).children(recursive=True):
            line = " ".join(child.cmdline())
            if "meshtop.runner.job.agent" in line or "torch.distributed.run" in line or "torchrun" in line:
                return child
        raise AssertionError(f"no launcher under node {node}'s meshtop")

    def finish(self) -> list[int]:
        """Every meshtop's exit code (a signal's as its negative), once all ended."""
        deadline = time.monotonic() + RUN_S
        codes = []
        for process in self.processes:
            try:
                codes.append(process.wait(timeout=max(1.0, deadline - time.monotonic())))
            except subprocess.TimeoutExpired:
                self.kill()
                raise AssertionError(f"meshtop did not end within {RUN_S:.0f} s") from None
        return codes

    def kill(self) -> None:
        self.look()
        for pid in self.seen:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        for process in self.processes:
            process.wait()


@dataclass(frozen=True)
class Fault:
    name: str
    what: str
    kind: str
    """builtin, script, nodes, terminal or disk: how the run is started (:func:`start`)."""
    statuses: frozenset[str]
    """The recording's status after it (``summary --json``'s ``run.status``)."""
    codes: frozenset[int]
    """meshtop's exit codes it may end with (the head's, on two nodes)."""
    apply: Callable[[Run, random.Random], str | None]
    """Strikes; returns the regular expression one line of meshtop's output must match (``None``: nothing to say,
    as for a SIGKILLed meshtop)."""
    options: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()


def kill_rank(signum: int, named: str) -> Callable[[Run, random.Random], str | None]:
    def apply(run: Run, chooser: random.Random) -> str | None:
        run.wait_for_steps()
        victim = chooser.choice(sorted(run.ranks()))
        os.kill(run.ranks()[victim]["pid"], signum)
        return named.format(rank=victim)

    return apply


def signal_meshtop(signum: int, named: str | None) -> Callable[[Run, random.Random], str | None]:
    def apply(run: Run, chooser: random.Random) -> str | None:
        run.wait_for_steps()
        run.processes[0].send_signal(signum)
        return named

    return apply


def kill_launcher(run: Run, chooser: random.Random) -> str | None:
    run.wait_for_steps()
    run.launcher().kill()
    return r"launcher killed by SIGKILL before reporting"


def rank_fails(run: Run, chooser: random.Random) -> str | None:
    """The fault is the run's environment (``MESHTOP_FAULT``): wait for it."""
    return r"rank \d failed first: .*out of memory"


def disk_fills(run: Run, chooser: random.Random) -> str | None:
    return r"cannot write the recording in .*; the job was stopped, the events written so far are kept"


def bad_frames(run: Run, chooser: random.Random) -> str | None:
    """A flood of garbage, a frame with a wrong token and a torn frame on the collector's port (from a rank's
    environment), while the job runs."""
    run.wait_for_steps(1)
    rank = psutil.Process(run.ranks()[0]["pid"])
    host, port = rank.environ()["MESHTOP_COLLECTOR"].rsplit(":", 1)
    for count in range(chooser.randrange(5, 30)):
        with contextlib.suppress(OSError), socket.create_connection((host, int(port)), timeout=5) as connection:
            if count % 3 == 0:
                connection.sendall(bytes(chooser.getrandbits(8) for _ in range(chooser.randrange(1, 4096))))
            elif count % 3 == 1:  # a well-formed frame with a token that is not the session's
                connection.sendall(pack({"token": "not-the-session's", "rank": 0}))
            else:  # torn: a length that promises more than ever comes
                connection.sendall(HEADER.pack(64) + b'{"token": ')
    return r"the collector refused \d+ messages? \(.*\): not from this job's ranks"


def two_at_once(run: Run, chooser: random.Random) -> str | None:
    """A rank killed and meshtop interrupted in the same instant."""
    run.wait_for_steps()
    os.kill(run.ranks()[chooser.choice(sorted(run.ranks()))]["pid"], signal.SIGKILL)
    run.processes[0].send_signal(signal.SIGINT)
    return r"failed first: signal SIGKILL|interrupted after"


def lose_terminal(run: Run, chooser: random.Random) -> str | None:
    """Close the terminal as a dropped SSH connection does; the job must go on headless, then SIGTERM ends it."""
    run.wait_for_steps()
    assert run.terminal is not None
    os.close(run.terminal)
    run.terminal = None
    before = len(recorded_so_far(run.out, "step"))
    deadline = time.monotonic() + 30
    while len(recorded_so_far(run.out, "step")) <= before + 2:
        if time.monotonic() > deadline or run.processes[0].poll() is not None:
            raise AssertionError("the job stopped with its terminal (no steps recorded after it went)")
        time.sleep(0.2)
    run.processes[0].send_signal(signal.SIGTERM)
    return None  # the terminal is gone: the manifest says it (checked in one())


def kill_node(what: str) -> Callable[[Run, random.Random], str | None]:
    def apply(run: Run, chooser: random.Random) -> str | None:
        run.wait_for_steps()
        if what == "meshtop":
            run.processes[1].kill()
            return r"node 1 \(host .*\) lost"
        run.launcher(node=1).kill()
        return r"node 1 \(host .*\) failed: launcher killed by SIGKILL before reporting"

    return apply


FAILED, INTERRUPTED, COMPLETED = frozenset({"failed"}), frozenset({"interrupted"}), frozenset({"completed"})
FAULTS = [
    Fault("rank SIGKILL", "kill a rank", "builtin", FAILED, frozenset({1}), kill_rank(9, r"rank {rank} failed first")),
    Fault(
        "rank SIGSTOP",
        "stop a rank: a hang",
        "builtin",
        FAILED,
        frozenset({1}),
        kill_rank(19, r"no rank made progress"),
        options=("--hang-timeout", "3"),
    ),
    Fault("rank OOM", "a rank's allocator fails", "builtin", FAILED, frozenset({1}), rank_fails),
    Fault("launcher SIGKILL", "kill the launcher", "builtin", FAILED, frozenset({1}), kill_launcher),
    Fault(
        "meshtop SIGINT", "Ctrl-C", "builtin", INTERRUPTED, frozenset({130}), signal_meshtop(2, r"interrupted after")
    ),
    Fault(
        "meshtop SIGTERM", "SIGTERM", "builtin", INTERRUPTED, frozenset({130}), signal_meshtop(15, r"interrupted after")
    ),
    Fault("meshtop SIGKILL", "kill meshtop", "builtin", INTERRUPTED, frozenset({-9}), signal_meshtop(9, None)),
    Fault("full disk", "the disk fills (a 512 KiB tmpfs)", "disk", FAILED, frozenset({2}), disk_fills),
    Fault("bad frames", "garbage on the collector's port", "builtin", COMPLETED, frozenset({0}), bad_frames),
    Fault(
        "two at once",
        "a rank killed as meshtop is interrupted",
        "builtin",
        FAILED | INTERRUPTED,
        frozenset({1, 130}),
        two_at_once,
    ),
    Fault("lost terminal", "the terminal closes mid-run", "terminal", INTERRUPTED, frozenset({130}), lose_terminal),
    Fault(
        "script rank SIGKILL",
        "kill a rank of a torchrun script",
        "script",
        FAILED,
        frozenset({1}),
        kill_rank(9, r"rank {rank} failed first"),
    ),
    Fault(
        "script SIGINT",
        "Ctrl-C on a torchrun script",
        "script",
        INTERRUPTED,
        frozenset({130}),
        signal_meshtop(2, r"interrupted after"),
    ),
    Fault("node meshtop SIGKILL", "kill node 1's meshtop", "nodes", FAILED, frozenset({1}), kill_node("meshtop")),
    Fault("node launcher SIGKILL", "kill node 1's launcher", "nodes", FAILED, frozenset({1}), kill_node("launcher")),
]
"""Each kind of fault."""


def can_mount_a_tmpfs() -> bool:
    """Whether a tmpfs can be mounted in a user and mount namespace of our own (no root needed where allowed)."""
    if shutil.which("unshare") is None:
        return False
    done = subprocess.run(
        ["unshare", "--user", "--map-root-user", "--mount", "sh", "-c", "mount -t tmpfs -o size=64k tmpfs /mnt"],
        capture_output=True,
        timeout=60,
    )
    return done.returncode == 0


def default_signals() -> None:
    """In the child: SIGINT as a terminal's Ctrl-C finds it (a shell without job control starts its background
    commands with SIGINT ignored, and the soak may be one of them)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def full_disk_limit() -> None:
    """Where no tmpfs can be mounted: a file-size limit, whose writes fail with EFBIG as a full disk's do."""
    import resource

    default_signals()
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (400_000, 400_000))


def controlling_terminal() -> None:
    """In the child, a session leader: the pty on its standard input becomes its controlling terminal."""
    default_signals()
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)


def start(fault: Fault, folder: Path, tmpfs: bool) -> Run:
    """Start the run ``fault`` strikes, in ``folder``."""
    out = folder / "rec"
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "TMPDIR": str(folder / "tmp"), **dict(fault.env)}
    (folder / "tmp").mkdir()
    builtin = ("--device", "cpu", "--model", "tiny", *fault.options)
    long = ("--steps", "100000")
    if fault.name == "rank OOM":
        env["MESHTOP_FAULT"] = f"oom:{random.Random(str(folder)).randrange(2)}:3"
    commands: list[list[str]]
    if fault.kind == "script":
        script = ("torchrun", "--standalone", "--nproc-per-node=2", str(ROOT / "examples" / "ddp.py"), *long)
        commands = [meshtop("record", str(out), "--device", "cpu", "--", *script)]
    elif fault.kind == "nodes":
        port = free_port()
        rendezvous = ("--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", f"soak{port}")
        commands = [
            meshtop(
                "record", str(out), *builtin, *long, "--dp", "4", "--nnodes", "2", "--node-rank", str(n), *rendezvous
            )
            for n in (0, 1)
        ]
    elif fault.kind == "terminal":
        out = folder / "runs"
        commands = [meshtop("run", *builtin, *long, "--runs-dir", str(out))]
    elif fault.kind == "disk" and tmpfs:
        disk = folder / "disk"
        disk.mkdir()
        inner = shlex.join(meshtop("record", str(disk / "rec"), *builtin, *long))
        script = (
            f"mount -t tmpfs -o size={DISK} tmpfs {disk} || exit 99; {inner}; code=$?; "
            f"cp -a {disk}/rec {out}; exit $code"
        )
        commands = [["unshare", "--user", "--map-root-user", "--mount", "sh", "-c", script]]
    else:
        steps = ("--steps", "40") if fault.apply is bad_frames else long
        commands = [meshtop("record", str(out), *builtin, *steps)]
    logs = [folder / f"node{n}.log" for n in range(len(commands))]
    terminal = None
    processes = []
    for command, log in zip(commands, logs, strict=True):
        if fault.kind == "terminal":
            terminal, process = start_in_a_terminal(command, env, folder, log)
        else:
            with log.open("wb") as sink:
                process = subprocess.Popen(
                    command,
                    cwd=folder,
                    env=env,
                    stdout=sink,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                    preexec_fn=full_disk_limit if fault.kind == "disk" and not tmpfs else default_signals,
                )
        processes.append(process)
    return Run(folder, processes, logs, out, terminal=terminal)


def start_in_a_terminal(
    command: list[str], env: dict[str, str], folder: Path, log: Path
) -> tuple[int, subprocess.Popen[bytes]]:
    """``command`` with a new pty as its controlling terminal (100x30); its output copied to ``log`` until the
    pty closes. Returns the pty's controlling side, whose close is the lost terminal."""
    controller, terminal = pty.openpty()
    termios.tcsetwinsize(terminal, (30, 100))
    process = subprocess.Popen(
        command,
        cwd=folder,
        env={**env, "TERM": "xterm-256color"},
        stdin=terminal,
        stdout=terminal,
        stderr=terminal,
        start_new_session=True,  # a session of its own, whose controlling terminal the pty becomes:
        preexec_fn=controlling_terminal,
    )
    os.close(terminal)

    def copy() -> None:
        with log.open("wb") as sink, contextlib.suppress(OSError):
            while chunk := os.read(controller, 65536):
                sink.write(chunk)

    threading.Thread(target=copy, daemon=True).start()
    return controller, process


def summary_status(recording: Path) -> tuple[str | None, str]:
    """``meshtop summary RECORDING --json``'s run status, or ``None`` and why it could not read it."""
    printed, errors = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(printed), contextlib.redirect_stderr(errors):
        code = meshtop_main(["summary", str(recording), "--json"])
    if code != 0:
        return None, f"summary: exit {code}: {errors.getvalue().strip()[-300:]}"
    return json.loads(printed.getvalue())["run"]["status"], ""


def leftovers(run: Run, shm_before: set[str], *, own_temp_allowed: bool) -> list[str]:
    """What the run left behind: live processes, new files in /dev/shm, half-written files, temporary files."""
    deadline = time.monotonic() + LINGER_S
    while True:
        left = []
        for pid in sorted(run.seen):
            with contextlib.suppress(psutil.NoSuchProcess):
                process = psutil.Process(pid)
                if process.status() != psutil.STATUS_ZOMBIE:
                    left.append(f"process {pid}: {' '.join(process.cmdline())[:100]}")
        for process in psutil.process_iter(["pid", "cmdline"]):
            line = " ".join(process.info["cmdline"] or [])
            if str(run.folder) in line and process.pid not in run.seen and process.pid != os.getpid():
                left.append(f"process {process.pid}: {line[:100]}")
        if not left or time.monotonic() > deadline:
            break
        time.sleep(0.25)
    shm = set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()
    left += [f"/dev/shm/{name}" for name in sorted(shm - shm_before)]
    if run.out.is_dir():
        left += [f"half-written: {p}" for p in run.out.rglob("*") if p.name.endswith(HALF_WRITTEN)]
    said = "".join(run.output(node) for node in range(len(run.logs)))
    for entry in sorted((run.folder / "tmp").iterdir()):
        if str(entry) not in said and not own_temp_allowed and not entry.name.startswith(CACHES):
            left += [f"temporary: {entry}"]
    return left


def one(fault: Fault, base: Path, index: int, chooser: random.Random, tmpfs: bool, times: list[float]) -> list[str]:
    """Run ``fault`` once; the checks it failed (none: passed). ``times`` gets the seconds to the fault, to
    meshtop's end and to the end of the checks."""
    folder = base / f"{index:03d}"
    folder.mkdir()
    shm_before = set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()
    began = time.monotonic()
    run = start(fault, folder, tmpfs)
    try:
        named = fault.apply(run, chooser)
        times.append(time.monotonic() - began)
        run.look()
        codes = run.finish()
        times.append(time.monotonic() - began)
    except (AssertionError, psutil.Error, OSError) as error:
        run.kill()
        return [f"{type(error).__name__}: {error}"]
    finally:
        if run.terminal is not None:
            os.close(run.terminal)
    problems = []
    if codes[0] not in fault.codes:
        problems.append(f"exit code {codes[0]}, not {'/'.join(map(str, sorted(fault.codes)))}: {run.output()[-300:]!r}")
    status, why = summary_status(run.out)
    if status is None:
        problems.append(why)
    elif status not in fault.statuses:
        problems.append(f"status {status}, not {'/'.join(sorted(fault.statuses))}")
    output = run.output()
    if named is not None and not re.search(named, output, re.MULTILINE):
        problems.append(f"no line matches {named!r}: {output.strip().splitlines()[-3:]}")
    if fault.kind == "terminal":
        manifest = json.loads((run.out / "manifest.json").read_text())
        if not manifest.get("terminal_lost"):
            problems.append("the manifest does not say the terminal was lost")
    killed = fault.name in ("meshtop SIGKILL", "node meshtop SIGKILL")
    problems += [f"left: {item}" for item in leftovers(run, shm_before, own_temp_allowed=killed)]
    if not problems:
        shutil.rmtree(folder, ignore_errors=True)  # a failed run's folder is kept for its logs
    times.append(time.monotonic() - began)
    return problems


def draws(seed: int, count: int, kinds: list[Fault]) -> list[Fault]:
    """``count`` faults: every kind once in a shuffled order, again and again, by ``seed``."""
    chooser = random.Random(seed)
    chosen: list[Fault] = []
    while len(chosen) < count:
        order = list(kinds)
        chooser.shuffle(order)
        chosen += order
    return chosen[:count]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--seed", type=int, default=int(time.time()) % 100_000)
    parser.add_argument("--faults", type=int, default=50)
    parser.add_argument("--time-limit", type=float, default=3600.0, help="start no fault after this many seconds")
    parser.add_argument("--keep", type=Path, default=None, help="run in this folder, and keep failed runs there")
    parser.add_argument("--only", default=None, help="draw only these faults (names, comma-separated)")
    args = parser.parse_args(argv)
    kinds = [fault for fault in FAULTS if args.only is None or fault.name in args.only.split(",")]
    tmpfs = can_mount_a_tmpfs()
    disk = "a 512 KiB tmpfs" if tmpfs else "a file-size limit (EFBIG; no tmpfs can be mounted here)"
    print(f"soak: seed {args.seed}, {args.faults} faults, {args.time_limit:.0f} s at most; full disk: {disk}")
    runs: Counter[str] = Counter()
    passed: Counter[str] = Counter()
    failures = 0
    started = time.monotonic()
    base = Path(tempfile.mkdtemp(prefix="meshtop-soak-", dir=args.keep))
    chooser = random.Random(args.seed)
    for index, fault in enumerate(draws(args.seed, args.faults, kinds), 1):
        if time.monotonic() - started > args.time_limit:
            print(f"soak: time limit reached after {index - 1} faults", flush=True)
            break
        times: list[float] = []
        problems = one(fault, base, index, chooser, tmpfs, times)
        runs[fault.name] += 1
        passed[fault.name] += not problems
        failures += bool(problems)
        verdict = "ok" if not problems else "FAILED: " + "; ".join(problems)
        phases = " / ".join(f"{t:5.1f}" for t in times)
        print(f"{index:3d} {fault.name:<22} {phases} s  {verdict}", flush=True)
    clean = subprocess.run(
        meshtop("record", str(base / "clean"), "--device", "cpu", "--model", "tiny", "--steps", "3"),
        capture_output=True,
        text=True,
        timeout=RUN_S,
    )
    if clean.returncode != 0:
        failures += 1
        print(f"a plain run after the soak: exit {clean.returncode}: {clean.stderr[-300:]}")
    print("\n| fault | what | runs | passed |\n| --- | --- | --- | --- |")
    for fault in FAULTS:
        print(f"| {fault.name} | {fault.what} | {runs[fault.name]} | {passed[fault.name]} |")
    took = time.monotonic() - started
    print(f"\nsoak: seed {args.seed}: {sum(passed.values())} of {sum(runs.values())} faults passed in {took:.0f} s")
    if not failures:
        shutil.rmtree(base, ignore_errors=True)
    else:
        print(f"soak: the failed runs' folders are kept in {base}")
    if failures:
        return 1
    return 0 if sum(runs.values()) == args.faults else 2


if __name__ == "__main__":
    sys.exit(main())
