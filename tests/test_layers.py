"""The house rules of imports: the layers' direction, meshtop's own import names, and no circles.

The direction of the design: tui -> runner -> recordings -> probes, tui -> recordings. Of the runner, only the
session (which records what it runs), the console (``record``'s output), the sweeps (loops of recordings: the
plans', a server's capacity) and the plan report (the bus factors and FLOPs per token the metrics core defines)
read recordings: the modules a rank imports stay free of pandas and pyarrow.

Every import counts, those inside functions and under ``TYPE_CHECKING`` included: a circle hidden behind a
lazy import is still a circle (two modules that can only be understood together)."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
LAYERS = ("probes", "recordings", "runner", "tui")
MAY_IMPORT = {
    "probes": {"probes"},
    "runner": {"runner", "probes"},
    "recordings": {"recordings", "probes"},
    "tui": {"tui", "recordings", "runner", "probes"},
}
SESSION_MODULES = {
    "runner/session/session.py",
    "runner/session/console.py",
    "runner/planner/sweep.py",
    "runner/planner/capacity.py",
    "runner/planner/report.py",
}
"""The runner's modules that run in meshtop's own process and keep a recording."""
RUN_TYPES = {"meshtop.recordings.manifest", "meshtop.recordings.predictions", "meshtop.recordings.typed_json"}
"""The run's description, the planner's predictions and their JSON, which every runner module may import: the
manifest, the planner, the runner and serving share one set of types (a model's shape, a load, a plan, a
plan's predicted traffic), defined at the lowest layer that records them. Plain dataclasses: they import no
pandas and no pyarrow, so a rank stays free of both."""
UI_LIBRARIES = {"textual", "rich"}


def module_name(path: Path) -> str:
    """``runner/job/launch.py`` -> ``meshtop.runner.job.launch``; a package's ``__init__`` is the package."""
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(("meshtop", *(parts[:-1] if parts[-1] == "__init__" else parts)))


def meshtop_files() -> list[Path]:
    return sorted(path for layer in LAYERS for path in (ROOT / layer).rglob("*.py") if "bootstrap" not in path.parts)


MODULES = {module_name(path): path for path in meshtop_files()}


def imports_of(path: Path) -> Iterator[str]:
    """Every module ``path`` imports, at any depth of its code; ``from a import b`` names ``a.b`` where that
    is a module of meshtop's, else ``a``."""
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            for alias in node.names:
                inner = f"{node.module}.{alias.name}"
                yield inner if inner in MODULES else node.module


def layer_of(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if parts[0] == "meshtop" and len(parts) > 1 else None


@pytest.mark.parametrize("package", LAYERS)
def test_package_imports_only_layers_below_it(package: str) -> None:
    files = sorted((ROOT / package).rglob("*.py"))
    assert files
    for path in files:
        imported = set(imports_of(path))
        shared = RUN_TYPES if package == "runner" else set()
        layers = {layer for module in imported - shared if (layer := layer_of(module)) is not None}
        allowed = MAY_IMPORT[package] | ({"recordings"} if str(path.relative_to(ROOT)) in SESSION_MODULES else set())
        wrong = layers - allowed
        assert not wrong, f"{path.relative_to(ROOT)} imports {sorted(wrong)}"
        if package != "tui":
            tops = {module.split(".")[0] for module in imported}
            assert not tops & UI_LIBRARIES, f"{path.relative_to(ROOT)} imports a UI library"


def test_the_run_types_import_only_the_standard_library_and_each_other() -> None:
    for module in RUN_TYPES:
        imported = {name for name in imports_of(MODULES[module]) if layer_of(name) is not None}
        allowed = RUN_TYPES | {"meshtop.probes.errors", "meshtop.probes.events"}  # the events import no library
        assert imported <= allowed, f"{module} imports {sorted(imported - allowed)}"
        assert not {name.split(".")[0] for name in imports_of(MODULES[module])} & {"pandas", "pyarrow"}


def test_the_layer_rule_sees_a_wrong_import() -> None:
    """The check above reads ``meshtop.``-prefixed names: a probe importing the runner is caught."""
    assert layer_of("meshtop.runner.plan") == "runner" and "runner" not in MAY_IMPORT["probes"]
    assert {layer_of(m) for m in imports_of(ROOT / "runner" / "errors.py")} >= {"probes"}


def test_nothing_imports_meshtop_under_a_generic_top_level_name() -> None:
    """``import runner`` would work from the repository's root and load a second copy of meshtop's modules
    beside ``meshtop.runner``; installed, it would load a user's ``runner.py``."""
    files = [*meshtop_files(), *(ROOT / "tests").rglob("*.py"), *(ROOT / "examples").rglob("*.py")]
    bare = [
        f"{path.relative_to(ROOT)}: {module}"
        for path in files
        for module in imports_of(path)
        if module.split(".")[0] in LAYERS
    ]
    assert bare == []


def import_graph() -> dict[str, set[str]]:
    """meshtop's modules and the meshtop modules each imports (a package's ``__init__`` included)."""
    return {
        name: {module for module in imports_of(path) if module in MODULES} - {name} for name, path in MODULES.items()
    }


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iteratively)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, edges = work[-1]
            for nxt in edges:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph[nxt]))))
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
    return found


def test_circle_finder_finds_a_circle_through_three_modules() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert circles(graph) == [["a", "b", "c"]]
    assert circles({"a": {"b"}, "b": set()}) == []


def test_no_import_circles_lazy_imports_included() -> None:
    assert circles(import_graph()) == []


def folder_of(module: str) -> str:
    """The folder (package) a module sits in; a package's ``__init__`` is its own folder."""
    return module if MODULES[module].name == "__init__.py" else module.rpartition(".")[0]


def folder_graph(layer: str) -> dict[str, set[str]]:
    """The folders of ``layer`` and the other folders of it that each one's modules import."""
    graph: dict[str, set[str]] = {}
    for module, imported in import_graph().items():
        if layer_of(module) != layer:
            continue
        folder = folder_of(module)
        graph.setdefault(folder, set()).update(
            other for name in imported if layer_of(name) == layer and (other := folder_of(name)) != folder
        )
    return graph


def test_circle_finder_sees_two_folders_that_import_each_other() -> None:
    graph = {"meshtop.runner.job": {"meshtop.runner.session"}, "meshtop.runner.session": {"meshtop.runner.job"}}
    assert circles(graph) == [["meshtop.runner.job", "meshtop.runner.session"]]


def test_the_runner_s_folders_form_a_tree() -> None:
    """No folder of the runner imports one that imports it back, through any path: each folder can be read
    knowing only those below it (the session above the job, the load and the nodes; they never import it)."""
    graph = folder_graph("runner")
    assert {"meshtop.runner.job", "meshtop.runner.session"} <= graph.keys()
    assert circles(graph) == []
