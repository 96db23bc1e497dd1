"""The actuator's OpenAPI document: served, valid OpenAPI 3, and covering every route."""

from __future__ import annotations

from typing import Any

import pytest
from flask import Flask
from openapi_spec_validator import validate

from flask_harvest import InMemoryOutboundWebhookHandler, get_engine

from .pipeline import make_app
from .test_actuator import AUTH, PREFIX, TOKEN


@pytest.fixture
def app() -> Flask:
    return make_app(InMemoryOutboundWebhookHandler(), HARVEST_ACTUATOR_TOKEN=TOKEN)


@pytest.fixture
def document(app: Flask) -> dict[str, Any]:
    response = app.test_client().get(f"{PREFIX}/openapi.json", headers=AUTH)
    assert response.status_code == 200
    body: dict[str, Any] = response.get_json()
    return body


def test_the_document_is_valid_openapi(document: dict[str, Any]) -> None:
    validate(document)
    assert document["servers"] == [{"url": PREFIX}]


def test_the_document_is_behind_the_access_check(app: Flask) -> None:
    assert app.test_client().get(f"{PREFIX}/openapi.json").status_code == 401


def test_every_actuator_route_is_described(app: Flask, document: dict[str, Any]) -> None:
    routes = set()
    for rule in app.url_map.iter_rules():
        if not rule.endpoint.startswith("harvest_actuator.") or rule.endpoint.endswith("unknown_route"):
            continue
        path = rule.rule.removeprefix(PREFIX).replace("<", "{").replace(">", "}")
        for method in (rule.methods or set()) - {"HEAD", "OPTIONS"}:
            routes.add((path, method.lower()))
    described = {(path, method) for path, item in document["paths"].items() for method in item}
    assert routes == described


def test_request_bodies_come_from_the_schemas(document: dict[str, Any]) -> None:
    schemas = document["components"]["schemas"]
    assert schemas["Replay"]["properties"]["dry_run"]["type"] == "boolean"
    assert schemas["SubscriptionCreate"]["required"] == ["event_topics", "target_url"]
    assert schemas["SubscriptionCreate"]["additionalProperties"] is False
    assert schemas["SubscriptionCreate"]["properties"]["description"]["maxLength"] == 2048


def test_the_document_lists_the_event_catalog(store_app_with_catalog: Flask) -> None:
    document = store_app_with_catalog.test_client().get(f"{PREFIX}/openapi.json", headers=AUTH).get_json()
    validate(document)
    hooks = document["x-webhooks"]
    assert list(hooks) == ["order.created"]
    body = hooks["order.created"]["post"]["requestBody"]["content"]["application/json"]
    assert body["schema"] == ORDER_SCHEMA and body["example"] == {"order_id": "ord_1"}
    assert hooks["order.created"]["post"]["summary"] == "An order was placed."


def test_without_a_catalog_there_is_no_webhooks_section(document: dict[str, Any]) -> None:
    assert "x-webhooks" not in document


ORDER_SCHEMA = {"type": "object", "required": ["order_id"], "properties": {"order_id": {"type": "string"}}}


@pytest.fixture
def store_app_with_catalog() -> Flask:
    app = make_app(InMemoryOutboundWebhookHandler(), HARVEST_ACTUATOR_TOKEN=TOKEN)
    get_engine(app).manager.catalog.register(
        "order.created",
        description="An order was placed.",
        schema=ORDER_SCHEMA,
        example={"order_id": "ord_1"},
    )
    return app
