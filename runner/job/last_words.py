"""Why a launcher or a rank died without saying so: the last meaningful line of the launcher's log.

The launcher (torchrun under :mod:`meshtop.runner.job.agent`) and its ranks write their stdout and stderr
to the session's ``launcher.log``. When the launcher exits before it wrote how the job ended (it failed to
import, its rendezvous broke), or a rank exits with no error torchrun could read (``sys.exit(3)`` after a
message, a crash in C), the end of that log is the only word of why. This reads back a bounded tail of
it and picks the line a person would read first: the last exception with its traceback's last frame, or
the last line the program printed, past torchrun's own log lines and the errors of ranks whose peer went
away (effects of the failure, not its cause).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from meshtop.runner.results import PEER_GONE

TAIL_BYTES = 8192
"""How much of the log's end is read: a traceback of some thirty frames."""
MAX_CHARS = 300
"""The longest line said (as the agent's rank errors)."""
TORCHRUN_LOG = re.compile(r"^[IWEF]\d{4} \d\d:\d\d:\d\d\.\d+ +\d+ \S+:\d+\] ")
"""torchrun's own log lines (glog style: level, date, time, thread, file:line)."""
TEE_PREFIX = re.compile(r"^\[[A-Za-z_]+\d+\]:")
"""What ``torchrun --tee`` (and ``--local-ranks-filter``) puts before each line of a rank's: ``[default0]:``."""
FRAME = re.compile(r'^\s+File "(?P<file>[^"]+)", line (?P<line>\d+)')
CONNECTORS = (
    "Traceback (most recent call last):",
    "During handling of the above exception, another exception occurred:",
    "The above exception was the direct cause of the following exception:",
)
"""A traceback's own lines, which say nothing of the error."""


def read_tail(path: Path, start: int = 0, size: int = TAIL_BYTES) -> str:
    """The last ``size`` bytes of ``path`` from offset ``start`` on (what one launch wrote to a log it shares
    with earlier ones), from its first whole line; ``""`` where the file is missing or holds nothing new."""
    try:
        with path.open("rb") as log:
            end = log.seek(0, os.SEEK_END)
            begin = max(start, end - size)
            log.seek(begin)
            data = log.read(end - begin)
    except OSError:
        return ""
    if begin > start and b"\n" in data:  # cut inside a line: drop its end
        data = data.split(b"\n", 1)[1]
    return data.decode("utf-8", errors="replace")


def last_words(text: str) -> str | None:
    """The last meaningful line of ``text``: an exception line followed by where it was raised
    (``ImportError: ... (at /path/mod.py:3)``), or the last line printed; ``None`` for a log that holds
    only blank lines."""
    lines = [TEE_PREFIX.sub("", line).rstrip() for line in text.splitlines()]
    lines = [line for line in lines if line.strip()]
    said = [line for line in lines if not TORCHRUN_LOG.match(line) and line.strip("*-= ")]
    for index in range(len(said) - 1, -1, -1):
        line = said[index]
        if line[0].isspace() or line in CONNECTORS or PEER_GONE.search(line):
            continue
        return shortened(line, _raised_at(said, index))
    return shortened(lines[-1].strip(), "") if lines else None


def _raised_at(lines: list[str], index: int) -> str:
    """`` (at FILE:LINE)`` of the traceback frame right above an exception line, ``""`` where none is."""
    for above in range(index - 1, -1, -1):
        if not lines[above][0].isspace():
            return ""
        if (frame := FRAME.match(lines[above])) is not None:
            return f" (at {frame['file']}:{frame['line']})"
    return ""


def shortened(line: str, where: str = "") -> str:
    """``line`` and ``where`` (a frame) in at most :data:`MAX_CHARS`, ``line`` cut with "..." if need be."""
    room = MAX_CHARS - len(where)
    return (line if len(line) <= room else line[: max(0, room - 3)] + "...") + where
