"""Payload filters and custom headers of subscriptions: validation, fan-out on every store (dispatch
and the outbox relay), delivery to a real receiver, and the actuator, CLI and console."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest
import sqlalchemy as sa
import standardwebhooks
from flask import Flask
from flask.testing import FlaskClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from flask_harvest import (
    DeliveryState,
    OutboundWebhookHandler,
    WebhookSubscription,
    WebhookSubscriptionStatus,
    get_engine,
)
from flask_harvest.errors import InvalidFieldError
from flask_harvest.testing import CapturingReceiver
from flask_harvest.triggers.conditions import evaluate, parse_condition
from flask_harvest.webhooks.models import (
    MAX_HEADER_NAME_LENGTH,
    MAX_HEADER_VALUE_LENGTH,
    MAX_HEADERS,
    SubscriptionChanges,
    validate_headers,
)
from flask_harvest.webhooks.stores.sql import SqlOutboundWebhookStore

from .dashboard_client import PREFIX as CONSOLE
from .dashboard_client import dashboard_app, signed_in, text
from .pipeline import make_app, wait_final
from .test_actuator import AUTH, PREFIX, SECRET, TOKEN, snapshot

EU = {"type": "Eq", "data": {"path": "region", "value": "EU"}}
FILTERS: dict[str, dict[str, Any] | None] = {
    "sub_all": None,
    "sub_eu": EU,
    "sub_big": {"type": "GreaterThan", "data": {"path": "amount", "value": 500}},
    "sub_in": {"type": "In", "data": {"path": "kind", "values": ["a", "c"]}},
    "sub_mix": {
        "type": "Any",
        "data": [
            {
                "type": "All",
                "data": [EU, {"type": "LessThanOrEqual", "data": {"path": "amount", "value": 100}}],
            },
            {"type": "Not", "data": {"type": "Exists", "data": {"path": "amount"}}},
        ],
    },
    "sub_null": {"type": "IsNull", "data": {"path": "customer.tier"}},
}


def payloads(count: int) -> list[dict[str, Any]]:
    """Varied payloads: missing members, nulls, numbers on both sides of the thresholds, floats."""
    rng = random.Random(20260)
    made = []
    for n in range(count):
        payload: dict[str, Any] = {"n": n}
        if rng.random() < 0.8:
            payload["region"] = rng.choice(["EU", "US", None, 1])
        if rng.random() < 0.8:
            payload["amount"] = rng.choice([0, 100, 100.0, 100.5, 499, 500, 501, 10**20, -3, "600"])
        if rng.random() < 0.7:
            payload["kind"] = rng.choice(["a", "b", "c", None])
        if rng.random() < 0.5:
            payload["customer"] = {"tier": rng.choice([None, "gold"])} if rng.random() < 0.8 else None
        made.append(payload)
    return made


def subscribe_all(store: OutboundWebhookHandler) -> None:
    for sub_id, condition in FILTERS.items():
        store.add_subscription(
            WebhookSubscription(
                "http://127.0.0.1:9/h",
                ["order.*"],
                SECRET,
                id=sub_id,
                payload_filter=None if condition is None else parse_condition(condition),
            )
        )


def delivered_payloads(store: OutboundWebhookHandler) -> dict[str, list[int]]:
    return {
        sub_id: sorted(
            json.loads(d.payload)["n"] for d in store.list_deliveries(subscription_id=sub_id, limit=500)
        )
        for sub_id in FILTERS
    }


def expected(sent: list[dict[str, Any]]) -> dict[str, list[int]]:
    # The completion triggers' evaluator, reached through their module, on the JSON the receiver gets.
    return {
        sub_id: [
            p["n"]
            for p in sent
            if condition is None or evaluate(parse_condition(condition), json.loads(json.dumps(p)))
        ]
        for sub_id, condition in FILTERS.items()
    }


def test_dispatch_makes_exactly_the_deliveries_whose_payload_matches(store: OutboundWebhookHandler) -> None:
    subscribe_all(store)
    app = make_app(store, delegate=lambda delivery, subscription: None)
    sent = payloads(100)
    with app.app_context():
        for payload in sent:
            get_engine().manager.dispatch("order.created", payload)
    want = expected(sent)
    assert delivered_payloads(store) == want
    # The filters select something and leave something out, so the comparison means something.
    assert all(0 < len(want[s]) < 100 for s in FILTERS if s != "sub_all")


def test_a_changed_filter_applies_from_the_next_dispatch(store: OutboundWebhookHandler) -> None:
    # Parsed filters are kept between dispatches: a change must still reach the next one.
    store.add_subscription(
        WebhookSubscription(
            "http://127.0.0.1:9/f", ["order.*"], SECRET, id="sub_f", payload_filter=parse_condition(EU)
        )
    )
    app = make_app(store, delegate=lambda delivery, subscription: None)
    with app.app_context():
        manager = get_engine().manager
        assert manager.dispatch("order.created", {"region": "EU"}) != []
        assert manager.dispatch("order.created", {"region": "US"}) == []
        store.update_subscription(
            "sub_f",
            SubscriptionChanges(payload_filter={"type": "Eq", "data": {"path": "region", "value": "US"}}),
        )
        assert manager.dispatch("order.created", {"region": "EU"}) == []
        assert manager.dispatch("order.created", {"region": "US"}) != []
        store.update_subscription("sub_f", SubscriptionChanges(remove_payload_filter=True))
        assert manager.dispatch("order.created", {"region": "EU"}) != []


def test_the_outbox_relay_filters_the_same_way(sql_store: SqlOutboundWebhookStore) -> None:
    subscribe_all(sql_store)
    # The relay by hand only: a timed sweep could relay some messages first.
    app = make_app(
        sql_store, delegate=lambda delivery, subscription: None, HARVEST_SWEEP_INTERVAL_SECONDS=3600
    )
    sent = payloads(100)
    with app.app_context():
        manager = get_engine().manager
        with sql_store.db.engine.begin() as conn:
            for payload in sent:
                manager.dispatch_in_tx(conn, "order.created", payload)
        assert manager.relay_outbox(limit=1000).relayed == 100
        assert manager.relay_outbox(limit=1000).relayed == 0
    assert delivered_payloads(sql_store) == expected(sent)


def test_a_disabled_subscription_skips_only_the_matching_payloads(store: OutboundWebhookHandler) -> None:
    store.add_subscription(
        WebhookSubscription(
            "http://127.0.0.1:9/h",
            ["a.b"],
            SECRET,
            id="sub_off",
            status=WebhookSubscriptionStatus.DISABLED,
            payload_filter=parse_condition(EU),
        )
    )
    with make_app(store).app_context():
        get_engine().manager.dispatch("a.b", {"region": "US"})
        get_engine().manager.dispatch("a.b", {"region": "EU"})
    [skipped] = store.list_deliveries(subscription_id="sub_off")
    assert skipped.state is DeliveryState.SKIPPED and json.loads(skipped.payload) == {"region": "EU"}


def test_rows_of_earlier_versions_have_no_filter_and_no_headers(sql_store: SqlOutboundWebhookStore) -> None:
    sql_store.add_subscription(WebhookSubscription("http://127.0.0.1:9/h", ["a.b"], SECRET, id="sub_old"))
    with sql_store.db.engine.begin() as conn:
        conn.execute(
            sa.text("UPDATE harvest_webhook_subscriptions SET payload_filter = NULL, headers = NULL")
        )
    found = sql_store.get_subscription("sub_old")
    assert found is not None and found.payload_filter is None and found.headers == {}


def test_filters_and_headers_round_trip_and_change(store: OutboundWebhookHandler) -> None:
    sub = store.add_subscription(
        WebhookSubscription(
            "http://127.0.0.1:9/h",
            ["a.b"],
            SECRET,
            id="sub_1",
            payload_filter=parse_condition(EU),
            headers={"X-A": "1"},
        )
    )
    assert store.get_subscription("sub_1") == sub
    changed = store.update_subscription("sub_1", SubscriptionChanges(headers={"X-B": "2 3"}))
    assert (changed.payload_filter, changed.headers) == (parse_condition(EU), {"X-B": "2 3"})
    cleared = store.update_subscription("sub_1", SubscriptionChanges(remove_payload_filter=True, headers={}))
    assert (cleared.payload_filter, cleared.headers) == (None, {})
    assert store.get_subscription("sub_1") == cleared


# -- validation ----------------------------------------------------------------------------------------

HOSTILE_HEADERS: list[Any] = [
    ["X-A", "1"],
    {"": "x"},
    {"X A": "x"},
    {"X:A": "x"},
    {"X-\u00e9": "x"},
    {"x" * (MAX_HEADER_NAME_LENGTH + 1): "x"},
    {"X-A": "a\r\nX-Injected: 1"},
    {"X-A": "a\nb"},
    {"X-A": "a\x00"},
    {"X-A": "caf\u00e9"},
    {"X-A": " padded"},
    {"X-A": "x" * (MAX_HEADER_VALUE_LENGTH + 1)},
    {"X-A": 1},
    {"X-A": "1", "x-a": "2"},
    {f"X-{n}": "v" for n in range(MAX_HEADERS + 1)},
    {f"X-{n}": "v" * 1000 for n in range(5)},
    *({name: "x"} for name in ("Connection", "keep-alive", "Transfer-Encoding", "TE", "Trailer", "Upgrade")),
    *(
        {name: "x"}
        for name in ("Proxy-Authorization", "Host", "Content-Length", "content-type", "User-Agent")
    ),
    *({name: "x"} for name in ("Webhook-Id", "webhook-timestamp", "WEBHOOK-SIGNATURE", "Autumn-Signature")),
]
HOSTILE_FILTERS: list[Any] = [
    "Eq",
    [],
    {"type": "Eq"},
    {"type": "Nope", "data": {}},
    {"type": "Eq", "data": {"path": "a..b", "value": 1}},
    {"type": "Eq", "data": {"path": "a", "value": 1, "x": 2}},
    {"type": "In", "data": {"path": "a", "values": list(range(1000))}},
    {"type": "All", "data": [{"type": "Exists", "data": {"path": "a"}}] * 100},
    {
        "type": "Not",
        "data": {
            "type": "Not",
            "data": {
                "type": "Not",
                "data": {
                    "type": "Not",
                    "data": {
                        "type": "Not",
                        "data": {
                            "type": "Not",
                            "data": {
                                "type": "Not",
                                "data": {"type": "Not", "data": {"type": "Exists", "data": {"path": "a"}}},
                            },
                        },
                    },
                },
            },
        },
    },
]


@pytest.mark.parametrize("headers", HOSTILE_HEADERS)
def test_hostile_headers_are_refused_by_name(headers: Any) -> None:
    with pytest.raises(InvalidFieldError) as info:
        WebhookSubscription("http://127.0.0.1:9/h", ["a.b"], SECRET, headers=headers)
    assert info.value.field == "headers"
    assert "\r" not in info.value.message and "\x00" not in info.value.message


@pytest.mark.parametrize("condition", HOSTILE_FILTERS)
def test_hostile_filters_are_refused_by_name(condition: Any) -> None:
    with pytest.raises(InvalidFieldError) as info:
        SubscriptionChanges(payload_filter=condition)
    assert info.value.field.startswith("payload_filter")


@settings(max_examples=300)
@given(st.dictionaries(st.text(max_size=12), st.text(max_size=12) | st.integers(), max_size=6))
def test_any_headers_are_valid_or_refused_and_valid_ones_cannot_split_a_request(
    headers: dict[str, Any],
) -> None:
    try:
        kept = validate_headers(headers)
    except InvalidFieldError as exc:
        refused: InvalidFieldError | None = exc
    else:
        refused = None
    if refused is not None:
        assert refused.field == "headers"
        return
    assert kept == headers
    for name, value in kept.items():
        assert name.isascii() and value.isascii()
        assert not any(c in name + value for c in "\r\n\x00:")


# -- delivery ------------------------------------------------------------------------------------------


def test_a_real_receiver_gets_the_headers_and_the_signature_verifies(
    store: OutboundWebhookHandler, receiver: CapturingReceiver
) -> None:
    app = make_app(store, HARVEST_WEBHOOKS_SIGNATURE_HEADER="X-Shop-Signature")
    store.add_subscription(
        WebhookSubscription(
            receiver.url("/hook"),
            ["order.*"],
            SECRET,
            id="sub_h",
            payload_filter=parse_condition(EU),
            # Saved before the signature header was configured as it is: never sent over ours.
            headers={
                "X-Tenant": "acme",
                "Authorization": "Bearer not-a-secret",
                "x-shop-signature": "forged",
            },
        )
    )
    with app.app_context():
        assert get_engine().manager.dispatch("order.created", {"region": "US"}) == []
        [delivery_id] = get_engine().manager.dispatch("order.created", {"region": "EU"})
        assert wait_final(store, [delivery_id]) == [DeliveryState.DELIVERED]
    [request] = receiver.requests
    assert request.headers["x-tenant"] == "acme"
    assert request.headers["authorization"] == "Bearer not-a-secret"
    assert request.headers["x-shop-signature"] != "forged"
    assert request.headers["content-type"] == "application/json"
    standardwebhooks.Webhook(SECRET).verify(request.body, dict(request.headers))
    stored = store.get_delivery(delivery_id)
    assert stored is not None and stored.request_headers["X-Tenant"] == "acme"


def test_the_configured_signature_header_cannot_be_set(store: OutboundWebhookHandler) -> None:
    app = make_app(store, HARVEST_WEBHOOKS_SIGNATURE_HEADER="X-Shop-Signature")
    with app.app_context():
        operations = get_engine().operations
        with pytest.raises(InvalidFieldError, match="cannot be set"):
            operations.create_subscription(
                target_url="http://127.0.0.1:9/h", event_topics=["a.b"], headers={"X-SHOP-SIGNATURE": "x"}
            )
        created = operations.create_subscription(target_url="http://127.0.0.1:9/h", event_topics=["a.b"])
        with pytest.raises(InvalidFieldError):
            operations.update_subscription(created.subscription.id, headers={"x-shop-signature": "x"})
        assert store.list_subscriptions() == [created.subscription]


# -- actuator --------------------------------------------------------------------------------------------


@pytest.fixture
def client(store: OutboundWebhookHandler) -> FlaskClient:
    return make_app(store, HARVEST_ACTUATOR_TOKEN=TOKEN).test_client()


def call(client: FlaskClient, method: str, path: str, body: Any) -> Any:
    return client.open(PREFIX + path, method=method, json=body, headers=AUTH)


def test_the_actuator_sets_shows_and_removes_filters_and_headers(
    client: FlaskClient, store: OutboundWebhookHandler
) -> None:
    body = {
        "id": "sub_1",
        "target_url": "http://127.0.0.1:9/h",
        "event_topics": ["a.b"],
        "payload_filter": EU,
    }
    created = call(client, "POST", "/subscriptions", {**body, "headers": {"X-A": "1"}})
    assert created.status_code == 201, created.get_json()
    assert (created.get_json()["payload_filter"], created.get_json()["headers"]) == (EU, {"X-A": "1"})
    shown = call(client, "GET", "/subscriptions/sub_1", None).get_json()
    assert (shown["payload_filter"], shown["headers"]) == (EU, {"X-A": "1"})
    kept = call(client, "PATCH", "/subscriptions/sub_1", {"description": "d"}).get_json()
    assert (kept["payload_filter"], kept["headers"]) == (EU, {"X-A": "1"})
    removed = call(client, "PATCH", "/subscriptions/sub_1", {"payload_filter": None, "headers": {}})
    assert (removed.get_json()["payload_filter"], removed.get_json()["headers"]) == (None, {})
    found = store.get_subscription("sub_1")
    assert found is not None and found.payload_filter is None and found.headers == {}


@pytest.mark.parametrize(
    "field_value",
    [("headers", h) for h in HOSTILE_HEADERS] + [("payload_filter", f) for f in HOSTILE_FILTERS],
)
def test_hostile_values_get_a_422_and_change_nothing(
    client: FlaskClient, store: OutboundWebhookHandler, field_value: tuple[str, Any]
) -> None:
    name, value = field_value
    store.add_subscription(
        WebhookSubscription("http://127.0.0.1:9/h", ["a.b"], SECRET, id="sub_1", headers={"X-A": "1"})
    )
    before = snapshot(store)
    create = {"target_url": "http://127.0.0.1:9/h", "event_topics": ["a.b"], name: value}
    for method, path, body in (
        ("POST", "/subscriptions", create),
        ("PATCH", "/subscriptions/sub_1", {name: value}),
    ):
        response = call(client, method, path, body)
        assert response.status_code == 422, (method, response.get_json())
        error = response.get_json()["error"]
        assert name in error["fields"] and error["message"]
        assert snapshot(store) == before


CONDITION_LIKE = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.text(max_size=8)
    | st.fixed_dictionaries(
        {"type": st.sampled_from(["Eq", "In", "Not", "All", "Exists"]), "data": st.none()}
    ),
    lambda children: (
        st.lists(children, max_size=3)
        | st.dictionaries(
            st.sampled_from(["type", "data", "path", "value", "values", "x"]), children, max_size=3
        )
    ),
    max_leaves=10,
)


@pytest.mark.parametrize("store", ["memory"], indirect=True)
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    method_path=st.sampled_from([("POST", "/subscriptions"), ("PATCH", "/subscriptions/sub_1")]),
    payload_filter=CONDITION_LIKE,
    headers=CONDITION_LIKE | st.dictionaries(st.text(max_size=10), st.text(max_size=10), max_size=4),
)
def test_arbitrary_filters_and_headers_never_get_a_5xx_nor_a_change_on_4xx(
    client: FlaskClient,
    store: OutboundWebhookHandler,
    method_path: tuple[str, str],
    payload_filter: Any,
    headers: Any,
) -> None:
    if store.get_subscription("sub_1") is None:
        store.add_subscription(WebhookSubscription("http://127.0.0.1:9/h", ["a.b"], SECRET, id="sub_1"))
    before = snapshot(store)
    method, path = method_path
    body = {"payload_filter": payload_filter, "headers": headers}
    if method == "POST":
        body.update(target_url="http://127.0.0.1:9/h", event_topics=["a.b"])
    response = call(client, method, path, body)
    assert response.status_code < 500, response.get_data(as_text=True)
    if response.status_code >= 400:
        assert snapshot(store) == before
        assert response.get_json()["error"]["message"]


def test_the_actuator_is_closed_to_these_fields_too(store: OutboundWebhookHandler) -> None:
    closed = make_app(store).test_client()
    body = {"target_url": "http://127.0.0.1:9/h", "event_topics": ["a.b"], "headers": {"X-A": "1"}}
    assert closed.post(f"{PREFIX}/subscriptions", json=body).status_code == 403
    assert store.list_subscriptions() == []


# -- CLI and console ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("store", ["memory"], indirect=True)
def test_the_cli_sets_and_removes_filters_and_headers(store: OutboundWebhookHandler) -> None:
    runner = make_app(store).test_cli_runner()
    added = runner.invoke(
        args=[
            "harvest",
            "subscriptions",
            "add",
            "http://127.0.0.1:9/h",
            "--topic",
            "a.b",
            "--id",
            "sub_c",
            "--filter",
            json.dumps(EU),
            "--header",
            "X-Tenant: acme",
            "--json",
        ]
    )
    assert added.exit_code == 0, added.output
    assert json.loads(added.output)["headers"] == {"X-Tenant": "acme"}
    bad = runner.invoke(args=["harvest", "subscriptions", "update", "sub_c", "--filter", '{"type": "Nope"}'])
    assert bad.exit_code == 1 and "payload_filter" in bad.output
    broken = runner.invoke(args=["harvest", "subscriptions", "update", "sub_c", "--header", "Host: x"])
    assert broken.exit_code == 1 and "cannot be set" in broken.output
    found = store.get_subscription("sub_c")
    assert (
        found is not None
        and found.payload_filter == parse_condition(EU)
        and found.headers == {"X-Tenant": "acme"}
    )
    cleared = runner.invoke(
        args=["harvest", "subscriptions", "update", "sub_c", "--no-filter", "--no-headers"]
    )
    assert cleared.exit_code == 0, cleared.output
    found = store.get_subscription("sub_c")
    assert found is not None and found.payload_filter is None and found.headers == {}


def test_the_console_shows_and_edits_filters_and_headers(store: OutboundWebhookHandler) -> None:
    app: Flask = dashboard_app(store)
    client = app.test_client()
    csrf = signed_in(client)
    store.add_subscription(WebhookSubscription("http://127.0.0.1:9/h", ["a.b"], SECRET, id="sub_1"))
    edit = f"{CONSOLE}/webhooks/subscriptions/sub_1/edit"
    assert 'id="save-subscription"' in text(client.get(edit))
    saved = client.post(
        edit,
        data={
            "csrf_token": csrf,
            "payload_filter": json.dumps(EU),
            "headers": "X-Tenant: acme <b>\n\nX-B: 2",
        },
    )
    assert saved.status_code == 303
    found = store.get_subscription("sub_1")
    assert found is not None and found.payload_filter == parse_condition(EU)
    assert found.headers == {"X-Tenant": "acme <b>", "X-B": "2"}
    page = text(client.get(f"{CONSOLE}/webhooks/subscriptions/sub_1"))
    assert "X-Tenant: acme &lt;b&gt;" in page and "&#34;region&#34;" in page
    for bad in (
        {"payload_filter": '{"type": "Nope"}'},
        {"headers": "Connection: close"},
        {"headers": "no colon"},
    ):
        refused = client.post(edit, data={"csrf_token": csrf, "payload_filter": "", "headers": "", **bad})
        assert refused.status_code == 422, bad
        assert 'id="form-error"' in text(refused)
        assert store.get_subscription("sub_1") == found
    cleared = client.post(edit, data={"csrf_token": csrf, "payload_filter": "", "headers": ""})
    assert cleared.status_code == 303
    found = store.get_subscription("sub_1")
    assert found is not None and found.payload_filter is None and found.headers == {}
