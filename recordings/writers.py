"""Who writes a recording, and how far it got: ``writer.json`` and ``progress.json`` beside the manifest.

A recording's manifest says ``running`` from the session's start to its end; a session whose process died
without closing it leaves it saying so forever. A reader (``meshtop ls``, ``meshtop watch``) tells the two
apart by the writer's identity, written when the session claims its folder (:func:`claim_recording`): its pid,
with the process's start time, which tells the writer from a later process given the same pid, and its host,
since a pid means nothing on another machine. The writer also says how far it got (:class:`Progress`), at
most once a second (:class:`ProgressWriter`), so a reader need not fold the events to show it.

Both files are written atomically (a temporary file, then a rename): a reader sees a whole file or the one
before. Both are read as untrusted input: a torn, foreign or hostile file reads as absent, never as an error.
"""

from __future__ import annotations

import json
import os
import shlex
import socket
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TypeVar

from meshtop.recordings.manifest import read_manifest
from meshtop.recordings.typed_json import RecordingError, dump, load

if TYPE_CHECKING:
    from meshtop.recordings.session_fold import SessionFold

WRITER_NAME = "writer.json"
"""The writer's identity, in the recording folder."""
PROGRESS_NAME = "progress.json"
"""The writer's progress, in the recording folder."""
PROGRESS_EVERY_S = 1.0
"""The least time between two writes of :data:`PROGRESS_NAME`: a reader polls about as often, and a write a
batch (many a second on a large job) would cost the fold's thread a file each time for nobody."""
MOST_BYTES = 64 * 1024
"""A file of these two larger than this is not one meshtop wrote (a few hundred bytes): it is not read."""
PID_LIMIT = 1 << 22
"""Linux's highest possible pid (``pid_max`` is at most 2^22): a pid outside 1..this is no process. 0 and
negative pids must never reach ``kill``, which would read them as a process group or every process."""

WriterState = Literal["alive", "gone", "elsewhere"]
T = TypeVar("T")


@dataclass(frozen=True, slots=True, kw_only=True)
class Writer:
    """The process that writes a recording (the session's meshtop; on many nodes, the head's)."""

    pid: int
    host: str
    """``socket.gethostname()`` of the writer's machine: its pid is checked only there."""
    uid: int
    """The user the writer runs as (who may act on the session)."""
    started_unix_s: float
    """When it claimed the recording."""
    process_start: int | None
    """``/proc/<pid>/stat`` field 22 (start time, in clock ticks since boot): a later process given the same
    pid has another (``None`` without ``/proc``: the pid alone is checked)."""
    command: str
    """The writer's command line, shell-quoted."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Progress:
    """How far a session got, as its fold counts it (the console's progress lines and the manifest read the
    same counts)."""

    steps: int | None
    """Job steps completed (inference: rank 0's iterations)."""
    requests: int | None
    """Requests of an inference load answered or failed (``None``: training)."""
    updated_unix_s: float
    """When the writer wrote it: a stale session's last sign of life."""


def process_start(pid: int) -> int | None:
    """``/proc/<pid>/stat``'s field 22 (the start time in clock ticks since boot), ``None`` where there is no
    such file. The fields are read after the last ``)``: the command name before it may hold spaces and
    parentheses."""
    stat = _stat_fields(pid)
    return int(stat[19]) if stat is not None and len(stat) > 19 and stat[19].isdigit() else None


def _stat_fields(pid: int) -> list[str] | None:
    """The fields of ``/proc/<pid>/stat`` from the third on (state, ppid, ...), ``None`` where it is absent."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except (OSError, ValueError):
        return None
    return text[text.rfind(")") + 1 :].split()


def claim_recording(directory: Path) -> Writer:
    """Say in ``directory`` that this process writes the recording: ``writer.json``, written atomically. A
    session claims its folder before it writes its first manifest, so a manifest that says ``running`` beside
    no writer is one from before writers were recorded. A :class:`RecordingError` if it cannot be written."""
    writer = Writer(
        pid=os.getpid(),
        host=socket.gethostname(),
        uid=os.getuid(),
        started_unix_s=time.time(),
        process_start=process_start(os.getpid()),
        command=shlex.join(sys.orig_argv),
    )
    try:
        _write_atomic(directory / WRITER_NAME, dump(writer))
    except OSError as error:
        raise RecordingError(f"cannot write {WRITER_NAME} in {directory}: {error.strerror or error}") from None
    return writer


def read_writer(directory: Path) -> Writer | None:
    """The writer of the recording in ``directory``; ``None`` where ``writer.json`` is absent (a recording from
    before writers were recorded) or is not one meshtop wrote."""
    return _read(directory / WRITER_NAME, Writer)


def writer_state(writer: Writer) -> WriterState:
    """Whether ``writer`` still runs: ``alive``; ``gone`` (no such process, one that has exited and waits to be
    reaped, or another process given its pid: another start time); ``elsewhere`` (it ran on another host,
    whose processes this one cannot see: it may be alive). A process of another user is alive: ``kill``
    answers that it may not signal it, which says it exists."""
    if writer.host != socket.gethostname():
        return "elsewhere"
    if not 0 < writer.pid <= PID_LIMIT:
        return "gone"
    try:
        os.kill(writer.pid, 0)
    except ProcessLookupError:
        return "gone"
    except PermissionError:
        pass
    stat = _stat_fields(writer.pid)
    if stat is None:  # no /proc here (or it ended this instant): kill's answer stands
        return "alive"
    if stat[0] in ("Z", "X"):  # exited (a zombie until its parent reaps it)
        return "gone"
    if writer.process_start is not None and process_start(writer.pid) not in (writer.process_start, None):
        return "gone"
    return "alive"


def write_progress(directory: Path, progress: Progress) -> None:
    """Write ``progress.json`` atomically (an OSError is the caller's)."""
    _write_atomic(directory / PROGRESS_NAME, dump(progress))


def read_progress(directory: Path) -> Progress | None:
    """The last progress the recording's writer wrote; ``None`` where there is none, or not one meshtop wrote."""
    return _read(directory / PROGRESS_NAME, Progress)


def progress_of(session: SessionFold) -> Progress:
    """The progress ``session``'s fold counts now: the steps the manifest is closed with, and the requests the
    console's progress lines count."""
    with session.reading() as fold:
        requests = fold.requests.reported if fold.requests is not None else None
        return Progress(steps=fold.steps_completed, requests=requests, updated_unix_s=time.time())


class ProgressWriter:
    """Writes a live session's progress into its recording, at most once every :data:`PROGRESS_EVERY_S`.

    :meth:`offer` is called with every batch the fold takes; between writes it costs one clock read, so a job
    of many batches a second pays nothing measurable for it. Best effort: a progress that cannot be written
    (a full disk) is skipped, the recording is whole without it."""

    def __init__(
        self,
        directory: Path,
        read: Callable[[], Progress],
        *,
        every_s: float = PROGRESS_EVERY_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.directory = directory
        self.read = read
        """The progress now (read only when it is written)."""
        self.every_s = every_s
        self.clock = clock
        self._due = float("-inf")
        """When the next write may be (the first is at once)."""

    def offer(self) -> bool:
        """Write the progress if the last write is :attr:`every_s` old; whether it was written."""
        now = self.clock()
        if now < self._due:
            return False
        self._due = now + self.every_s
        self.write()
        return True

    def write(self) -> None:
        """Write the progress now (the session's end: its final counts, whenever the last write was)."""
        try:
            write_progress(self.directory, self.read())
        except OSError:
            pass


def session_status(directory: Path) -> str:
    """The status of the session recorded in ``directory``: the manifest's (``completed``, ``failed``,
    ``interrupted``) once it ended; while it says ``running``: ``running`` where its writer is alive (or runs
    on another host, which cannot be asked), ``stale`` where it is gone, or unknown (no ``writer.json``: a
    recording of a meshtop from before writers were recorded, left ``running`` when it was cut short). A
    :class:`RecordingError` (one line) where the manifest cannot be read."""
    status = read_manifest(directory).status
    return status if status != "running" else running_status(read_writer(directory))


def running_status(writer: Writer | None) -> Literal["running", "stale"]:
    """What a manifest that says ``running`` means, given its writer (``None``: none recorded):
    :func:`session_status`'s rule."""
    return "running" if writer is not None and writer_state(writer) != "gone" else "stale"


def _write_atomic(path: Path, data: Any) -> None:
    """``data`` as JSON into ``path``, through a temporary file renamed over it (the OSError is the caller's)."""
    tmp = path.with_name(path.name + ".tmp")
    try:
        tmp.write_text(json.dumps(data) + "\n")
        os.replace(tmp, path)
    except OSError:
        tmp.unlink(missing_ok=True)
        raise


def _read(path: Path, kind: type[T]) -> T | None:
    """The file at ``path`` as ``kind``; ``None`` where it is absent, too large, torn, or not a ``kind``."""
    try:
        with path.open("rb") as file:
            data = file.read(MOST_BYTES + 1)
        if len(data) > MOST_BYTES:
            return None
        return load(kind, json.loads(data))
    except (OSError, ValueError, RecursionError, RecordingError):
        return None
