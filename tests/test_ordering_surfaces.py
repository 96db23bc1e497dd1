"""Ordered delivery from its operator surfaces: the ordering policy in the actuator (hostile values
get a 4xx and change nothing) and the CLI, the skip and blocked-keys routes, and dispatch's key."""

from __future__ import annotations

import json
from typing import Any

import pytest
from flask.testing import FlaskClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from flask_harvest import DeliveryState, EnqueueError, OutboundWebhookHandler, WebhookSubscription, get_engine
from flask_harvest.webhooks.models import utcnow
from flask_harvest.webhooks.ordering import OrderingPolicy

from .pipeline import make_app
from .test_actuator import AUTH, PREFIX, SECRET, TOKEN, snapshot
from .test_ordered_store import fail_attempt, log_keyed
from .test_subscription_rate_limit import JSONISH


@pytest.fixture
def client(store: OutboundWebhookHandler) -> FlaskClient:
    return make_app(store, HARVEST_ACTUATOR_TOKEN=TOKEN).test_client()


def call(client: FlaskClient, method: str, path: str, body: Any = None) -> Any:
    return client.open(PREFIX + path, method=method, json=body, headers=AUTH)


def test_the_actuator_sets_shows_and_changes_the_policy(
    client: FlaskClient, store: OutboundWebhookHandler
) -> None:
    create = {"target_url": "http://127.0.0.1:9/h", "event_topics": ["a.b"], "id": "sub_o"}
    created = call(client, "POST", "/subscriptions", create)
    assert created.status_code == 201 and created.get_json()["ordering_policy"] == "block"
    changed = call(client, "PATCH", "/subscriptions/sub_o", {"ordering_policy": "skip"})
    assert changed.status_code == 200 and changed.get_json()["ordering_policy"] == "skip"
    found = store.get_subscription("sub_o")
    assert found is not None and found.ordering_policy is OrderingPolicy.SKIP


@pytest.mark.parametrize("store", ["memory"], indirect=True)
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    method_path=st.sampled_from([("POST", "/subscriptions"), ("PATCH", "/subscriptions/sub_1")]),
    value=JSONISH,
)
def test_arbitrary_policies_never_get_a_5xx_nor_a_change_on_4xx(
    client: FlaskClient, store: OutboundWebhookHandler, method_path: tuple[str, str], value: Any
) -> None:
    if store.get_subscription("sub_1") is None:
        store.add_subscription(WebhookSubscription("http://127.0.0.1:9/h", ["a.b"], SECRET, id="sub_1"))
    before = snapshot(store)
    method, path = method_path
    body: dict[str, Any] = {"ordering_policy": value}
    if method == "POST":
        body.update(target_url="http://127.0.0.1:9/h", event_topics=["a.b"])
    response = call(client, method, path, body)
    assert response.status_code < 500, response.get_data(as_text=True)
    if value in ("block", "skip"):
        assert response.status_code in (200, 201)
        assert response.get_json()["ordering_policy"] == value
    else:
        error = response.get_json()["error"]
        if error["code"] == "bad_json":  # NaN and infinities are not JSON: refused before the field
            assert response.status_code == 400
        else:
            assert response.status_code == 422, error
            assert "ordering_policy" in error["fields"]
        assert snapshot(store) == before


def test_skip_and_blocked_keys_release_a_held_key(client: FlaskClient, store: OutboundWebhookHandler) -> None:
    sub = store.add_subscription(WebhookSubscription("http://127.0.0.1:9/h", ["a.b"], SECRET, id="sub_k")).id
    now = utcnow()
    # Logged straight into the store: no job, and the sweeper leaves rows due less than 2 s alone.
    head, waiting = log_keyed(store, sub, now, "order-42"), log_keyed(store, sub, now, "order-42")
    refused = call(client, "POST", f"/deliveries/{head.id}/skip", {})
    assert refused.status_code == 409, refused.get_json()
    fail_attempt(store, head, now, DeliveryState.DLQ)
    blocked = call(client, "GET", "/subscriptions/sub_k/blocked-keys")
    assert blocked.get_json() == [{"ordering_key": "order-42", "delivery_id": head.id, "waiting": 1}]
    assert call(client, "GET", "/subscriptions/sub_none/blocked-keys").status_code == 404
    assert call(client, "POST", f"/deliveries/{head.id}/skip").status_code in (400, 415)  # a body is required
    skipped = call(client, "POST", f"/deliveries/{head.id}/skip", {})
    assert skipped.status_code == 200 and skipped.get_json()["state"] == "skipped"
    assert call(client, "GET", "/subscriptions/sub_k/blocked-keys").get_json() == []
    assert store.get_delivery(waiting.id) is not None


@pytest.mark.parametrize("store", ["memory"], indirect=True)
def test_the_cli_sets_and_refuses_a_policy_and_skips(store: OutboundWebhookHandler) -> None:
    runner = make_app(store).test_cli_runner()
    add = ["harvest", "subscriptions", "add", "http://127.0.0.1:9/h", "--topic", "a.b", "--id", "sub_c"]
    added = runner.invoke(args=[*add, "--ordering-policy", "skip", "--json"])
    assert added.exit_code == 0, added.output
    assert json.loads(added.output)["ordering_policy"] == "skip"
    refused = runner.invoke(
        args=["harvest", "subscriptions", "update", "sub_c", "--ordering-policy", "maybe"]
    )
    assert refused.exit_code == 2 and "--ordering-policy" in refused.output
    changed = runner.invoke(
        args=["harvest", "subscriptions", "update", "sub_c", "--ordering-policy", "block"]
    )
    assert changed.exit_code == 0, changed.output
    found = store.get_subscription("sub_c")
    assert found is not None and found.ordering_policy is OrderingPolicy.BLOCK
    missing = runner.invoke(args=["harvest", "dlq", "skip", "msg_nothing"])
    assert missing.exit_code == 1 and "msg_nothing" in missing.output


def test_a_failed_enqueue_dead_letters_only_the_deliveries_it_failed_to_queue(
    store: OutboundWebhookHandler,
) -> None:
    # The job backend is down (nothing listens on port 9): dispatch queues the head of each line.
    app = make_app(store, HARVEST_JOBS_BACKEND="rq", HARVEST_REDIS_URL="redis://127.0.0.1:9/0")
    for sub_id in ("sub_held", "sub_free"):
        store.add_subscription(WebhookSubscription("http://127.0.0.1:9/h", ["order.*"], SECRET, id=sub_id))
    earlier = log_keyed(store, "sub_held", utcnow(), "order-42")  # holds sub_held's line
    with app.app_context(), pytest.raises(EnqueueError) as caught:
        get_engine().manager.dispatch("order.created", {}, ordering_key="order-42")
    [failed] = caught.value.delivery_ids
    dead = store.get_delivery(failed)
    assert dead is not None and (dead.subscription_id, dead.state) == ("sub_free", DeliveryState.DLQ)
    # The delivery behind the earlier one needed no job: it keeps its place in line.
    [behind] = [d for d in store.list_deliveries(subscription_id="sub_held") if d.id != earlier.id]
    assert behind.state is DeliveryState.PENDING
    assert store.blocked_keys("sub_held") == []
    assert [d.id for d in store.list_dlq()] == [failed]
