"""The launcher child: torchrun itself, plus a file that says how each rank ended.

``python -m meshtop.runner.job.agent STATUS_JSON torchrun [torchrun arguments...]`` runs
``torch.distributed.run`` with the given arguments (so every torchrun option,
multi-node rendezvous included, works as documented) and writes, however the
job ends, a JSON status: ``completed``, ``failed`` with each failed rank's exit
code, signal and error line, or ``interrupted``. Before the ranks start, it
builds the C++ collective probe where needed (:mod:`meshtop.probes.native`; once per
torch version) and tells them where it is.

``... STATUS_JSON accelerate [accelerate launch arguments...]`` runs ``accelerate launch`` instead, which
prepares the ranks' environment and starts them with torchrun's run, in this process: that run is meshtop's
(:func:`accelerate_launch`), with the same status file.
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import shutil
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

from torch.distributed import run as torchrun
from torch.distributed.elastic.multiprocessing.api import SignalException
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
from torch.distributed.run import run as run_ranks_with_torchrun  # torchrun's, while accelerate's launch gets ours

from meshtop.probes.native import NATIVE_ENV, built, environment_value
from meshtop.recordings.typed_json import dump
from meshtop.runner.job.files import PHASE_NAME, TORCHELASTIC_NAME, LauncherStatus
from meshtop.runner.job.last_words import shortened
from meshtop.runner.results import RankFailure

PARENT_POLL_S = 0.5


NO_ERROR_FILE = "To enable traceback see:"
"""How torchrun's message for a rank that wrote no error file begins (it exited without an uncaught exception
meshtop's or the script's ``@record`` saw): a pointer to torchrun's docs, not an error. Such a rank's error is
read from the end of the launcher log instead (:mod:`meshtop.runner.job.last_words`)."""


def error_line(message: object) -> str | None:
    """The one-line error of a failure message (torchrun gives a dict or a string); ``None`` where the rank
    left none.

    The first line: it names the exception type, while a multi-line message
    (a tensor's repr, a nested traceback) goes on below it.
    """
    if isinstance(message, dict):
        message = message.get("message")
    if not message or str(message).startswith(NO_ERROR_FILE):
        return None
    lines = [line.strip() for line in str(message).splitlines() if line.strip()]
    if not lines:
        return None
    return shortened(lines[0])


def failure_status(error: ChildFailedError) -> LauncherStatus:
    ranks = {
        str(rank): RankFailure(
            exit_code=failure.exitcode,
            signal=failure.signal_name() if failure.exitcode < 0 else None,
            error=error_line(failure.message),
            timestamp=failure.timestamp,
        )
        for rank, failure in error.failures.items()
    }
    return LauncherStatus(status="failed", ranks=ranks)


def stop_when_orphaned() -> None:
    """If meshtop dies without stopping us, stop the job rather than run on unwatched."""
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(PARENT_POLL_S)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, name="meshtop-orphan-watch", daemon=True).start()


def say_phase(status_path: Path, phase: str) -> None:
    """Write what the launcher does now (best effort: the job does not depend on it)."""
    with contextlib.suppress(OSError):
        (status_path.parent / PHASE_NAME).write_text(phase)


def main(argv: list[str]) -> int:
    status_path, launcher, launcher_args = Path(argv[0]), argv[1], argv[2:]
    stop_when_orphaned()
    if launcher == "accelerate":
        return accelerate_launch(launcher_args, status_path)
    if launcher != "torchrun":
        raise SystemExit(f"meshtop launcher: {launcher!r} is neither torchrun nor accelerate")
    return run_torchrun(torchrun.parse_args(launcher_args), status_path)


def run_torchrun(args: Any, status_path: Path) -> int:
    """torchrun's run with its parsed ``args``, its logs in meshtop's session folder unless the user named a
    folder; the exit code."""
    own_log_dir = args.log_dir is None  # a user's --log-dir is theirs to keep
    if own_log_dir:
        args.log_dir = str(status_path.parent / TORCHELASTIC_NAME)
    try:
        return launch(args, status_path)
    finally:
        if own_log_dir:
            shutil.rmtree(args.log_dir, ignore_errors=True)


def accelerate_launch(accelerate_args: list[str], status_path: Path) -> int:
    """``accelerate launch`` with ``accelerate_args``, its torchrun run meshtop's; the exit code.

    accelerate's launch reads its options and config file, prepares the ranks' environment (its
    ``ACCELERATE_*`` variables over this process's, which carry meshtop's bootstrap) and then calls
    ``torch.distributed.run.run`` in this process. That function is swapped for :func:`run_torchrun` while the
    launch runs, so every step of accelerate's stays its own, and the ranks' ending is written as torchrun's is:
    accelerate's own handling would turn a signal into an exit and print a failure, with no status file.
    The command was checked before it came here (:func:`meshtop.runner.script.command.accelerate_launch`).
    """
    from accelerate.commands.launch import launch_command, launch_command_parser

    codes: list[int] = []

    def run_ranks(args: Any) -> None:
        codes.append(run_torchrun(args, status_path))

    args = launch_command_parser().parse_args(accelerate_args)
    accelerate_run = torchrun.run
    torchrun.run = run_ranks
    try:
        launch_command(args)
    finally:
        torchrun.run = accelerate_run
    if not codes:  # it ran the script some other way, which the check before should have refused
        print("meshtop: accelerate launch did not start the ranks with torchrun", file=sys.stderr)
        return 1
    return codes[0]


def launch(args: Any, status_path: Path) -> int:
    """torchrun with ``args``, then the status file; the exit code."""
    if NATIVE_ENV not in os.environ:
        if not built():
            say_phase(status_path, "building the C++ probe (first run only, ~30 s)")
        os.environ[NATIVE_ENV] = environment_value()
    say_phase(status_path, "starting the ranks (rendezvous, import torch)")
    try:
        run_ranks_with_torchrun(args)
        status, code = LauncherStatus(status="completed"), 0
    except ChildFailedError as error:
        status, code = failure_status(error), 1
    except SignalException as error:
        status = LauncherStatus(status="interrupted", signal=error.sigval.name)
        code = 128 + int(error.sigval)
    written = dump(status)
    if status.signal is None:
        del written["signal"]
    tmp = status_path.with_suffix(".tmp")
    try:
        tmp.write_text(json.dumps(written))
        os.replace(tmp, status_path)
    except OSError:  # a full disk: meshtop goes by the exit code; no half-written file is left
        tmp.unlink(missing_ok=True)
    return code


if __name__ == "__main__":
    code = main(sys.argv[1:])
    gc.freeze()  # the interpreter's last full collection, over torch's objects, would delay the job's end ~0.7 s
    sys.exit(code)
