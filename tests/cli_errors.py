"""Running meshtop's command line in the test process and reading its one-line errors."""

from __future__ import annotations

import pytest

from meshtop.tui.cli import main


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
