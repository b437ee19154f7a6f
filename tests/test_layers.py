"""The import direction of the design: tui -> recordings -> probes, tui -> runner -> probes."""

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
        wrong = (imports & PROJECT) - MAY_IMPORT[package]
        assert not wrong, f"{path.relative_to(ROOT)} imports {sorted(wrong)}"
        if package != "tui":
            assert not imports & UI_LIBRARIES, f"{path.relative_to(ROOT)} imports a UI library"
