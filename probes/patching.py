"""Replace attributes for the life of a probe, and put back exactly what was there."""

from __future__ import annotations

from types import ModuleType
from typing import Any

from meshtop.probes.errors import ProbeError

_MISSING = object()


class MissingInternal(ProbeError):
    """A torch internal a probe hooks is not in this torch release: the probe stays off, the job runs."""


def qualified_name(owner: Any) -> str:
    """``module.qualname`` of a module or class, as a user would look it up in torch's source."""
    if isinstance(owner, ModuleType):
        return owner.__name__
    return f"{owner.__module__}.{owner.__qualname__}"


def require(owner: Any, name: str) -> Any:
    """``owner.name``, or :class:`MissingInternal` naming it and the torch release.

    Probes call this for every private torch attribute they patch or use before
    patching anything, so a torch release that renamed one leaves the probe
    uninstalled rather than half-installed.
    """
    try:
        return getattr(owner, name)
    except AttributeError:
        import torch  # only for the message: every owner checked here is torch's

        raise MissingInternal(f"torch {torch.__version__} has no {qualified_name(owner)}.{name}") from None


class Patches:
    """Attribute replacements that :meth:`restore` undoes in reverse order.

    The raw class attribute is saved (``vars(owner)``), not ``getattr``'s
    result: for a pybind11 method ``getattr`` returns the bare function, and
    putting that back would lose the binding of ``self``.
    """

    def __init__(self) -> None:
        self._saved: list[tuple[Any, str, Any]] = []

    def replace(self, owner: Any, name: str, replacement: Any) -> None:
        self._saved.append((owner, name, vars(owner).get(name, _MISSING)))
        setattr(owner, name, replacement)

    def restore(self) -> None:
        for owner, name, original in reversed(self._saved):
            if original is _MISSING:
                delattr(owner, name)
            else:
                setattr(owner, name, original)
        self._saved.clear()
