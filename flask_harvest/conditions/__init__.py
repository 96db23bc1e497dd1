"""The condition language: a closed comparison AST over JSON values, its parser and evaluator. Pure.

Completion triggers guard their fires with it and webhook subscriptions filter payloads with it:
one parser, one set of caps and one evaluator for both (:mod:`.operators`; paths in :mod:`.paths`).
"""

from __future__ import annotations

from .operators import (
    MAX_CONDITION_DEPTH,
    MAX_CONDITION_IN_VALUES,
    MAX_CONDITION_NODES,
    MAX_VALUE_DEPTH,
    OPERATORS,
    All,
    Any,
    Condition,
    Eq,
    Exists,
    GreaterThan,
    GreaterThanOrEqual,
    In,
    IsNull,
    LessThan,
    LessThanOrEqual,
    Not,
    NotEq,
    condition_to_json,
    evaluate,
    json_equal,
    parse_condition,
    validate_condition,
)

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
