"""JSON value checks shared by the condition language and the trigger cores. Pure."""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Sequence
from typing import Any

from ..errors import InvalidFieldError

__all__ = [
    "MAX_VALUE_DEPTH",
    "check_text",
    "check_value",
    "describe",
    "is_number",
    "names",
    "parse_tagged",
]

#: The deepest nesting of arrays and objects accepted in a registered value (a Static input, a
#: comparison value).
MAX_VALUE_DEPTH = 32
#: The largest integer accepted in a registered value, in bits (about 3,900 decimal digits).
MAX_INT_BITS = 13_000


#: A lone surrogate: what ``"\\ud800"`` in JSON (or undecodable bytes on a command line) decodes
#: to. It has no UTF-8 encoding, so no database can store it.
_SURROGATE = re.compile("[\ud800-\udfff]")


def check_text(text: str, where: str, field: str) -> None:
    """Refuse a string that is not Unicode text (it holds a lone surrogate)."""
    found = _SURROGATE.search(text)
    if found is not None:
        raise InvalidFieldError(
            field, f"{where} holds a lone surrogate (U+{ord(found.group()):04X}), which is not Unicode text"
        )


def is_number(value: object) -> bool:
    """Whether ``value`` is a JSON number (a boolean is not)."""
    return isinstance(value, int | float) and not isinstance(value, bool)


def check_value(value: object, where: str, field: str) -> None:
    """Refuse what is not finite JSON (NaN, infinities, tuples, non-string keys) or nests too deep."""
    stack: list[tuple[object, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if depth > MAX_VALUE_DEPTH:
            raise InvalidFieldError(field, f"{where} nests deeper than {MAX_VALUE_DEPTH} levels")
        if item is None or isinstance(item, bool):
            continue
        if isinstance(item, str):
            check_text(item, where, field)
            continue
        if isinstance(item, int):
            # Beyond about 4,000 digits Python refuses to turn an integer into text (JSON).
            if item.bit_length() > MAX_INT_BITS:
                raise InvalidFieldError(field, f"{where} is an integer too large to store as JSON")
            continue
        if isinstance(item, float):
            if not math.isfinite(item):
                raise InvalidFieldError(field, f"{where} is not a finite number ({item!r})")
            continue
        if isinstance(item, list):
            stack.extend((child, depth + 1) for child in item)
            continue
        if isinstance(item, dict):
            for key, child in item.items():
                if not isinstance(key, str):
                    raise InvalidFieldError(field, f"{where} has a key that is not a string ({key!r:.40})")
                check_text(key, f"{where} (a key)", field)
                stack.append((child, depth + 1))
            continue
        raise InvalidFieldError(field, f"{where} is not a JSON value ({type(item).__name__})")


def describe(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if is_number(value):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__


def names(keys: Iterable[object]) -> str:
    """The keys for an error message: sorted, each shown cut to 40 characters."""
    return ", ".join(repr(k)[:40] for k in sorted(keys, key=str))


def parse_tagged(
    data: object, kinds: Sequence[str], noun: str, field: str, where: str | None = None
) -> tuple[str, dict[str, Any]]:
    """Check an adjacently tagged object ``{"type", "data"}`` and return its type and the object.

    Both parsers (conditions, the triggers' input mappings) take this one JSON shape, so they refuse it
    the same way. ``kinds`` are the accepted types, ``noun`` names one in errors ("an operator");
    ``where`` locates the object in errors (``None``: the field itself). ``"data"`` is not checked:
    whether it is required depends on the type.
    """
    lead, dot = ("", "") if where is None else (f"{where} ", f"{where}.")
    if not isinstance(data, dict):
        raise InvalidFieldError(field, f'{lead}must be an object {{"type", "data"}}, not {describe(data)}')
    extra = set(data) - {"type", "data"}
    if extra:
        raise InvalidFieldError(field, f"{lead}has unknown key(s) {names(extra)}; use 'type' and 'data'")
    kind = data.get("type")
    if not isinstance(kind, str) or kind not in kinds:
        shown = repr(kind)[:60] if isinstance(kind, str) else describe(kind)
        raise InvalidFieldError(field, f"{dot}type {shown} is not {noun}; use one of {', '.join(kinds)}")
    return kind, data
