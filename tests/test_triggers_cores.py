"""The pure cores of completion triggers: paths, guard conditions, input mappings, definitions."""

from __future__ import annotations

import json
import math
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
    All,
    Eq,
    GreaterThan,
    condition_to_json,
    evaluate,
    parse_condition,
)
from flask_harvest.triggers.mappings import (
    Outcome,
    Passthrough,
    Projection,
    SourceOutcome,
    Static,
    apply_mapping,
    mapping_to_json,
    parse_mapping,
)
from flask_harvest.triggers.paths import MISSING, parse_path, select

# -- paths ---------------------------------------------------------------------------------------


def test_path_selects_members_and_reports_missing_apart_from_null() -> None:
    out = {"a": {"b": None, "c": [1, 2]}, "": 5}
    assert select(out, parse_path("")) == out
    assert select(out, parse_path("a.b")) is None
    assert select(out, parse_path("a.x")) is MISSING
    assert select(out, parse_path("a.c")) == [1, 2]
    # Segments name object members only: an array is never indexed.
    assert select(out, parse_path("a.c.0")) is MISSING
    assert select({"a": {"0": "zero"}}, parse_path("a.0")) == "zero"
    assert select(None, parse_path("a")) is MISSING
    assert select("text", parse_path("a")) is MISSING


@pytest.mark.parametrize("bad", ["a..b", ".a", "a.", ".", ".."])
def test_malformed_paths_are_refused(bad: str) -> None:
    with pytest.raises(InvalidFieldError, match="segment is empty"):
        parse_path(bad)


def test_a_path_must_be_a_string() -> None:
    for bad in (None, 1, True, ["a"], {"a": 1}):
        with pytest.raises(InvalidFieldError, match="must be a dotted path string"):
            parse_path(bad)


# -- guard conditions: the seed's edge cases ----------------------------------------------------


def cond(kind: str, path: str, value: Any = None) -> dict[str, Any]:
    if kind in ("Exists", "IsNull"):
        return {"type": kind, "data": {"path": path}}
    if kind == "In":
        return {"type": "In", "data": {"path": path, "values": value}}
    return {"type": kind, "data": {"path": path, "value": value}}


def holds(condition: dict[str, Any], output: Any) -> bool:
    return evaluate(parse_condition(condition), output)


def test_integers_compare_exactly_at_any_size() -> None:
    big = 2**53
    assert not holds(cond("Eq", "n", big), {"n": big + 1})
    assert holds(cond("NotEq", "n", big), {"n": big + 1})
    assert holds(cond("GreaterThan", "n", big), {"n": big + 1})
    assert holds(cond("Eq", "n", 2**200), {"n": 2**200})
    assert not holds(cond("Eq", "n", 2**200), {"n": 2**200 + 1})
    assert holds(cond("LessThan", "n", 2**64), {"n": -(2**64)})


def test_a_float_on_either_side_compares_as_floats() -> None:
    assert holds(cond("Eq", "n", 1), {"n": 1.0})
    assert holds(cond("Eq", "n", 1.0), {"n": 1})
    assert holds(cond("GreaterThanOrEqual", "n", 1), {"n": 1.0})
    # Above 2^53 a mixed pair follows float precision.
    assert holds(cond("Eq", "n", 2.0**53), {"n": 2**53 + 1})
    # An integer beyond the float range compares as an infinity, never raising.
    assert holds(cond("GreaterThan", "n", 1.5), {"n": 10**400})
    assert not holds(cond("Eq", "n", 1.5), {"n": 10**400})


def test_strict_equality_otherwise() -> None:
    assert not holds(cond("Eq", "n", "1"), {"n": 1})
    assert not holds(cond("Eq", "n", 1), {"n": "1"})
    assert not holds(cond("Eq", "n", 1), {"n": True})
    assert not holds(cond("Eq", "n", True), {"n": 1})
    assert not holds(cond("Eq", "n", 0), {"n": False})
    assert holds(cond("Eq", "n", True), {"n": True})
    # No coercion inside arrays or objects.
    assert not holds(cond("Eq", "n", {"a": 1}), {"n": {"a": 1.0}})
    assert not holds(cond("Eq", "n", [1]), {"n": [1.0]})
    assert not holds(cond("Eq", "n", [1]), {"n": [True]})
    assert holds(cond("Eq", "n", {"a": [1, {"b": None}]}), {"n": {"a": [1, {"b": None}]}})
    assert holds(cond("Eq", "", {"n": 1}), {"n": 1})


def test_ordering_is_numeric_only() -> None:
    for value, other in [("b", "a"), (True, 0), ([2], [1]), ({"a": 2}, {"a": 1})]:
        assert not holds(cond("GreaterThan", "n", other), {"n": value})
        assert not holds(cond("LessThan", "n", value), {"n": other})
    assert not holds(cond("GreaterThan", "n", 0), {"n": True})
    assert holds(cond("LessThanOrEqual", "n", 2.5), {"n": 2})


def test_missing_and_null_make_every_comparison_false_and_not_negates() -> None:
    for output in ({}, {"n": None}, None, [1], "text"):
        for kind in ("Eq", "NotEq", "GreaterThan", "GreaterThanOrEqual", "LessThan", "LessThanOrEqual"):
            assert not holds(cond(kind, "n", 1), output), (kind, output)
            assert not holds(cond(kind, "n", None), output), (kind, output)
        assert not holds(cond("In", "n", [1, None]), output)
        # NotEq requires presence; Not(Eq) is pure negation.
        assert holds({"type": "Not", "data": cond("Eq", "n", 1)}, output)
    assert holds(cond("Exists", "n"), {"n": None})
    assert not holds(cond("Exists", "n"), {})
    assert holds(cond("IsNull", "n"), {"n": None})
    assert not holds(cond("IsNull", "n"), {})
    assert holds(cond("IsNull", ""), None)
    assert holds({"type": "Not", "data": cond("Exists", "n")}, None)


def test_in_and_the_combinators() -> None:
    assert holds(cond("In", "r", ["EU", "US"]), {"r": "EU"})
    assert not holds(cond("In", "r", []), {"r": "EU"})
    assert holds(cond("In", "n", [2, 1.0]), {"n": 1})
    assert not holds(cond("In", "n", [True]), {"n": 1})
    assert holds({"type": "All", "data": []}, {})
    assert not holds({"type": "Any", "data": []}, {})
    seed = {
        "type": "All",
        "data": [cond("GreaterThan", "amount", 1000), cond("Eq", "region", "EU")],
    }
    assert holds(seed, {"amount": 1500, "region": "EU"})
    assert not holds(seed, {"amount": 1500, "region": "US"})
    assert not holds(seed, {"amount": 1000, "region": "EU"})
    nested = {"type": "Any", "data": [{"type": "Not", "data": seed}, cond("Eq", "vip", True)]}
    assert holds(nested, {"amount": 1, "region": "EU"})


# -- guard conditions: validation and caps --------------------------------------------------------


def nest(depth: int) -> dict[str, Any]:
    condition: dict[str, Any] = cond("Exists", "a")
    for _ in range(depth - 1):
        condition = {"type": "Not", "data": condition}
    return condition


def test_depth_cap() -> None:
    parse_condition(nest(MAX_CONDITION_DEPTH))
    with pytest.raises(InvalidFieldError, match="deeper than 8"):
        parse_condition(nest(MAX_CONDITION_DEPTH + 1))
    with pytest.raises(InvalidFieldError, match="deeper than 8"):
        parse_condition(nest(5000))


def test_node_cap() -> None:
    parse_condition({"type": "All", "data": [cond("Exists", "a")] * (MAX_CONDITION_NODES - 1)})
    with pytest.raises(InvalidFieldError, match="more than 64 nodes"):
        parse_condition({"type": "All", "data": [cond("Exists", "a")] * MAX_CONDITION_NODES})


def test_in_cap() -> None:
    parse_condition(cond("In", "a", list(range(MAX_CONDITION_IN_VALUES))))
    with pytest.raises(InvalidFieldError, match="more than 64"):
        parse_condition(cond("In", "a", list(range(MAX_CONDITION_IN_VALUES + 1))))


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        (None, "must be an object"),
        ([], "must be an object"),
        ("Eq", "must be an object"),
        ({"type": "Regex", "data": {"path": "a", "value": "x"}}, "'Regex' is not an operator"),
        ({"type": "eq", "data": {"path": "a", "value": 1}}, "is not an operator"),
        ({"type": 1, "data": {}}, "a number is not an operator"),
        ({"data": {"path": "a"}}, "null is not an operator"),
        ({"type": "Eq"}, "has no 'data'"),
        ({"type": "Eq", "data": {"path": "a"}}, "has no 'value'"),
        ({"type": "Eq", "data": {"value": 1}}, "has no 'path'"),
        ({"type": "Eq", "data": {"path": "a", "value": 1, "x": 2}}, "unknown key"),
        ({"type": "Eq", "data": {"path": "a", "value": 1}, "extra": 1}, "unknown key"),
        ({"type": "Eq", "data": ["a", 1]}, "must be an object"),
        ({"type": "Eq", "data": {"path": "a..b", "value": 1}}, "segment is empty"),
        ({"type": "Exists", "data": {"path": ".a"}}, "segment is empty"),
        ({"type": "IsNull", "data": {"path": "a."}}, "segment is empty"),
        ({"type": "Eq", "data": {"path": 3, "value": 1}}, "dotted path string"),
        ({"type": "Eq", "data": {"path": "a", "value": math.nan}}, "not a finite number"),
        ({"type": "Eq", "data": {"path": "a", "value": math.inf}}, "not a finite number"),
        ({"type": "Eq", "data": {"path": "a", "value": [1, -math.inf]}}, "not a finite number"),
        ({"type": "In", "data": {"path": "a", "values": "EU"}}, "must be a list"),
        ({"type": "Eq", "data": {"path": "a", "value": 10**5000}}, "integer too large"),
        ({"type": "Eq", "data": {"path": "a", "value": {1: "x"}}}, "key that is not a string"),
        ({"type": "Eq", "data": {"path": "a", "value": (1, 2)}}, "not a JSON value"),
        ({"type": "In", "data": {"path": "a", "value": ["EU"]}}, "has no 'values'"),
        ({"type": "All", "data": {"type": "Exists"}}, "must be a list of conditions"),
        ({"type": "All", "data": [{"type": "Nope", "data": 1}]}, r"condition.data\[0\].type"),
        ({"type": "Not", "data": None}, "must be an object"),
        ({"type": "Not", "data": [cond("Exists", "a")]}, "must be an object"),
    ],
)
def test_malformed_conditions_are_refused_with_a_clear_error(bad: Any, message: str) -> None:
    with pytest.raises(InvalidFieldError, match=message) as info:
        parse_condition(bad)
    assert info.value.field == "condition"


def test_conditions_round_trip_through_json() -> None:
    seed = {"type": "All", "data": [cond("GreaterThan", "amount", 1000), cond("Eq", "region", "EU")]}
    parsed = parse_condition(seed)
    assert parsed == All([GreaterThan("amount", 1000), Eq("region", "EU")])
    assert condition_to_json(parsed) == seed


# -- hypothesis: never raise, deterministic, refuse with InvalidFieldError only --------------------

json_scalars = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=5)
json_values = st.recursive(
    json_scalars,
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=3), children, max_size=4)
    ),
    max_leaves=20,
)
paths = st.sampled_from(["", "a", "a.b", "b", "a.b.c", "0", "a.0"])


def leaf_conditions() -> st.SearchStrategy[dict[str, Any]]:
    compare = st.builds(
        lambda kind, path, value: cond(kind, path, value),
        st.sampled_from(["Eq", "NotEq", "GreaterThan", "GreaterThanOrEqual", "LessThan", "LessThanOrEqual"]),
        paths,
        json_values.filter(_finite),
    )
    presence = st.builds(lambda kind, path: cond(kind, path), st.sampled_from(["Exists", "IsNull"]), paths)
    member = st.builds(
        lambda path, values: cond("In", path, values),
        paths,
        st.lists(json_values.filter(_finite), max_size=5),
    )
    return compare | presence | member


def _finite(value: Any) -> bool:
    try:
        json.dumps(value, allow_nan=False)
    except ValueError:
        return False
    return True


valid_conditions = st.recursive(
    leaf_conditions(),
    lambda children: (
        st.builds(lambda items: {"type": "All", "data": items}, st.lists(children, max_size=3))
        | st.builds(lambda items: {"type": "Any", "data": items}, st.lists(children, max_size=3))
        | st.builds(lambda item: {"type": "Not", "data": item}, children)
    ),
    max_leaves=10,
)


@settings(max_examples=300, deadline=None)
@given(valid_conditions, json_values)
def test_evaluation_never_raises_and_is_deterministic(data: dict[str, Any], output: Any) -> None:
    try:
        condition = parse_condition(data)
    except InvalidFieldError:
        return  # over a cap: refused at registration, never evaluated
    first = evaluate(condition, output)
    assert isinstance(first, bool)
    assert evaluate(condition, output) is first
    assert evaluate(parse_condition(condition_to_json(condition)), output) is first
    assert evaluate(condition, json.loads(json.dumps(output))) is first or not _finite(output)


@settings(max_examples=300, deadline=None)
@given(json_values | st.dictionaries(st.sampled_from(["type", "data", "x"]), json_values | valid_conditions))
def test_arbitrary_json_is_parsed_or_refused_with_invalid_field_error(data: Any) -> None:
    try:
        condition = parse_condition(data)
    except InvalidFieldError as exc:
        refused: InvalidFieldError | None = exc
    else:
        refused = None
        evaluate(condition, data)
    assert refused is None or refused.field == "condition"


# -- input mappings ---------------------------------------------------------------------------------


def source(state: str = "Completed", output: Any = None, error: str | None = None) -> SourceOutcome:
    return SourceOutcome("exec-1", "wf-1", "etl_ingest", state, output, error)


def test_mappings() -> None:
    out = {"results": {"summary": {"rows": 3}}, "n": 1}
    assert apply_mapping(Passthrough(), source(output=out)) == out
    assert apply_mapping(Static({"k": [1]}), source(output=out)) == {"k": [1]}
    assert apply_mapping(Projection("results.summary"), source(output=out)) == {"rows": 3}
    assert apply_mapping(Projection(""), source(output=out)) == out
    assert apply_mapping(Projection("results.missing"), source(output=out)) is None
    # A source that did not complete has no output: Passthrough and Projection give null.
    assert apply_mapping(Passthrough(), source("Failed", out, "boom")) is None
    assert apply_mapping(Projection("n"), source("Failed", out, "boom")) is None


def test_outcome_envelope() -> None:
    assert apply_mapping(Outcome(), source(output={"a": 1})) == {
        "terminal_state": "COMPLETED",
        "source_exec_id": "exec-1",
        "source_workflow_id": "wf-1",
        "source_workflow_name": "etl_ingest",
        "output": {"a": 1},
    }
    failed = apply_mapping(Outcome(), source("Failed", None, "ValueError: boom"))
    assert failed["terminal_state"] == "FAILED"
    assert failed["error"] == "ValueError: boom"
    assert "output" not in failed
    for state, name in [("Cancelled", "CANCELLED"), ("TimedOut", "TIMED_OUT"), ("Terminated", "TERMINATED")]:
        assert apply_mapping(Outcome(), source(state, None, "why"))["terminal_state"] == name
    assert (
        apply_mapping(Outcome("error"), source("Cancelled", None, "operator said so")) == "operator said so"
    )
    assert apply_mapping(Outcome("output.a"), source(output={"a": 7})) == 7
    assert apply_mapping(Outcome("error"), source(output={"a": 7})) is None


@pytest.mark.parametrize(
    "data",
    [
        {"type": "Passthrough"},
        {"type": "Static", "data": None},
        {"type": "Static", "data": {"a": [1, 2.5, "x"]}},
        {"type": "Projection", "data": "results.summary"},
        {"type": "Projection", "data": ""},
        {"type": "Outcome", "data": {"projection": None}},
        {"type": "Outcome", "data": {"projection": "error"}},
    ],
)
def test_mapping_json_shapes_round_trip(data: dict[str, Any]) -> None:
    assert mapping_to_json(parse_mapping(data)) == data


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        ("Passthrough", "must be an object"),
        ({"type": "Copy"}, "is not a mapping"),
        ({"type": "Passthrough", "data": 1}, "takes no 'data'"),
        ({"type": "Static"}, "has no 'data'"),
        ({"type": "Static", "data": math.nan}, "not a finite number"),
        ({"type": "Projection", "data": "a..b"}, "segment is empty"),
        ({"type": "Projection", "data": 5}, "dotted path string"),
        ({"type": "Outcome", "data": "error"}, "must be an object"),
        ({"type": "Outcome", "data": {"projection": ".x"}}, "segment is empty"),
        ({"type": "Outcome", "data": {"path": "x"}}, "unknown key"),
        ({"type": "Projection", "data": "a", "extra": 1}, "unknown key"),
    ],
)
def test_malformed_mappings_are_refused(bad: Any, message: str) -> None:
    with pytest.raises(InvalidFieldError, match=message):
        parse_mapping(bad)


@settings(max_examples=200, deadline=None)
@given(
    st.sampled_from(
        [Passthrough(), Projection("a.b"), Projection(""), Outcome(), Outcome("output.a"), Static(1)]
    ),
    st.sampled_from(["Completed", "Failed", "Cancelled", "TimedOut", "Terminated"]),
    json_values,
    st.none() | st.text(max_size=10),
)
def test_mappings_never_raise(mapping: Any, state: str, output: Any, error: str | None) -> None:
    apply_mapping(mapping, source(state, output, error))


# -- definitions ------------------------------------------------------------------------------------


def test_a_trigger_defaults_and_normalises() -> None:
    trigger = CompletionTrigger("etl_ingest", "daily_report")
    assert trigger.terminal_states == ("Completed",)
    assert trigger.input_mapping == Passthrough()
    assert trigger.condition is None
    assert trigger.id == CompletionTrigger("etl_ingest", "daily_report").id
    assert trigger.id != CompletionTrigger("etl_ingest", "other").id
    assert trigger.matches("Completed") and not trigger.matches("Failed")
    cancel = CompletionTrigger("a", "b", terminal_states=["Cancelled"])
    assert cancel.matches("Cancelled") and not cancel.matches("Terminated")
    terminate = CompletionTrigger("a", "b", terminal_states=["Terminated"])
    assert terminate.matches("Terminated") and not terminate.matches("Cancelled")


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"source_workflow_name": ""}, "source_workflow_name"),
        ({"target_workflow_name": "x" * 256}, "target_workflow_name"),
        ({"terminal_states": []}, "at least one"),
        ({"terminal_states": ["COMPLETED"]}, "'COMPLETED' is not a terminal state"),
        ({"terminal_states": ["Pending"]}, "is not a terminal state"),
        ({"terminal_states": "Completed"}, "must be a list"),
        ({"input_mapping": "Passthrough"}, "input_mapping"),
        ({"condition": {"type": "Eq", "data": {"path": "a..b", "value": 1}}}, "segment is empty"),
        ({"condition": nest(9)}, "deeper than 8"),
        ({"id": "not-a-uuid"}, "is not a UUID"),
    ],
)
def test_a_bad_trigger_is_refused_naming_it(kwargs: dict[str, Any], message: str) -> None:
    fields: dict[str, Any] = {"source_workflow_name": "order_flow", "target_workflow_name": "fulfil"}
    fields.update(kwargs)
    with pytest.raises(InvalidFieldError, match=message) as info:
        CompletionTrigger(**fields)
    assert "completion trigger" in str(info.value)


def test_the_seeds_api_body_decodes_and_shows_condition_always() -> None:
    body = {
        "id": "78099354-94b3-4f24-9b16-621be94576ff",
        "source_workflow_name": "upstream-processing",
        "terminal_states": ["Completed", "Failed"],
        "target_workflow_name": "downstream-reporting",
        "input_mapping": {"type": "Projection", "data": "results.summary"},
        "condition": {"type": "GreaterThan", "data": {"path": "results.amount", "value": 1000}},
    }
    shown = trigger_to_json(trigger_from_json(body))
    assert {k: shown[k] for k in body} == body
    plain = trigger_to_json(trigger_from_json({"source_workflow_name": "a", "target_workflow_name": "b"}))
    assert plain["condition"] is None
    assert plain["input_mapping"] == {"type": "Passthrough"}
    assert plain["terminal_states"] == ["Completed"]
    with pytest.raises(InvalidFieldError, match="unknown field"):
        trigger_from_json({"source_workflow_name": "a", "target_workflow_name": "b", "guard": {}})
    with pytest.raises(InvalidFieldError, match="is required"):
        trigger_from_json({"source_workflow_name": "a"})
