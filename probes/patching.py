"""Replace attributes for the life of a probe, and put back exactly what was there."""

from __future__ import annotations

from typing import Any

_MISSING = object()


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
