"""A subscription's rate limit from every surface: the store, the actuator (hostile values get a
4xx and change nothing), the CLI and the console."""

from __future__ import annotations

import json
from typing import Any

import pytest
import sqlalchemy as sa
from flask import Flask
from flask.testing import FlaskClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from flask_harvest import OutboundWebhookHandler, WebhookSubscription
from flask_harvest.outbound.rate import RateLimit
from flask_harvest.webhooks.models import SubscriptionChanges
from flask_harvest.webhooks.stores.sql import SqlOutboundWebhookStore

from .dashboard_client import PREFIX as CONSOLE
from .dashboard_client import dashboard_app, signed_in, text
from .pipeline import make_app
from .test_actuator import AUTH, PREFIX, SECRET, TOKEN, snapshot

LIMIT = {"per_second": 10.0, "burst": 5}
HOSTILE = [
    {"per_second": 0, "burst": 1},
    {"per_second": -1, "burst": 1},
    {"per_second": 1e308, "burst": 1},
    {"per_second": 10, "burst": 0},
    {"per_second": 10, "burst": 1.5},
    {"per_second": 10, "burst": True},
    {"per_second": "10", "burst": 1},
    {"per_second": 10},
    {"per_second": 10, "burst": 1, "window": 2},
    [10, 1],
    "10/s",
    7,
]


@pytest.fixture
def client(store: OutboundWebhookHandler) -> FlaskClient:
    return make_app(store, HARVEST_ACTUATOR_TOKEN=TOKEN).test_client()


def call(client: FlaskClient, method: str, path: str, body: Any) -> Any:
    return client.open(PREFIX + path, method=method, json=body, headers=AUTH)


def test_a_rate_limit_round_trips_and_changes_on_every_store(store: OutboundWebhookHandler) -> None:
    limit = RateLimit(per_second=2.5, burst=3)
    store.add_subscription(
        WebhookSubscription("http://127.0.0.1:9/h", ["a.b"], SECRET, id="sub_1", rate_limit=limit)
    )
    found = store.get_subscription("sub_1")
    assert found is not None and found.rate_limit == limit
    store.update_subscription("sub_1", SubscriptionChanges(rate_limit={"per_second": 100, "burst": 1}))
    found = store.get_subscription("sub_1")
    assert found is not None and found.rate_limit == RateLimit(per_second=100.0, burst=1)
    store.update_subscription("sub_1", SubscriptionChanges(description="kept"))
    found = store.get_subscription("sub_1")
    assert found is not None and found.rate_limit == RateLimit(per_second=100.0, burst=1)
    store.update_subscription("sub_1", SubscriptionChanges(remove_rate_limit=True))
    found = store.get_subscription("sub_1")
    assert found is not None and found.rate_limit is None


def test_rows_of_earlier_versions_have_no_rate_limit(sql_store: SqlOutboundWebhookStore) -> None:
    sql_store.add_subscription(WebhookSubscription("http://127.0.0.1:9/h", ["a.b"], SECRET, id="sub_old"))
    with sql_store.db.engine.begin() as conn:
        conn.execute(sa.text("UPDATE harvest_webhook_subscriptions SET rate_limit = NULL"))
    found = sql_store.get_subscription("sub_old")
    assert found is not None and found.rate_limit is None


def test_the_actuator_sets_shows_keeps_and_removes_a_rate_limit(
    client: FlaskClient, store: OutboundWebhookHandler
) -> None:
    body = {"id": "sub_1", "target_url": "http://127.0.0.1:9/h", "event_topics": ["a.b"], "rate_limit": LIMIT}
    created = call(client, "POST", "/subscriptions", body)
    assert created.status_code == 201, created.get_json()
    assert created.get_json()["rate_limit"] == LIMIT
    assert call(client, "GET", "/subscriptions/sub_1", None).get_json()["rate_limit"] == LIMIT
    kept = call(client, "PATCH", "/subscriptions/sub_1", {"description": "d"}).get_json()
    assert kept["rate_limit"] == LIMIT
    changed = call(client, "PATCH", "/subscriptions/sub_1", {"rate_limit": {"per_second": 0.5, "burst": 2}})
    assert changed.get_json()["rate_limit"] == {"per_second": 0.5, "burst": 2}
    removed = call(client, "PATCH", "/subscriptions/sub_1", {"rate_limit": None})
    assert removed.get_json()["rate_limit"] is None
    found = store.get_subscription("sub_1")
    assert found is not None and found.rate_limit is None


@pytest.mark.parametrize("value", HOSTILE)
def test_hostile_rate_limits_get_a_422_naming_the_field_and_change_nothing(
    client: FlaskClient, store: OutboundWebhookHandler, value: Any
) -> None:
    store.add_subscription(
        WebhookSubscription("http://127.0.0.1:9/h", ["a.b"], SECRET, id="sub_1", rate_limit=RateLimit(1, 1))
    )
    before = snapshot(store)
    create = {"target_url": "http://127.0.0.1:9/h", "event_topics": ["a.b"], "rate_limit": value}
    for method, path, body in (
        ("POST", "/subscriptions", create),
        ("PATCH", "/subscriptions/sub_1", {"rate_limit": value}),
    ):
        response = call(client, method, path, body)
        assert response.status_code == 422, (method, response.get_json())
        error = response.get_json()["error"]
        assert "rate_limit" in error["fields"] and error["message"]
        assert snapshot(store) == before


JSONISH = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=6),
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=10), children, max_size=3)
    ),
    max_leaves=8,
)
RATE_LIKE = JSONISH | st.fixed_dictionaries(
    {
        "per_second": st.floats() | st.integers() | st.text(max_size=4) | st.none(),
        "burst": st.integers(-(2**70), 2**70) | st.floats() | st.booleans() | st.none(),
    }
)


@pytest.mark.parametrize("store", ["memory"], indirect=True)
@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    method_path=st.sampled_from([("POST", "/subscriptions"), ("PATCH", "/subscriptions/sub_1")]),
    value=RATE_LIKE,
)
def test_arbitrary_rate_limits_never_get_a_5xx_nor_a_change_on_4xx(
    client: FlaskClient, store: OutboundWebhookHandler, method_path: tuple[str, str], value: Any
) -> None:
    if store.get_subscription("sub_1") is None:
        store.add_subscription(WebhookSubscription("http://127.0.0.1:9/h", ["a.b"], SECRET, id="sub_1"))
    before = snapshot(store)
    method, path = method_path
    body: dict[str, Any] = {"rate_limit": value}
    if method == "POST":
        body.update(target_url="http://127.0.0.1:9/h", event_topics=["a.b"])
    response = call(client, method, path, body)
    assert response.status_code < 500, response.get_data(as_text=True)
    if response.status_code >= 400:
        assert snapshot(store) == before
        assert response.get_json()["error"]["message"]
    else:
        shown = response.get_json()["rate_limit"]
        assert shown is None or RateLimit(**shown).to_dict() == shown


@pytest.mark.parametrize("store", ["memory"], indirect=True)
def test_the_cli_sets_refuses_and_removes_a_rate_limit(store: OutboundWebhookHandler) -> None:
    runner = make_app(store).test_cli_runner()
    add = ["harvest", "subscriptions", "add", "http://127.0.0.1:9/h", "--topic", "a.b", "--id", "sub_c"]
    added = runner.invoke(args=[*add, "--rate", "10", "--burst", "5", "--json"])
    assert added.exit_code == 0, added.output
    assert json.loads(added.output)["rate_limit"] == LIMIT
    update = ["harvest", "subscriptions", "update", "sub_c"]
    for bad, says in (
        (["--rate", "0", "--burst", "1"], "per_second"),
        (["--rate", "nan", "--burst", "1"], "per_second"),
        (["--rate", "5"], "--burst"),
        (["--rate", "5", "--burst", "0"], "burst"),
        (["--rate", "5", "--burst", "1", "--no-rate"], "not both"),
    ):
        refused = runner.invoke(args=[*update, *bad])
        assert refused.exit_code == 1 and says in refused.output, (bad, refused.output)
    not_a_number = runner.invoke(args=[*update, "--rate", "fast", "--burst", "1"])
    assert not_a_number.exit_code == 2 and "--rate" in not_a_number.output
    found = store.get_subscription("sub_c")
    assert found is not None and found.rate_limit == RateLimit(10, 5)
    cleared = runner.invoke(args=[*update, "--no-rate"])
    assert cleared.exit_code == 0, cleared.output
    found = store.get_subscription("sub_c")
    assert found is not None and found.rate_limit is None


def test_the_console_shows_and_edits_a_rate_limit(store: OutboundWebhookHandler) -> None:
    app: Flask = dashboard_app(store)
    client = app.test_client()
    csrf = signed_in(client)
    store.add_subscription(WebhookSubscription("http://127.0.0.1:9/h", ["a.b"], SECRET, id="sub_1"))
    edit = f"{CONSOLE}/webhooks/subscriptions/sub_1/edit"
    form = {"csrf_token": csrf, "payload_filter": "", "headers": ""}
    saved = client.post(edit, data={**form, "rate_per_second": "12.5", "rate_burst": "4"})
    assert saved.status_code == 303
    found = store.get_subscription("sub_1")
    assert found is not None and found.rate_limit == RateLimit(12.5, 4)
    page = text(client.get(f"{CONSOLE}/webhooks/subscriptions/sub_1"))
    assert "12.5 per second, bursts of 4" in page
    assert 'value="12.5"' in text(client.get(edit))
    for bad in (
        {"rate_per_second": "12"},
        {"rate_burst": "3"},
        {"rate_per_second": "fast", "rate_burst": "3"},
        {"rate_per_second": "0", "rate_burst": "3"},
        {"rate_per_second": "inf", "rate_burst": "3"},
        {"rate_per_second": "5", "rate_burst": "-1"},
        {"rate_per_second": "5", "rate_burst": "1e3"},
    ):
        refused = client.post(edit, data={**form, **bad})
        assert refused.status_code == 422, bad
        assert 'id="form-error"' in text(refused)
        assert store.get_subscription("sub_1") == found
    cleared = client.post(edit, data={**form, "rate_per_second": "", "rate_burst": ""})
    assert cleared.status_code == 303
    found = store.get_subscription("sub_1")
    assert found is not None and found.rate_limit is None
