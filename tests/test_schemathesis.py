"""schemathesis against the live actuator: requests generated from its OpenAPI document, on a
real store; the property is that none gets a 5xx."""

from __future__ import annotations

from typing import Any

import pytest
import redis
import schemathesis
from flask import Flask
from hypothesis import given, settings
from schemathesis.core.result import Ok

from flask_harvest import OutboundWebhookHandler, WebhookSubscription, get_engine
from flask_harvest.webhooks.openapi import build_openapi

from .pipeline import make_app
from .properties import EXAMPLES
from .test_actuator import AUTH, PREFIX, SECRET, TOKEN, dead_letters


@pytest.fixture
def app(store: OutboundWebhookHandler, redis_conn: redis.Redis, redis_url: str) -> Flask:
    return make_app(
        store, HARVEST_ACTUATOR_TOKEN=TOKEN, HARVEST_JOBS_BACKEND="rq", HARVEST_REDIS_URL=redis_url
    )


def test_no_generated_request_gets_a_5xx(app: Flask, store: OutboundWebhookHandler) -> None:
    store.add_subscription(WebhookSubscription("https://a.example.com/h", ("a.b",), SECRET, id="sub_1"))
    dead_letters(store, 2)
    get_engine(app).manager.catalog.register("order.created", schema={"type": "object"}, example={})
    schema = schemathesis.openapi.from_dict(build_openapi(PREFIX, get_engine(app).operations.event_types()))
    operations = []
    for result in schema.get_all_operations():
        assert isinstance(result, Ok), result  # the document describes every operation fully
        operations.append(result.ok())
    assert len(operations) == 17

    for operation in operations:

        @settings(max_examples=max(EXAMPLES // 4, 10), deadline=None, database=None)
        @given(case=operation.as_strategy())
        def no_5xx(case: Any) -> None:
            response = case.call(app=app, headers=AUTH)
            assert response.status_code < 500, f"{case.method} {case.formatted_path}: {response.text}"

        no_5xx()
