"""Operational webhooks: the app's own endpoint is told, through the delivery pipeline, when a
subscription is turned off and when a delivery is dead-lettered; real stores, a real receiver on
127.0.0.1, the in-process backend and a real RQ worker."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
import redis
import sqlalchemy as sa
import standardwebhooks
from flask import Flask
from hypothesis import given
from hypothesis import strategies as st
from werkzeug.wrappers import Response

from flask_harvest import (
    ConfigurationError,
    DeliveryState,
    InvalidFieldError,
    OutboundWebhookHandler,
    WebhookSubscription,
    WebhookSubscriptionStatus,
    generate_secret,
    get_engine,
)
from flask_harvest._time import utcnow
from flask_harvest.config import load_settings
from flask_harvest.errors import StoreError
from flask_harvest.outbound.signing import verify_standard
from flask_harvest.testing import CapturingReceiver, ReceivedRequest
from flask_harvest.webhooks import operational, outcome
from flask_harvest.webhooks.models import AttemptResult, Claim, DeliveryLog
from flask_harvest.webhooks.operational import (
    DELIVERY_DEAD_LETTERED,
    OPERATIONAL_SUBSCRIPTION_ID,
    SUBSCRIPTION_DISABLED,
    SUBSCRIPTION_RATE_LIMITED,
    TEST,
)
from flask_harvest.webhooks.stores.base import Outcome
from flask_harvest.webhooks.stores.sql import SqlOutboundWebhookStore

from .pipeline import FAST, make_app, rq_app, wait_final
from .test_delivery_rq import work_until_final

SECRET = generate_secret()
OPS_SECRET = generate_secret()
#: An endpoint that is never reached (the tests that use it send nothing).
ELSEWHERE = {
    "HARVEST_OPERATIONAL_WEBHOOK_URL": "https://ops.example/h",
    "HARVEST_OPERATIONAL_WEBHOOK_SECRET": "s",
}
#: Two attempts, and a subscription fails at its second failure in a row: one delivery that
#: fails twice is dead-lettered and turns its subscription off in the same outcome.
FAILING = {"HARVEST_WEBHOOKS_MAX_ATTEMPTS": 2, "HARVEST_WEBHOOKS_FAILURE_THRESHOLD": 2}


def ops_config(receiver: CapturingReceiver, path: str = "/ops") -> dict[str, Any]:
    return {
        "HARVEST_OPERATIONAL_WEBHOOK_URL": receiver.url(path),
        "HARVEST_OPERATIONAL_WEBHOOK_SECRET": OPS_SECRET,
    }


def subscribe(
    store: OutboundWebhookHandler, url: str, sub_id: str = "sub_1", topics: list[str] | None = None
) -> None:
    store.add_subscription(WebhookSubscription(url, topics or ["order.*"], SECRET, id=sub_id))


def ops_deliveries(store: OutboundWebhookHandler) -> list[DeliveryLog]:
    return store.list_deliveries(limit=100, subscription_id=OPERATIONAL_SUBSCRIPTION_ID)


def wait_ops(store: OutboundWebhookHandler, count: int, timeout: float = 20.0) -> list[DeliveryLog]:
    """Wait until ``count`` operational notifications exist and every one is final."""
    end = time.monotonic() + timeout
    while True:
        found = ops_deliveries(store)
        if len(found) >= count:
            wait_final(store, [d.id for d in found], timeout=max(0.1, end - time.monotonic()))
            return ops_deliveries(store)
        if time.monotonic() > end:
            raise TimeoutError(f"{len(found)} of {count} operational notifications after {timeout} s")
        time.sleep(0.02)


def body(request: ReceivedRequest) -> dict[str, Any]:
    data = json.loads(request.body)
    assert isinstance(data, dict)
    return data


def check_signed(request: ReceivedRequest) -> None:
    """The notification verifies with the operational secret, with ours and with the Standard
    Webhooks library; not with an ordinary subscription's."""
    verify_standard(OPS_SECRET, request.headers, request.body)
    standardwebhooks.Webhook(OPS_SECRET).verify(request.body, dict(request.headers))
    with pytest.raises(standardwebhooks.WebhookVerificationError):
        standardwebhooks.Webhook(SECRET).verify(request.body, dict(request.headers))


def fail_one_delivery(app: Flask, store: OutboundWebhookHandler, receiver: CapturingReceiver) -> str:
    """Dispatch one event to a subscription whose endpoint always answers 500; wait until it is
    dead-lettered; return its id."""
    receiver.handle("/hook", lambda _request: _status(500))
    with app.app_context():
        ids = get_engine().manager.dispatch("order.created", {"order_id": "ord_1"})
    wait_final(store, ids)
    [delivery] = [d for d in store.get_deliveries(ids) if d.subscription_id == "sub_1"]
    assert delivery.state is DeliveryState.DLQ
    return delivery.id


def _status(code: int) -> Response:
    return Response("no", status=code)


# -- delivered, signed, once per transition ------------------------------------------------------


def test_a_dead_letter_and_a_subscription_turned_off_are_notified_signed_once_each(
    store: OutboundWebhookHandler, receiver: CapturingReceiver
) -> None:
    app = make_app(store, **FAILING, **ops_config(receiver))
    subscribe(store, receiver.url("/hook"))
    # An ordinary subscription to every topic: it gets the event, never a notification.
    subscribe(store, receiver.url("/all"), "sub_all", ["*"])
    delivery_id = fail_one_delivery(app, store, receiver)

    notices = wait_ops(store, 2)
    assert sorted(d.topic for d in notices) == [DELIVERY_DEAD_LETTERED, SUBSCRIPTION_DISABLED]
    assert {d.state for d in notices} == {DeliveryState.DELIVERED}
    requests = receiver.wait_for(2, path="/ops")
    assert len(requests) == 2
    by_type = {body(r)["type"]: r for r in requests}
    for request in requests:
        check_signed(request)
        assert request.webhook_id in {d.id for d in notices}

    dead = body(by_type[DELIVERY_DEAD_LETTERED])
    assert dead["data"]["delivery_id"] == delivery_id
    assert dead["data"]["subscription_id"] == "sub_1"
    assert dead["data"]["subscription_url"] == receiver.url("/hook")
    assert dead["data"]["topic"] == "order.created"
    assert dead["data"]["attempts"] == 2
    assert dead["data"]["response_status"] == 500
    assert dead["data"]["last_error"]
    off = body(by_type[SUBSCRIPTION_DISABLED])
    assert off["data"]["subscription_id"] == "sub_1"
    assert off["data"]["status"] == "failed"
    assert off["data"]["delivery_id"] == delivery_id
    # Neither carries a secret, and both match the types the catalog lists.
    for payload in (dead, off):
        assert SECRET not in json.dumps(payload) and OPS_SECRET not in json.dumps(payload)
        event_type = get_engine(app).manager.catalog.get(payload["type"])
        assert event_type is not None and event_type.problem(payload) is None

    # The '*' subscription got the event and nothing else.
    assert [body(r) for r in receiver.requests if r.path == "/all"] == [{"order_id": "ord_1"}]
    assert all(r.path != "/all" or "harvest" not in r.body.decode() for r in receiver.requests)
    subscription = store.get_subscription("sub_1")
    assert subscription is not None and subscription.status is WebhookSubscriptionStatus.FAILED
    # A later event skips the failed subscription: a skip is no transition, and notifies nothing.
    with app.app_context():
        second = get_engine().manager.dispatch("order.created", {"order_id": "ord_2"})
    assert wait_final(store, second) == [DeliveryState.DELIVERED]
    assert len(ops_deliveries(store)) == 2


def test_a_410_disables_the_subscription_and_notifies_it(
    store: OutboundWebhookHandler, receiver: CapturingReceiver
) -> None:
    app = make_app(store, **ops_config(receiver))
    subscribe(store, receiver.url("/hook"))
    receiver.handle("/hook", lambda _request: _status(410))
    with app.app_context():
        [delivery_id] = get_engine().manager.dispatch("order.created", {})
    assert wait_final(store, [delivery_id]) == [DeliveryState.DLQ]
    notices = wait_ops(store, 2)
    assert sorted(d.topic for d in notices) == [DELIVERY_DEAD_LETTERED, SUBSCRIPTION_DISABLED]
    off = next(body(r) for r in receiver.wait_for(2, path="/ops") if body(r)["type"] == SUBSCRIPTION_DISABLED)
    assert off["data"]["status"] == "disabled"


def test_a_retry_that_is_not_the_last_notifies_nothing(
    store: OutboundWebhookHandler, receiver: CapturingReceiver
) -> None:
    app = make_app(store, HARVEST_WEBHOOKS_MAX_ATTEMPTS=3, **ops_config(receiver))
    subscribe(store, receiver.url("/hook"))
    receiver.respond("/hook", 500, times=2)  # then 200
    with app.app_context():
        [delivery_id] = get_engine().manager.dispatch("order.created", {})
    assert wait_final(store, [delivery_id]) == [DeliveryState.DELIVERED]
    assert ops_deliveries(store) == []


# -- no loop ---------------------------------------------------------------------------------------


def test_a_failing_operational_endpoint_does_not_notify_itself(
    store: OutboundWebhookHandler, receiver: CapturingReceiver
) -> None:
    app = make_app(
        store, HARVEST_WEBHOOKS_MAX_ATTEMPTS=1, HARVEST_WEBHOOKS_FAILURE_THRESHOLD=1, **ops_config(receiver)
    )
    subscribe(store, receiver.url("/hook"))
    receiver.handle("/ops", lambda _request: _status(500))
    fail_one_delivery(app, store, receiver)
    notices = wait_ops(store, 2)
    # Both notices were dead-lettered, and the endpoint itself turned off: no notice of either.
    assert {d.state for d in notices} == {DeliveryState.DLQ}
    ops = store.get_subscription(OPERATIONAL_SUBSCRIPTION_ID)
    assert ops is not None and ops.status is WebhookSubscriptionStatus.FAILED
    with app.app_context():
        get_engine().sweep()  # anything still due would run now
    assert len(ops_deliveries(store)) == 2
    assert len(store.list_deliveries(limit=100)) == 3


# -- off by default, and kept apart from ordinary dispatch -----------------------------------------


def test_nothing_is_made_when_no_endpoint_is_configured(
    store: OutboundWebhookHandler, receiver: CapturingReceiver
) -> None:
    app = make_app(store, **FAILING)
    subscribe(store, receiver.url("/hook"))
    delivery_id = fail_one_delivery(app, store, receiver)
    assert store.get_subscription(OPERATIONAL_SUBSCRIPTION_ID) is None
    assert [d.id for d in store.list_deliveries(limit=100)] == [delivery_id]
    assert get_engine(app).manager.catalog.types() == []
    assert [r.path for r in receiver.requests] == ["/hook", "/hook"]


def test_without_an_endpoint_recording_a_dead_letter_writes_no_row(
    sql_store: SqlOutboundWebhookStore, receiver: CapturingReceiver
) -> None:
    app = make_app(sql_store, **FAILING)
    subscribe(sql_store, receiver.url("/hook"))
    receiver.handle("/hook", lambda _request: _status(500))
    inserts: list[str] = []

    def count(conn: sa.Connection, cursor: Any, statement: str, *_: Any) -> None:
        if "harvest_webhook_deliveries" in statement and statement.lstrip().upper().startswith("INSERT"):
            inserts.append(statement)

    sa.event.listen(sql_store.engine, "before_cursor_execute", count)
    try:
        with app.app_context():
            [delivery_id] = get_engine().manager.dispatch("order.created", {})
        assert wait_final(sql_store, [delivery_id]) == [DeliveryState.DLQ]
    finally:
        sa.event.remove(sql_store.engine, "before_cursor_execute", count)
    assert len(inserts) == 1  # the dispatch's; recording the attempts inserts no delivery


def test_the_outcome_rules_attach_no_context_without_an_endpoint_or_for_its_own_deliveries() -> None:
    now = utcnow()
    settings = load_settings({}, {})
    configured = load_settings(ELSEWHERE, {})
    sub = WebhookSubscription("https://user:pw@r.example/h?token=t", ["a"], SECRET, id="sub_1")
    ordinary = Claim(DeliveryLog("msg_1", "sub_1", "a", "{}", attempt=9), sub, "lease")
    notice = DeliveryLog("msg_2", OPERATIONAL_SUBSCRIPTION_ID, SUBSCRIPTION_DISABLED, "{}", attempt=9)
    own = Claim(notice, sub, "lease")
    assert outcome.before_sending(ordinary, settings, now) is not None
    assert outcome.before_sending(ordinary, settings, now).operational is None  # type: ignore[union-attr]
    assert outcome.before_sending(own, configured, now).operational is None  # type: ignore[union-attr]
    result = outcome.before_sending(ordinary, configured, now)
    assert result is not None and result.state is DeliveryState.DLQ
    ctx = result.operational
    assert ctx is not None and ctx.subscription_id == OPERATIONAL_SUBSCRIPTION_ID
    # The URL as it may be shown: no credentials, no query values.
    assert ctx.subscription_url == "https://***@r.example/h?token=***"
    [notice] = operational.notices("msg_1", "sub_1", result, None)
    assert notice.topic == DELIVERY_DEAD_LETTERED and notice.subscription_id == OPERATIONAL_SUBSCRIPTION_ID


#: A notification's shape, sent by the app itself.
FORGED = operational.KINDS[SUBSCRIPTION_DISABLED].example


def test_an_ordinary_dispatch_never_reaches_the_operational_subscription(
    store: OutboundWebhookHandler, receiver: CapturingReceiver
) -> None:
    app = make_app(store, **ops_config(receiver))
    assert store.get_subscription(OPERATIONAL_SUBSCRIPTION_ID) is not None
    with app.app_context():
        assert get_engine().manager.dispatch(SUBSCRIPTION_DISABLED, FORGED) == []
        with pytest.raises(InvalidFieldError, match="reserved"):
            get_engine().operations.create_subscription(
                target_url=receiver.url("/x"), event_topics=["a"], subscription_id=OPERATIONAL_SUBSCRIPTION_ID
            )
    assert ops_deliveries(store) == []


def test_starting_again_updates_the_url_and_rotates_the_secret(
    store: OutboundWebhookHandler, receiver: CapturingReceiver
) -> None:
    make_app(store, **ops_config(receiver))
    first = store.get_subscription(OPERATIONAL_SUBSCRIPTION_ID)
    assert first is not None and first.target_url == receiver.url("/ops")
    make_app(store, **ops_config(receiver))  # the same configuration: nothing changes
    assert store.get_subscription(OPERATIONAL_SUBSCRIPTION_ID) == first
    new_secret = generate_secret()
    make_app(
        store,
        HARVEST_OPERATIONAL_WEBHOOK_URL=receiver.url("/ops2"),
        HARVEST_OPERATIONAL_WEBHOOK_SECRET=new_secret,
    )
    moved = store.get_subscription(OPERATIONAL_SUBSCRIPTION_ID)
    assert moved is not None
    assert moved.target_url == receiver.url("/ops2")
    assert moved.secret == new_secret and moved.previous_secret == OPS_SECRET
    assert moved.signing_secrets(utcnow()) == [new_secret, OPS_SECRET]


def test_the_catalog_lists_the_notifications_without_warning_about_ordinary_patterns(
    store: OutboundWebhookHandler, receiver: CapturingReceiver
) -> None:
    app = make_app(store, **ops_config(receiver))
    catalog = get_engine(app).manager.catalog
    assert [t.name for t in catalog.types()] == [
        DELIVERY_DEAD_LETTERED,
        TEST,
        SUBSCRIPTION_DISABLED,
        SUBSCRIPTION_RATE_LIMITED,
    ]
    assert catalog.unmatched_patterns(["order.*"]) == []


# -- the notification commits with its transition --------------------------------------------------


def test_a_notification_that_cannot_be_written_leaves_the_transition_unwritten(
    sql_store: SqlOutboundWebhookStore,
) -> None:
    configured = load_settings(ELSEWHERE, {})
    sql_store.add_subscription(WebhookSubscription("https://r.example/h", ["a"], SECRET, id="sub_1"))
    now = utcnow()
    sql_store.log_deliveries([DeliveryLog("msg_1", "sub_1", "a", "{}", attempt=1, next_attempt_at=now)])
    claim = sql_store.claim_delivery("msg_1", now=now, lease_seconds=60, max_attempts=1)
    assert claim is not None
    # Past the attempt limit: dead-lettered without a request.
    past_limit = Claim(claim.delivery.replace(attempt=9), claim.subscription, claim.lease_token)
    result = outcome.before_sending(past_limit, configured, now)
    assert isinstance(result, AttemptResult) and result.operational is not None

    def refuse_the_notice(conn: sa.Connection, cursor: Any, statement: str, params: Any, *_: Any) -> None:
        if statement.lstrip().upper().startswith("INSERT INTO HARVEST_WEBHOOK_DELIVERIES"):
            raise RuntimeError("the notice's insert fails")

    sa.event.listen(sql_store.engine, "before_cursor_execute", refuse_the_notice)
    try:
        with pytest.raises((StoreError, RuntimeError)):
            sql_store.finish_attempts([Outcome("msg_1", claim.lease_token, result)])
    finally:
        sa.event.remove(sql_store.engine, "before_cursor_execute", refuse_the_notice)
    stored = sql_store.get_delivery("msg_1")
    assert stored is not None and stored.state is DeliveryState.INFLIGHT  # not dead-lettered
    assert ops_deliveries(sql_store) == []
    # Written again, both commit together, once.
    [recorded] = sql_store.finish_attempts([Outcome("msg_1", claim.lease_token, result)])
    assert recorded.held and [n.topic for n in recorded.notices] == [DELIVERY_DEAD_LETTERED]
    assert [d.id for d in ops_deliveries(sql_store)] == [recorded.notices[0].id]
    [again] = sql_store.finish_attempts([Outcome("msg_1", claim.lease_token, result)])
    assert not again.held and again.notices == ()
    assert len(ops_deliveries(sql_store)) == 1


# -- a real RQ worker ------------------------------------------------------------------------------


@pytest.mark.redis
def test_an_rq_worker_delivers_the_notifications(
    sql_store: SqlOutboundWebhookStore, redis_conn: redis.Redis, redis_url: str, receiver: CapturingReceiver
) -> None:
    app = rq_app(sql_store, redis_url, **FAILING, **ops_config(receiver))
    subscribe(sql_store, receiver.url("/hook"))
    receiver.handle("/hook", lambda _request: _status(500))
    with app.app_context():
        ids = get_engine().manager.dispatch("order.created", {})
    assert work_until_final(app, ids) == [DeliveryState.DLQ]
    notices = ops_deliveries(sql_store)
    assert len(notices) == 2
    assert work_until_final(app, [d.id for d in notices]) == [DeliveryState.DELIVERED]
    requests = receiver.wait_for(2, path="/ops")
    assert sorted(body(r)["type"] for r in requests) == [DELIVERY_DEAD_LETTERED, SUBSCRIPTION_DISABLED]
    for request in requests:
        check_signed(request)


# -- configuration -------------------------------------------------------------------------------

HOSTILE = st.one_of(
    st.text(max_size=40),
    st.binary(max_size=20),
    st.integers(),
    st.floats(),
    st.none(),
    st.lists(st.text(max_size=5), max_size=3),
    st.sampled_from(
        [
            "ftp://x.example/h",
            "http://127.0.0.1/h",
            "https://",
            "https://x.example/\x00",
            "//x",
            "https://x.example/h\udc80",
            "whsec_!!!",
            "whsec_",
            "x" * 9000,
        ]
    ),
)


@given(url=HOSTILE, secret=HOSTILE)
def test_hostile_configuration_is_refused_with_a_configuration_error(url: object, secret: object) -> None:
    config = {"HARVEST_OPERATIONAL_WEBHOOK_URL": url, "HARVEST_OPERATIONAL_WEBHOOK_SECRET": secret}
    try:
        settings = load_settings(config, {})
    except ConfigurationError:
        return
    # Accepted: then it is an endpoint the pipeline can use, or nothing at all.
    if settings.operational_webhook_url:
        subscription = operational.subscription_for(settings)
        assert subscription is not None
        assert subscription.target_url == url
    else:
        assert settings.operational_webhook_secret == ""


@pytest.mark.parametrize(
    "url", ["http://127.0.0.1/ops", "ftp://ops.example/", "https://ops.example/\\x", "not a url", ""]
)
def test_a_refused_endpoint_is_named_without_showing_the_secret(url: str) -> None:
    secret = generate_secret()
    with pytest.raises(ConfigurationError, match="HARVEST_OPERATIONAL_WEBHOOK_") as raised:
        load_settings(
            {"HARVEST_OPERATIONAL_WEBHOOK_URL": url, "HARVEST_OPERATIONAL_WEBHOOK_SECRET": secret}, {}
        )
    assert secret not in str(raised.value) and secret[6:20] not in str(raised.value)


def test_the_endpoint_may_be_on_loopback_where_private_targets_are_allowed() -> None:
    settings = load_settings(
        {
            **FAST,
            "HARVEST_OPERATIONAL_WEBHOOK_URL": "http://127.0.0.1:9/ops",
            "HARVEST_OPERATIONAL_WEBHOOK_SECRET": OPS_SECRET,
        },
        {},
    )
    assert settings.operational_webhook_url == "http://127.0.0.1:9/ops"
    assert OPS_SECRET not in repr(settings)
