"""The writer's control socket: how a viewer (``meshtop watch``) acts on a job it does not own.

A session that keeps a recording listens on a Unix socket in it, ``control/socket``. Anyone who can read the
recording can watch the job; only its owner may act on it, and that is checked twice:
- the ``control/`` folder is its owner's alone (mode 0700) and the socket 0600, so another user's viewer
  cannot even connect;
- each connection's peer is read from the kernel (``SO_PEERCRED``) and one of another uid is refused: socket
  permissions alone are no portable guarantee, and a folder's mode can be loosened by hand.

A request is one JSON line, ``{"action": "stop" | "stacks", "ranks": [int, ...] | null}``; the answer one
JSON line, ``{"ok": bool, "message": str}``. ``stop`` stops the job as the dashboard's q stops one with a
fixed number of steps (status interrupted, the writer exits 130); ``stacks`` asks for py-spy dumps of
``ranks`` (every rank where null), with the flight recorder's triage that comes with them. Every request is
kept in the recording, ``control/actions.jsonl``, with who asked: uid, pid and the asking process's
terminal, as the kernel and ``/proc`` tell them (not as the viewer says).
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import struct
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

from meshtop.probes.errors import MeshtopError
from meshtop.runner.job.control import JobControl

CONTROL_DIR = "control"
SOCKET_NAME = "socket"
ACTIONS_NAME = "actions.jsonl"
ACTIONS = ("stop", "stacks")
REQUEST_BYTES = 4096
"""The longest request read; a longer one is refused (a rank list of a thousand ranks fits)."""
ANSWER_S = 5.0
"""How long either side waits for the other's line: a viewer never hangs on a writer that stopped answering."""


class ControlRefused(MeshtopError):
    """A viewer's request that the writer did not take (not its owner, no such writer, a bad request)."""


@dataclass(frozen=True, slots=True)
class Peer:
    """Who asked, as the kernel says (uid, pid) and ``/proc`` (the terminal of its standard input)."""

    uid: int
    pid: int
    tty: str | None


@dataclass(frozen=True, slots=True)
class Action:
    """A request as the recording keeps it."""

    time_unix_s: float
    action: str
    ranks: list[int] | None
    uid: int
    pid: int
    tty: str | None
    done: bool
    answer: str


@contextmanager
def _folder_path(folder: Path) -> Iterator[str]:
    """A short path to ``folder`` (``/proc/self/fd/N``): a socket's path may not exceed 107 bytes, and a
    recording's folder can be deeper than that."""
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        yield f"/proc/self/fd/{fd}"
    finally:
        os.close(fd)


def peer_of(connection: socket.socket) -> Peer:
    """The process at the other end of ``connection``, from the kernel."""
    pid, uid, _ = struct.unpack("3i", connection.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))
    try:
        tty: str | None = os.readlink(f"/proc/{pid}/fd/0")
    except OSError:
        tty = None
    return Peer(uid, pid, tty if tty is not None and tty.startswith("/dev/") else None)


class ControlServer:
    """Listens on a recording's control socket while the session runs, and acts on ``control`` for its owner."""

    def __init__(self, directory: Path, control: JobControl) -> None:
        self.folder = directory / CONTROL_DIR
        self.control = control
        self.owner = os.getuid()
        self._socket: socket.socket | None = None
        self._thread = threading.Thread(target=self._serve, name="meshtop-control", daemon=True)
        self._closed = threading.Event()

    def start(self) -> bool:
        """Make the owner-only folder and listen in it; whether it listens (a file system that takes no sockets,
        say, leaves the job without viewers' actions: it runs all the same)."""
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self.folder.mkdir(mode=0o700, exist_ok=True)
            self.folder.chmod(0o700)  # whatever the umask, or a folder left by an earlier writer
            (self.folder / SOCKET_NAME).unlink(missing_ok=True)
            with _folder_path(self.folder) as short:
                listener.bind(f"{short}/{SOCKET_NAME}")
            (self.folder / SOCKET_NAME).chmod(0o600)
            listener.listen(8)
        except OSError:
            listener.close()
            return False
        listener.settimeout(0.2)
        self._socket = listener
        self._thread.start()
        return True

    def close(self) -> None:
        """Stop listening and remove the socket (the actions asked stay in the recording)."""
        self._closed.set()
        if self._thread.ident is not None:
            self._thread.join(timeout=2 * ANSWER_S)
        if self._socket is not None:
            self._socket.close()
        with contextlib.suppress(OSError):  # a folder turned read-only keeps it: the session says why it broke
            (self.folder / SOCKET_NAME).unlink(missing_ok=True)
        with contextlib.suppress(OSError):  # kept where it holds the actions asked
            self.folder.rmdir()

    def _serve(self) -> None:
        assert self._socket is not None
        while not self._closed.is_set():
            try:
                connection, _ = self._socket.accept()
            except TimeoutError:
                continue
            except OSError:  # closed
                return
            with connection:
                try:
                    self._answer(connection)
                except OSError:  # the viewer went away before its answer: nothing was done for it
                    pass

    def _answer(self, connection: socket.socket) -> None:
        connection.settimeout(ANSWER_S)
        peer = peer_of(connection)
        line = connection.makefile("rb").readline(REQUEST_BYTES + 1)
        action, ranks, problem = _request(line)
        if peer.uid != self.owner:
            problem = f"only uid {self.owner}, who started this job, can act on it (you are uid {peer.uid})"
        answer = self._act(action, ranks) if problem is None else ""

        self._keep(Action(time.time(), action, ranks, peer.uid, peer.pid, peer.tty, problem is None, problem or answer))
        reply = {"ok": problem is None, "message": problem or answer}
        connection.sendall(json.dumps(reply).encode() + b"\n")

    def _act(self, action: str, ranks: list[int] | None) -> str:
        if action == "stop":
            self.control.stop.set()
            return "stopping every rank; the recording is kept"
        self.control.ask_stacks(ranks)
        return f"stack dumps asked of {'every rank' if ranks is None else 'ranks ' + ','.join(map(str, ranks))}"

    def _keep(self, action: Action) -> None:
        try:
            with (self.folder / ACTIONS_NAME).open("a") as file:
                file.write(json.dumps(asdict(action)) + "\n")
        except OSError:  # a full disk: the action is taken all the same, and the session reports the disk
            pass


def _request(line: bytes) -> tuple[str, list[int] | None, str | None]:
    """A request's action and ranks, or why it is not one."""
    if len(line) > REQUEST_BYTES or not line.endswith(b"\n"):
        return "", None, "a request is one JSON line of at most 4096 bytes"
    try:
        request = json.loads(line)
    except ValueError:
        return "", None, "a request is a JSON object"
    if not isinstance(request, dict) or request.get("action") not in ACTIONS:
        return "", None, f"the action must be one of {', '.join(ACTIONS)}"
    ranks = request.get("ranks")
    if ranks is not None and not (
        isinstance(ranks, list) and all(isinstance(r, int) and not isinstance(r, bool) and r >= 0 for r in ranks)
    ):
        return request["action"], None, "ranks must be a list of ranks (integers from 0) or null"
    return request["action"], ranks, None


def ask(directory: Path, action: str, ranks: list[int] | None = None) -> str:
    """Ask the writer of the recording in ``directory`` to act: its answer, or a :class:`ControlRefused` saying in
    one line why nothing was done."""
    path = directory / CONTROL_DIR / SOCKET_NAME
    try:
        with _folder_path(directory / CONTROL_DIR) as short, socket.socket(socket.AF_UNIX) as connection:
            connection.settimeout(ANSWER_S)
            connection.connect(f"{short}/{SOCKET_NAME}")
            connection.sendall(json.dumps({"action": action, "ranks": ranks}).encode() + b"\n")
            line = connection.makefile("rb").readline(REQUEST_BYTES)
    except PermissionError:
        raise ControlRefused(f"only the owner of this job can act on it ({path} is theirs)") from None
    except (FileNotFoundError, ConnectionRefusedError):
        raise ControlRefused("no writer answers for this recording: its job has ended") from None
    except OSError as error:
        raise ControlRefused(f"cannot reach the job's writer at {path}: {error.strerror or error}") from None
    try:
        answer = json.loads(line)
        ok, message = bool(answer["ok"]), str(answer["message"])
    except (ValueError, KeyError, TypeError):
        raise ControlRefused("the job's writer gave no answer") from None
    if not ok:
        raise ControlRefused(message)
    return message
