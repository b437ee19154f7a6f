"""The import direction of the design: tui -> runner -> recordings -> probes, tui -> recordings.

Of the runner, only the session (which records what it runs), the console (``record``'s output), the sweep
(a loop of recordings) and the plan report (the bus factors and FLOPs per token the metrics core defines) read
recordings: the modules a rank imports stay free of pandas and pyarrow."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
MAY_IMPORT = {
    "probes": {"probes"},
    "runner": {"runner", "probes"},
    "recordings": {"recordings", "probes"},
    "tui": {"tui", "recordings", "runner", "probes"},
}
SESSION_MODULES = {
    "runner/job/session.py",
    "runner/job/console.py",
    "runner/planner/sweep.py",
    "runner/planner/report.py",
}
"""The runner's modules that run in meshtop's own process and keep a recording."""
PROJECT = set(MAY_IMPORT)
UI_LIBRARIES = {"textual", "rich"}


def imported_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


@pytest.mark.parametrize("package", sorted(MAY_IMPORT))
def test_package_imports_only_layers_below_it(package: str) -> None:
    files = sorted((ROOT / package).rglob("*.py"))
    assert files
    for path in files:
        imports = imported_modules(path)
        allowed = MAY_IMPORT[package] | ({"recordings"} if str(path.relative_to(ROOT)) in SESSION_MODULES else set())
        wrong = (imports & PROJECT) - allowed
        assert not wrong, f"{path.relative_to(ROOT)} imports {sorted(wrong)}"
        if package != "tui":
            assert not imports & UI_LIBRARIES, f"{path.relative_to(ROOT)} imports a UI library"
