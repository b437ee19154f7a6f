"""The docs as tests: the fenced blocks of README.md and docs/*.md, run as a user would run them, their shown
output checked against what the commands print.

A small runner of our own rather than pytest-examples (Python blocks only, where ours are shell) or cog (it
rewrites the markdown from the code, so the docs change at every run's timing and a wrong figure is
overwritten rather than reported): the blocks keep the text a user reads, and this module says what differs.

The rules a page follows:

- Every fenced block names its language: ``sh`` (commands), ``console`` (a transcript: ``$ COMMAND`` lines, each
  followed by the output it prints) or ``text`` (anything else: a layout, a diagram).
- Every ``sh`` and ``console`` block is run, unless the comment right before it says why it cannot be here:
  ``<!-- illustrative: needs a GPU -->`` (a GPU, a real server, another host, a placeholder path).
- A transcript's shown lines must appear in the output, in order (``...`` marks lines left out); each line's
  words are equal, whitespace aside, and its figures equal as printed, or within the factor that a comment
  before the block states for figures measured on a shared CPU:
  ``<!-- figures within 10x: timings of a shared CPU -->`` (a figure off by one unit of its last printed digit
  matches too, so ``ETA 0.0 s`` matches ``0.1``).

The rewrites, so a block runs here as it would for a user, and small:

- ``meshtop`` is the meshtop this Python imports; ``/tmp/NAME`` and ``runs/NAME`` are ``NAME`` in a fresh
  temporary folder, in the command and in the output shown.
- In an ``sh`` block (never in a transcript, whose output is the point): ``meshtop run ARGS`` is
  ``meshtop record <folder> ARGS`` (``run`` draws the dashboard and needs a terminal; ``record`` runs the
  same plan headless); a training job runs ``--steps 2`` (given or not) and an inference load ``--requests
  8`` (where it gives none).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import os
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent
PAGES = (ROOT / "README.md", *sorted(path for path in (ROOT / "docs").glob("*.md") if path.name != "design.md"))
"""The pages a user copies from (docs/design.md holds the reasoning, and no commands)."""
LANGUAGES = ("sh", "console", "text")
RUN_LANGUAGES = ("sh", "console")
SMALL_STEPS = "2"
SMALL_REQUESTS = "8"

_FENCE = re.compile(r"^```(\S*)\s*$")
_MARKER = re.compile(r"^<!--\s*(illustrative|figures within (\d+)x):\s*(.+?)\s*-->$")
_UNITS = {
    **{unit: ("time", scale) for unit, scale in (("ns", 1e-9), ("µs", 1e-6), ("ms", 1e-3), ("s", 1.0))},
    **{unit: ("bytes", 1000.0**i) for i, unit in enumerate(("B", "kB", "MB", "GB", "TB"))},
    **{unit: ("bytes", 1024.0**i) for i, unit in enumerate(("KiB", "MiB", "GiB", "TiB"), start=1)},
    **{f"{unit}B/s": ("rate", 1000.0**i) for i, unit in enumerate(("", "k", "M", "G", "T"))},
}
"""The units meshtop prints a figure in: its kind, and its size in the kind's base."""
_FIGURE = re.compile(
    r"(?<![\w.])(-?\d[\d,]*(?:\.\d+)?)(?: ?(" + "|".join(sorted(_UNITS, key=len, reverse=True)) + r"))?(?![\w/])"
)
_TEMPORARY = re.compile(r"(?<![\w./-])(?:/tmp/|runs/)(?=[\w.-])")


@dataclasses.dataclass(frozen=True, kw_only=True)
class Block:
    """One fenced block of a page."""

    page: Path
    line: int
    """The line of its opening fence, counted from 1."""
    language: str
    text: str
    illustrative: str | None = None
    """Why it is not run here, from the comment before it; ``None``: it is run."""
    factor: float = 1.0
    """How far a shown figure may be from the printed one (1: equal as printed)."""
    markers: tuple[str, ...] = ()
    """The comments right before it (the checks refuse one they do not know)."""

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def blocks(page: Path) -> Iterator[Block]:
    """Every fenced block of ``page``, with the markers of the comments right before it."""
    lines = page.read_text().splitlines()
    opening: int | None = None
    for number, line in enumerate(lines):
        fence = _FENCE.match(line)
        if fence is None:
            continue
        if opening is None:
            opening, language = number, fence.group(1)
            continue
        markers = tuple(itertools.takewhile(lambda text: text.startswith("<!--"), reversed(lines[:opening])))
        illustrative, factor = None, 1.0
        for marker in markers:
            found = _MARKER.match(marker)
            if found and found.group(1) == "illustrative":
                illustrative = found.group(3)
            elif found:
                factor = float(found.group(2))
        yield Block(
            page=page,
            line=opening + 1,
            language=language,
            text="\n".join(lines[opening + 1 : number]),
            illustrative=illustrative,
            factor=factor,
            markers=markers,
        )
        opening = None


def all_blocks() -> list[Block]:
    return [block for page in PAGES for block in blocks(page)]


def unknown_markers(block: Block) -> list[str]:
    return [marker for marker in block.markers if not _MARKER.match(marker)]


@dataclasses.dataclass(frozen=True, kw_only=True)
class Shown:
    """A transcript's command and the lines shown under it."""

    command: str
    lines: tuple[str, ...]


def transcript(block: Block) -> list[Shown]:
    """A ``console`` block's commands, each with its shown output (a ``\\`` at a line's end continues it)."""
    shown: list[Shown] = []
    for line in block.text.splitlines():
        if line.startswith("$ "):
            shown.append(Shown(command=line[2:], lines=()))
        elif shown and shown[-1].command.endswith("\\") and not shown[-1].lines:
            shown[-1] = Shown(command=shown[-1].command[:-1] + line.strip(), lines=())
        elif shown:
            shown[-1] = dataclasses.replace(shown[-1], lines=(*shown[-1].lines, line))
        else:
            raise ValueError(f"{block.where}: a transcript starts with a $ command")
    return shown


def commands(script: str) -> list[str]:
    """An ``sh`` block's commands, continuation lines joined, comments and blank lines left out."""
    joined = re.sub(r"\\\n\s*", "", script)
    return [
        line
        for line in (re.split(r"\s+#\s", line, maxsplit=1)[0].strip() for line in joined.splitlines())
        if line and not line.startswith("#")
    ]


def missing_programs(command: str) -> list[str]:
    """The programs a command pipes through that this machine lacks (``jq``, say): its block is skipped."""
    programs = (shlex.split(part)[0] for part in command.split("|") if part.strip())
    return [program for program in programs if program != "meshtop" and shutil.which(program) is None]


def in_folder(text: str, folder: Path) -> str:
    """``/tmp/NAME`` and ``runs/NAME`` as ``NAME`` in ``folder``."""
    return _TEMPORARY.sub(f"{folder}/", text)


def small(command: str, folder: Path, number: int) -> str:
    """An ``sh`` block's command as this runner runs it: ``run`` headless, a short job (the module's rules)."""
    command, background, _ = command.partition(" &")  # a node of two on one machine: `meshtop record ... &`
    words = shlex.split(command)
    if words[:2] != ["meshtop", "run"] and words[:2] != ["meshtop", "record"]:
        return command + background
    if words[1] == "run":
        words[1:2] = ["record", str(folder / f"run-{number}")]
    ours, script = (words, []) if "--" not in words else (words[: words.index("--")], words[words.index("--") :])
    if "infer" in ours:
        if "--requests" not in ours:
            ours += ["--requests", SMALL_REQUESTS]
    elif "--steps" in ours:
        ours[ours.index("--steps") + 1] = SMALL_STEPS
    else:
        ours += ["--steps", SMALL_STEPS]
    return shlex.join(ours + script) + background


def shell(script: str, folder: Path, *, timeout_s: float = 300) -> subprocess.CompletedProcess[str]:
    """Run ``script`` with bash from the repository's root (``-e``: the first command that fails ends it, one
    it started in the background too),
        ``meshtop`` on the PATH this Python's, stdout and stderr together as a terminal shows them."""
    bin_folder = folder / ".bin"
    bin_folder.mkdir(exist_ok=True)
    wrapper = bin_folder / "meshtop"
    wrapper.write_text(f'#!/bin/sh\nexec {shlex.quote(sys.executable)} -m meshtop.tui.cli "$@"\n')
    wrapper.chmod(0o755)
    python = bin_folder / "python"
    if not python.exists():
        python.symlink_to(sys.executable)
    environment = {**os.environ, "PATH": f"{bin_folder}{os.pathsep}{os.environ['PATH']}"}
    return subprocess.run(
        ["bash", "-e", "-o", "pipefail", "-c", f"{script}\nfor job in $(jobs -p); do wait $job; done"],
        cwd=ROOT,
        env=environment,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=timeout_s,
    )


def differences(shown: tuple[str, ...], printed: str, *, factor: float = 1.0) -> list[str]:
    """The shown lines that the printed output lacks, in order (empty: every one appears)."""
    lines = printed.splitlines()
    at = 0
    missing: list[str] = []
    for expected in shown:
        if expected.strip() in ("", "..."):
            continue
        found = next((i for i in range(at, len(lines)) if same_line(expected, lines[i], factor=factor)), None)
        if found is None:
            missing.append(expected)
        else:
            at = found + 1
    return missing


def same_line(shown: str, printed: str, *, factor: float = 1.0) -> bool:
    """Equal but for runs of whitespace; with a ``factor`` above 1, the figures within it instead (a figure
    with a unit as a quantity: ``1.8 ms`` is ``1800 µs``; or within one unit of the shown figure's last digit)
    and the words equal."""
    if factor == 1.0:
        return shown.split() == printed.split()
    words, printed_words = _FIGURE.split(shown), _FIGURE.split(printed)
    if len(words) != len(printed_words):
        return False
    texts = zip(words[::3], printed_words[::3], strict=True)
    figures = zip(words[1::3], words[2::3], printed_words[1::3], printed_words[2::3], strict=True)
    return all(a.split() == b.split() for a, b in texts) and all(
        _same_figure(a, unit_a, b, unit_b, factor=factor) for a, unit_a, b, unit_b in figures
    )


def _same_figure(shown: str, unit: str | None, printed: str, printed_unit: str | None, *, factor: float) -> bool:
    """Within ``factor`` (a quantity in its unit's base), or one unit of ``shown``'s last digit in its unit."""
    if (unit is None) != (printed_unit is None) or (unit and _UNITS[unit][0] != _UNITS[printed_unit or ""][0]):
        return False
    scale, printed_scale = (_UNITS[unit][1], _UNITS[printed_unit or ""][1]) if unit else (1.0, 1.0)
    a, b = float(shown.replace(",", "")), float(printed.replace(",", "")) * printed_scale / scale
    if abs(a - b) <= 10.0 ** -len(shown.partition(".")[2]):
        return True
    if a == 0 or b == 0 or math.copysign(1, a) != math.copysign(1, b):
        return False
    return max(abs(a), abs(b)) <= factor * min(abs(a), abs(b))
