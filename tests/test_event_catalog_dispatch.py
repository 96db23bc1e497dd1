"""The event catalog at the edges: dispatch on every store (refuse, warn, strict), dispatch_in_tx on
SQL, the actuator's routes and subscription warnings, the CLI and the console page."""

from __future__ import annotations

import json
import logging
from decimal import Decimal
from typing import Any

import pytest
import sqlalchemy as sa
from flask import Flask

from flask_harvest import (
    DeliveryLog,
    InMemoryOutboundWebhookHandler,
    OutboundWebhookHandler,
    SqlOutboundWebhookStore,
    WebhookSubscription,
    generate_secret,
    get_engine,
)
from flask_harvest.errors import InvalidFieldError, PayloadSchemaError, UnknownEventTypeError
from flask_harvest.webhooks.stores._schema import outbox_table

from .dashboard_client import PREFIX as DASHBOARD
from .dashboard_client import dashboard_app, signed_in, text
from .pipeline import make_app
from .test_actuator import AUTH, PREFIX, TOKEN
from .test_event_catalog import ORDER_EXAMPLE, ORDER_SCHEMA

BAD = {"order_id": "ord_1", "total": 1, "items": [{"qty": 1}]}
BAD_PATH = "$.items[0]"


def catalog_app(store: OutboundWebhookHandler, handed: list[str] | None = None, **config: Any) -> Flask:
    """An app on ``store`` with ``order.created`` in its catalog and a subscription to ``order.*``;
    deliveries go to a delegate that records their ids (no HTTP)."""

    def delegate(delivery: DeliveryLog, _: WebhookSubscription) -> None:
        if handed is not None:
            handed.append(delivery.id)

    app = make_app(store, delegate=delegate, HARVEST_ACTUATOR_TOKEN=TOKEN, **config)
    get_engine(app).manager.catalog.register(
        "order.created", description="An order was placed.", schema=ORDER_SCHEMA, example=ORDER_EXAMPLE
    )
    store.add_subscription(WebhookSubscription("https://a.example.com/h", ["order.*"], generate_secret()))
    return app


def written(store: OutboundWebhookHandler) -> int:
    return store.count_deliveries(cap=1000)


# -- dispatch ---------------------------------------------------------------------------------------


def test_a_valid_payload_is_sent(store: OutboundWebhookHandler) -> None:
    handed: list[str] = []
    app = catalog_app(store, handed)
    with app.app_context():
        ids = get_engine().manager.dispatch("order.created", ORDER_EXAMPLE)
    assert len(ids) == 1
    assert handed == ids


def test_refuse_raises_naming_the_path_and_writes_nothing(store: OutboundWebhookHandler) -> None:
    handed: list[str] = []
    app = catalog_app(store, handed)
    with app.app_context(), pytest.raises(PayloadSchemaError) as caught:
        get_engine().manager.dispatch("order.created", BAD)
    assert caught.value.path == BAD_PATH
    assert caught.value.topic == "order.created"
    assert f"at {BAD_PATH}: 'sku' is a required property" in str(caught.value)
    assert isinstance(caught.value, InvalidFieldError)
    assert written(store) == 0
    assert handed == []


def test_warn_logs_the_path_and_sends(
    store: OutboundWebhookHandler, caplog: pytest.LogCaptureFixture
) -> None:
    handed: list[str] = []
    app = catalog_app(store, handed, HARVEST_EVENT_VALIDATION="warn")
    with app.app_context(), caplog.at_level(logging.WARNING, "flask_harvest.webhooks.manager"):
        ids = get_engine().manager.dispatch("order.created", BAD)
    assert handed == ids and len(ids) == 1
    [record] = [r for r in caplog.records if "does not match" in r.getMessage()]
    assert BAD_PATH in record.getMessage()
    assert "'order.created'" in record.getMessage()


def test_what_is_checked_is_the_json_sent(store: OutboundWebhookHandler) -> None:
    # A Decimal is sent as a string: a schema asking for a number refuses it, as a receiver would.
    app = catalog_app(store)
    with app.app_context(), pytest.raises(PayloadSchemaError, match=r"at \$\.total"):
        get_engine().manager.dispatch("order.created", {"order_id": "o", "total": Decimal("1.5")})


@pytest.mark.parametrize("mode", ["refuse", "warn"])
def test_an_unknown_type_is_sent_unless_the_catalog_is_strict(
    store: OutboundWebhookHandler, mode: str
) -> None:
    handed: list[str] = []
    app = catalog_app(store, handed, HARVEST_EVENT_VALIDATION=mode)
    with app.app_context():
        ids = get_engine().manager.dispatch("order.deleted", {"anything": True})
    assert handed == ids and len(ids) == 1

    strict_store = (
        InMemoryOutboundWebhookHandler() if isinstance(store, InMemoryOutboundWebhookHandler) else store
    )
    before = written(strict_store)
    strict = catalog_app(
        strict_store, handed, HARVEST_EVENT_VALIDATION=mode, HARVEST_EVENT_CATALOG_STRICT=True
    )
    with (
        strict.app_context(),
        pytest.raises(UnknownEventTypeError, match=r"'order\.deleted' is not an event type"),
    ):
        get_engine().manager.dispatch("order.deleted", {"anything": True})
    assert written(strict_store) == before
    assert len(handed) == 1


def test_a_strict_empty_catalog_refuses_every_topic() -> None:
    store = InMemoryOutboundWebhookHandler()
    app = make_app(store, HARVEST_EVENT_CATALOG_STRICT=True)
    with app.app_context(), pytest.raises(UnknownEventTypeError):
        get_engine().manager.dispatch("order.created", ORDER_EXAMPLE)


def test_without_a_catalog_nothing_is_checked(store: OutboundWebhookHandler) -> None:
    handed: list[str] = []
    app = make_app(store, delegate=lambda d, s: handed.append(d.id))
    store.add_subscription(WebhookSubscription("https://a.example.com/h", ["order.*"], generate_secret()))
    with app.app_context():
        assert len(get_engine().manager.dispatch("order.created", BAD)) == 1


def outbox_rows(store: SqlOutboundWebhookStore) -> list[str]:
    engine = store.capabilities.engine
    assert engine is not None
    with engine.connect() as conn:
        return [row.topic for row in conn.execute(sa.select(outbox_table.c.topic))]


@pytest.mark.parametrize(
    ("config", "payload", "topic", "error"),
    [
        ({}, BAD, "order.created", PayloadSchemaError),
        ({"HARVEST_EVENT_CATALOG_STRICT": True}, {}, "order.deleted", UnknownEventTypeError),
    ],
)
def test_dispatch_in_tx_refuses_before_writing_into_the_transaction(
    sql_store: SqlOutboundWebhookStore,
    config: dict[str, Any],
    payload: Any,
    topic: str,
    error: type[Exception],
) -> None:
    app = catalog_app(sql_store, **config)
    engine = sql_store.capabilities.engine
    assert engine is not None
    with app.app_context(), engine.begin() as conn:
        with pytest.raises(error):
            get_engine().manager.dispatch_in_tx(conn, topic, payload)
        # The caller's transaction goes on, and commits nothing of the refused event.
        get_engine().manager.dispatch_in_tx(conn, "order.created", ORDER_EXAMPLE)
    assert outbox_rows(sql_store) == ["order.created"]


def test_dispatch_in_tx_warns_and_writes(
    sql_store: SqlOutboundWebhookStore, caplog: pytest.LogCaptureFixture
) -> None:
    app = catalog_app(sql_store, HARVEST_EVENT_VALIDATION="warn")
    engine = sql_store.capabilities.engine
    assert engine is not None
    with app.app_context(), engine.begin() as conn, caplog.at_level(logging.WARNING):
        get_engine().manager.dispatch_in_tx(conn, "order.created", BAD)
    assert outbox_rows(sql_store) == ["order.created"]
    assert any(BAD_PATH in r.getMessage() for r in caplog.records)


# -- the actuator -----------------------------------------------------------------------------------


def test_the_actuator_lists_and_shows_event_types(store: OutboundWebhookHandler) -> None:
    client = catalog_app(store).test_client()
    listed = client.get(f"{PREFIX}/event-types", headers=AUTH)
    assert listed.status_code == 200
    assert [t["name"] for t in listed.get_json()] == ["order.created"]
    shown = client.get(f"{PREFIX}/event-types/order.created", headers=AUTH).get_json()
    assert shown == {
        "name": "order.created",
        "description": "An order was placed.",
        "version": 1,
        "schema": ORDER_SCHEMA,
        "example": ORDER_EXAMPLE,
    }
    missing = client.get(f"{PREFIX}/event-types/order.deleted", headers=AUTH)
    assert missing.status_code == 404
    assert missing.get_json()["error"]["code"] == "not_found"
    assert client.get(f"{PREFIX}/event-types").status_code == 401


def test_subscription_answers_warn_about_patterns_that_select_no_type(store: OutboundWebhookHandler) -> None:
    client = catalog_app(store).test_client()
    body = {
        "target_url": "https://b.example.com/h",
        "event_topics": ["order.*", "ordr.created"],
        "id": "sub_w",
    }
    created = client.post(f"{PREFIX}/subscriptions", json=body, headers=AUTH)
    assert created.status_code == 201
    assert created.get_json()["warnings"] == [
        "topic pattern 'ordr.created' matches no event type in the catalog"
    ]
    assert store.get_subscription("sub_w") is not None  # a warning, not a refusal
    patched = client.patch(f"{PREFIX}/subscriptions/sub_w", json={"event_topics": ["user.*"]}, headers=AUTH)
    assert patched.status_code == 200
    assert patched.get_json()["warnings"] == ["topic pattern 'user.*' matches no event type in the catalog"]
    fine = client.patch(
        f"{PREFIX}/subscriptions/sub_w", json={"event_topics": ["order.created"]}, headers=AUTH
    )
    assert "warnings" not in fine.get_json()
    untouched = client.patch(f"{PREFIX}/subscriptions/sub_w", json={"description": "x"}, headers=AUTH)
    assert "warnings" not in untouched.get_json()


def test_without_a_catalog_subscriptions_get_no_warnings(store: OutboundWebhookHandler) -> None:
    client = make_app(store, HARVEST_ACTUATOR_TOKEN=TOKEN).test_client()
    body = {"target_url": "https://b.example.com/h", "event_topics": ["anything.*"]}
    created = client.post(f"{PREFIX}/subscriptions", json=body, headers=AUTH)
    assert created.status_code == 201
    assert "warnings" not in created.get_json()
    assert client.get(f"{PREFIX}/event-types", headers=AUTH).get_json() == []


# -- the CLI ----------------------------------------------------------------------------------------


def test_the_cli_lists_shows_and_renders_the_catalog() -> None:
    runner = catalog_app(InMemoryOutboundWebhookHandler()).test_cli_runner()
    listed = runner.invoke(args=["harvest", "event-types", "list"])
    assert listed.exit_code == 0, listed.output
    assert "order.created" in listed.output and "An order was placed." in listed.output
    as_json = runner.invoke(args=["harvest", "event-types", "list", "--json"])
    assert json.loads(as_json.output)[0]["schema"] == ORDER_SCHEMA
    shown = runner.invoke(args=["harvest", "event-types", "show", "order.created"])
    assert shown.exit_code == 0 and '"order_id": "ord_1"' in shown.output
    missing = runner.invoke(args=["harvest", "event-types", "show", "order.deleted"])
    assert missing.exit_code == 1
    assert "Error: no event type named 'order.deleted'" in missing.output
    page = runner.invoke(args=["harvest", "event-types", "rst", "--title", "Our events"])
    assert page.output.startswith("Our events\n==========\n")


def test_subscriptions_add_prints_a_warning_on_stderr() -> None:
    runner = catalog_app(InMemoryOutboundWebhookHandler()).test_cli_runner()
    added = runner.invoke(
        args=["harvest", "subscriptions", "add", "https://c.example.com/h", "--topic", "ordr.*"]
    )
    assert added.exit_code == 0, added.output
    assert "Warning: topic pattern 'ordr.*' matches no event type in the catalog" in added.stderr
    assert "Warning" not in added.stdout
    as_json = runner.invoke(
        args=["harvest", "subscriptions", "add", "https://c.example.com/h", "--topic", "ordr.*", "--json"]
    )
    assert json.loads(as_json.stdout)["warnings"] == [
        "topic pattern 'ordr.*' matches no event type in the catalog"
    ]


# -- the console ------------------------------------------------------------------------------------


def test_the_console_page_shows_each_type_and_is_in_the_navigation() -> None:
    store = InMemoryOutboundWebhookHandler()
    app = dashboard_app(store)
    get_engine(app).manager.catalog.register(
        "order.created", description="An <b>order</b>.", schema=ORDER_SCHEMA, example=ORDER_EXAMPLE, version=2
    )
    client = app.test_client()
    signed_in(client)
    page = text(client.get(f"{DASHBOARD}/webhooks/event-types"))
    assert 'href="/harvest/webhooks/event-types"' in text(client.get(f"{DASHBOARD}/"))
    assert "order.created" in page and "Version 2" in page
    assert "An &lt;b&gt;order&lt;/b&gt;." in page  # escaped, never markup
    assert "&#34;minimum&#34;: 0" in page and "&#34;sku&#34;: &#34;A-1&#34;" in page


def test_the_console_warns_about_a_new_subscriptions_unmatched_pattern() -> None:
    store = InMemoryOutboundWebhookHandler()
    app = dashboard_app(store)
    get_engine(app).manager.catalog.register("order.created", schema=ORDER_SCHEMA, example=ORDER_EXAMPLE)
    client = app.test_client()
    csrf = signed_in(client)
    form = {"target_url": "https://d.example.com/h", "topics": "order.* ordr.x", "csrf_token": csrf}
    created = client.post(f"{DASHBOARD}/webhooks/subscriptions/new", data=form)
    assert created.status_code == 201
    assert "Warning: topic pattern &#39;ordr.x&#39; matches no event type in the catalog" in text(created)
    assert "order.*&#39; matches" not in text(created)
