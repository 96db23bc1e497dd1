"""Delivery against a real receiver on 127.0.0.1, through the in-process backend, on every store."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
import standardwebhooks
import stripe
from flask import Flask
from werkzeug.wrappers import Request, Response

from flask_harvest import (
    DeliveryState,
    EnqueueError,
    OutboundWebhookHandler,
    WebhookSubscription,
    WebhookSubscriptionStatus,
    __version__,
    generate_secret,
    get_engine,
    signals,
)
from flask_harvest._time import utcnow
from flask_harvest.jobs.local import LocalBackend
from flask_harvest.outbound.signing import verify_standard, verify_stripe
from flask_harvest.testing import CapturingReceiver

from .pipeline import make_app, wait_final

SECRET = generate_secret()


def subscribe(
    store: OutboundWebhookHandler, url: str, sub_id: str = "sub_1", **kw: Any
) -> WebhookSubscription:
    return store.add_subscription(WebhookSubscription(url, ["order.*"], SECRET, id=sub_id, **kw))


def test_dispatch_delivers_a_signed_request(
    store: OutboundWebhookHandler, receiver: CapturingReceiver
) -> None:
    app = make_app(store)
    subscribe(store, receiver.url("/hook"))
    with app.app_context():
        [delivery_id] = get_engine().manager.dispatch("order.created", {"order_id": "ord_1", "total": 4.2})
        assert wait_final(store, [delivery_id]) == [DeliveryState.DELIVERED]
    [request] = receiver.requests
    assert request.body == b'{"order_id":"ord_1","total":4.2}'
    assert request.webhook_id == delivery_id
    assert request.headers["content-type"] == "application/json"
    assert request.headers["user-agent"] == f"flask-harvest/{__version__}"
    # Independent verifiers: the Standard Webhooks library and Stripe's.
    standardwebhooks.Webhook(SECRET).verify(request.body, dict(request.headers))
    stripe.WebhookSignature.verify_header(
        request.body.decode(), request.headers["autumn-signature"], SECRET, tolerance=300
    )
    stored = store.get_delivery(delivery_id)
    assert stored is not None
    assert stored.response_status == 200
    assert stored.request_headers["webhook-id"] == delivery_id


def test_retry_keeps_the_id_and_signs_a_fresh_timestamp(
    store: OutboundWebhookHandler, receiver: CapturingReceiver
) -> None:
    app = make_app(store)
    subscribe(store, receiver.url("/hook"))
    receiver.respond("/hook", 503, "busy", {"Retry-After": "1"})
    with app.app_context():
        [delivery_id] = get_engine().manager.dispatch("order.created", {"n": 1})
        assert wait_final(store, [delivery_id]) == [DeliveryState.DELIVERED]
    first, second = receiver.requests
    assert first.webhook_id == second.webhook_id == delivery_id
    assert int(second.headers["webhook-timestamp"]) > int(first.headers["webhook-timestamp"])
    for request in (first, second):  # each attempt verifies, with our verifier and with theirs
        verify_standard(SECRET, request.headers, request.body)
        verify_stripe(SECRET, request.headers["autumn-signature"], request.body)
        standardwebhooks.Webhook(SECRET).verify(request.body, dict(request.headers))
        stripe.WebhookSignature.verify_header(
            request.body.decode(), request.headers["autumn-signature"], SECRET, tolerance=300
        )
    stored = store.get_delivery(delivery_id)
    assert stored is not None
    assert stored.attempt == 2
    attempts = store.list_attempts(delivery_id)
    assert [a.response_status for a in attempts][-1] == 200
    if store.supports_transactions:  # the SQL store keeps every attempt
        assert [a.response_status for a in attempts] == [503, 200]


def test_410_gone_disables_the_subscription(
    store: OutboundWebhookHandler, receiver: CapturingReceiver
) -> None:
    app = make_app(store)
    subscribe(store, receiver.url("/gone"))
    receiver.respond("/gone", 410)
    disabled: list[str] = []

    def on_disabled(sender: Flask, subscription_id: str, **extra: Any) -> None:
        disabled.append(subscription_id)

    with signals.subscription_disabled.connected_to(on_disabled, app), app.app_context():
        [delivery_id] = get_engine().manager.dispatch("order.created", {})
        assert wait_final(store, [delivery_id]) == [DeliveryState.DLQ]
        # The signal follows the recorded outcome, on the worker's thread: wait for it.
        deadline = time.monotonic() + 10
        while not disabled and time.monotonic() < deadline:
            time.sleep(0.01)
    assert len(receiver.requests) == 1  # no retry after 410
    subscription = store.get_subscription("sub_1")
    assert subscription is not None
    assert subscription.status is WebhookSubscriptionStatus.DISABLED
    assert disabled == ["sub_1"]


def test_redirect_is_a_failure_and_never_followed(
    store: OutboundWebhookHandler, receiver: CapturingReceiver
) -> None:
    app = make_app(store, HARVEST_WEBHOOKS_MAX_ATTEMPTS=2)
    subscribe(store, receiver.url("/moved"))
    receiver.handle("/moved", lambda r: Response("", 302, {"Location": receiver.url("/elsewhere")}))
    with app.app_context():
        [delivery_id] = get_engine().manager.dispatch("order.created", {})
        assert wait_final(store, [delivery_id]) == [DeliveryState.DLQ]
    assert [r.path for r in receiver.requests] == ["/moved", "/moved"]
    stored = store.get_delivery(delivery_id)
    assert stored is not None
    assert stored.last_error == "server returned status: 302"


def test_connection_refused_is_retried_then_dead_lettered(store: OutboundWebhookHandler) -> None:
    app = make_app(store, HARVEST_WEBHOOKS_MAX_ATTEMPTS=2)
    subscribe(store, "http://127.0.0.1:9/closed")  # the discard port: nothing listens here
    with app.app_context():
        [delivery_id] = get_engine().manager.dispatch("order.created", {})
        assert wait_final(store, [delivery_id]) == [DeliveryState.DLQ]
    stored = store.get_delivery(delivery_id)
    assert stored is not None
    assert stored.attempt == 2
    assert stored.last_error == "connection failed: connection refused"
    assert stored.response_status is None


def test_read_timeout_is_a_failure(store: OutboundWebhookHandler, receiver: CapturingReceiver) -> None:
    app = make_app(store, HARVEST_WEBHOOKS_MAX_ATTEMPTS=1, HARVEST_WEBHOOKS_TIMEOUT_SECONDS=0.3)

    def slow(_request: Request) -> Response:
        time.sleep(1.5)
        return Response("late")

    receiver.handle("/slow", slow)
    subscribe(store, receiver.url("/slow"))
    with app.app_context():
        [delivery_id] = get_engine().manager.dispatch("order.created", {})
        assert wait_final(store, [delivery_id]) == [DeliveryState.DLQ]
    stored = store.get_delivery(delivery_id)
    assert stored is not None
    assert stored.last_error == "read timed out after 0.3 s"


def test_a_dripping_receiver_is_cut_off_at_the_deadline(
    store: OutboundWebhookHandler, receiver: CapturingReceiver
) -> None:
    app = make_app(
        store,
        HARVEST_WEBHOOKS_MAX_ATTEMPTS=1,
        # Each byte arrives well within the read timeout (0.2 s apart, so only a machine 25 times
        # slower than the receiver's clock could see a read timeout instead)...
        HARVEST_WEBHOOKS_TIMEOUT_SECONDS=5,
        HARVEST_WEBHOOKS_DEADLINE_SECONDS=1,  # ...but the whole answer would take 10 s
    )

    def drip(_request: Request) -> Response:
        def body() -> Iterator[bytes]:
            for _ in range(50):
                time.sleep(0.2)
                yield b"x"

        return Response(body(), 200, direct_passthrough=True)

    receiver.handle("/drip", drip)
    subscribe(store, receiver.url("/drip"))
    with app.app_context():
        [delivery_id] = get_engine().manager.dispatch("order.created", {})
        assert wait_final(store, [delivery_id]) == [DeliveryState.DLQ]
    stored = store.get_delivery(delivery_id)
    assert stored is not None
    assert stored.last_error == "attempt exceeded its deadline of 1 s"
    assert stored.elapsed_ms is not None
    assert stored.elapsed_ms < 5000


def test_a_huge_response_is_read_only_up_to_the_limit(
    store: OutboundWebhookHandler, receiver: CapturingReceiver
) -> None:
    app = make_app(store)

    def huge(_request: Request) -> Response:
        chunk = b"y" * 65536
        return Response((chunk for _ in range(800)), 200, direct_passthrough=True)  # 50 MB

    receiver.handle("/huge", huge)
    subscribe(store, receiver.url("/huge"))
    with app.app_context():
        [delivery_id] = get_engine().manager.dispatch("order.created", {})
        assert wait_final(store, [delivery_id]) == [DeliveryState.DELIVERED]
    stored = store.get_delivery(delivery_id)
    assert stored is not None
    assert stored.response_body == "y" * 20 * 1024


def test_failures_disable_at_the_threshold_and_success_resets_the_count(
    store: OutboundWebhookHandler, receiver: CapturingReceiver
) -> None:
    app = make_app(store, HARVEST_WEBHOOKS_MAX_ATTEMPTS=1, HARVEST_WEBHOOKS_FAILURE_THRESHOLD=3)
    subscribe(store, receiver.url("/flaky"))
    failed: list[str] = []

    def on_failed(sender: Flask, subscription_id: str, **extra: Any) -> None:
        failed.append(subscription_id)

    def dispatch_one() -> DeliveryState:
        [delivery_id] = get_engine().manager.dispatch("order.created", {})
        [state] = wait_final(store, [delivery_id])
        return state

    def failures() -> int:
        subscription = store.get_subscription("sub_1")
        assert subscription is not None
        return subscription.consecutive_failures

    with signals.subscription_failed.connected_to(on_failed, app), app.app_context():
        receiver.respond("/flaky", 500, times=2)
        assert [dispatch_one(), dispatch_one()] == [DeliveryState.DLQ, DeliveryState.DLQ]
        assert failures() == 2
        assert dispatch_one() is DeliveryState.DELIVERED
        assert failures() == 0
        receiver.respond("/flaky", 500, times=3)
        for _ in range(3):
            dispatch_one()
        subscription = store.get_subscription("sub_1")
        assert subscription is not None
        assert subscription.status is WebhookSubscriptionStatus.FAILED
        assert failed == ["sub_1"]
        # A failed subscription gets SKIPPED rows and no requests.
        before = len(receiver.requests)
        assert get_engine().manager.dispatch("order.created", {}) == []
        assert len(receiver.requests) == before


def test_inactive_subscriptions_get_skipped_rows(
    store: OutboundWebhookHandler, receiver: CapturingReceiver
) -> None:
    app = make_app(store)
    subscribe(store, receiver.url("/on"), "sub_on")
    subscribe(store, receiver.url("/off"), "sub_off", status=WebhookSubscriptionStatus.DISABLED)
    skipped: list[str] = []

    def on_skipped(sender: Flask, delivery: Any, **extra: Any) -> None:
        skipped.append(delivery.id)

    with signals.delivery_skipped.connected_to(on_skipped, app), app.app_context():
        ids = get_engine().manager.dispatch("order.created", {})
        assert wait_final(store, ids) == [DeliveryState.DELIVERED]
    [skipped_id] = skipped
    row = store.get_delivery(skipped_id)
    assert row is not None
    assert row.state is DeliveryState.SKIPPED
    assert row.subscription_id == "sub_off"
    assert [r.path for r in receiver.requests] == ["/on"]


def test_an_enqueue_failure_dead_letters_and_names_the_deliveries(
    store: OutboundWebhookHandler, receiver: CapturingReceiver
) -> None:
    app = make_app(store, HARVEST_JOBS_BACKEND="rq", HARVEST_REDIS_URL="redis://127.0.0.1:9/0")
    subscribe(store, receiver.url("/hook"))
    with app.app_context(), pytest.raises(EnqueueError) as caught:
        get_engine().manager.dispatch("order.created", {"n": 1})
    [delivery_id] = caught.value.delivery_ids
    assert delivery_id in str(caught.value)
    stored = store.get_delivery(delivery_id)
    assert stored is not None
    assert stored.state is DeliveryState.DLQ
    assert stored.last_error is not None
    assert stored.last_error.startswith("enqueue failed")
    assert [d.id for d in store.list_dlq()] == [delivery_id]


def test_a_delegate_takes_over_and_its_error_reaches_the_caller(
    store: OutboundWebhookHandler, receiver: CapturingReceiver
) -> None:
    handed: list[str] = []

    def delegate(delivery: Any, subscription: WebhookSubscription) -> None:
        handed.append(delivery.id)
        if len(handed) > 1:
            raise RuntimeError("delegate is down")

    app = make_app(store, delegate=delegate)
    subscribe(store, receiver.url("/hook"))
    with app.app_context():
        [first] = get_engine().manager.dispatch("order.created", {})
        with pytest.raises(RuntimeError, match="delegate is down"):
            get_engine().manager.dispatch("order.created", {})
    assert handed[0] == first
    time.sleep(2.1)  # past the sweeper's grace period: the rows are due and have no job...
    with app.app_context():
        assert get_engine().sweep().requeued == 0  # ...but the delegate owns them
    for delivery_id in handed:  # handed over, not sent, and never dead-lettered
        stored = store.get_delivery(delivery_id)
        assert stored is not None
        assert stored.state is DeliveryState.PENDING
    assert receiver.requests == []


def test_a_delegate_is_handed_replays_and_test_events_too(
    store: OutboundWebhookHandler, receiver: CapturingReceiver
) -> None:
    """The delegate owns the app's deliveries: a replay or a test event goes to it, as a dispatch
    does, never to the job backend behind its back."""
    handed: list[tuple[str, str]] = []
    app = make_app(store, delegate=lambda d, s: handed.append((d.id, s.id)))
    subscribe(store, receiver.url("/hook"))
    with app.app_context():
        engine = get_engine()
        engine.manager.catalog.register(
            "order.created", description="An order.", schema={"type": "object"}, example={"id": "o_1"}
        )
        [dispatched] = engine.manager.dispatch("order.created", {"id": "o_2"})
        store.dead_letter([dispatched], "gave up", now=utcnow())
        engine.operations.replay(dispatched)
        tested, _ = engine.operations.send_test_event("sub_1", "order.created")
        assert isinstance(engine.backend, LocalBackend)
        assert engine.backend.join(timeout=10)  # any job queued meanwhile has run
    assert handed == [(dispatched, "sub_1"), (dispatched, "sub_1"), (tested.id, "sub_1")]
    assert receiver.requests == []


def test_with_a_delegate_the_operational_test_takes_the_road_real_notices_take(
    store: OutboundWebhookHandler, receiver: CapturingReceiver
) -> None:
    """Operational notifications are the workers' to send even with a delegate (those an outcome
    logs are queued as jobs), so the endpoint's test goes the same way, not to the delegate."""
    handed: list[str] = []
    app = make_app(
        store,
        delegate=lambda d, s: handed.append(s.id),
        HARVEST_OPERATIONAL_WEBHOOK_URL=receiver.url("/ops"),
        HARVEST_OPERATIONAL_WEBHOOK_SECRET=SECRET,
    )
    with app.app_context():
        notice, not_queued = get_engine().operations.send_operational_test()
    assert not_queued is None
    [received] = receiver.wait_for(1, path="/ops")
    assert received.webhook_id == notice.id
    assert handed == []
