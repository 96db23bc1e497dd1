"""Conditions: a closed comparison AST over a JSON value, and its evaluator. Pure.

One language for two uses: a completion trigger's guard (over its source workflow's output) and a
webhook subscription's payload filter (over an event's payload).

A condition is adjacently tagged JSON::

    {"type": "All", "data": [
        {"type": "GreaterThan", "data": {"path": "amount", "value": 1000}},
        {"type": "Eq", "data": {"path": "region", "value": "EU"}}]}

The operators: ``All`` and ``Any`` (``data``: a list of conditions; ``All([])`` is true and
``Any([])`` false), ``Not`` (``data``: one condition), ``Exists`` and ``IsNull`` (``data``:
``{"path"}``), ``Eq``, ``NotEq``, ``GreaterThan``, ``GreaterThanOrEqual``, ``LessThan``,
``LessThanOrEqual`` (``data``: ``{"path", "value"}``) and ``In`` (``data``: ``{"path", "values"}``).

:func:`parse_condition` refuses anything else with an :class:`~flask_harvest.errors.InvalidFieldError`
that says where (unknown operators and keys, wrong shapes, malformed paths, numbers that are not
finite) and enforces the caps: depth at most :data:`MAX_CONDITION_DEPTH`, at most
:data:`MAX_CONDITION_NODES` nodes, ``In`` lists of at most :data:`MAX_CONDITION_IN_VALUES` values.

:func:`evaluate` is total and deterministic. Its rules:

- a missing path or a ``null`` makes every comparison (``Eq``, ``NotEq``, ordering, ``In``) false;
  ``Not`` is plain negation, so ``NotEq`` and ``Not(Eq)`` differ exactly there;
- two integers compare exactly at any size; when either side is a float both compare as floats
  (``1 == 1.0``); otherwise equality is strict JSON equality: a number never equals a string, a
  boolean is not a number, and there is no numeric coercion inside arrays or objects;
- the ordering operators compare numbers only; anything else is false.
"""

from __future__ import annotations

import math
import typing
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ..errors import InvalidFieldError
from .paths import MISSING, Path, parse_path, select
from .values import MAX_VALUE_DEPTH, check_value, describe, is_number, names, parse_tagged

__all__ = [
    "MAX_CONDITION_DEPTH",
    "MAX_CONDITION_IN_VALUES",
    "MAX_CONDITION_NODES",
    "MAX_VALUE_DEPTH",
    "OPERATORS",
    "All",
    "Any",
    "Condition",
    "Eq",
    "Exists",
    "GreaterThan",
    "GreaterThanOrEqual",
    "In",
    "IsNull",
    "LessThan",
    "LessThanOrEqual",
    "Not",
    "NotEq",
    "condition_to_json",
    "evaluate",
    "json_equal",
    "parse_condition",
    "validate_condition",
]

#: The deepest condition accepted (a leaf alone has depth 1).
MAX_CONDITION_DEPTH = 8
#: The most nodes (operators, leaves included) a condition may have.
MAX_CONDITION_NODES = 64
#: The most values an ``In`` may list.
MAX_CONDITION_IN_VALUES = 64

JsonValue = typing.Any


@dataclass(frozen=True)
class _Group:
    conditions: tuple[Condition, ...]

    def __init__(self, conditions: Sequence[Condition]) -> None:
        object.__setattr__(self, "conditions", tuple(conditions))


class All(_Group):
    """True when every condition is (true for none)."""


class Any(_Group):
    """True when at least one condition is (false for none)."""


@dataclass(frozen=True)
class Not:
    """The negation of ``condition`` (true where it is false, a missing path included)."""

    condition: Condition


@dataclass(frozen=True)
class Exists:
    """True when ``path`` leads to a value (``null`` included)."""

    path: str


@dataclass(frozen=True)
class IsNull:
    """True when ``path`` leads to ``null`` (false when it is missing)."""

    path: str


@dataclass(frozen=True)
class _Compare:
    path: str
    value: JsonValue


class Eq(_Compare):
    """The value at ``path`` equals ``value``."""


class NotEq(_Compare):
    """The value at ``path`` is present, not ``null``, and differs from ``value``."""


class GreaterThan(_Compare):
    """The value at ``path`` and ``value`` are numbers and the first is greater."""


class GreaterThanOrEqual(_Compare):
    """The value at ``path`` and ``value`` are numbers and the first is greater or equal."""


class LessThan(_Compare):
    """The value at ``path`` and ``value`` are numbers and the first is less."""


class LessThanOrEqual(_Compare):
    """The value at ``path`` and ``value`` are numbers and the first is less or equal."""


@dataclass(frozen=True)
class In:
    """The value at ``path`` equals one of ``values`` (as :class:`Eq` compares)."""

    path: str
    values: tuple[JsonValue, ...]

    def __init__(self, path: str, values: Sequence[JsonValue]) -> None:
        object.__setattr__(self, "path", path)
        object.__setattr__(self, "values", tuple(values))


Condition = typing.Union[  # noqa: UP007 - the names All and Any shadow typing's at runtime
    All, Any, Not, Exists, IsNull, Eq, NotEq, GreaterThan, GreaterThanOrEqual, LessThan, LessThanOrEqual, In
]

_COMPARE_TYPES: dict[str, type[_Compare]] = {
    "Eq": Eq,
    "NotEq": NotEq,
    "GreaterThan": GreaterThan,
    "GreaterThanOrEqual": GreaterThanOrEqual,
    "LessThan": LessThan,
    "LessThanOrEqual": LessThanOrEqual,
}
#: Every operator's JSON ``type`` name.
OPERATORS = ("All", "Any", "Not", "Exists", "IsNull", *_COMPARE_TYPES, "In")


# -- parsing (registration-time validation) ----------------------------------------------------


class _Budget:
    def __init__(self, field: str) -> None:
        self.nodes = 0
        self.field = field

    def count(self, where: str) -> None:
        self.nodes += 1
        if self.nodes > MAX_CONDITION_NODES:
            raise InvalidFieldError(
                self.field, f"has more than {MAX_CONDITION_NODES} nodes (at {where}); simplify it"
            )


def parse_condition(data: object, *, field: str = "condition") -> Condition:
    """Return the condition ``data`` (its adjacently tagged JSON form) describes.

    :param field: names the condition in errors.
    :raises InvalidFieldError: an unknown operator or key, a wrong shape, a malformed path, a value
        that is not finite JSON, or a cap exceeded; the message says where.
    """
    return _parse(data, field, 1, _Budget(field), field)


def _parse(data: object, where: str, depth: int, budget: _Budget, field: str) -> Condition:
    if depth > MAX_CONDITION_DEPTH:
        raise InvalidFieldError(field, f"is nested deeper than {MAX_CONDITION_DEPTH} levels (at {where})")
    budget.count(where)
    kind, data = parse_tagged(data, OPERATORS, "an operator", field, where)
    if "data" not in data:
        raise InvalidFieldError(field, f"{where} ({kind}) has no 'data'")
    body = data["data"]
    at = f"{where}.data"
    if kind in ("All", "Any"):
        if not isinstance(body, list):
            raise InvalidFieldError(
                field, f"{at} ({kind}) must be a list of conditions, not {describe(body)}"
            )
        items = [_parse(item, f"{at}[{i}]", depth + 1, budget, field) for i, item in enumerate(body)]
        return All(items) if kind == "All" else Any(items)
    if kind == "Not":
        return Not(_parse(body, at, depth + 1, budget, field))
    if kind in ("Exists", "IsNull"):
        path = _leaf(body, at, kind, ("path",), field)
        return Exists(path) if kind == "Exists" else IsNull(path)
    if kind == "In":
        path = _leaf(body, at, kind, ("path", "values"), field)
        values = typing.cast(dict[str, object], body)["values"]
        if not isinstance(values, list):
            raise InvalidFieldError(field, f"{at}.values (In) must be a list, not {describe(values)}")
        if len(values) > MAX_CONDITION_IN_VALUES:
            raise InvalidFieldError(
                field, f"{at}.values (In) lists {len(values)} values, more than {MAX_CONDITION_IN_VALUES}"
            )
        for i, value in enumerate(values):
            check_value(value, f"{at}.values[{i}]", field)
        return In(path, values)
    path = _leaf(body, at, kind, ("path", "value"), field)
    value = typing.cast(dict[str, object], body)["value"]
    check_value(value, f"{at}.value", field)
    return typing.cast(Condition, _COMPARE_TYPES[kind](path, value))


def _leaf(body: object, at: str, kind: str, keys: tuple[str, ...], field: str) -> str:
    shape = "{" + ", ".join(f'"{k}"' for k in keys) + "}"
    if not isinstance(body, dict):
        raise InvalidFieldError(field, f"{at} ({kind}) must be an object {shape}, not {describe(body)}")
    missing = [k for k in keys if k not in body]
    if missing:
        raise InvalidFieldError(field, f"{at} ({kind}) has no {names(missing)}; it takes {shape}")
    extra = set(body) - set(keys)
    if extra:
        raise InvalidFieldError(field, f"{at} ({kind}) has unknown key(s) {names(extra)}; it takes {shape}")
    try:
        parse_path(body["path"])
    except InvalidFieldError as exc:
        raise InvalidFieldError(field, f"{at}.{exc.field}: {exc.message}") from None
    path: str = body["path"]
    return path


# -- serialising -------------------------------------------------------------------------------


def condition_to_json(condition: Condition) -> dict[str, JsonValue]:
    """Return the adjacently tagged JSON form of ``condition`` (what :func:`parse_condition` reads)."""
    if isinstance(condition, All | Any):
        return {
            "type": type(condition).__name__,
            "data": [condition_to_json(c) for c in condition.conditions],
        }
    if isinstance(condition, Not):
        return {"type": "Not", "data": condition_to_json(condition.condition)}
    if isinstance(condition, Exists | IsNull):
        return {"type": type(condition).__name__, "data": {"path": condition.path}}
    if isinstance(condition, In):
        return {"type": "In", "data": {"path": condition.path, "values": list(condition.values)}}
    return {"type": type(condition).__name__, "data": {"path": condition.path, "value": condition.value}}


def validate_condition(condition: Condition, *, field: str = "condition") -> Condition:
    """Check a condition built in Python (not parsed) against the same rules and caps.

    :returns: the condition, as :func:`parse_condition` rebuilds it from its JSON form.
    :raises InvalidFieldError: it breaks a rule or a cap.
    """
    if not isinstance(condition, _CONDITION_CLASSES):
        raise InvalidFieldError(field, f"must be a condition (Eq, All, ...), not {type(condition).__name__}")
    try:
        data = condition_to_json(condition)
    except (AttributeError, TypeError, RecursionError) as exc:
        raise InvalidFieldError(field, f"is not a well-formed condition ({exc})") from None
    return parse_condition(data, field=field)


# -- evaluation --------------------------------------------------------------------------------


def evaluate(condition: Condition, output: JsonValue) -> bool:
    """Whether ``condition`` holds on ``output`` (a source's recorded output, ``None`` when it has
    none; or an event's payload). Total and deterministic: any value gives ``True`` or ``False``,
    never an exception."""
    if isinstance(condition, All):
        return all(evaluate(c, output) for c in condition.conditions)
    if isinstance(condition, Any):
        return any(evaluate(c, output) for c in condition.conditions)
    if isinstance(condition, Not):
        return not evaluate(condition.condition, output)
    found = select(output, _segments(condition.path))
    if isinstance(condition, Exists):
        return found is not MISSING
    if isinstance(condition, IsNull):
        return found is None
    if found is MISSING or found is None:
        return False  # comparisons require presence
    if isinstance(condition, In):
        return any(_equal(found, value) for value in condition.values)
    if isinstance(condition, Eq):
        return _equal(found, condition.value)
    if isinstance(condition, NotEq):
        return not _equal(found, condition.value)
    order = _order(found, condition.value)
    if order is None:
        return False
    if isinstance(condition, GreaterThan):
        return order > 0
    if isinstance(condition, GreaterThanOrEqual):
        return order >= 0
    if isinstance(condition, LessThan):
        return order < 0
    return order <= 0


def _segments(path: str) -> Path:
    # Conditions reaching evaluate were parsed, so the path is valid; a hand-built one that is not
    # selects nothing rather than raising.
    try:
        return parse_path(path)
    except InvalidFieldError:
        return ("",)


def _as_float(value: int | float) -> float:
    try:
        return float(value)
    except OverflowError:  # an integer beyond the float range: its sign decides
        return math.inf if value > 0 else -math.inf


def _equal(left: object, right: object) -> bool:
    """The top-level equality: integers exactly, a float on either side as floats, else strict."""
    if is_number(left) and is_number(right):
        if isinstance(left, int) and isinstance(right, int):
            return left == right
        return _as_float(typing.cast(float, left)) == _as_float(typing.cast(float, right))
    return json_equal(left, right)


def _order(left: object, right: object) -> int | None:
    if not (is_number(left) and is_number(right)):
        return None
    if isinstance(left, int) and isinstance(right, int):
        a: int | float = left
        b: int | float = right
    else:
        a, b = _as_float(typing.cast(float, left)), _as_float(typing.cast(float, right))
        if math.isnan(a) or math.isnan(b):
            return None
    return (a > b) - (a < b)


def json_equal(left: object, right: object) -> bool:
    """Strict JSON equality: same JSON type (a boolean is not a number, an integer is not a float)
    and equal content, recursively. Iterative, so no nesting depth makes it raise."""
    stack: list[tuple[object, object]] = [(left, right)]
    while stack:
        a, b = stack.pop()
        if _json_type(a) != _json_type(b):
            return False
        if isinstance(a, list) and isinstance(b, list):
            if len(a) != len(b):
                return False
            stack.extend(zip(a, b, strict=True))
        elif isinstance(a, Mapping) and isinstance(b, Mapping):
            try:
                if a.keys() != b.keys():
                    return False
                stack.extend((a[key], b[key]) for key in a)
            except Exception:
                return False
        elif not _scalar_equal(a, b):
            return False
    return True


def _scalar_equal(a: object, b: object) -> bool:
    try:
        return bool(a == b)
    except Exception:
        return False


def _json_type(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "int"
    if isinstance(value, float):
        return "float"
    if isinstance(value, str):
        return "str"
    if isinstance(value, list):
        return "list"
    if isinstance(value, Mapping):
        return "object"
    return f"other:{type(value).__name__}"


_CONDITION_CLASSES = (
    All,
    Any,
    Not,
    Exists,
    IsNull,
    Eq,
    NotEq,
    GreaterThan,
    GreaterThanOrEqual,
    LessThan,
    LessThanOrEqual,
    In,
)
