"""JSON value checks shared by the trigger cores. Pure."""

from __future__ import annotations

import math

from ..errors import InvalidFieldError

__all__ = ["MAX_VALUE_DEPTH", "check_value", "describe", "is_number"]

#: The deepest nesting of arrays and objects accepted in a registered value (a Static input, a
#: comparison value).
MAX_VALUE_DEPTH = 32
#: The largest integer accepted in a registered value, in bits (about 3,900 decimal digits).
MAX_INT_BITS = 13_000


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
        if item is None or isinstance(item, bool | str):
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
