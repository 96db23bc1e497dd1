"""An adversarial review of the trigger cores: every operator against every JSON type and the seed's
edge cases, the caps at and just past each limit, and text no database can store."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flask_harvest.errors import InvalidFieldError
from flask_harvest.triggers import CompletionTrigger, trigger_from_json, trigger_to_json
from flask_harvest.triggers.conditions import (
    MAX_CONDITION_DEPTH,
    MAX_CONDITION_IN_VALUES,
    MAX_CONDITION_NODES,
    evaluate,
    parse_condition,
)
from flask_harvest.triggers.mappings import Outcome, SourceOutcome, apply_mapping

BIG = 2**53


def leaf(kind: str, path: str, value: Any) -> dict[str, Any]:
    return {"type": kind, "data": {"path": path, "value": value}}


def holds(condition: dict[str, Any], output: Any) -> bool:
    return evaluate(parse_condition(condition), output)


# (operator, path, value, output, expected)
MATRIX: list[tuple[str, str, Any, Any, bool]] = [
    # integers exactly, at any size and sign
    ("Eq", "a", BIG + 1, {"a": BIG}, False),
    ("NotEq", "a", BIG + 1, {"a": BIG}, True),
    ("LessThan", "a", BIG + 1, {"a": BIG}, True),
    ("GreaterThanOrEqual", "a", BIG + 1, {"a": BIG}, False),
    ("Eq", "a", 10**400, {"a": 10**400}, True),
    ("Eq", "a", 10**400, {"a": 10**400 + 1}, False),
    ("GreaterThan", "a", 10**400, {"a": 10**400 + 1}, True),
    ("Eq", "a", -(2**63), {"a": -(2**63)}, True),
    ("LessThan", "a", 2**64, {"a": -(2**64)}, True),
    # a float on either side: both as floats
    ("Eq", "a", 1, {"a": 1.0}, True),
    ("Eq", "a", 1.0, {"a": 1}, True),
    ("Eq", "a", BIG + 1, {"a": float(BIG)}, True),  # float precision above 2**53
    ("Eq", "a", -0.0, {"a": 0}, True),
    ("Eq", "a", 0.0, {"a": -0.0}, True),
    ("LessThan", "a", 0, {"a": -0.0}, False),
    ("Eq", "a", 1e308, {"a": 1e308}, True),
    ("GreaterThan", "a", 1e308, {"a": 10**400}, True),  # an int past the float range
    ("LessThan", "a", -1e308, {"a": -(10**400)}, True),
    ("Eq", "a", 1e308, {"a": 10**400}, False),
    ("GreaterThanOrEqual", "a", 1, {"a": 1.0}, True),
    ("LessThanOrEqual", "a", 1.5, {"a": 2}, False),
    # strict otherwise: no string, boolean or nested coercion
    ("Eq", "a", "1", {"a": 1}, False),
    ("Eq", "a", 1, {"a": "1"}, False),
    ("NotEq", "a", "1", {"a": 1}, True),
    ("Eq", "a", True, {"a": 1}, False),
    ("Eq", "a", 1, {"a": True}, False),
    ("Eq", "a", 0, {"a": False}, False),
    ("Eq", "a", 1.0, {"a": True}, False),
    ("Eq", "a", True, {"a": True}, True),
    ("Eq", "a", {"a": 1}, {"a": {"a": 1.0}}, False),
    ("Eq", "a", {"a": 1}, {"a": {"a": 1}}, True),
    ("Eq", "a", [1], {"a": [1.0]}, False),
    ("Eq", "a", [True], {"a": [1]}, False),
    ("Eq", "a", [[1, {"z": [None]}]], {"a": [[1, {"z": [None]}]]}, True),
    ("Eq", "a", [], {"a": {}}, False),
    ("Eq", "a", "", {"a": ""}, True),
    ("Eq", "a", "é", {"a": "e\u0301"}, False),  # no Unicode normalisation
    # ordering is numeric only
    ("GreaterThan", "a", True, {"a": 2}, False),
    ("GreaterThan", "a", 0, {"a": True}, False),
    ("GreaterThan", "a", "a", {"a": "b"}, False),
    ("LessThan", "a", [2], {"a": [1]}, False),
    ("GreaterThanOrEqual", "a", None, {"a": 1}, False),
    # missing or null: every comparison is false
    ("Eq", "a", None, {"a": None}, False),
    ("NotEq", "a", 1, {"a": None}, False),
    ("NotEq", "a", 1, {}, False),
    ("NotEq", "a", None, {"a": 1}, True),
    ("GreaterThan", "a", 0, {}, False),
    ("LessThanOrEqual", "a", 0, {"a": None}, False),
    # paths: the empty path, unicode, a key containing a dot, digits never index arrays
    ("Eq", "", {"x": 1}, {"x": 1}, True),
    ("Eq", "", 5, 5, True),
    ("Eq", "", None, None, False),
    ("Eq", "é.ü", 1, {"é": {"ü": 1}}, True),
    ("Eq", "a.b", 1, {"a.b": 1}, False),
    ("Eq", "0", 1, [1], False),
    ("Eq", "0", 1, {"0": 1}, True),
    ("Eq", " ", 1, {" ": 1}, True),
    ("Eq", "a.b", 1, {"a": [{"b": 1}]}, False),
    ("Eq", "a.b", 1, {"a": "b"}, False),
    ("Eq", "a", 1, [{"a": 1}], False),
]


@pytest.mark.parametrize(("kind", "path", "value", "output", "expected"), MATRIX)
def test_every_operator_against_the_edge_cases(
    kind: str, path: str, value: Any, output: Any, expected: bool
) -> None:
    assert holds(leaf(kind, path, value), output) is expected


def test_in_with_mixed_types_compares_each_value_as_eq_does() -> None:
    def is_in(values: list[Any], output: Any) -> bool:
        return holds({"type": "In", "data": {"path": "a", "values": values}}, output)

    assert is_in(["1", True, 1.0], {"a": 1})
    assert not is_in(["1", True], {"a": 1})
    assert not is_in([1, 0], {"a": True})
    assert is_in([False], {"a": False})
    assert not is_in([None], {"a": None})
    assert not is_in([None], {})
    assert not is_in([], {"a": 1})
    assert not is_in([[1]], {"a": [1.0]})
    assert is_in([{"k": [1]}], {"a": {"k": [1]}})
    assert not is_in([BIG], {"a": BIG + 1})
    assert is_in([BIG + 1], {"a": BIG + 1})


def test_not_eq_and_not_of_eq_and_existence() -> None:
    ne = leaf("NotEq", "a", 1)
    not_eq = {"type": "Not", "data": leaf("Eq", "a", 1)}
    exists = {"type": "Exists", "data": {"path": "a"}}
    is_null = {"type": "IsNull", "data": {"path": "a"}}
    for output, want in [
        ({"a": 1}, (False, False, True, False)),
        ({"a": 2}, (True, True, True, False)),
        ({"a": None}, (False, True, True, True)),
        ({}, (False, True, False, False)),
        (None, (False, True, False, False)),
        ([1], (False, True, False, False)),
    ]:
        assert (
            holds(ne, output),
            holds(not_eq, output),
            holds(exists, output),
            holds(is_null, output),
        ) == want
    # A null root (a source that did not complete): the empty path exists and is null.
    assert holds({"type": "Exists", "data": {"path": ""}}, None)
    assert holds({"type": "IsNull", "data": {"path": ""}}, None)


def chain(depth: int) -> dict[str, Any]:
    condition: dict[str, Any] = {"type": "Exists", "data": {"path": "a"}}
    for i in range(depth - 1):
        condition = {"type": ("Not", "All", "Any")[i % 3], "data": condition}
        if condition["type"] != "Not":
            condition["data"] = [condition["data"]]
    return condition


def wide(nodes: int) -> dict[str, Any]:
    return {"type": "Any", "data": [leaf("Eq", "a", i) for i in range(nodes - 1)]}


def in_values(count: int) -> dict[str, Any]:
    return {"type": "In", "data": {"path": "a", "values": list(range(count))}}


@pytest.mark.parametrize(
    ("at_cap", "past_cap"),
    [
        (chain(MAX_CONDITION_DEPTH), chain(MAX_CONDITION_DEPTH + 1)),
        (wide(MAX_CONDITION_NODES), wide(MAX_CONDITION_NODES + 1)),
        (in_values(MAX_CONDITION_IN_VALUES), in_values(MAX_CONDITION_IN_VALUES + 1)),
    ],
)
def test_each_cap_holds_at_the_limit_and_refuses_one_past_it(at_cap: Any, past_cap: Any) -> None:
    # The static surface takes a condition's JSON form as well as a Condition.
    assert CompletionTrigger("a", "b", condition=at_cap).condition is not None
    assert trigger_from_json({"source_workflow_name": "a", "target_workflow_name": "b", "condition": at_cap})
    with pytest.raises(InvalidFieldError, match=r"completion trigger .*'a' -> 'b'"):
        CompletionTrigger("a", "b", condition=past_cap)
    with pytest.raises(InvalidFieldError):
        trigger_from_json({"source_workflow_name": "a", "target_workflow_name": "b", "condition": past_cap})


def test_a_deep_and_wide_condition_counts_every_node() -> None:
    # 8 levels deep with 64 nodes in all is the largest accepted tree.
    inner = chain(MAX_CONDITION_DEPTH - 1)
    tree: dict[str, Any] = {
        "type": "All",
        "data": [inner] + [leaf("Eq", "a", i) for i in range(MAX_CONDITION_NODES - 8)],
    }
    parse_condition(tree)
    tree["data"].append(leaf("Eq", "a", -1))
    with pytest.raises(InvalidFieldError, match="more than 64 nodes"):
        parse_condition(tree)


LONE_SURROGATES: list[dict[str, Any]] = [
    {"source_workflow_name": "a\ud800"},
    {"target_workflow_name": "\udfffb"},
    {"input_mapping": {"type": "Static", "data": "\udcff"}},
    {"input_mapping": {"type": "Static", "data": {"k\ud800": 1}}},
    {"input_mapping": {"type": "Static", "data": [["\ud83d"]]}},
    {"input_mapping": {"type": "Projection", "data": "a.\ud800"}},
    {"input_mapping": {"type": "Outcome", "data": {"projection": "\ud800"}}},
    {"condition": leaf("Eq", "\ud800", 1)},
    {"condition": leaf("Eq", "a", "\ud800")},
    {"condition": leaf("Eq", "a", {"\ud800": 1})},
    {"condition": {"type": "In", "data": {"path": "a", "values": ["ok", "\udfff"]}}},
    {"condition": {"type": "Exists", "data": {"path": "\udfff"}}},
]


@pytest.mark.parametrize("changes", LONE_SURROGATES)
def test_text_that_is_not_unicode_is_refused_at_registration(changes: dict[str, Any]) -> None:
    # A lone surrogate (what "\ud800" in JSON, or undecodable bytes on a command line, decode to)
    # cannot be encoded as UTF-8: no database can store it, so registration refuses it.
    body = {"source_workflow_name": "a", "target_workflow_name": "b", **changes}
    field = next(iter(changes))
    with pytest.raises(InvalidFieldError) as info:
        trigger_from_json(body)
    assert info.value.field == field
    assert "surrogate" in info.value.message


@pytest.mark.parametrize("name", ["a\x00b", "\x00"])
def test_a_workflow_name_with_a_nul_is_refused(name: str) -> None:
    # PostgreSQL text cannot hold a NUL, and no registered workflow has one.
    with pytest.raises(InvalidFieldError, match="source_workflow_name"):
        CompletionTrigger(name, "b")
    with pytest.raises(InvalidFieldError, match="target_workflow_name"):
        CompletionTrigger("a", name)


def test_a_nul_inside_json_values_and_paths_is_fine() -> None:
    trigger = CompletionTrigger("a", "b", condition=parse_condition(leaf("Eq", "k\x00", "v\x00")))
    assert trigger.condition is not None
    assert evaluate(trigger.condition, {"k\x00": "v\x00"})


def test_the_outcome_envelope_always_has_the_seeds_six_fields() -> None:
    failed = apply_mapping(
        Outcome(), SourceOutcome("e", "order-42", "fulfil_order", "Failed", None, "declined")
    )
    assert failed == {
        "terminal_state": "FAILED",
        "source_exec_id": "e",
        "source_workflow_id": "order-42",
        "source_workflow_name": "fulfil_order",
        "output": None,
        "error": "declined",
    }
    completed = apply_mapping(Outcome(), SourceOutcome("e", "w", "n", "Completed", {"a": 1}, None))
    assert completed["output"] == {"a": 1} and completed["error"] is None
    assert list(completed) == list(failed)
    # A failed source with an output recorded still shows none: output is only for COMPLETED.
    assert apply_mapping(Outcome(), SourceOutcome("e", "w", "n", "Failed", {"a": 1}, "x"))["output"] is None


hostile_text = st.text(
    alphabet=st.characters(categories=["Cs", "Cc", "L", "N", "P"]) | st.sampled_from([".", "\x00"]),
    max_size=6,
)
hostile_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | hostile_text,
    lambda children: st.lists(children, max_size=3) | st.dictionaries(hostile_text, children, max_size=3),
    max_leaves=10,
)


@settings(max_examples=300, deadline=None)
@given(
    source=hostile_text,
    path=hostile_text,
    value=hostile_json,
    static=hostile_json,
    projection=hostile_text,
)
def test_a_registered_definition_is_always_storable_text(
    source: str, path: str, value: Any, static: Any, projection: str
) -> None:
    for body in (
        {"source_workflow_name": source, "target_workflow_name": "b"},
        {"source_workflow_name": "a", "target_workflow_name": "b", "condition": leaf("Eq", path, value)},
        {
            "source_workflow_name": "a",
            "target_workflow_name": "b",
            "input_mapping": {"type": "Static", "data": static},
        },
        {
            "source_workflow_name": "a",
            "target_workflow_name": "b",
            "input_mapping": {"type": "Projection", "data": projection},
        },
    ):
        try:
            trigger = trigger_from_json(body)
        except InvalidFieldError:
            continue
        # What registration accepts, every database can store: UTF-8 text, and no NUL in a name.
        stored = json.dumps(trigger_to_json(trigger), ensure_ascii=False)
        stored.encode("utf-8")
        assert "\x00" not in trigger.source_workflow_name + trigger.target_workflow_name
