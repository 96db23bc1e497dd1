"""Tenants: the tenant check, dispatch routing by tenant, and isolation of scoped store calls and
actuator routes, on every store (memory, SQLite, PostgreSQL)."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
import sqlalchemy as sa
from flask import Flask
from hypothesis import given
from hypothesis import strategies as st

from flask_harvest import DeliveryLog, DeliveryState, OutboundWebhookHandler, WebhookSubscription, get_engine
from flask_harvest.errors import (
    DeliveryNotFoundError,
    InvalidFieldError,
    InvalidStateError,
    SubscriptionNotFoundError,
)
from flask_harvest.webhooks.models import SubscriptionChanges, WebhookSubscriptionStatus
from flask_harvest.webhooks.stores.base import BlockedKey
from flask_harvest.webhooks.stores.sql import SqlOutboundWebhookStore
from flask_harvest.webhooks.tenants import ALL_TENANTS, MAX_TENANT_LENGTH, validate_tenant

from .pipeline import make_app
from .properties import BUDGET, TEXT
from .test_store_contract import make_delivery

TOKEN = "test-actuator-token-0123456789"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
PREFIX = "/actuator/webhooks"
SECRET = "whsec_" + "MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
T0 = datetime(2026, 12, 1, 12, 0, tzinfo=timezone.utc)

# -- the tenant check -----------------------------------------------------------------------------

TENANT_CHARS = st.characters(blacklist_categories=("Cs", "Cc", "Zs", "Zl", "Zp", "Cf", "Co", "Cn"))
TENANTS = st.text(TENANT_CHARS, min_size=1, max_size=MAX_TENANT_LENGTH)


@BUDGET
@given(TENANTS)
def test_a_printable_tenant_is_kept(tenant: str) -> None:
    assert validate_tenant(tenant) == tenant


@BUDGET
@given(
    st.one_of(
        st.just(""),
        st.text(TENANT_CHARS, min_size=MAX_TENANT_LENGTH + 1, max_size=MAX_TENANT_LENGTH + 3),
        TEXT.filter(lambda t: any(c in t for c in "\x00\ud800\udfff\udcff \u202e\n")),
        st.integers(),
        st.lists(st.text(max_size=3), max_size=2),
    )
)
def test_anything_else_is_refused_naming_the_field(value: Any) -> None:
    with pytest.raises(InvalidFieldError) as info:
        validate_tenant(value)
    assert info.value.field == "tenant"


def test_a_subscription_refuses_a_bad_tenant_and_keeps_none() -> None:
    with pytest.raises(InvalidFieldError) as info:
        WebhookSubscription(
            target_url="https://example.com/h", event_topics=["a"], secret=SECRET, tenant="a b"
        )
    assert info.value.field == "tenant"
    assert (
        WebhookSubscription(target_url="https://example.com/h", event_topics=["a"], secret=SECRET).tenant
        is None
    )


# -- dispatch routing -----------------------------------------------------------------------------


def subscribe(store: OutboundWebhookHandler, tenant: str | None, pattern: str = "order.*") -> str:
    made = WebhookSubscription(
        target_url="https://receiver.example/h", event_topics=[pattern], secret=SECRET, tenant=tenant
    )
    return store.add_subscription(made).id


@pytest.fixture
def handed_over(store: OutboundWebhookHandler) -> tuple[Flask, list[DeliveryLog]]:
    """An app on ``store`` whose deliveries are handed to a list instead of being sent."""
    taken: list[DeliveryLog] = []
    app = make_app(store, delegate=lambda delivery, subscription: taken.append(delivery))
    return app, taken


def test_dispatch_reaches_its_own_tenant_only(
    store: OutboundWebhookHandler, handed_over: tuple[Flask, list[DeliveryLog]]
) -> None:
    app, taken = handed_over
    untenanted, of_a, of_b = subscribe(store, None), subscribe(store, "acme"), subscribe(store, "globex")
    with app.app_context():
        manager = get_engine().manager
        to_a = manager.dispatch("order.created", {"n": 1}, tenant="acme")
        to_none = manager.dispatch("order.created", {"n": 2})
        to_nobody = manager.dispatch("order.created", {"n": 3}, tenant="initech")
    logged = {d.id: d for d in store.list_deliveries(limit=100)}
    assert [(logged[i].subscription_id, logged[i].tenant) for i in to_a] == [(of_a, "acme")]
    assert [(logged[i].subscription_id, logged[i].tenant) for i in to_none] == [(untenanted, None)]
    assert to_nobody == []
    assert not any(d.subscription_id == of_b for d in logged.values())
    assert sorted(d.id for d in taken) == sorted(to_a + to_none)


def test_dispatch_refuses_a_bad_tenant_and_writes_nothing(
    store: OutboundWebhookHandler, handed_over: tuple[Flask, list[DeliveryLog]]
) -> None:
    app, _ = handed_over
    subscribe(store, None)
    with app.app_context(), pytest.raises(InvalidFieldError) as info:
        get_engine().manager.dispatch("order.created", {}, tenant="a\nb")
    assert info.value.field == "tenant"
    assert store.list_deliveries(limit=10) == []


@pytest.mark.parametrize("tenant", ["acme", None])
def test_the_outbox_relay_keeps_the_tenant(sql_store: SqlOutboundWebhookStore, tenant: str | None) -> None:
    taken: list[DeliveryLog] = []
    # The relay by hand only: a timed sweep could relay the messages first.
    app = make_app(
        sql_store,
        delegate=lambda delivery, subscription: taken.append(delivery),
        HARVEST_SWEEP_INTERVAL_SECONDS=3600,
    )
    by_tenant = {t: subscribe(sql_store, t) for t in (None, "acme", "globex")}
    with app.app_context():
        manager = get_engine().manager
        with sql_store.engine.begin() as conn:
            manager.dispatch_in_tx(conn, "order.created", {"n": 1}, tenant=tenant)
            # A second message of another tenant in the same batch: one relay, two lookups.
            manager.dispatch_in_tx(conn, "order.created", {"n": 2}, tenant="globex")
        assert manager.relay_outbox().relayed == 2
    logged = sql_store.list_deliveries(limit=10)
    assert sorted((d.subscription_id, d.tenant) for d in logged) == sorted(
        [(by_tenant[tenant], tenant), (by_tenant["globex"], "globex")]
    )
    assert sorted(d.id for d in taken) == sorted(d.id for d in logged)


def test_a_dispatch_carries_its_tenant_and_its_ordering_key_together(
    store: OutboundWebhookHandler, handed_over: tuple[Flask, list[DeliveryLog]]
) -> None:
    app, _ = handed_over
    of_a, of_b = subscribe(store, "acme"), subscribe(store, "globex")
    with app.app_context():
        manager = get_engine().manager
        first = manager.dispatch("order.created", {"n": 1}, ordering_key="o-1", tenant="acme")
        second = manager.dispatch("order.created", {"n": 2}, ordering_key="o-1", tenant="acme")
        other = manager.dispatch("order.created", {"n": 3}, ordering_key="o-1", tenant="globex")
    logged = {d.id: d for d in store.list_deliveries(limit=10)}
    a1, a2, b1 = logged[first[0]], logged[second[0]], logged[other[0]]
    assert (a1.subscription_id, a1.tenant, a1.ordering_key) == (of_a, "acme", "o-1")
    assert a1.ordering_seq is not None and a2.ordering_seq is not None and a1.ordering_seq < a2.ordering_seq
    assert (b1.subscription_id, b1.tenant, b1.ordering_key) == (of_b, "globex", "o-1")


def test_the_outbox_relay_keeps_the_tenant_and_the_ordering_key(sql_store: SqlOutboundWebhookStore) -> None:
    app = make_app(
        sql_store, delegate=lambda delivery, subscription: None, HARVEST_SWEEP_INTERVAL_SECONDS=3600
    )
    of_a = subscribe(sql_store, "acme")
    subscribe(sql_store, None)
    with app.app_context():
        manager = get_engine().manager
        with sql_store.engine.begin() as conn:
            manager.dispatch_in_tx(conn, "order.created", {"n": 1}, ordering_key="o-1", tenant="acme")
        assert manager.relay_outbox().relayed == 1
    [logged] = sql_store.list_deliveries(limit=10)
    assert (logged.subscription_id, logged.tenant, logged.ordering_key) == (of_a, "acme", "o-1")
    assert logged.ordering_seq is not None


# -- isolation of scoped store calls ----------------------------------------------------------------


#: The ordering key of every tenant's seeded deliveries: the same key in each tenant, so a scoped
#: skip or blocked-keys listing must tell the tenants' lines apart by their rows, not by the key.
KEY = "order-1"


@dataclass
class Tenancy:
    """One tenant's rows: a subscription, a dead letter (the head of the :data:`KEY` line, which
    it blocks) and a pending delivery waiting behind it."""

    tenant: str | None
    subscription: str
    dead: str
    pending: str


def seed_tenant(store: OutboundWebhookHandler, tenant: str | None) -> Tenancy:
    subscription = subscribe(store, tenant)
    tag = uuid.uuid4().hex[:8]
    dead = make_delivery(
        subscription, T0, id=f"dlq_{tag}", state=DeliveryState.DLQ, tenant=tenant, ordering_key=KEY
    )
    pending = make_delivery(
        subscription, T0 + timedelta(seconds=1), id=f"pen_{tag}", tenant=tenant, ordering_key=KEY
    )
    # Logged one by one: each takes its own number in the key's line, the dead letter first.
    store.log_deliveries([dead])
    store.log_deliveries([pending])
    return Tenancy(tenant, subscription, dead.id, pending.id)


def snapshot(store: OutboundWebhookHandler, rows: Tenancy) -> tuple[Any, ...]:
    """Everything an unscoped reader sees of ``rows``."""
    return (
        store.get_subscription(rows.subscription),
        store.get_deliveries([rows.dead, rows.pending]),
        store.list_attempts(rows.dead),
    )


#: Each scoped call an operator or a portal makes with another tenant's ids: what it must answer.
ScopedCall = Callable[[OutboundWebhookHandler, Tenancy, str | None], Any]
FOREIGN_CALLS: dict[str, tuple[ScopedCall, Any]] = {
    "get_subscription": (lambda s, b, a: s.get_subscription(b.subscription, tenant=a), None),
    "remove_subscription": (lambda s, b, a: s.remove_subscription(b.subscription, tenant=a), False),
    "update_subscription": (
        lambda s, b, a: s.update_subscription(b.subscription, SubscriptionChanges(description="x"), tenant=a),
        SubscriptionNotFoundError,
    ),
    "set_subscription_status": (
        lambda s, b, a: s.set_subscription_status(
            b.subscription, WebhookSubscriptionStatus.DISABLED, tenant=a
        ),
        SubscriptionNotFoundError,
    ),
    "rotate_secret": (
        lambda s, b, a: s.rotate_secret(b.subscription, SECRET, previous_expires_at=T0, tenant=a),
        SubscriptionNotFoundError,
    ),
    "get_delivery": (lambda s, b, a: s.get_delivery(b.dead, tenant=a), None),
    "get_deliveries": (lambda s, b, a: s.get_deliveries([b.dead, b.pending], tenant=a), []),
    "list_attempts": (lambda s, b, a: s.list_attempts(b.dead, tenant=a), []),
    "replay_dead_letter": (
        lambda s, b, a: s.replay_delivery(b.dead, now=T0, tenant=a),
        DeliveryNotFoundError,
    ),
    "replay_pending": (lambda s, b, a: s.replay_delivery(b.pending, now=T0, tenant=a), DeliveryNotFoundError),
    "skip_dead_letter": (
        lambda s, b, a: s.skip_delivery(b.dead, reason="x", now=T0, tenant=a),
        DeliveryNotFoundError,
    ),
    "skip_pending": (
        lambda s, b, a: s.skip_delivery(b.pending, reason="x", now=T0, tenant=a),
        DeliveryNotFoundError,
    ),
    "blocked_keys": (lambda s, b, a: s.blocked_keys(b.subscription, tenant=a), []),
    "subscription_deliveries": (
        lambda s, b, a: s.list_deliveries(subscription_id=b.subscription, tenant=a),
        [],
    ),
    "subscription_dlq": (lambda s, b, a: s.list_dlq(subscription_id=b.subscription, tenant=a), []),
    "subscription_count": (
        lambda s, b, a: s.count_deliveries(cap=10, subscription_id=b.subscription, tenant=a),
        0,
    ),
}


def ids_of(rows: list[Any]) -> set[str]:
    return {row.id for row in rows}


@BUDGET
@given(
    st.sampled_from(["acme", None]),
    st.sampled_from(["globex", "acme-2", None]),
    st.lists(st.sampled_from(sorted(FOREIGN_CALLS)), min_size=1, max_size=6),
)
def test_no_scoped_store_call_sees_or_changes_another_tenants_rows(
    store: OutboundWebhookHandler, tenant_a: str | None, tenant_b: str | None, calls: list[str]
) -> None:
    if tenant_a == tenant_b:
        tenant_b = "globex"
    a, b = seed_tenant(store, tenant_a), seed_tenant(store, tenant_b)
    before = snapshot(store, b)
    for name in calls:
        call, expected = FOREIGN_CALLS[name]
        if isinstance(expected, type):
            with pytest.raises(expected):
                call(store, b, tenant_a)
        else:
            assert call(store, b, tenant_a) == expected, name
    assert snapshot(store, b) == before
    # The lists of A's scope hold A's rows, and all of them.
    for listed in (
        store.list_subscriptions(tenant=tenant_a),
        store.list_subscriptions_page(limit=500, tenant=tenant_a),
        store.subscriptions_for_topic("order.created", tenant=tenant_a),
        store.subscriptions_for_topics(["order.created"], tenant=tenant_a)["order.created"],
    ):
        assert all(s.tenant == tenant_a for s in listed)
        assert a.subscription in ids_of(listed) and b.subscription not in ids_of(listed)
    for deliveries in (
        store.list_deliveries(limit=500, tenant=tenant_a),
        store.list_delivery_summaries(limit=500, tenant=tenant_a),
        store.list_dlq(limit=500, tenant=tenant_a),
    ):
        assert a.dead in ids_of(deliveries)
        assert not ids_of(deliveries) & {b.dead, b.pending}
    _, per_subscription = store.delivery_stats(cap=1000, tenant=tenant_a)
    assert a.subscription in per_subscription and b.subscription not in per_subscription
    # B's line is still held by its dead letter, and A's own is seen in A's scope.
    assert store.blocked_keys(b.subscription) == [BlockedKey(KEY, b.dead, 1)]
    assert store.blocked_keys(a.subscription, tenant=tenant_a) == [BlockedKey(KEY, a.dead, 1)]
    # And A's own rows are found in A's scope, and changed by it.
    assert store.replay_delivery(a.dead, now=T0, tenant=tenant_a).state is DeliveryState.PENDING
    with pytest.raises(InvalidStateError):
        store.replay_delivery(a.pending, now=T0, tenant=tenant_a)


def test_a_scoped_skip_moves_its_own_tenants_dead_letter_only(store: OutboundWebhookHandler) -> None:
    a, b = seed_tenant(store, "acme"), seed_tenant(store, "globex")
    with pytest.raises(DeliveryNotFoundError):
        store.skip_delivery(b.dead, reason="x", now=T0, tenant="acme")
    with pytest.raises(InvalidStateError):
        store.skip_delivery(a.pending, reason="x", now=T0, tenant="acme")
    skipped = store.skip_delivery(a.dead, reason="given up", now=T0, tenant="acme")
    assert skipped.state is DeliveryState.SKIPPED and skipped.tenant == "acme"
    assert store.blocked_keys(a.subscription, tenant="acme") == []
    # The same key in the other tenant is still held.
    assert store.blocked_keys(b.subscription, tenant="globex") == [BlockedKey(KEY, b.dead, 1)]


def test_the_cli_skips_in_a_tenant_scope(store: OutboundWebhookHandler) -> None:
    a, b = seed_tenant(store, "acme"), seed_tenant(store, "globex")
    runner = make_app(store).test_cli_runner()
    foreign = runner.invoke(args=["harvest", "dlq", "skip", b.dead, "--tenant", "acme"])
    assert foreign.exit_code == 1 and b.dead in foreign.output
    found = store.get_delivery(b.dead)
    assert found is not None and found.state is DeliveryState.DLQ
    own = runner.invoke(args=["harvest", "dlq", "skip", a.dead, "--tenant", "acme", "--json"])
    assert own.exit_code == 0, own.output
    assert json.loads(own.output)["state"] == "skipped"


def test_the_unscoped_view_sees_every_tenant(store: OutboundWebhookHandler) -> None:
    a, b = seed_tenant(store, "acme"), seed_tenant(store, None)
    assert {a.subscription, b.subscription} <= ids_of(store.list_subscriptions(tenant=ALL_TENANTS))
    assert {a.dead, b.dead} <= ids_of(store.list_dlq())


def test_a_tenanted_subscription_keeps_its_tenant_through_an_edit(store: OutboundWebhookHandler) -> None:
    subscription = subscribe(store, "acme")
    changed = store.update_subscription(
        subscription, SubscriptionChanges(event_topics=["invoice.*"]), tenant="acme"
    )
    assert changed.tenant == "acme"
    assert [s.id for s in store.subscriptions_for_topic("invoice.paid", tenant="acme")] == [subscription]
    assert store.subscriptions_for_topic("invoice.paid", tenant=None) == []


# -- isolation of scoped actuator routes ------------------------------------------------------------


def foreign_routes(b: Tenancy) -> list[tuple[str, str, Any]]:
    """Every actuator route that names one of B's rows, with a body where it needs one."""
    sub = f"/subscriptions/{b.subscription}"
    return [
        ("GET", sub, None),
        ("PATCH", sub, {"description": "taken"}),
        ("PATCH", sub, {"status": "disabled"}),
        ("DELETE", sub, None),
        ("POST", f"{sub}/rotate-secret", {}),
        ("GET", f"/deliveries/{b.dead}", None),
        ("POST", "/replay", {"log_id": b.dead}),
        ("POST", "/replay", {"subscription_id": b.subscription}),
        ("POST", f"/deliveries/{b.dead}/skip", {}),
        ("POST", f"/deliveries/{b.pending}/skip", {}),
        ("GET", f"{sub}/blocked-keys", None),
        # The operational endpoint is the application's own: absent from every tenant's scope.
        ("GET", "/operational", None),
        ("POST", "/operational/test", {}),
    ]


@BUDGET
@given(st.sampled_from(["acme", "ac/me", "ACME", "é-1"]), st.sampled_from(["globex", "acme2"]), st.data())
def test_no_scoped_route_sees_or_changes_another_tenants_rows(
    store: OutboundWebhookHandler, tenant_a: str, tenant_b: str, data: st.DataObject
) -> None:
    app = make_app(store, HARVEST_ACTUATOR_TOKEN=TOKEN)
    client = app.test_client()
    # Tenants of this example alone: the store keeps the rows of the examples before it.
    tag = uuid.uuid4().hex[:6]
    tenant_a, tenant_b = f"{tenant_a}-{tag}", f"{tenant_b}-{tag}"
    a, b = seed_tenant(store, tenant_a), seed_tenant(store, tenant_b)
    untenanted = seed_tenant(store, None)
    before = snapshot(store, b), snapshot(store, untenanted)
    scope = {"tenant": tenant_a}
    for method, path, body in data.draw(st.permutations(foreign_routes(b))):
        answer = client.open(PREFIX + path, method=method, json=body, headers=AUTH, query_string=scope)
        assert answer.status_code == 404, (method, path, answer.get_json())
        assert answer.get_json()["error"]["code"].endswith("not_found")
    assert (snapshot(store, b), snapshot(store, untenanted)) == before
    listed = client.get(PREFIX + "/subscriptions", headers=AUTH, query_string=scope).get_json()
    assert [s["id"] for s in listed] == [a.subscription]
    dlq = client.get(PREFIX + "/dlq", headers=AUTH, query_string={**scope, "limit": 500}).get_json()
    assert [d["id"] for d in dlq] == [a.dead]
    stats = client.get(PREFIX + "/stats", headers=AUTH, query_string=scope).get_json()
    assert list(stats["subscriptions"]) == [a.subscription]
    shown = client.get(PREFIX + f"/deliveries/{a.dead}", headers=AUTH, query_string=scope)
    assert shown.status_code == 200 and shown.get_json()["tenant"] == tenant_a
    blocked = client.get(
        PREFIX + f"/subscriptions/{a.subscription}/blocked-keys", headers=AUTH, query_string=scope
    )
    assert blocked.get_json() == [{"ordering_key": KEY, "delivery_id": a.dead, "waiting": 1}]


@BUDGET
@given(
    st.one_of(
        st.just(""),
        st.text(TENANT_CHARS, min_size=MAX_TENANT_LENGTH + 1, max_size=MAX_TENANT_LENGTH + 2),
        st.sampled_from([" ", "a b", "a\tb", "\u202eab", "a\x7fb"]),
    ),
    st.sampled_from(
        [
            "GET /subscriptions",
            "POST /subscriptions",
            "GET /dlq",
            "GET /stats",
            "POST /replay",
            "POST /deliveries/{dead}/skip",
            "GET /subscriptions/{subscription}/blocked-keys",
            "GET /operational",
            "POST /operational/test",
        ]
    ),
)
def test_a_bad_tenant_scope_is_a_422_and_changes_nothing(
    store: OutboundWebhookHandler, tenant: str, route: str
) -> None:
    app = make_app(store, HARVEST_ACTUATOR_TOKEN=TOKEN)
    rows = seed_tenant(store, "acme")
    before = snapshot(store, rows), len(store.list_subscriptions())
    method, path = route.split()
    path = path.format(dead=rows.dead, subscription=rows.subscription)
    body: Any = {}
    if path == "/subscriptions":
        body = {"target_url": "https://receiver.example/h", "event_topics": ["a"]}
    if path == "/replay":
        body = {"log_id": rows.dead}
    answer = app.test_client().open(
        PREFIX + path,
        method=method,
        json=body if method == "POST" else None,
        headers=AUTH,
        query_string={"tenant": tenant},
    )
    assert answer.status_code == 422, answer.get_json()
    assert answer.get_json()["error"]["code"] == "validation_error"
    assert (snapshot(store, rows), len(store.list_subscriptions())) == before


def test_a_scoped_creation_is_of_its_tenant_and_cannot_name_another(store: OutboundWebhookHandler) -> None:
    client = make_app(store, HARVEST_ACTUATOR_TOKEN=TOKEN).test_client()
    body = {"target_url": "https://receiver.example/h", "event_topics": ["order.*"]}
    made = client.post(PREFIX + "/subscriptions?tenant=acme", json=body, headers=AUTH)
    assert made.status_code == 201 and made.get_json()["tenant"] == "acme"
    refused = client.post(
        PREFIX + "/subscriptions?tenant=acme", json={**body, "tenant": "globex"}, headers=AUTH
    )
    assert refused.status_code == 422 and "tenant" in refused.get_json()["error"]["fields"]
    unscoped = client.post(PREFIX + "/subscriptions", json={**body, "tenant": "globex"}, headers=AUTH)
    assert unscoped.get_json()["tenant"] == "globex"
    assert sorted(s.tenant or "" for s in store.list_subscriptions()) == ["acme", "globex"]


def test_the_upgrade_adds_the_tenant_columns_and_old_rows_are_untenanted(tmp_path: Any) -> None:
    engine = sa.create_engine(f"sqlite:///{tmp_path / 'old.db'}")
    store = SqlOutboundWebhookStore(engine)
    store.ensure_schema()
    subscription = subscribe(store, None)
    with engine.begin() as conn:
        # A database of the previous version: no tenant columns, nor their indexes.
        for table in (
            "harvest_webhook_subscriptions",
            "harvest_webhook_subscription_topics",
            "harvest_webhook_deliveries",
            "harvest_outbox",
        ):
            for index in sa.inspect(conn).get_indexes(table):
                if "tenant" in index["column_names"]:
                    conn.exec_driver_sql(f"DROP INDEX {index['name']}")
            conn.exec_driver_sql(f"ALTER TABLE {table} DROP COLUMN tenant")
    store.ensure_schema()
    columns = {c["name"] for c in sa.inspect(engine).get_columns("harvest_webhook_deliveries")}
    assert "tenant" in columns
    found = store.get_subscription(subscription, tenant=None)
    assert found is not None and found.tenant is None
    assert [s.id for s in store.subscriptions_for_topic("order.created", tenant=None)] == [subscription]
    engine.dispose()
