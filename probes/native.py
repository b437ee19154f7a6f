"""Build and load the C++ collective probe (``c10d_kernel.cpp``), the fast path of the collective hooks.

The Python kernel of :mod:`meshtop.probes.collectives` costs the calling
thread tens of microseconds per collective, most of it in running a Python
completion callback on gloo's thread (the GIL hand-over). The C++ kernel does
the same work in about a microsecond, with no Python on either end, and
writes the finished operations as the wire's JSON lines, on the shipper's
thread (docs/benchmarks.md, "Per-op cost of the collective hooks").

It is compiled with ``torch.utils.cpp_extension`` against the installed
torch, once per torch version and source (about 30 s), into
``$MESHTOP_CACHE_DIR`` or ``~/.cache/meshtop``. The launcher builds it
before the ranks start and tells them where it is in ``MESHTOP_NATIVE_PROBE``
(or why there is none: no compiler, a failed build); ``MESHTOP_NATIVE_PROBE=off``
keeps the Python kernel. Without it every hook still works, only dearer.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType

from meshtop.probes.errors import ProbeError

NATIVE_ENV = "MESHTOP_NATIVE_PROBE"
"""For the ranks: the built module's path, ``off``, or ``unavailable: <why>``."""
CACHE_ENV = "MESHTOP_CACHE_DIR"
SOURCE = Path(__file__).with_name("c10d_kernel.cpp")
UNAVAILABLE = "unavailable: "


def module_name() -> str:
    """Named by the source and the torch it is built against, so a change of either builds anew."""
    import torch

    digest = hashlib.sha256(SOURCE.read_bytes() + torch.__version__.encode()).hexdigest()[:16]
    return f"meshtop_c10d_{digest}"


def cache_dir() -> Path:
    if configured := os.environ.get(CACHE_ENV):
        return Path(configured)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "meshtop"


def built() -> bool:
    """Whether the module for this torch is built already (a build takes about 30 s, once per torch)."""
    directory = cache_dir() / "native" / module_name()
    return (directory / f"{module_name()}.so").exists() and not (directory / "lock").exists()


def build() -> Path:
    """The built module's path, compiling it first where needed; :class:`ProbeError` says why it cannot be."""
    name = module_name()
    directory = cache_dir() / "native" / name
    built = directory / f"{name}.so"
    if built.exists() and not (directory / "lock").exists():  # built, and no build under way
        return built
    try:
        directory.mkdir(parents=True, exist_ok=True)
        from torch.utils import cpp_extension

        # A pip-installed ninja lives next to this Python, which may not be on PATH.
        scripts, path = str(Path(sys.executable).parent), os.environ.get("PATH", "")
        if scripts not in path.split(os.pathsep):
            os.environ["PATH"] = os.pathsep.join((scripts, path)) if path else scripts
        cpp_extension.load(
            name=name, sources=[str(SOURCE)], build_directory=str(directory), extra_cflags=["-O2"], verbose=False
        )
    except Exception as error:  # a compiler's many ways to fail all mean "no fast path"
        raise ProbeError(f"cannot build the C++ collective probe: {first_line(error)}") from error
    if not built.exists():
        raise ProbeError(f"the C++ collective probe built, but {built} is missing")
    return built


def first_line(error: BaseException) -> str:
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    return lines[0][:200] if lines else type(error).__name__


def environment_value() -> str:
    """What the launcher puts in :data:`NATIVE_ENV` for its ranks (building the module if needed)."""
    if os.environ.get(NATIVE_ENV) == "off":
        return "off"
    try:
        return str(build())
    except ProbeError as error:
        return UNAVAILABLE + str(error)


def load(path: Path) -> ModuleType:
    """Import a module :func:`build` made (torch must be imported first: the module links against it)."""
    spec = importlib.util.spec_from_file_location(path.stem, path)
    if spec is None or spec.loader is None:
        raise ProbeError(f"cannot load the C++ collective probe from {path}")
    try:
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    except ImportError as error:
        raise ProbeError(f"cannot load the C++ collective probe: {first_line(error)}") from error
    return module


def from_environment() -> tuple[ModuleType | None, str | None]:
    """The module the launcher built for this rank, or ``None`` and why (``None`` too when switched off)."""
    value = os.environ.get(NATIVE_ENV)
    if value == "off":
        return None, None
    if not value:
        return None, "the launcher did not build it"
    if value.startswith(UNAVAILABLE):
        return None, value.removeprefix(UNAVAILABLE)
    try:
        return load(Path(value)), None
    except ProbeError as error:
        return None, str(error)


if __name__ == "__main__":  # python -m meshtop.probes.native: build now (CI does, so no test waits for it)
    print(environment_value())
