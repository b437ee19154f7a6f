"""JSON files read into typed dataclasses, and written from them: what the manifest and the sweep file share.

:func:`load` turns parsed JSON into a dataclass by its type hints and refuses,
in one line (a :class:`RecordingError` naming the field by its dotted path), a
field it does not know, a field of the wrong type or a required field missing:
no reader guesses with ``.get(...) or 1``. Types understood: the dataclasses,
``int``, ``float`` (an integer is taken), ``str``, ``bool``, ``X | None``,
``tuple[X, ...]`` and fixed tuples (JSON lists), ``dict[str, X]``.
"""

from __future__ import annotations

import json
import types
import typing
from collections.abc import Collection
from dataclasses import MISSING, fields, is_dataclass
from pathlib import Path
from typing import Any, TypeVar

from meshtop.probes.errors import MeshtopError


class RecordingError(MeshtopError):
    """A recording (or a sweep of them) cannot be written or read as asked."""


T = TypeVar("T")


def read_versioned(path: Path, cls: type[T], *, version: int, what: str, missing: str) -> T:
    """The JSON file ``path`` as ``cls``: a :class:`RecordingError` (one line) where it is missing (``missing``
    says what that means), unreadable, of a version other than ``version``, or not of ``cls``'s shape (a field
    unknown, of the wrong type or missing); ``what`` names the file (``sweep``: "the sweep file")."""
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise RecordingError(missing) from None
    except (OSError, ValueError) as error:
        raise RecordingError(f"{path} cannot be read: {error}") from None
    found = data.get("version") if isinstance(data, dict) else None
    if found != version:
        raise RecordingError(f"{path} has {what} version {found!r}; this meshtop reads version {version}")
    try:
        typed: T = load(cls, data, whole=f"the {what} file")
    except RecordingError as error:
        raise RecordingError(f"{path} is not a {what} file this meshtop reads: {error}") from None
    return typed


def dump(value: Any) -> Any:
    """``value`` as plain JSON data: dataclasses as objects, tuples as lists."""
    if is_dataclass(value) and not isinstance(value, type):
        return {f.name: dump(getattr(value, f.name)) for f in fields(value)}
    if isinstance(value, tuple):
        return [dump(item) for item in value]
    if isinstance(value, dict):
        return {key: dump(item) for key, item in value.items()}
    return value


def load(hint: Any, value: Any, where: str = "", *, flat: Collection[str] = (), whole: str = "the file") -> Any:
    """``value`` (parsed JSON) as ``hint``; a :class:`RecordingError` naming the field ``where`` (a dotted path,
    empty at the top) if it is not one. Fields named in ``flat`` hold a dataclass whose fields sit at the top
    level on disk (their paths are not prefixed); ``whole`` names the top-level object in a message."""
    origin = typing.get_origin(hint)
    if isinstance(hint, types.UnionType) or origin is typing.Union:
        members = typing.get_args(hint)
        if value is None and type(None) in members:
            return None
        (inner,) = [m for m in members if m is not type(None)]
        return load(inner, value, where, flat=flat, whole=whole)
    if is_dataclass(hint):
        return _load_dataclass(hint, value, where, flat=flat, whole=whole)  # type: ignore[arg-type]
    if origin is tuple:
        args = typing.get_args(hint)
        if not isinstance(value, list) or (args[-1] is not Ellipsis and len(value) != len(args)):
            raise RecordingError(
                f"{where} must be a list of {len(args)}" if args[-1] is not Ellipsis else f"{where} must be a list"
            )
        items = args[:1] * len(value) if args[-1] is Ellipsis else args
        return tuple(
            load(item, v, f"{where}[{i}]", flat=flat, whole=whole)
            for i, (item, v) in enumerate(zip(items, value, strict=True))
        )
    if origin is dict:
        _, item = typing.get_args(hint)
        if not isinstance(value, dict):
            raise RecordingError(f"{where} must be an object")
        return {str(k): load(item, v, f"{where}.{k}", flat=flat, whole=whole) for k, v in value.items()}
    if hint is float and isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if hint in (int, str, bool) and type(value) is hint:
        return value
    expected = {int: "an integer", float: "a number", str: "a string", bool: "true or false"}.get(hint, str(hint))
    raise RecordingError(f"{where} must be {expected}, not {value!r}"[:200])


def _load_dataclass(cls: type, value: Any, where: str, *, flat: Collection[str], whole: str) -> Any:
    if not isinstance(value, dict):
        raise RecordingError(f"{where or whole} must be an object")
    hints = typing.get_type_hints(cls)
    known = {f.name: f for f in fields(cls)}
    prefix = f"{where}." if where and where not in flat else ""
    unknown = sorted(set(value) - set(known))
    if unknown:
        raise RecordingError(f"unknown field {prefix}{unknown[0]} (written by another meshtop?)")
    values = {}
    for name, spec in known.items():
        if name in value:
            values[name] = load(hints[name], value[name], f"{prefix}{name}", flat=flat, whole=whole)
        elif spec.default is MISSING and spec.default_factory is MISSING:
            raise RecordingError(f"field {prefix}{name} is missing")
    return cls(**values)
