"""The actuator blueprint through Flask's test client, on every store."""

from __future__ import annotations

import base64
import json
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
import redis
import sqlalchemy as sa
import standardwebhooks
from flask import Flask
from flask.testing import FlaskClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from flask_harvest import (
    DeliveryLog,
    DeliveryState,
    OutboundWebhookHandler,
    WebhookSubscription,
    generate_secret,
    get_engine,
)
from flask_harvest.testing import CapturingReceiver
from flask_harvest.webhooks.operations import STATS_COUNT_CAP
from flask_harvest.webhooks.stores._schema import deliveries_table
from flask_harvest.webhooks.stores.sql import SqlOutboundWebhookStore

from .pipeline import before_first_update, make_app, rq_app, wait_final
from .test_models import SEED_DLQ_FIELDS
from .test_store_contract import fail_once, in_threads, make_delivery

TOKEN = "test-actuator-token-0123456789"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
PREFIX = "/actuator/webhooks"
SECRET = generate_secret()
T0 = datetime(2026, 12, 1, 12, 0, tzinfo=timezone.utc)


@pytest.fixture
def app(store: OutboundWebhookHandler) -> Flask:
    return make_app(store, HARVEST_ACTUATOR_TOKEN=TOKEN)


@pytest.fixture
def client(app: Flask) -> FlaskClient:
    return app.test_client()


def call(client: FlaskClient, method: str, path: str, body: Any = None, **kw: Any) -> Any:
    headers = {**AUTH, **kw.pop("headers", {})}
    return client.open(PREFIX + path, method=method, json=body, headers=headers, **kw)


def dead_letters(
    store: OutboundWebhookHandler, count: int, subscription_id: str = "sub_1", topic: str = "a.b"
) -> list[str]:
    """Log ``count`` dead-lettered deliveries, one minute apart, oldest first."""
    rows = [
        DeliveryLog(
            id=f"msg_{subscription_id}_{n:03d}",
            subscription_id=subscription_id,
            topic=topic,
            payload=json.dumps({"n": n}),
            state=DeliveryState.DLQ,
            attempt=5,
            last_error="server returned status: 500",
            timestamp=T0 + timedelta(minutes=n),
            next_attempt_at=None,
        )
        for n in range(count)
    ]
    store.log_deliveries(rows)
    return [r.id for r in rows]


def snapshot(store: OutboundWebhookHandler) -> Any:
    """Everything a request could change, to compare before and after a refused one."""
    subscriptions = [(s.to_dict(), s.secret) for s in store.list_subscriptions()]
    deliveries = sorted((d.id, d.state.value, d.attempt) for d in store.list_dlq(limit=1000))
    return subscriptions, deliveries


ROUTES = [
    ("GET", "/dlq"),
    ("POST", "/replay"),
    ("GET", "/deliveries/msg_x"),
    ("GET", "/stats"),
    ("GET", "/subscriptions"),
    ("POST", "/subscriptions"),
    ("GET", "/subscriptions/sub_1"),
    ("PATCH", "/subscriptions/sub_1"),
    ("DELETE", "/subscriptions/sub_1"),
    ("POST", "/subscriptions/sub_1/rotate-secret"),
    ("GET", "/event-types"),
    ("GET", "/event-types/order.created"),
]


# -- auth ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("method", "path"), ROUTES)
def test_every_route_is_closed_without_a_token_or_authorizer(
    store: OutboundWebhookHandler, method: str, path: str
) -> None:
    client = make_app(store).test_client()
    response = client.open(PREFIX + path, method=method, json={}, headers=AUTH)
    assert response.status_code == 403
    assert response.get_json()["error"]["code"] == "actuator_disabled"


@pytest.mark.parametrize(("method", "path"), ROUTES)
def test_a_missing_or_wrong_token_is_refused(client: FlaskClient, method: str, path: str) -> None:
    assert client.open(PREFIX + path, method=method, json={}).status_code == 401
    wrong = client.open(PREFIX + path, method=method, json={}, headers={"Authorization": "Bearer nope"})
    assert wrong.status_code == 401
    assert wrong.headers["WWW-Authenticate"].startswith("Bearer")


def test_an_authorizer_decides_when_registered(store: OutboundWebhookHandler) -> None:
    app = make_app(store)
    state = get_engine(app)
    assert state.access.authorizer is None

    def only_admins(request: Any) -> bool:
        return bool(request.headers.get("X-Role") == "admin")

    state.access.authorizer = only_admins
    client = app.test_client()
    assert client.get(f"{PREFIX}/stats", headers={"X-Role": "admin"}).status_code == 200
    assert client.get(f"{PREFIX}/stats", headers={"X-Role": "guest"}).status_code == 403


def test_the_plugin_decorator_registers_the_authorizer(store: OutboundWebhookHandler) -> None:
    from flask_harvest import OutboundWebhookPlugin

    app = Flask("decorated")
    plugin = OutboundWebhookPlugin(store, app)

    @plugin.actuator_authorizer
    def everyone(request: Any) -> bool:
        return True

    try:
        assert app.test_client().get(f"{PREFIX}/stats").status_code == 200
    finally:
        get_engine(app).close()


# -- subscriptions ---------------------------------------------------------------------------------


def test_create_returns_a_generated_secret_once(client: FlaskClient, store: OutboundWebhookHandler) -> None:
    created = call(
        client,
        "POST",
        "/subscriptions",
        {"target_url": "https://hooks.example.com/a", "event_topics": ["order.*"]},
    )
    assert created.status_code == 201
    body = created.get_json()
    assert body["secret"].startswith("whsec_")
    stored = store.get_subscription(body["id"])
    assert stored is not None
    assert stored.secret == body["secret"]
    for path in ("/subscriptions", f"/subscriptions/{body['id']}"):
        shown = call(client, "GET", path)
        assert shown.status_code == 200
        assert body["secret"] not in shown.get_data(as_text=True)


def test_a_plain_secret_is_stored_in_the_standard_form(
    app: Flask, client: FlaskClient, store: OutboundWebhookHandler, receiver: CapturingReceiver
) -> None:
    # Issue 12, defect 3: a secret without whsec_ was kept as given, and receivers using the
    # standardwebhooks library could not verify with it. It is now stored as whsec_ + base64 of
    # its bytes: the same HMAC key, in the form every receiver takes.
    plain = "our-shared-secret"
    created = call(
        client,
        "POST",
        "/subscriptions",
        {"target_url": receiver.url("/hook"), "event_topics": ["a.b"], "secret": plain, "id": "sub_1"},
    )
    assert created.status_code == 201
    shown = created.get_json()["secret"]
    assert shown == "whsec_" + base64.b64encode(plain.encode()).decode()
    stored = store.get_subscription("sub_1")
    assert stored is not None
    assert stored.secret == shown
    rotated = call(client, "POST", "/subscriptions/sub_1/rotate-secret", {"secret": "next-plain-secret"})
    assert rotated.get_json()["secret"] == "whsec_" + base64.b64encode(b"next-plain-secret").decode()

    with app.app_context():
        get_engine().manager.dispatch("a.b", {"x": 1})
    [request] = receiver.wait_for(1)
    standardwebhooks.Webhook(rotated.get_json()["secret"]).verify(request.body, dict(request.headers))
    standardwebhooks.Webhook(shown).verify(request.body, dict(request.headers))  # the grace period


def test_create_refuses_bad_input_and_stores_nothing(
    client: FlaskClient, store: OutboundWebhookHandler
) -> None:
    good = {"target_url": "https://hooks.example.com/a", "event_topics": ["order.*"]}
    bad_bodies = [
        {},
        {**good, "target_url": "not a url"},
        {**good, "target_url": 42},
        {**good, "event_topics": []},
        {**good, "event_topics": "order.*"},
        {**good, "event_topics": ["bad topic"]},
        {**good, "secret": ""},
        {**good, "secret": "whsec_!!!"},
        {**good, "unknown": 1},
        {**good, "id": ""},
    ]
    for bad in bad_bodies:
        response = call(client, "POST", "/subscriptions", bad)
        assert response.status_code == 422, (bad, response.get_json())
        assert "fields" in response.get_json()["error"]
    assert store.list_subscriptions() == []


def test_malformed_requests_get_clear_4xx(client: FlaskClient, store: OutboundWebhookHandler) -> None:
    url = f"{PREFIX}/subscriptions"
    not_json = client.post(url, data="{", headers={**AUTH, "Content-Type": "application/json"})
    assert not_json.status_code == 400
    assert client.post(url, json=[1, 2], headers=AUTH).status_code == 400
    assert client.post(url, data="x=1", headers=AUTH).status_code == 415
    huge = {"target_url": "https://hooks.example.com/a", "event_topics": ["a"], "description": "x" * 100_000}
    assert client.post(url, json=huge, headers=AUTH).status_code == 413
    assert store.list_subscriptions() == []


def test_patch_enables_disables_and_changes(client: FlaskClient, store: OutboundWebhookHandler) -> None:
    store.add_subscription(WebhookSubscription("https://a.example.com/h", ["a.b"], SECRET, id="sub_1"))
    disabled = call(client, "PATCH", "/subscriptions/sub_1", {"status": "disabled"})
    assert disabled.get_json()["status"] == "disabled"
    changed = call(
        client,
        "PATCH",
        "/subscriptions/sub_1",
        {"status": "active", "event_topics": ["c.*"], "target_url": "https://b.example.com/h"},
    )
    assert changed.status_code == 200
    stored = store.get_subscription("sub_1")
    assert stored is not None
    assert (stored.status.value, stored.event_topics, stored.target_url) == (
        "active",
        ("c.*",),
        "https://b.example.com/h",
    )
    assert call(client, "PATCH", "/subscriptions/sub_1", {}).status_code == 422
    assert call(client, "PATCH", "/subscriptions/sub_1", {"status": "failed"}).status_code == 422
    assert call(client, "PATCH", "/subscriptions/nope", {"status": "disabled"}).status_code == 404


def test_delete_and_duplicates(client: FlaskClient, store: OutboundWebhookHandler) -> None:
    body = {"id": "sub_1", "target_url": "https://a.example.com/h", "event_topics": ["a.b"]}
    assert call(client, "POST", "/subscriptions", body).status_code == 201
    assert call(client, "POST", "/subscriptions", body).status_code == 409
    assert call(client, "DELETE", "/subscriptions/sub_1").status_code == 204
    assert call(client, "DELETE", "/subscriptions/sub_1").status_code == 404
    assert call(client, "GET", "/subscriptions/sub_1").status_code == 404


# -- DLQ, replay, deliveries, stats -----------------------------------------------------------------


def test_dlq_pages_newest_first_with_a_cursor_and_filters(
    client: FlaskClient, store: OutboundWebhookHandler
) -> None:
    ids = dead_letters(store, 5)
    other = dead_letters(store, 1, subscription_id="sub_2", topic="c.d")
    first = call(client, "GET", "/dlq?limit=2&subscription_id=sub_1")
    assert [d["id"] for d in first.get_json()] == [ids[4], ids[3]]
    assert set(first.get_json()[0]) >= SEED_DLQ_FIELDS
    second = call(
        client, "GET", f"/dlq?limit=2&subscription_id=sub_1&cursor={first.headers['X-Next-Cursor']}"
    )
    assert [d["id"] for d in second.get_json()] == [ids[2], ids[1]]
    third = call(
        client, "GET", f"/dlq?limit=2&subscription_id=sub_1&cursor={second.headers['X-Next-Cursor']}"
    )
    assert [d["id"] for d in third.get_json()] == [ids[0]]
    assert "X-Next-Cursor" not in third.headers
    assert [d["id"] for d in call(client, "GET", "/dlq?topic=c.d").get_json()] == other
    assert call(client, "GET", "/dlq?cursor=garbage").status_code == 422
    assert call(client, "GET", "/dlq?limit=0").status_code == 422
    assert call(client, "GET", "/dlq?limit=abc").status_code == 422


def test_replay_sends_the_same_id_again(
    app: Flask, client: FlaskClient, store: OutboundWebhookHandler, receiver: CapturingReceiver
) -> None:
    store.add_subscription(WebhookSubscription(receiver.url("/hook"), ["a.b"], SECRET, id="sub_1"))
    [delivery_id] = dead_letters(store, 1)
    response = call(client, "POST", "/replay", {"log_id": delivery_id})
    assert response.status_code == 200
    assert response.get_json()["delivery_ids"] == [delivery_id]
    assert wait_final(store, [delivery_id]) == [DeliveryState.DELIVERED]
    [request] = receiver.requests
    assert request.webhook_id == delivery_id
    stored = store.get_delivery(delivery_id)
    assert stored is not None
    assert stored.attempt == 1
    assert call(client, "POST", "/replay", {"log_id": delivery_id}).status_code == 409  # not in the DLQ
    assert call(client, "POST", "/replay", {"log_id": "msg_unknown"}).status_code == 404


def test_bulk_replay_with_dry_run_and_cap(client: FlaskClient, store: OutboundWebhookHandler) -> None:
    store.add_subscription(WebhookSubscription("http://127.0.0.1:9/none", ["a.b"], SECRET, id="sub_1"))
    ids = dead_letters(store, 4)
    before = snapshot(store)
    dry = call(client, "POST", "/replay", {"subscription_id": "sub_1", "dry_run": True})
    assert dry.get_json() == {
        "dry_run": True,
        "count": 4,
        "delivery_ids": list(reversed(ids)),
        "results": [{"delivery_id": i, "outcome": "would_replay"} for i in reversed(ids)],
    }
    assert snapshot(store) == before
    window = call(
        client,
        "POST",
        "/replay",
        {"since": (T0 + timedelta(minutes=2)).isoformat(), "limit": 1, "dry_run": True},
    )
    assert window.get_json()["delivery_ids"] == [ids[3]]
    done = call(client, "POST", "/replay", {"subscription_id": "sub_1", "limit": 3})
    assert done.get_json()["count"] == 3
    assert [d.id for d in store.list_dlq()] == [ids[0]]
    assert call(client, "POST", "/replay", {"subscription_id": "sub_1", "limit": 5000}).status_code == 422
    assert call(client, "POST", "/replay", {"log_id": ids[0], "subscription_id": "sub_1"}).status_code == 422
    assert call(client, "POST", "/replay", {"subscription_id": "nope"}).status_code == 404


def test_a_bulk_replay_reports_rows_that_left_the_dlq_meanwhile_and_replays_the_rest(
    sql_store: SqlOutboundWebhookStore, redis_conn: redis.Redis, redis_url: str
) -> None:
    # Before, the first such row answered 409 with the rows before it already pending. On the rq
    # backend with no worker, nothing sends the replayed rows meanwhile.
    client = rq_app(sql_store, redis_url, HARVEST_ACTUATOR_TOKEN=TOKEN).test_client()
    sql_store.add_subscription(WebhookSubscription("http://127.0.0.1:9/none", ["a.b"], SECRET, id="sub_1"))
    oldest, deleted, taken, newest = dead_letters(sql_store, 4)

    def another_operator() -> None:
        sql_store.replay_delivery(taken, now=T0)
        with sql_store.engine.begin() as conn:
            conn.execute(sa.delete(deliveries_table).where(deliveries_table.c.id == deleted))

    with before_first_update(sql_store.engine, another_operator):
        response = call(client, "POST", "/replay", {"subscription_id": "sub_1"})

    assert response.status_code == 200, response.get_json()
    body = response.get_json()
    assert body["count"] == 2 and body["delivery_ids"] == [newest, oldest]
    results = body["results"]
    assert [(r["delivery_id"], r["outcome"]) for r in results] == [
        (newest, "replayed"),
        (taken, "not_replayable"),
        (deleted, "not_found"),
        (oldest, "replayed"),
    ]
    assert "pending, not dead-lettered" in results[1]["reason"]
    assert "no delivery" in results[2]["reason"]
    assert "reason" not in results[0]
    assert sql_store.list_dlq() == []


@pytest.mark.parametrize(
    "extra",
    [
        {"dry_run": True},
        {"dry_run": False},
        {"limit": 1},
        {"since": T0.isoformat()},
        {"until": (T0 + timedelta(hours=1)).isoformat()},
        {"dry_run": True, "subscription_id": "sub_1"},
    ],
)
def test_single_replay_refuses_bulk_fields(
    client: FlaskClient, store: OutboundWebhookHandler, extra: dict[str, Any]
) -> None:
    # Issue 12, defect 1: {"log_id", "dry_run": true} answered 200 "dry_run": false and replayed.
    store.add_subscription(WebhookSubscription("http://127.0.0.1:9/none", ["a.b"], SECRET, id="sub_1"))
    [delivery_id] = dead_letters(store, 1)
    before = snapshot(store)

    response = call(client, "POST", "/replay", {"log_id": delivery_id, **extra})

    assert response.status_code == 422, response.get_json()
    error = response.get_json()["error"]
    [message] = error["fields"]["log_id"]
    for name in extra:
        assert name in message
    assert "bulk" in message
    assert snapshot(store) == before


@pytest.mark.parametrize("flag", [1, 0, "true", "false", "yes", None, [True]])
def test_dry_run_must_be_a_json_boolean(
    client: FlaskClient, store: OutboundWebhookHandler, flag: Any
) -> None:
    # Issue 16, item 13: "dry_run": 1 was taken as true.
    store.add_subscription(WebhookSubscription("http://127.0.0.1:9/none", ["a.b"], SECRET, id="sub_1"))
    dead_letters(store, 2)
    before = snapshot(store)

    response = call(client, "POST", "/replay", {"subscription_id": "sub_1", "dry_run": flag})

    assert response.status_code == 422, response.get_json()
    assert "dry_run" in response.get_json()["error"]["fields"]
    assert snapshot(store) == before


def test_delivery_detail_and_stats(
    client: FlaskClient, store: OutboundWebhookHandler, receiver: CapturingReceiver, app: Flask
) -> None:
    store.add_subscription(WebhookSubscription(receiver.url("/hook"), ["a.b"], SECRET, id="sub_1"))
    receiver.respond("/hook", 500)
    with app.app_context():
        [delivery_id] = get_engine().manager.dispatch("a.b", {"x": 1})
    assert wait_final(store, [delivery_id]) == [DeliveryState.DELIVERED]
    dead_letters(store, 2)
    detail = call(client, "GET", f"/deliveries/{delivery_id}").get_json()
    assert detail["state"] == "delivered"
    assert [a["response_status"] for a in detail["attempts"]][-1] == 200
    assert call(client, "GET", "/deliveries/msg_nope").status_code == 404
    stats = call(client, "GET", "/stats").get_json()
    assert stats["overall"]["counts"]["delivered"] == 1
    assert stats["overall"]["dlq_depth"] == 2
    assert stats["overall"]["oldest_pending_age_seconds"] is None
    assert stats["subscriptions"]["sub_1"]["dlq_depth"] == 2
    assert stats["overall"]["capped"] == dict.fromkeys(stats["overall"]["counts"], False)
    assert stats["overall"]["count_cap"] == STATS_COUNT_CAP


def test_stats_stop_counting_at_the_cap_and_say_so(
    client: FlaskClient, store: OutboundWebhookHandler
) -> None:
    dead_letters(store, STATS_COUNT_CAP + 1)
    stats = call(client, "GET", "/stats").get_json()
    overall = stats["overall"]
    assert overall["counts"]["dlq"] == overall["dlq_depth"] == STATS_COUNT_CAP
    assert overall["capped"]["dlq"] is True and overall["capped"]["pending"] is False
    # The subscription's count is its share of the rows read: a lower bound, marked as one.
    assert stats["subscriptions"]["sub_1"]["counts"]["dlq"] == STATS_COUNT_CAP
    assert stats["subscriptions"]["sub_1"]["capped"]["dlq"] is True


# -- secret rotation -------------------------------------------------------------------------------


def test_rotation_signs_with_both_secrets_during_the_grace_period(
    app: Flask, client: FlaskClient, store: OutboundWebhookHandler, receiver: CapturingReceiver
) -> None:
    store.add_subscription(WebhookSubscription(receiver.url("/hook"), ["a.b"], SECRET, id="sub_1"))
    rotated = call(client, "POST", "/subscriptions/sub_1/rotate-secret", {})
    assert rotated.status_code == 200
    new_secret = rotated.get_json()["secret"]
    assert new_secret != SECRET
    with app.app_context():
        get_engine().manager.dispatch("a.b", {"during": "grace"})
    [during] = receiver.wait_for(1)
    assert len(during.headers["webhook-signature"].split(" ")) == 2
    for secret in (SECRET, new_secret):  # a receiver on either secret accepts it
        standardwebhooks.Webhook(secret).verify(during.body, dict(during.headers))

    # Rotating again with no grace: the secret before is no longer used at all.
    call(client, "POST", "/subscriptions/sub_1/rotate-secret", {"grace_seconds": 0})
    newest = store.get_subscription("sub_1")
    assert newest is not None
    with app.app_context():
        get_engine().manager.dispatch("a.b", {"after": "grace"})
    after = receiver.wait_for(2)[1]
    assert len(after.headers["webhook-signature"].split(" ")) == 1
    standardwebhooks.Webhook(newest.secret).verify(after.body, dict(after.headers))
    with pytest.raises(standardwebhooks.webhooks.WebhookVerificationError):
        standardwebhooks.Webhook(new_secret).verify(after.body, dict(after.headers))
    assert call(client, "POST", "/subscriptions/nope/rotate-secret", {}).status_code == 404
    assert (
        call(client, "POST", "/subscriptions/sub_1/rotate-secret", {"grace_seconds": -1}).status_code == 422
    )


def test_operator_edits_never_undo_the_workers_failure_count(
    app: Flask, store: OutboundWebhookHandler
) -> None:
    # Issue 12, defect 2, end to end: PATCH and rotate-secret while workers count failures.
    store.add_subscription(WebhookSubscription("https://hooks.example.com/a", ["a.b"], SECRET, id="sub_1"))
    now = datetime.now(timezone.utc)
    deliveries = [make_delivery("sub_1", now) for _ in range(24)]
    store.log_deliveries(deliveries)
    answers: list[int] = []

    def work(index: int) -> None:
        if index < 3:
            for delivery in deliveries[index::3]:
                fail_once(store, delivery, now, threshold=10)
            return
        client = app.test_client()
        for round_ in range(8):
            if index == 3:
                response = call(client, "PATCH", "/subscriptions/sub_1", {"description": f"r{round_}"})
            else:
                response = call(client, "POST", "/subscriptions/sub_1/rotate-secret", {"grace_seconds": 60})
            answers.append(response.status_code)

    in_threads(5, work)

    assert answers == [200] * 16
    stored = store.get_subscription("sub_1")
    assert stored is not None
    assert (stored.status.value, stored.consecutive_failures) == ("failed", 24)


# -- arbitrary input -------------------------------------------------------------------------------

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=12), children, max_size=5)
    ),
    max_leaves=12,
)
KEYS = [
    "id",
    "target_url",
    "event_topics",
    "secret",
    "description",
    "status",
    "log_id",
    "subscription_id",
    "since",
    "until",
    "limit",
    "dry_run",
    "grace_seconds",
]
BODIES = JSON | st.dictionaries(st.sampled_from(KEYS), JSON, max_size=5)
WRITES = [
    ("POST", "/subscriptions"),
    ("PATCH", "/subscriptions/sub_1"),
    ("POST", "/subscriptions/sub_1/rotate-secret"),
    ("POST", "/replay"),
]


@pytest.mark.parametrize("store", ["memory"], indirect=True)
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(route=st.sampled_from(WRITES), body=BODIES)
def test_arbitrary_json_never_gets_a_5xx_nor_a_change_on_4xx(
    client: FlaskClient, store: OutboundWebhookHandler, route: tuple[str, str], body: Any
) -> None:
    if store.get_subscription("sub_1") is None:
        store.add_subscription(WebhookSubscription("https://a.example.com/h", ["a.b"], SECRET, id="sub_1"))
        dead_letters(store, 2)
    before = snapshot(store)
    method, path = route
    response = call(client, method, path, body)
    assert response.status_code < 500, response.get_data(as_text=True)
    if response.status_code >= 400:
        assert snapshot(store) == before
        assert response.get_json()["error"]["message"]


def test_a_form_post_cannot_rotate_a_secret(client: FlaskClient, store: OutboundWebhookHandler) -> None:
    store.add_subscription(WebhookSubscription("https://a.example.com/h", ["a.b"], SECRET, id="sub_1"))
    # What a cross-site HTML form sends: no JSON body.
    response = client.post(f"{PREFIX}/subscriptions/sub_1/rotate-secret", headers=AUTH)
    assert response.status_code == 415
    stored = store.get_subscription("sub_1")
    assert stored is not None
    assert stored.secret == SECRET


def test_unknown_routes_answer_json_after_the_auth_check(
    client: FlaskClient, store: OutboundWebhookHandler
) -> None:
    assert client.get(f"{PREFIX}/nothing-here").status_code == 401
    missing = client.get(f"{PREFIX}/nothing-here", headers=AUTH)
    assert missing.status_code == 404
    assert missing.get_json()["error"]["code"] == "not_found"
    assert make_app(store).test_client().get(f"{PREFIX}/nothing-here").status_code == 403
