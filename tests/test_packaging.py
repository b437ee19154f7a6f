"""The built wheel: one ``meshtop`` import package holding every module of the design card's folders.

The folders map onto ``meshtop.*`` through setuptools' ``package-dir`` and an explicit package list in
pyproject.toml, so a subpackage left out of that list would be missing from a user's install while every
test run from the repository (an editable install) still passed. This test builds the wheel and holds its
file list to the source tree's."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # builds a wheel and runs the CLI from it: about 15 s

ROOT = Path(__file__).resolve().parent.parent
FOLDERS = ("runner", "probes", "recordings", "tui")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Built from a copy of the tree as it is on disk: a build in place would reuse ``build/`` and could ship
    a module deleted since."""
    source = tmp_path_factory.mktemp("source")
    for name in ("pyproject.toml", "README.md", *FOLDERS):
        path = ROOT / name
        if path.is_dir():
            shutil.copytree(path, source / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(path, source / name)
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--wheel-dir", str(out), str(source)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    [built] = out.glob("meshtop-*.whl")
    return built


def source_files() -> set[str]:
    """What the wheel must hold, under ``meshtop/``: every module of the four folders, the C++ probe, the
    ``py.typed`` marks and the shipped sample recordings."""
    shipped = ("*.py", "*.cpp", "py.typed", "samples/*/manifest.json", "samples/*/events/*.parquet")
    return {
        f"meshtop/{path.relative_to(ROOT).as_posix()}"
        for folder in FOLDERS
        for pattern in shipped
        for path in (ROOT / folder).rglob(pattern)
        if "__pycache__" not in path.parts
    }


def test_the_wheel_holds_every_module_under_meshtop_and_nothing_at_the_top(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    packaged = {name for name in names if name.startswith("meshtop/")}
    assert source_files() - packaged == set(), "in the source tree but not in the wheel"
    assert packaged - source_files() == set(), "in the wheel but not tracked in the source tree"
    others = {name.split("/")[0] for name in names} - {"meshtop"}
    assert all(top.endswith(".dist-info") for top in others), others


def test_the_unpacked_wheel_runs_the_cli_from_its_own_files(wheel: Path, tmp_path: Path) -> None:
    """Imported from the wheel's files alone (an editable install's finder comes after them on the path),
    from a folder holding a user's ``runner.py`` and ``tui.py`` that must not be picked up."""
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    user = tmp_path / "user"
    user.mkdir()
    for name in ("runner", "tui", "probes"):
        (user / f"{name}.py").write_text("raise SystemExit('the user module was imported')\n")
    code = (
        "import meshtop.tui.cli, meshtop.runner.rank.worker, meshtop.recordings.metrics.run;"
        "print(meshtop.tui.cli.__file__); print(meshtop.runner.rank.worker.__file__)"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=user,
        env={"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert all(Path(line).is_relative_to(site) for line in done.stdout.split()), done.stdout
