"""Dotted JSON paths: ``results.summary.count`` selects a member of a member of a value. Pure.

The one path syntax of every condition leaf (completion triggers' guards, webhook subscriptions'
payload filters) and of the triggers' ``Projection`` and ``Outcome`` input mappings:

- the empty path ``""`` selects the whole value;
- otherwise the path is split on ``.`` and each segment selects the member of that name of a JSON
  object; a segment never indexes an array (``items.0`` looks for a member named ``"0"``, which an
  array does not have): paths name object members only;
- every segment must be non-empty: ``a..b``, ``.a`` and ``a.`` are malformed and refused where a
  path is registered (:func:`parse_path`);
- a path that does not lead to a value (a member absent, or a step into a non-object) is *missing*,
  which :func:`select` reports apart from a present ``null``.
"""

from __future__ import annotations

from typing import Any

from ..errors import InvalidFieldError
from .values import check_text, describe

__all__ = ["MAX_PATH_LENGTH", "MISSING", "Path", "parse_path", "select"]

#: The longest path accepted, in characters.
MAX_PATH_LENGTH = 1024

#: The segments of a parsed path; ``()`` is the whole value.
Path = tuple[str, ...]


class _Missing:
    """The result of a path that leads nowhere (distinct from a JSON ``null``)."""

    _instance: _Missing | None = None

    def __new__(cls) -> _Missing:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "MISSING"

    def __bool__(self) -> bool:
        return False


#: What :func:`select` returns for a missing path.
MISSING: Any = _Missing()


def parse_path(path: object, *, field: str = "path") -> Path:
    """Return the segments of a dotted path, refusing a malformed one.

    :param field: names the path in the error (``condition.data.path``).
    :raises InvalidFieldError: not a string, too long, or with an empty segment.
    """
    if not isinstance(path, str):
        raise InvalidFieldError(field, f"must be a dotted path string, not {describe(path)}")
    if len(path) > MAX_PATH_LENGTH:
        raise InvalidFieldError(field, f"is longer than {MAX_PATH_LENGTH} characters")
    check_text(path, f"{path!r:.80}", field)
    if path == "":
        return ()
    segments = tuple(path.split("."))
    if any(segment == "" for segment in segments):
        raise InvalidFieldError(
            field,
            f"{path!r:.80} is not a dotted path: a segment is empty (no leading, trailing or doubled "
            "dots; use '' for the whole value)",
        )
    return segments


def select(value: Any, path: Path) -> Any:
    """Return the value ``path`` selects in ``value``, or :data:`MISSING`. Never raises."""
    current = value
    for segment in path:
        if not isinstance(current, dict) or segment not in current:
            return MISSING
        current = current[segment]
    return current
