"""The dashboard's webhook pages and actions through Flask's test client, on every store."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from flask import Flask
from flask.testing import FlaskClient

from flask_harvest import (
    DeliveryLog,
    DeliveryState,
    OutboundWebhookHandler,
    WebhookSubscription,
    WebhookSubscriptionStatus,
    generate_secret,
)
from flask_harvest.dashboard.paging import PAGE_SIZE
from flask_harvest.testing import CapturingReceiver
from flask_harvest.webhooks.operations import STATS_COUNT_CAP
from flask_harvest.webhooks.stores.sql import SqlOutboundWebhookStore

from .dashboard_client import PREFIX, dashboard_app, signed_in, text
from .pipeline import before_first_update, wait_final
from .test_actuator import T0, dead_letters, snapshot
from .workflow_support import SQL_KINDS

SECRET = generate_secret()
SCRIPT = "<script>alert('x')</script>"
TARGET = "http://127.0.0.1:9/none"  # nothing listens: the tests that send use the receiver


@pytest.fixture
def app(store: OutboundWebhookHandler) -> Flask:
    return dashboard_app(store)


@pytest.fixture
def client(app: Flask) -> FlaskClient:
    return app.test_client()


@pytest.fixture
def csrf(client: FlaskClient) -> str:
    return signed_in(client)


def add_subscription(store: OutboundWebhookHandler, sub_id: str = "sub_1", **changes: object) -> None:
    values: dict[str, object] = {
        "target_url": TARGET,
        "event_topics": ["a.b"],
        "secret": SECRET,
        "id": sub_id,
    }
    values.update(changes)
    store.add_subscription(WebhookSubscription(**values))  # type: ignore[arg-type]


# -- overview --------------------------------------------------------------------------------------


def test_overview_counts_chart_and_troubled_subscriptions(
    client: FlaskClient, csrf: str, store: OutboundWebhookHandler
) -> None:
    add_subscription(store)
    add_subscription(store, "sub_off")
    store.set_subscription_status("sub_off", WebhookSubscriptionStatus.DISABLED)
    dead_letters(store, 3)
    page = text(client.get(f"{PREFIX}/"))
    assert 'id="dlq-size"><div class="value">3<' in page
    assert 'id="count-dlq"><div class="value">3<' in page
    assert 'id="count-pending"><div class="value">0<' in page
    assert '<svg class="chart"' in page
    assert "sub_off" in page and 'id="troubled-subscriptions"' in page
    assert SECRET not in page
    assert 'id="count-cap"' not in page


def test_overview_shows_a_capped_count_with_a_plus(
    client: FlaskClient, csrf: str, store: OutboundWebhookHandler
) -> None:
    dead_letters(store, STATS_COUNT_CAP + 1)
    page = text(client.get(f"{PREFIX}/"))
    assert f'id="count-dlq"><div class="value">{STATS_COUNT_CAP}+<' in page
    assert f'id="dlq-size"><div class="value">{STATS_COUNT_CAP}+<' in page
    assert 'id="count-pending"><div class="value">0<' in page
    assert 'id="count-cap"' in page


# -- subscriptions ---------------------------------------------------------------------------------


def test_subscriptions_list_filters_and_pages(
    client: FlaskClient, csrf: str, store: OutboundWebhookHandler
) -> None:
    for n in range(PAGE_SIZE + 2):
        add_subscription(store, f"sub_{n:03d}", event_topics=["a.b"] if n % 2 else ["c.*"])
    store.set_subscription_status("sub_001", WebhookSubscriptionStatus.DISABLED)
    first = text(client.get(f"{PREFIX}/webhooks/subscriptions"))
    assert first.count('href="/harvest/webhooks/subscriptions/sub_') == PAGE_SIZE
    assert 'id="next-page"' in first
    next_url = first.split('id="next-page" href="')[1].split('"')[0].replace("&amp;", "&")
    second = text(client.get(next_url))
    assert second.count('href="/harvest/webhooks/subscriptions/sub_') == 2
    assert 'id="next-page"' not in second
    disabled = text(client.get(f"{PREFIX}/webhooks/subscriptions?status=disabled"))
    assert disabled.count('href="/harvest/webhooks/subscriptions/sub_') == 1
    by_topic = text(client.get(f"{PREFIX}/webhooks/subscriptions?topic=c.x"))
    assert by_topic.count('href="/harvest/webhooks/subscriptions/sub_') == (PAGE_SIZE + 2) // 2
    assert client.get(f"{PREFIX}/webhooks/subscriptions?status=bogus").status_code == 422
    assert client.get(f"{PREFIX}/webhooks/subscriptions?cursor=bogus").status_code == 422
    assert client.get(f"{PREFIX}/webhooks/subscriptions?topic=a..b").status_code == 422  # not a topic
    assert SECRET not in first


def test_subscription_detail_shows_recent_deliveries_and_failures(
    client: FlaskClient, csrf: str, store: OutboundWebhookHandler
) -> None:
    add_subscription(store)
    ids = dead_letters(store, 2)
    page = text(client.get(f"{PREFIX}/webhooks/subscriptions/sub_1"))
    assert all(i in page for i in ids)
    assert 'id="failure-count">0<' in page
    assert SECRET not in page
    assert client.get(f"{PREFIX}/webhooks/subscriptions/sub_missing").status_code == 404


def test_disable_and_enable(client: FlaskClient, csrf: str, store: OutboundWebhookHandler) -> None:
    add_subscription(store)
    url = f"{PREFIX}/webhooks/subscriptions/sub_1/status"
    before = snapshot(store)
    assert client.post(url, data={"status": "disabled"}).status_code == 403  # no CSRF token
    assert client.post(url, data={"status": "disabled", "csrf_token": "x" * 43}).status_code == 403
    assert snapshot(store) == before
    done = client.post(url, data={"status": "disabled", "csrf_token": csrf})
    assert done.status_code == 303
    assert store.get_subscription("sub_1").status is WebhookSubscriptionStatus.DISABLED  # type: ignore[union-attr]
    assert "Disabled." in text(client.get(done.headers["Location"]))
    assert client.post(url, data={"status": "failed", "csrf_token": csrf}).status_code == 422
    client.post(url, data={"status": "active", "csrf_token": csrf})
    assert store.get_subscription("sub_1").status is WebhookSubscriptionStatus.ACTIVE  # type: ignore[union-attr]
    assert (
        client.post(
            f"{PREFIX}/webhooks/subscriptions/nope/status", data={"status": "active", "csrf_token": csrf}
        ).status_code
        == 404
    )


def test_rotate_secret_shows_the_new_one_once(
    client: FlaskClient, csrf: str, store: OutboundWebhookHandler
) -> None:
    add_subscription(store)
    url = f"{PREFIX}/webhooks/subscriptions/sub_1/rotate-secret"
    before = snapshot(store)
    assert client.post(url, data={"grace_seconds": "60"}).status_code == 403
    assert snapshot(store) == before
    response = client.post(url, data={"grace_seconds": "60", "csrf_token": csrf})
    assert response.status_code == 200
    assert response.headers["Cache-Control"] == "no-store"
    stored = store.get_subscription("sub_1")
    assert stored is not None and stored.secret != SECRET
    page = text(response)
    assert f'id="new-secret">{stored.secret}<' in page
    assert SECRET not in page  # the old one is never shown
    again = text(client.get(f"{PREFIX}/webhooks/subscriptions/sub_1"))
    assert stored.secret not in again and "new-secret" not in again
    for bad in ("-1", "nan", "1e12", "x"):
        assert client.post(url, data={"grace_seconds": bad, "csrf_token": csrf}).status_code == 422
    assert store.get_subscription("sub_1").secret == stored.secret  # type: ignore[union-attr]


# -- deliveries ------------------------------------------------------------------------------------


def test_deliveries_filter_by_state_subscription_topic_and_time(
    client: FlaskClient, csrf: str, store: OutboundWebhookHandler
) -> None:
    add_subscription(store)
    add_subscription(store, "sub_2")
    dlq = dead_letters(store, 3)  # T0, T0+1min, T0+2min
    other = dead_letters(store, 1, subscription_id="sub_2", topic="c.d")
    delivered = DeliveryLog(
        id="msg_ok",
        subscription_id="sub_1",
        topic="a.b",
        payload="{}",
        state=DeliveryState.DELIVERED,
        timestamp=T0,
    )
    store.log_deliveries([delivered])

    def listed(query: str) -> list[str]:
        page = text(client.get(f"{PREFIX}/webhooks/deliveries{query}"))
        return [i for i in [*dlq, *other, "msg_ok"] if f">{i}</a>" in page]

    assert sorted(listed("")) == sorted([*dlq, *other, "msg_ok"])
    assert listed("?state=delivered") == ["msg_ok"]
    assert sorted(listed("?state=dlq")) == sorted([*dlq, *other])
    assert listed("?subscription_id=sub_2") == other
    assert listed("?topic=c.d") == other
    assert sorted(listed("?since=2026-12-01T12:01&until=2026-12-01T12:02:30Z")) == sorted(dlq[1:])
    for bad in ("?state=nope", "?since=yesterday", "?cursor=%%%", "?since=2026-12-02&until=2026-12-01"):
        assert client.get(f"{PREFIX}/webhooks/deliveries{bad}").status_code == 422, bad


def test_deliveries_page_with_cursors(client: FlaskClient, csrf: str, store: OutboundWebhookHandler) -> None:
    add_subscription(store)
    ids = dead_letters(store, PAGE_SIZE + 3)
    seen: list[str] = []
    url: str | None = f"{PREFIX}/webhooks/deliveries?state=dlq"
    while url:
        page = text(client.get(url))
        seen += [i for i in ids if f">{i}</a>" in page]
        url = (
            page.split('id="next-page" href="')[1].split('"')[0].replace("&amp;", "&")
            if "next-page" in page
            else None
        )
    assert sorted(seen) == sorted(ids) and len(seen) == len(ids)


def test_delivery_detail_and_replay(
    client: FlaskClient, csrf: str, store: OutboundWebhookHandler, receiver: CapturingReceiver
) -> None:
    add_subscription(store, target_url=receiver.url("/hook"))
    [delivery_id] = dead_letters(store, 1)
    page = text(client.get(f"{PREFIX}/webhooks/deliveries/{delivery_id}"))
    assert 'id="replay"' in page and "server returned status: 500" in page
    url = f"{PREFIX}/webhooks/deliveries/{delivery_id}/replay"
    assert client.post(url).status_code == 403
    assert store.get_delivery(delivery_id).state is DeliveryState.DLQ  # type: ignore[union-attr]
    done = client.post(url, data={"csrf_token": csrf})
    assert done.status_code == 303
    assert wait_final(store, [delivery_id]) == [DeliveryState.DELIVERED]
    assert receiver.requests[0].webhook_id == delivery_id
    after = text(client.get(f"{PREFIX}/webhooks/deliveries/{delivery_id}"))
    assert "state-delivered" in after and 'id="replay"' not in after
    assert 'id="attempts"' in after and " ms<" in after
    assert client.post(url, data={"csrf_token": csrf}).status_code == 409
    assert client.get(f"{PREFIX}/webhooks/deliveries/msg_unknown").status_code == 404
    assert (
        client.post(f"{PREFIX}/webhooks/deliveries/msg_unknown/replay", data={"csrf_token": csrf}).status_code
        == 404
    )


def test_bulk_replay_counts_first_then_replays(
    client: FlaskClient, csrf: str, store: OutboundWebhookHandler
) -> None:
    add_subscription(store)
    ids = dead_letters(store, 4)
    url = f"{PREFIX}/webhooks/replay"
    assert client.get(url).status_code == 200
    before = snapshot(store)
    form = {"subscription_id": "sub_1", "limit": "3", "csrf_token": csrf}
    dry = client.post(url, data={**form, "action": "dry-run"})
    assert dry.status_code == 200
    assert 'id="dry-run-count">3 dead-lettered' in text(dry)
    assert 'id="confirm-replay"' in text(dry)
    assert snapshot(store) == before
    assert client.post(url, data={**form, "action": "replay", "csrf_token": ""}).status_code == 403
    assert snapshot(store) == before
    done = client.post(url, data={**form, "action": "replay"})
    assert 'id="replayed-count">Replayed 3' in text(done)
    states = {i: store.get_delivery(i).state for i in ids}  # type: ignore[union-attr]
    assert list(states.values()).count(DeliveryState.DLQ) == 1
    for bad in (
        {"action": "nope"},
        {"action": "dry-run", "limit": "0"},
        {"action": "dry-run", "limit": "x"},
        {"action": "dry-run", "subscription_id": ""},
        {"action": "dry-run", "since": "soon"},
    ):
        assert client.post(url, data={**form, **bad}).status_code in (422, 404), bad
    assert (
        client.post(url, data={**form, "action": "dry-run", "subscription_id": "sub_nope"}).status_code == 404
    )


@pytest.mark.parametrize("store", SQL_KINDS, indirect=True)
def test_bulk_replay_lists_what_it_did_not_replay(
    client: FlaskClient, csrf: str, store: SqlOutboundWebhookStore
) -> None:
    add_subscription(store)
    oldest, taken = dead_letters(store, 2)
    form = {"subscription_id": "sub_1", "action": "replay", "csrf_token": csrf}
    with before_first_update(store.engine, lambda: store.replay_delivery(taken, now=T0)):
        done = client.post(f"{PREFIX}/webhooks/replay", data=form)
    assert done.status_code == 200
    page = text(done)
    assert 'id="replayed-count">Replayed 1' in page and f">{oldest}</a></li>" in page
    assert 'id="not-replayed"' in page and f"{taken}</a>: delivery &#39;{taken}&#39; is pending" in page


def test_script_in_payload_topic_and_error_renders_as_text(
    client: FlaskClient, csrf: str, store: OutboundWebhookHandler
) -> None:
    add_subscription(store, description=SCRIPT)
    row = DeliveryLog(
        id="msg_script",
        subscription_id="sub_1",
        topic="a.<script>",
        payload=json.dumps({"html": SCRIPT}),
        state=DeliveryState.DLQ,
        last_error=SCRIPT,
        timestamp=T0 + timedelta(minutes=1),
        next_attempt_at=None,
    )
    store.log_deliveries([row])
    for path in (
        "/",
        "/webhooks/deliveries",
        "/webhooks/deliveries/msg_script",
        "/webhooks/subscriptions/sub_1",
    ):
        page = text(client.get(PREFIX + path))
        assert "<script>" not in page, path
    detail = text(client.get(f"{PREFIX}/webhooks/deliveries/msg_script"))
    assert "&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt;" in detail
