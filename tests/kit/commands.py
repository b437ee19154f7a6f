"""meshtop's command line in the tests: its argv under this Python, run to its end, its one-line errors, its
summary as JSON."""

from __future__ import annotations

import contextlib
import io
import json
import os
import queue
import re
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from meshtop.tui.cli import main

CLI_MODULE = "meshtop.tui.cli"
"""The module ``python -m`` runs as meshtop's command line (what the installed ``meshtop`` script calls)."""


def meshtop(*args: str | Path) -> list[str]:
    """The argv of ``meshtop ARGS`` run by this Python."""
    return [sys.executable, "-m", CLI_MODULE, *map(str, args)]


def run_meshtop(
    *args: str | Path,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
    timeout_s: float | None = 300,
    **options: Any,
) -> subprocess.CompletedProcess[str]:
    """Run ``meshtop ARGS`` in a process of its own to its end (``timeout_s``: ``None`` waits as long as it
    takes), its output captured as text; ``env``: variables set over this process's environment for it;
    ``options``: more of :func:`subprocess.run`'s."""
    return subprocess.run(
        meshtop(*args),
        capture_output=True,
        text=True,
        timeout=timeout_s,
        env={**os.environ, **(env or {})},
        cwd=cwd,
        **options,
    )


def summary_json(recording: Path) -> dict[str, Any]:
    """``meshtop summary RECORDING --json`` (run in this process), checked to exit 0, parsed."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main(["summary", str(recording), "--json"])
    assert code == 0, out.getvalue()
    return json.loads(out.getvalue())


def one_line_error(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """Run ``meshtop ARGV``; check it exits 2 with nothing on stdout and one ``meshtop: error:`` line; that line."""
    try:
        code = main(argv)
    except SystemExit as exit_:  # argparse's own errors
        code = exit_.code
    captured = capsys.readouterr()
    assert code == 2
    assert captured.out == ""
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1, captured.err
    assert lines[0].startswith("meshtop: error: "), lines[0]
    return lines[0]


def line_matching(process: subprocess.Popen[str], pattern: str, timeout_s: float = 120) -> re.Match[str]:
    """The first line ``process`` writes that matches ``pattern``; fails the test if it ends first, or writes
    no such line within ``timeout_s``. A thread reads the lines (a read on the pipe cannot be given a
    deadline) and stops at the match; the lines after it are left in the pipe."""
    assert process.stdout is not None
    stdout = process.stdout
    lines: queue.Queue[str] = queue.Queue()

    def read() -> None:
        for line in iter(stdout.readline, ""):
            lines.put(line)
            if re.match(pattern, line):
                return
        lines.put("")

    threading.Thread(target=read, daemon=True).start()
    deadline = time.monotonic() + timeout_s
    seen: list[str] = []
    while (left := deadline - time.monotonic()) > 0:
        try:
            line = lines.get(timeout=left)
        except queue.Empty:
            break
        assert line, "it ended without a line matching " + pattern + ":\n" + "".join(seen[-20:])
        seen.append(line)
        if match := re.match(pattern, line):
            return match
    raise AssertionError(f"no line matching {pattern} within {timeout_s:.0f} s:\n" + "".join(seen[-20:]))
