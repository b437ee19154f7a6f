"""meshtop's command line in the tests: its argv under this Python, run to its end, its one-line errors, its
summary as JSON."""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys
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
