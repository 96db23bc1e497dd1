"""The event catalog's pure core: registration checks, payload problems, topic warnings, the docs page."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from flask_harvest.errors import InvalidFieldError
from flask_harvest.webhooks.catalog import EventCatalog, PayloadProblem, make_event_type, render_rst

from .properties import BUDGET, JSON, PAYLOADS, TEXT

ORDER_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["order_id", "total"],
    "properties": {
        "order_id": {"type": "string"},
        "total": {"type": "number", "minimum": 0},
        "items": {"type": "array", "items": {"$ref": "#/$defs/item"}},
    },
    "$defs": {"item": {"type": "object", "required": ["sku"], "properties": {"qty": {"type": "integer"}}}},
}
ORDER_EXAMPLE = {"order_id": "ord_1", "total": 12.5, "items": [{"sku": "A-1", "qty": 2}]}


def order_catalog() -> EventCatalog:
    catalog = EventCatalog()
    catalog.register("order.created", description="An order.", schema=ORDER_SCHEMA, example=ORDER_EXAMPLE)
    return catalog


def refusal(field: str, **overrides: Any) -> str:
    arguments: dict[str, Any] = {"schema": ORDER_SCHEMA, "example": ORDER_EXAMPLE}
    name = overrides.pop("name", "order.created")
    arguments.update(overrides)
    with pytest.raises(InvalidFieldError) as caught:
        EventCatalog().register(name, **arguments)
    assert caught.value.field == field
    return caught.value.message


def test_a_registered_type_is_listed_and_served_as_json() -> None:
    catalog = order_catalog()
    [event_type] = catalog.types()
    assert catalog.get("order.created") == event_type
    assert catalog.get("order.updated") is None
    assert event_type.to_dict() == {
        "name": "order.created",
        "description": "An order.",
        "version": 1,
        "schema": ORDER_SCHEMA,
        "example": ORDER_EXAMPLE,
    }


def test_a_valid_payload_has_no_problem_and_an_unknown_topic_no_type() -> None:
    catalog = order_catalog()
    assert catalog.check("order.created", {"order_id": "o", "total": 0})[1] is None
    assert catalog.check("order.deleted", {"anything": True}) == (None, None)


@pytest.mark.parametrize(
    ("payload", "path", "words"),
    [
        ({"total": 1}, "$", "'order_id' is a required property"),
        ({"order_id": 7, "total": 1}, "$.order_id", "'type' rule"),
        ({"order_id": "o", "total": -1}, "$.total", "'minimum' rule (0)"),
        ({"order_id": "o", "total": 1, "items": [{"sku": "a"}, {"qty": 1}]}, "$.items[1]", "'sku' is a"),
        ({"order_id": "o", "total": 1, "items": [{"sku": "a", "qty": "two"}]}, "$.items[0].qty", "'type'"),
        ([], "$", "'type' rule"),
    ],
)
def test_a_problem_names_the_json_path_and_the_rule(payload: Any, path: str, words: str) -> None:
    _, problem = order_catalog().check("order.created", payload)
    assert problem is not None
    assert problem.path == path
    assert words in problem.message


def test_a_problem_never_quotes_the_payloads_values() -> None:
    _, problem = order_catalog().check("order.created", {"order_id": "o", "total": "card 4242 4242"})
    assert problem == PayloadProblem("$.total", "does not match the schema's 'type' rule (\"number\")")


@pytest.mark.parametrize(
    ("field", "overrides", "words"),
    [
        ("name", {"name": "order.*"}, "is not a topic"),
        ("name", {"name": ""}, "non-empty"),
        ("name", {"name": "a" * 256}, "at most 255"),
        ("name", {"name": "order\x00created"}, "NUL"),
        ("description", {"description": 3}, "must be a string"),
        ("description", {"description": "x" * 2049}, "at most 2048"),
        ("version", {"version": 0}, "integer from 1"),
        ("version", {"version": True}, "integer from 1"),
        ("schema", {"schema": "object"}, "is an object"),
        ("schema", {"schema": {"type": "nope"}}, "not a valid JSON Schema at type"),
        ("schema", {"schema": {"type": "string", "pattern": "("}}, "not a valid JSON Schema at pattern"),
        ("schema", {"schema": {"$schema": "https://example.com/mine"}}, "unknown $schema dialect"),
        ("schema", {"schema": {"const": float("nan")}}, "must be JSON data"),
        ("schema", {"schema": {"enum": [{1, 2}]}}, "must be JSON data"),
        ("example", {"example": {"order_id": 1}}, "does not match its schema at $"),
        ("example", {"schema": {"$ref": "https://example.com/order.json"}}, "remote $refs are not fetched"),
        ("example", {"schema": {"$ref": "#"}}, "refers to itself"),
    ],
)
def test_registration_refuses_a_broken_type_naming_the_part(
    field: str, overrides: dict[str, Any], words: str
) -> None:
    assert words in refusal(field, **overrides)


def test_registration_takes_other_dialects_and_boolean_schemas() -> None:
    catalog = EventCatalog()
    catalog.register(
        "a.b", schema={"$schema": "http://json-schema.org/draft-07/schema#", "type": "integer"}, example=1
    )
    catalog.register("a.c", schema=True, example={"anything": []})
    assert catalog.check("a.b", "1")[1] is not None
    assert catalog.check("a.c", None)[1] is None


def test_registering_again_is_a_no_op_but_another_type_under_the_name_is_refused() -> None:
    catalog = order_catalog()
    catalog.register("order.created", description="An order.", schema=ORDER_SCHEMA, example=ORDER_EXAMPLE)
    with pytest.raises(InvalidFieldError, match="registered already"):
        catalog.register("order.created", description="Changed.", schema=ORDER_SCHEMA, example=ORDER_EXAMPLE)
    assert [t.description for t in catalog.types()] == ["An order."]


def test_the_schema_and_example_are_copied_as_json() -> None:
    schema: dict[str, Any] = {"type": "object", "properties": {"tags": {"enum": [("a", "b")]}}}
    event_type = make_event_type("a.b", schema=schema, example={"tags": ["a", "b"]})
    schema["type"] = "array"  # the caller's dict, changed afterwards, changes nothing registered
    assert event_type.schema == {"type": "object", "properties": {"tags": {"enum": [["a", "b"]]}}}


@pytest.mark.parametrize(
    ("patterns", "warned"),
    [
        (["order.created"], []),
        (["order.*", "*"], []),
        (["ordr.*", "order.created.extra", "order.created"], ["ordr.*", "order.created.extra"]),
    ],
)
def test_topic_patterns_that_select_no_type_are_warned_about(patterns: list[str], warned: list[str]) -> None:
    warnings = order_catalog().unmatched_patterns(patterns)
    assert warnings == [f"topic pattern {p!r} matches no event type in the catalog" for p in warned]


def test_an_empty_catalog_warns_about_nothing() -> None:
    assert EventCatalog().unmatched_patterns(["anything.*", "x"]) == []


def test_the_docs_page_shows_each_type_and_escapes_markup() -> None:
    catalog = order_catalog()
    catalog.register("a.b", description="Uses *stars* and `ticks`.", schema=True, example=None, version=3)
    page = render_rst(catalog, title="Webhook events")
    assert page.startswith("Webhook events\n==============\n")
    assert page.index("``a.b``") < page.index("``order.created``")
    assert "Uses \\*stars\\* and \\`ticks\\`." in page
    assert "Version: 3" in page
    assert "   " + json.dumps(ORDER_EXAMPLE, indent=2).splitlines()[1] in page


# -- hostile registrations ---------------------------------------------------------------------------

SCHEMAS = st.one_of(
    JSON,
    st.dictionaries(
        st.sampled_from(["type", "properties", "required", "pattern", "$ref", "$schema", "items", "enum"]),
        JSON,
        max_size=3,
    ),
    st.just({"$ref": "#"}),
)
NAMES = st.one_of(st.sampled_from(["order.created", "a.*", "a..b", ".", "a" * 300]), TEXT)


@BUDGET
@given(name=NAMES, description=st.one_of(TEXT, JSON), schema=SCHEMAS, example=PAYLOADS, version=JSON)
def test_a_hostile_registration_is_registered_or_refused_clearly(
    name: Any, description: Any, schema: Any, example: Any, version: Any
) -> None:
    catalog = EventCatalog()
    refused: InvalidFieldError | None = None
    try:
        event_type = catalog.register(
            name, description=description, schema=schema, example=example, version=version
        )
    except InvalidFieldError as exc:
        refused = exc
    if refused is not None:
        assert refused.field in ("name", "description", "schema", "example", "version")
        assert refused.message
        assert catalog.types() == []
        return
    assert catalog.types() == [event_type]
    assert event_type.problem(event_type.example) is None


@BUDGET
@given(payload=PAYLOADS)
def test_any_json_payload_matches_or_gets_a_path(payload: Any) -> None:
    try:
        data = json.loads(json.dumps(payload, allow_nan=False))
    except (ValueError, RecursionError, UnicodeError):
        return  # not a payload dispatch accepts: encode_payload refuses it before the catalog
    _, problem = order_catalog().check("order.created", data)
    assert problem is None or problem.path.startswith("$")


def test_a_type_builds_its_validator_once_and_still_explains_a_mismatch() -> None:
    event_type = order_catalog().get("order.created")
    assert event_type is not None
    assert event_type.validator() is event_type.validator()  # not rebuilt at every dispatch
    problem = event_type.problem({})
    assert problem is not None and problem.path == "$"
