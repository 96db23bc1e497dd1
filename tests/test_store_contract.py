"""The store contract: every store (memory, SQLite, PostgreSQL) passes these same tests."""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from typing import Any, TypeVar

import pytest

from flask_harvest.errors import (
    DeliveryNotFoundError,
    DuplicateSubscriptionError,
    InvalidFieldError,
    InvalidStateError,
    SubscriptionNotFoundError,
)
from flask_harvest.webhooks.models import (
    AttemptResult,
    Claim,
    DeliveryAttempt,
    DeliveryLog,
    DeliveryState,
    SubscriptionChanges,
    SubscriptionEffect,
    WebhookSubscription,
    WebhookSubscriptionStatus,
    new_id,
    utcnow,
)
from flask_harvest.webhooks.stores import OutboundWebhookHandler, StoreCapabilities
from flask_harvest.webhooks.stores.base import DeliverySchedule, Outcome, Recorded
from flask_harvest.webhooks.stores.sql import SqlOutboundWebhookStore

SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
OTHER_SECRET = "whsec_YW5vdGhlci1zZWNyZXQtb2YtdGhlLWNvbnRyYWN0LXRlc3Q="
THIRD_SECRET = "whsec_YS10aGlyZC1zZWNyZXQtb2YtdGhlLWNvbnRyYWN0LXRlc3Q="
LEASE = 30.0
T = TypeVar("T")

Active = WebhookSubscriptionStatus.ACTIVE
Disabled = WebhookSubscriptionStatus.DISABLED
Failed = WebhookSubscriptionStatus.FAILED


@pytest.fixture
def now() -> datetime:
    return utcnow()


def make_subscription(**changes: Any) -> WebhookSubscription:
    values: dict[str, Any] = {
        "target_url": "https://receiver.example/hooks",
        "event_topics": ["order.created"],
        "secret": SECRET,
    }
    values.update(changes)
    return WebhookSubscription(**values)


def make_delivery(subscription_id: str, now: datetime, **changes: Any) -> DeliveryLog:
    values: dict[str, Any] = {
        "id": new_id("dlv"),
        "subscription_id": subscription_id,
        "topic": "order.created",
        "payload": '{"id": 1}',
        "timestamp": now,
        "next_attempt_at": now,
        "created_at": now,
    }
    values.update(changes)
    return DeliveryLog(**values)


def result_for(
    delivery: DeliveryLog,
    now: datetime,
    *,
    state: DeliveryState,
    effect: SubscriptionEffect = SubscriptionEffect.NONE,
    status: int | None = 500,
    next_attempt_at: datetime | None = None,
    threshold: int = 50,
    headers: dict[str, str] | None = None,
    with_attempt: bool = True,
) -> AttemptResult:
    attempt = DeliveryAttempt(
        delivery_id=delivery.id,
        attempt=delivery.attempt,
        started_at=now,
        response_status=status,
        response_body=f"status {status}",
        elapsed_ms=12,
        error=None if status and status < 300 else f"HTTP {status}",
    )
    return AttemptResult(
        state=state,
        attempt_number=delivery.attempt,
        next_attempt_at=next_attempt_at,
        last_error=attempt.error,
        timestamp=now,
        request_headers=headers if headers is not None else {"webhook-id": delivery.id},
        attempt=attempt if with_attempt else None,
        effect=effect,
        failure_threshold=threshold,
    )


def success_for(delivery: DeliveryLog, now: datetime, **changes: Any) -> AttemptResult:
    """A 200 that resets the subscription's failure count."""
    return result_for(
        delivery,
        now,
        state=DeliveryState.DELIVERED,
        effect=SubscriptionEffect.RESET_FAILURES,
        status=200,
        **changes,
    )


def seed(store: OutboundWebhookHandler, now: datetime, **changes: Any) -> tuple[str, DeliveryLog]:
    """Add a subscription and one due delivery for it."""
    subscription = store.add_subscription(make_subscription())
    delivery = make_delivery(subscription.id, now, **changes)
    assert store.log_deliveries([delivery]) == [delivery.id]
    return subscription.id, delivery


def stored_subscription(store: OutboundWebhookHandler, subscription_id: str) -> WebhookSubscription:
    subscription = store.get_subscription(subscription_id)
    assert subscription is not None
    return subscription


def stored_delivery(store: OutboundWebhookHandler, delivery_id: str) -> DeliveryLog:
    delivery = store.get_delivery(delivery_id)
    assert delivery is not None
    return delivery


def fail_once(
    store: OutboundWebhookHandler, delivery: DeliveryLog, now: datetime, threshold: int
) -> WebhookSubscriptionStatus | None:
    """Claim the delivery and record a counted failure that schedules a retry."""
    claim = store.claim_delivery(delivery.id, now=now, lease_seconds=LEASE, max_attempts=5)
    assert claim is not None
    result = result_for(
        claim.delivery,
        now,
        state=DeliveryState.PENDING,
        effect=SubscriptionEffect.COUNT_FAILURE,
        next_attempt_at=now,
        threshold=threshold,
    )
    return store.finish_attempt(delivery.id, claim.lease_token, result)


def in_threads(count: int, work: Callable[[int], T]) -> list[T]:
    """Run ``work(i)`` in ``count`` threads released together; return their results."""
    barrier = threading.Barrier(count)
    results: list[Any] = [None] * count
    errors: list[BaseException] = []

    def run(index: int) -> None:
        barrier.wait()
        try:
            results[index] = work(index)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not errors, errors
    return results


# -- subscriptions -----------------------------------------------------------------------------


def test_subscription_crud(store: OutboundWebhookHandler, now: datetime) -> None:
    first = store.add_subscription(make_subscription(created_at=now - timedelta(seconds=2)))
    second = store.add_subscription(make_subscription(description="b", created_at=now))

    assert store.get_subscription(first.id) == first
    assert store.get_subscription("sub_missing") is None
    assert [s.id for s in store.list_subscriptions()] == [first.id, second.id]

    updated = store.update_subscription(
        first.id, SubscriptionChanges(description="renamed", event_topics=["a.b", "a.b"])
    )
    assert updated.description == "renamed"
    assert updated.event_topics == ("a.b",)
    assert updated.updated_at >= first.updated_at
    assert updated == first.replace(
        description="renamed", event_topics=("a.b",), updated_at=updated.updated_at
    )
    assert store.get_subscription(first.id) == updated

    assert store.remove_subscription(first.id) is True
    assert store.remove_subscription(first.id) is False
    assert store.get_subscription(first.id) is None
    assert store.list_subscriptions() == [second]


def test_sql_datetimes_come_back_aware_utc(sql_store: SqlOutboundWebhookStore, now: datetime) -> None:
    # SQLite keeps no time zone; the column type stores UTC and hands back aware UTC values.
    local = now.astimezone(timezone(timedelta(hours=5)))
    subscription = sql_store.add_subscription(make_subscription(created_at=local))
    stored = stored_subscription(sql_store, subscription.id)
    assert stored.created_at == now
    assert stored.created_at.utcoffset() == timedelta(0)


def test_duplicate_subscription_id(store: OutboundWebhookHandler) -> None:
    original = store.add_subscription(make_subscription(id="sub_dup"))
    with pytest.raises(DuplicateSubscriptionError, match="sub_dup"):
        store.add_subscription(make_subscription(id="sub_dup", description="other"))
    assert store.list_subscriptions() == [original]


def test_update_unknown_subscription(store: OutboundWebhookHandler, now: datetime) -> None:
    with pytest.raises(SubscriptionNotFoundError):
        store.update_subscription("sub_nobody", SubscriptionChanges(description="x"))
    with pytest.raises(SubscriptionNotFoundError):
        store.rotate_secret("sub_nobody", OTHER_SECRET, previous_expires_at=now)
    assert store.list_subscriptions() == []


def test_update_writes_only_the_named_fields(store: OutboundWebhookHandler) -> None:
    subscription = store.add_subscription(make_subscription(consecutive_failures=7, description="d"))

    moved = store.update_subscription(
        subscription.id, SubscriptionChanges(target_url="https://other.example/h")
    )
    assert (moved.target_url, moved.description, moved.consecutive_failures) == (
        "https://other.example/h",
        "d",
        7,
    )
    disabled = store.update_subscription(subscription.id, SubscriptionChanges(status=Disabled))
    assert (disabled.status, disabled.consecutive_failures) == (Disabled, 7)
    # Enabling clears the count, as set_subscription_status does.
    enabled = store.update_subscription(subscription.id, SubscriptionChanges(status=Active))
    assert (enabled.status, enabled.consecutive_failures) == (Active, 0)
    assert enabled.secret == SECRET
    assert store.get_subscription(subscription.id) == enabled


def test_rotate_secret_keeps_the_old_one_as_previous(store: OutboundWebhookHandler, now: datetime) -> None:
    subscription = store.add_subscription(make_subscription(description="d"))
    expires = now + timedelta(hours=1)

    rotated = store.rotate_secret(subscription.id, OTHER_SECRET, previous_expires_at=expires)

    assert (rotated.secret, rotated.previous_secret) == (OTHER_SECRET, SECRET)
    assert rotated.previous_secret_expires_at == expires
    assert rotated.signing_secrets(now) == [OTHER_SECRET, SECRET]
    assert rotated.description == "d"
    assert rotated.updated_at >= subscription.updated_at
    assert store.get_subscription(subscription.id) == rotated
    twice = store.rotate_secret(subscription.id, SECRET, previous_expires_at=expires)
    assert (twice.secret, twice.previous_secret) == (SECRET, OTHER_SECRET)


def test_a_rotation_after_a_given_one_happens_once(store: OutboundWebhookHandler, now: datetime) -> None:
    """Two rotations that both saw "never rotated" (a form sent twice): the second is refused and
    the first keeps its previous secret and grace period; the store checks it in its update."""
    subscription = store.add_subscription(make_subscription())
    expires = now + timedelta(hours=1)
    first = store.rotate_secret(subscription.id, OTHER_SECRET, previous_expires_at=expires, after=None)
    with pytest.raises(InvalidStateError, match="rotated since"):
        store.rotate_secret(subscription.id, THIRD_SECRET, previous_expires_at=expires, after=None)
    assert store.get_subscription(subscription.id) == first
    assert (first.secret, first.previous_secret) == (OTHER_SECRET, SECRET)
    # After the rotation it saw, a rotation goes ahead (as read back from the store).
    seen = first.previous_secret_expires_at
    again = store.rotate_secret(subscription.id, THIRD_SECRET, previous_expires_at=expires, after=seen)
    assert (again.secret, again.previous_secret) == (THIRD_SECRET, OTHER_SECRET)
    with pytest.raises(SubscriptionNotFoundError):
        store.rotate_secret("sub_missing", THIRD_SECRET, previous_expires_at=expires, after=None)


def test_a_claim_never_pairs_a_delivery_with_another_tenants_subscription(
    store: OutboundWebhookHandler, now: datetime
) -> None:
    """An id chosen again after a removal, for another tenant: the old deliveries are as good as
    those of a removed subscription (no subscription), so they never reach the new tenant."""
    store.add_subscription(make_subscription(id="hook-1"))
    old = make_delivery("hook-1", now)
    store.log_deliveries([old])
    assert store.remove_subscription("hook-1")
    store.add_subscription(make_subscription(id="hook-1", tenant="acme"))
    claim = store.claim_delivery(old.id, now=now, lease_seconds=LEASE, max_attempts=5)
    assert claim is not None and claim.subscription is None
    fresh = make_delivery("hook-1", now, tenant="acme")
    store.log_deliveries([fresh])
    [claimed] = store.claim_deliveries([fresh.id], now=now, lease_seconds=LEASE, max_attempts=5)
    assert claimed.subscription is not None and claimed.subscription.tenant == "acme"


def test_subscriptions_for_topic(store: OutboundWebhookHandler) -> None:
    exact = store.add_subscription(make_subscription(event_topics=["order.created"]))
    prefix = store.add_subscription(make_subscription(event_topics=["order.*"]))
    every = store.add_subscription(
        make_subscription(event_topics=["*"], status=WebhookSubscriptionStatus.DISABLED)
    )
    other = store.add_subscription(make_subscription(event_topics=["invoice.paid", "x.*.y"]))

    def ids(topic: str) -> set[str]:
        return {s.id for s in store.subscriptions_for_topic(topic)}

    assert ids("order.created") == {exact.id, prefix.id, every.id}
    assert ids("order.item.added") == {prefix.id, every.id}
    assert ids("invoice.paid") == {other.id, every.id}
    assert ids("x.any.y") == {other.id, every.id}
    assert ids("order") == {every.id}


def test_set_subscription_status(store: OutboundWebhookHandler) -> None:
    subscription = store.add_subscription(make_subscription(consecutive_failures=3))

    disabled = store.set_subscription_status(subscription.id, Disabled)
    assert (disabled.status, disabled.consecutive_failures) == (Disabled, 3)
    enabled = store.set_subscription_status(subscription.id, Active)
    assert (enabled.status, enabled.consecutive_failures) == (Active, 0)
    assert store.get_subscription(subscription.id) == enabled
    with pytest.raises(SubscriptionNotFoundError):
        store.set_subscription_status("sub_nobody", Disabled)


# -- delivery logs -----------------------------------------------------------------------------


def test_log_deliveries_returns_only_inserted_ids(store: OutboundWebhookHandler, now: datetime) -> None:
    a, b, c = (make_delivery("sub_1", now) for _ in range(3))
    assert store.log_deliveries([]) == []
    assert sorted(store.log_deliveries([a, b])) == sorted([a.id, b.id])

    changed_b = b.replace(payload='{"changed": true}')
    assert store.log_deliveries([changed_b, c]) == [c.id]
    assert store.get_delivery(b.id) == b  # the existing row is left as it was
    assert store.log_deliveries([a, b, c]) == []


def test_log_many_deliveries_in_one_call(store: OutboundWebhookHandler, now: datetime) -> None:
    # More rows than one INSERT statement carries.
    deliveries = [make_delivery("sub_1", now, payload=f'{{"n": {n}}}') for n in range(1203)]
    assert sorted(store.log_deliveries(deliveries)) == sorted(d.id for d in deliveries)
    found = store.get_deliveries([d.id for d in deliveries])
    assert sorted(found, key=lambda d: d.id) == sorted(deliveries, key=lambda d: d.id)


def test_log_deliveries_for_topic(store: OutboundWebhookHandler, now: datetime) -> None:
    exact = store.add_subscription(make_subscription())
    disabled = store.add_subscription(make_subscription(status=Disabled))
    wildcard = store.add_subscription(make_subscription(event_topics=["order.*"]))
    store.add_subscription(make_subscription(event_topics=["invoice.paid"]))
    built: list[str] = []

    def build(subscription: WebhookSubscription) -> DeliveryLog:
        built.append(subscription.id)
        return make_delivery(subscription.id, now)

    pairs = store.log_deliveries_for_topic("order.created", build)

    assert sorted(built) == sorted([exact.id, disabled.id, wildcard.id])
    assert sorted(s.id for s, _ in pairs) == sorted(built)
    for subscription, delivery in pairs:
        assert subscription == store.get_subscription(subscription.id)
        assert delivery.subscription_id == subscription.id
        assert store.get_delivery(delivery.id) == delivery
    assert store.log_deliveries_for_topic("refund.issued", build) == []
    assert len(built) == 3


def test_delivery_round_trips(store: OutboundWebhookHandler, now: datetime) -> None:
    delivery = make_delivery(
        "sub_1",
        now,
        topic="order.item.added",
        payload='{"emoji": "✓", "n": 1}',
        attempt=2,
        max_attempts=7,
        request_headers={"webhook-id": "x", "content-type": "application/json"},
        response_status=503,
        response_body="busy",
        elapsed_ms=40,
        last_error="HTTP 503",
        next_attempt_at=now + timedelta(minutes=5),
    )
    store.log_deliveries([delivery])
    assert store.get_delivery(delivery.id) == delivery
    assert store.get_delivery("dlv_missing") is None


def test_get_deliveries(store: OutboundWebhookHandler, now: datetime) -> None:
    a, b, c = (make_delivery("sub_1", now) for _ in range(3))
    store.log_deliveries([a, b, c])
    found = store.get_deliveries([c.id, "dlv_missing", a.id])
    assert sorted(found, key=lambda d: d.id) == sorted([a, c], key=lambda d: d.id)
    assert store.get_deliveries([]) == []


# -- claiming and recording attempts -----------------------------------------------------------


def test_claim_only_due_pending(store: OutboundWebhookHandler, now: datetime) -> None:
    subscription_id, due = seed(store, now)
    later = make_delivery(subscription_id, now, next_attempt_at=now + timedelta(seconds=60))
    dead = make_delivery(subscription_id, now, state=DeliveryState.DLQ, next_attempt_at=None)
    store.log_deliveries([later, dead])

    assert store.claim_delivery(later.id, now=now, lease_seconds=LEASE, max_attempts=5) is None
    assert store.claim_delivery(dead.id, now=now, lease_seconds=LEASE, max_attempts=5) is None
    assert store.claim_delivery("dlv_missing", now=now, lease_seconds=LEASE, max_attempts=5) is None

    claim = store.claim_delivery(due.id, now=now, lease_seconds=LEASE, max_attempts=3)
    assert claim is not None
    assert claim.subscription == store.get_subscription(subscription_id)
    assert claim.delivery.state is DeliveryState.INFLIGHT
    assert claim.delivery.lease_expires_at == now + timedelta(seconds=LEASE)
    assert claim.delivery.max_attempts == 3
    assert claim.lease_token
    assert store.get_delivery(due.id) == claim.delivery
    assert store.claim_delivery(due.id, now=now, lease_seconds=LEASE, max_attempts=3) is None


def test_claim_reports_a_removed_subscription(store: OutboundWebhookHandler, now: datetime) -> None:
    subscription_id, delivery = seed(store, now)
    store.remove_subscription(subscription_id)
    claim = store.claim_delivery(delivery.id, now=now, lease_seconds=LEASE, max_attempts=5)
    assert claim is not None
    assert claim.subscription is None


def test_claim_deliveries_takes_only_due_pending(store: OutboundWebhookHandler, now: datetime) -> None:
    subscription_id, first = seed(store, now)
    second = make_delivery(subscription_id, now, next_attempt_at=None)
    later = make_delivery(subscription_id, now, next_attempt_at=now + timedelta(seconds=60))
    dead = make_delivery(subscription_id, now, state=DeliveryState.DLQ, next_attempt_at=None)
    done = make_delivery(subscription_id, now, state=DeliveryState.DELIVERED, next_attempt_at=None)
    leased = make_delivery(subscription_id, now)
    store.log_deliveries([second, later, dead, done, leased])
    assert store.claim_delivery(leased.id, now=now, lease_seconds=LEASE, max_attempts=5) is not None
    ids = [first.id, later.id, dead.id, "dlv_missing", done.id, leased.id, second.id, first.id]

    claims = store.claim_deliveries(ids, now=now, lease_seconds=LEASE, max_attempts=3)

    assert sorted(claim.delivery.id for claim in claims) == sorted([first.id, second.id])
    subscription = store.get_subscription(subscription_id)
    for claim in claims:
        assert claim.subscription == subscription
        assert claim.delivery.state is DeliveryState.INFLIGHT
        assert claim.delivery.lease_expires_at == now + timedelta(seconds=LEASE)
        assert claim.delivery.max_attempts == 3
        assert claim.lease_token
        assert store.get_delivery(claim.delivery.id) == claim.delivery
    for untouched in (later, dead, done):
        assert store.get_delivery(untouched.id) == untouched
    assert store.claim_deliveries(ids, now=now, lease_seconds=LEASE, max_attempts=3) == []
    assert store.claim_deliveries([], now=now, lease_seconds=LEASE, max_attempts=3) == []


def test_claim_deliveries_returns_current_subscriptions(store: OutboundWebhookHandler, now: datetime) -> None:
    kept_id, kept_delivery = seed(store, now)
    removed_id, removed_delivery = seed(store, now)
    store.update_subscription(kept_id, SubscriptionChanges(description="changed"))
    store.remove_subscription(removed_id)

    claims = store.claim_deliveries(
        [kept_delivery.id, removed_delivery.id], now=now, lease_seconds=LEASE, max_attempts=5
    )

    by_id = {claim.delivery.id: claim for claim in claims}
    assert by_id.keys() == {kept_delivery.id, removed_delivery.id}
    kept = by_id[kept_delivery.id].subscription
    assert kept is not None
    assert kept == store.get_subscription(kept_id)
    assert kept.description == "changed"
    assert by_id[removed_delivery.id].subscription is None


def test_claim_deliveries_leases_can_be_finished(store: OutboundWebhookHandler, now: datetime) -> None:
    subscription = store.add_subscription(make_subscription(consecutive_failures=2))
    deliveries = [make_delivery(subscription.id, now) for _ in range(3)]
    store.log_deliveries(deliveries)
    claims = store.claim_deliveries([d.id for d in deliveries], now=now, lease_seconds=LEASE, max_attempts=5)
    assert len(claims) == 3

    for claim in claims:
        result = success_for(claim.delivery, now)
        assert store.finish_attempt(claim.delivery.id, claim.lease_token, result) is None
        assert stored_delivery(store, claim.delivery.id).state is DeliveryState.DELIVERED
        assert store.list_attempts(claim.delivery.id) == [result.attempt]
    assert stored_subscription(store, subscription.id).consecutive_failures == 0


def test_claim_deliveries_beyond_one_statement(store: OutboundWebhookHandler, now: datetime) -> None:
    # More ids than the SQL store puts in one IN list.
    subscription = store.add_subscription(make_subscription())
    deliveries = [make_delivery(subscription.id, now) for _ in range(1_100)]
    store.log_deliveries(deliveries)
    ids = [d.id for d in deliveries]

    claims = store.claim_deliveries(ids + ids[:10], now=now, lease_seconds=LEASE, max_attempts=5)

    assert sorted(claim.delivery.id for claim in claims) == sorted(ids)


def test_finish_success_resets_failures(store: OutboundWebhookHandler, now: datetime) -> None:
    subscription = store.add_subscription(make_subscription(consecutive_failures=4))
    delivery = make_delivery(subscription.id, now)
    store.log_deliveries([delivery])
    claim = store.claim_delivery(delivery.id, now=now, lease_seconds=LEASE, max_attempts=5)
    assert claim is not None
    done_at = now + timedelta(seconds=1)
    result = success_for(
        claim.delivery, done_at, headers={"webhook-id": delivery.id, "webhook-timestamp": "1"}
    )

    assert store.finish_attempt(delivery.id, claim.lease_token, result) is None

    stored = stored_delivery(store, delivery.id)
    assert stored.state is DeliveryState.DELIVERED
    assert (stored.response_status, stored.response_body, stored.elapsed_ms) == (200, "status 200", 12)
    assert stored.request_headers == {"webhook-id": delivery.id, "webhook-timestamp": "1"}
    assert stored.timestamp == done_at
    assert stored.lease_expires_at is None
    assert stored.next_attempt_at is None
    assert stored_subscription(store, subscription.id).consecutive_failures == 0
    assert store.list_attempts(delivery.id) == [result.attempt]
    with pytest.raises(InvalidStateError):
        store.finish_attempt(delivery.id, claim.lease_token, result)


def test_success_resets_a_failure_counted_after_its_claim(
    store: OutboundWebhookHandler, now: datetime
) -> None:
    # The claim saw no failures, but another worker counted one before this success was recorded.
    subscription_id, succeeding = seed(store, now)
    failing = make_delivery(subscription_id, now)
    store.log_deliveries([failing])
    claim = store.claim_delivery(succeeding.id, now=now, lease_seconds=LEASE, max_attempts=5)
    assert claim is not None
    assert claim.subscription is not None
    assert claim.subscription.consecutive_failures == 0
    fail_once(store, failing, now, threshold=50)
    assert stored_subscription(store, subscription_id).consecutive_failures == 1

    result = success_for(claim.delivery, now)
    assert store.finish_attempt(succeeding.id, claim.lease_token, result) is None

    assert stored_subscription(store, subscription_id).consecutive_failures == 0


def test_finish_failure_schedules_a_retry(store: OutboundWebhookHandler, now: datetime) -> None:
    subscription_id, delivery = seed(store, now)
    claim = store.claim_delivery(delivery.id, now=now, lease_seconds=LEASE, max_attempts=5)
    assert claim is not None
    retry_at = now + timedelta(seconds=2)
    result = result_for(
        claim.delivery,
        now,
        state=DeliveryState.PENDING,
        effect=SubscriptionEffect.COUNT_FAILURE,
        next_attempt_at=retry_at,
    )
    result = dataclasses.replace(result, attempt_number=2)

    assert store.finish_attempt(delivery.id, claim.lease_token, result) is None

    stored = stored_delivery(store, delivery.id)
    assert (stored.state, stored.attempt, stored.next_attempt_at) == (DeliveryState.PENDING, 2, retry_at)
    assert stored.last_error == "HTTP 500"
    assert stored_subscription(store, subscription_id).consecutive_failures == 1
    assert store.claim_delivery(delivery.id, now=now, lease_seconds=LEASE, max_attempts=5) is None
    assert store.claim_delivery(delivery.id, now=retry_at, lease_seconds=LEASE, max_attempts=5)


def test_finish_without_attempt_keeps_response(store: OutboundWebhookHandler, now: datetime) -> None:
    subscription_id, delivery = seed(
        store, now, response_status=503, response_body="busy", elapsed_ms=9, request_headers={"a": "b"}
    )
    claim = store.claim_delivery(delivery.id, now=now, lease_seconds=LEASE, max_attempts=5)
    assert claim is not None
    result = result_for(claim.delivery, now, state=DeliveryState.DLQ, with_attempt=False, headers={})

    assert store.finish_attempt(delivery.id, claim.lease_token, result) is None

    stored = stored_delivery(store, delivery.id)
    assert stored.state is DeliveryState.DLQ
    assert (stored.response_status, stored.response_body, stored.elapsed_ms) == (503, "busy", 9)
    assert stored.request_headers == {"a": "b"}
    assert store.list_attempts(delivery.id) == []
    assert stored_subscription(store, subscription_id).consecutive_failures == 0


def test_wrong_lease_token_writes_nothing(store: OutboundWebhookHandler, now: datetime) -> None:
    subscription_id, delivery = seed(store, now)
    claim = store.claim_delivery(delivery.id, now=now, lease_seconds=LEASE, max_attempts=5)
    assert claim is not None
    result = result_for(
        claim.delivery, now, state=DeliveryState.DLQ, effect=SubscriptionEffect.COUNT_FAILURE, threshold=1
    )

    with pytest.raises(InvalidStateError, match="lease"):
        store.finish_attempt(delivery.id, "0" * 32, result)

    assert store.get_delivery(delivery.id) == claim.delivery
    assert store.list_attempts(delivery.id) == []
    subscription = stored_subscription(store, subscription_id)
    assert (subscription.status, subscription.consecutive_failures) == (Active, 0)
    with pytest.raises(InvalidStateError):
        store.finish_attempt("dlv_missing", claim.lease_token, result)


def test_failure_threshold_reported_once(store: OutboundWebhookHandler, now: datetime) -> None:
    subscription_id, delivery = seed(store, now)
    changes = [fail_once(store, delivery, now, threshold=3) for _ in range(5)]
    assert changes == [None, None, Failed, None, None]
    subscription = stored_subscription(store, subscription_id)
    assert (subscription.status, subscription.consecutive_failures) == (Failed, 5)


def test_gone_disables_the_subscription(store: OutboundWebhookHandler, now: datetime) -> None:
    subscription_id, first = seed(store, now)
    second = make_delivery(subscription_id, now)
    store.log_deliveries([second])
    changes = []
    for delivery in (first, second):
        claim = store.claim_delivery(delivery.id, now=now, lease_seconds=LEASE, max_attempts=5)
        assert claim is not None
        result = result_for(
            claim.delivery, now, state=DeliveryState.DLQ, effect=SubscriptionEffect.DISABLE, status=410
        )
        changes.append(store.finish_attempt(delivery.id, claim.lease_token, result))
    assert changes == [Disabled, None]
    assert stored_subscription(store, subscription_id).status is Disabled


def test_effect_on_a_removed_subscription(store: OutboundWebhookHandler, now: datetime) -> None:
    subscription_id, delivery = seed(store, now)
    store.remove_subscription(subscription_id)
    assert fail_once(store, delivery, now, threshold=1) is None
    assert store.get_subscription(subscription_id) is None


def test_list_attempts_has_the_latest(store: OutboundWebhookHandler, now: datetime) -> None:
    _, delivery = seed(store, now)
    fail_once(store, delivery, now, threshold=50)
    later = now + timedelta(seconds=5)
    fail_once(store, delivery, later, threshold=50)
    attempts = store.list_attempts(delivery.id)
    assert attempts[-1].started_at == later
    assert store.list_attempts("dlv_missing") == []


def test_sql_store_keeps_every_attempt(sql_store: SqlOutboundWebhookStore, now: datetime) -> None:
    _, delivery = seed(sql_store, now)
    times = [now + timedelta(seconds=n) for n in range(3)]
    for at in times:
        fail_once(sql_store, delivery, at, threshold=50)
    attempts = sql_store.list_attempts(delivery.id)
    assert [a.started_at for a in attempts] == times
    assert all(a.delivery_id == delivery.id and a.response_status == 500 for a in attempts)


# -- dead letters, replay, leases, scheduling --------------------------------------------------


def test_dead_letter_moves_only_pending(store: OutboundWebhookHandler, now: datetime) -> None:
    subscription_id, pending = seed(store, now)
    inflight, delivered = make_delivery(subscription_id, now), make_delivery(subscription_id, now)
    store.log_deliveries([inflight, delivered.replace(state=DeliveryState.DELIVERED)])
    assert store.claim_delivery(inflight.id, now=now, lease_seconds=LEASE, max_attempts=5)
    later = now + timedelta(seconds=1)

    moved = store.dead_letter(
        [pending.id, inflight.id, delivered.id, "dlv_missing"], "enqueue failed: down", now=later
    )

    assert moved == [pending.id]
    stored = stored_delivery(store, pending.id)
    assert (stored.state, stored.last_error) == (DeliveryState.DLQ, "enqueue failed: down")
    assert (stored.timestamp, stored.next_attempt_at) == (later, None)
    assert stored_delivery(store, inflight.id).state is DeliveryState.INFLIGHT
    assert stored_delivery(store, delivered.id).state is DeliveryState.DELIVERED
    assert store.dead_letter([], "x", now=now) == []


def test_replay(store: OutboundWebhookHandler, now: datetime) -> None:
    _, delivery = seed(store, now, attempt=5)
    store.dead_letter([delivery.id], "attempts exhausted", now=now)
    later = now + timedelta(hours=1)

    replayed = store.replay_delivery(delivery.id, now=later)

    assert (replayed.id, replayed.payload, replayed.topic) == (delivery.id, delivery.payload, delivery.topic)
    assert (replayed.state, replayed.attempt, replayed.next_attempt_at) == (DeliveryState.PENDING, 1, later)
    assert store.get_delivery(delivery.id) == replayed
    assert store.due_deliveries(now=later, limit=10) == [delivery.id]
    with pytest.raises(InvalidStateError, match="pending, not dead-lettered"):
        store.replay_delivery(delivery.id, now=later)
    with pytest.raises(DeliveryNotFoundError):
        store.replay_delivery("dlv_missing", now=later)


def test_release_expired_leases(store: OutboundWebhookHandler, now: datetime) -> None:
    _, delivery = seed(store, now, attempt=2)
    claim = store.claim_delivery(delivery.id, now=now, lease_seconds=LEASE, max_attempts=5)
    assert claim is not None

    assert store.release_expired_leases(now=now + timedelta(seconds=LEASE - 1)) == []
    after = now + timedelta(seconds=LEASE + 1)
    assert store.release_expired_leases(now=after) == [delivery.id]

    stored = stored_delivery(store, delivery.id)
    assert (stored.state, stored.attempt, stored.next_attempt_at) == (DeliveryState.PENDING, 2, after)
    assert stored.lease_expires_at is None
    result = result_for(claim.delivery, after, state=DeliveryState.DELIVERED, status=200)
    with pytest.raises(InvalidStateError):
        store.finish_attempt(delivery.id, claim.lease_token, result)
    assert store.release_expired_leases(now=after) == []


def test_due_deliveries(store: OutboundWebhookHandler, now: datetime) -> None:
    at = [now - timedelta(seconds=n) for n in (30, 20, 10)]
    oldest, middle, newest = (make_delivery("sub_1", now, next_attempt_at=t) for t in at)
    tie = make_delivery("sub_1", now, id="dlv_0", next_attempt_at=at[1])
    future = make_delivery("sub_1", now, next_attempt_at=now + timedelta(seconds=1))
    dead = make_delivery("sub_1", now, next_attempt_at=at[0], state=DeliveryState.DLQ)
    store.log_deliveries([newest, future, middle, dead, oldest, tie])

    assert store.due_deliveries(now=now, limit=10) == [oldest.id, tie.id, middle.id, newest.id]
    assert store.due_deliveries(now=now, limit=2) == [oldest.id, tie.id]
    assert store.due_deliveries(now=now - timedelta(hours=1), limit=10) == []


def test_get_schedules(store: OutboundWebhookHandler, now: datetime) -> None:
    later = now + timedelta(seconds=30)
    first = make_delivery("sub_1", now, next_attempt_at=now)
    retry = make_delivery("sub_1", now, attempt=3, next_attempt_at=later)
    store.log_deliveries([first, retry])

    schedules = store.get_schedules([retry.id, "dlv_missing", first.id, retry.id, "bad\x00id"])

    expected = [DeliverySchedule(first.id, first.attempt, now), DeliverySchedule(retry.id, 3, later)]
    assert sorted(schedules, key=lambda s: s.id) == sorted(expected, key=lambda s: s.id)
    assert store.get_schedules([]) == []


def test_queue_gauges(store: OutboundWebhookHandler, now: datetime) -> None:
    assert store.queue_gauges(now=now, dlq_limit=10) == (0, None)
    oldest_due = now - timedelta(seconds=30)
    deliveries = [
        make_delivery("sub_1", now, next_attempt_at=oldest_due),
        make_delivery("sub_1", now, next_attempt_at=now - timedelta(seconds=5)),
        make_delivery("sub_1", now, next_attempt_at=now + timedelta(seconds=60)),
        # Not pending: neither is waiting, whatever its due time says.
        make_delivery("sub_1", now, next_attempt_at=now - timedelta(hours=1), state=DeliveryState.DELIVERED),
        *(make_delivery("sub_1", now, next_attempt_at=None, state=DeliveryState.DLQ) for _ in range(3)),
    ]
    store.log_deliveries(deliveries)

    assert store.queue_gauges(now=now, dlq_limit=10) == (3, oldest_due)
    assert store.queue_gauges(now=now, dlq_limit=2) == (2, oldest_due)
    assert store.queue_gauges(now=now - timedelta(minutes=1), dlq_limit=10) == (3, None)
    # The base class's fallback (for third-party stores) answers the same.
    assert OutboundWebhookHandler.queue_gauges(store, now=now, dlq_limit=2) == (2, oldest_due)


def test_list_dlq(store: OutboundWebhookHandler, now: datetime) -> None:
    deliveries = [
        make_delivery(
            "sub_a" if n % 2 else "sub_b",
            now,
            id=f"dlv_{n:02d}",
            topic="order.created" if n % 3 else "order.paid",
            state=DeliveryState.DLQ,
            # Two rows per timestamp, so paging must break ties on the id.
            timestamp=now + timedelta(seconds=n // 2),
        )
        for n in range(10)
    ]
    store.log_deliveries([*deliveries, make_delivery("sub_a", now, id="dlv_pending")])
    newest_first = sorted(deliveries, key=lambda d: (d.timestamp, d.id), reverse=True)

    assert store.list_dlq() == newest_first
    pages, before = [], None
    while page := store.list_dlq(limit=3, before=before):
        pages.append(page)
        before = (page[-1].timestamp, page[-1].id)
    assert [len(page) for page in pages] == [3, 3, 3, 1]
    assert [d.id for page in pages for d in page] == [d.id for d in newest_first]

    by_sub = store.list_dlq(subscription_id="sub_a")
    assert [d.id for d in by_sub] == [d.id for d in newest_first if d.subscription_id == "sub_a"]
    paid_b = store.list_dlq(subscription_id="sub_b", topic="order.paid")
    expected = [d.id for d in newest_first if d.subscription_id == "sub_b" and d.topic == "order.paid"]
    assert [d.id for d in paid_b] == expected
    assert expected  # the filters select something


def test_purge_deliveries_before(store: OutboundWebhookHandler, now: datetime) -> None:
    subscription_id, old_delivered = seed(store, now - timedelta(days=10))
    claim = store.claim_delivery(old_delivered.id, now=now, lease_seconds=LEASE, max_attempts=5)
    assert claim is not None
    old = now - timedelta(days=9)
    store.finish_attempt(
        old_delivered.id,
        claim.lease_token,
        result_for(claim.delivery, old, state=DeliveryState.DELIVERED, status=200),
    )
    keep = [
        make_delivery(subscription_id, now, timestamp=old, state=state)
        for state in (DeliveryState.PENDING, DeliveryState.DLQ, DeliveryState.SKIPPED)
    ]
    recent = make_delivery(subscription_id, now, state=DeliveryState.DELIVERED)
    store.log_deliveries([*keep, recent])

    assert store.purge_deliveries_before(now - timedelta(days=1)) == 1

    assert store.get_delivery(old_delivered.id) is None
    assert store.list_attempts(old_delivered.id) == []
    remaining = store.get_deliveries([d.id for d in [*keep, recent]])
    assert len(remaining) == 4
    assert store.purge_deliveries_before(now - timedelta(days=1)) == 0


# -- concurrency -------------------------------------------------------------------------------


def test_one_of_many_concurrent_claims_wins(store: OutboundWebhookHandler, now: datetime) -> None:
    _, delivery = seed(store, now)
    claims = in_threads(
        8, lambda _: store.claim_delivery(delivery.id, now=now, lease_seconds=LEASE, max_attempts=5)
    )
    assert sum(claim is not None for claim in claims) == 1


def test_concurrent_batch_claims_never_share_a_delivery(store: OutboundWebhookHandler, now: datetime) -> None:
    subscription = store.add_subscription(make_subscription())
    deliveries = [make_delivery(subscription.id, now) for _ in range(60)]
    store.log_deliveries(deliveries)
    ids = [d.id for d in deliveries]

    def claim(index: int) -> list[str]:
        # Overlapping windows, half of them in reverse order: a plain UPDATE ... IN could deadlock.
        window = ids[index * 6 : index * 6 + 30]
        if index % 2:
            window = window[::-1]
        claims = store.claim_deliveries(window, now=now, lease_seconds=LEASE, max_attempts=5)
        return [c.delivery.id for c in claims]

    claimed = [delivery_id for ids_of_one in in_threads(8, claim) for delivery_id in ids_of_one]

    assert len(claimed) == len(set(claimed))
    assert set(claimed) == set(ids)


def test_concurrent_failures_all_count(store: OutboundWebhookHandler, now: datetime) -> None:
    subscription = store.add_subscription(make_subscription())
    deliveries = [make_delivery(subscription.id, now) for _ in range(8)]
    store.log_deliveries(deliveries)

    changes = in_threads(8, lambda i: fail_once(store, deliveries[i], now, threshold=5))

    assert changes.count(Failed) == 1
    assert changes.count(None) == 7
    stored = stored_subscription(store, subscription.id)
    assert (stored.status, stored.consecutive_failures) == (Failed, 8)


def test_edits_never_undo_a_failure_counted_meanwhile(store: OutboundWebhookHandler, now: datetime) -> None:
    # The lost update of issue 12: an edit read the row, a worker counted failures (and marked the
    # subscription FAILED), then the edit wrote the whole row back: ACTIVE with the old count.
    threshold = 10
    subscription = store.add_subscription(make_subscription())
    deliveries = [make_delivery(subscription.id, now) for _ in range(4 * threshold)]
    store.log_deliveries(deliveries)
    workers = 4
    per_worker = len(deliveries) // workers
    seen: list[tuple[WebhookSubscriptionStatus, int]] = []

    def work(index: int) -> None:
        if index < workers:
            for delivery in deliveries[index * per_worker : (index + 1) * per_worker]:
                fail_once(store, delivery, now, threshold=threshold)
            return
        # Editors: each change returns the row as stored, which must carry every failure so far.
        for round_ in range(per_worker):
            if index % 2:
                edited = store.update_subscription(
                    subscription.id, SubscriptionChanges(description=f"{round_}")
                )
            else:
                secret = OTHER_SECRET if round_ % 2 else SECRET
                edited = store.rotate_secret(subscription.id, secret, previous_expires_at=now)
            seen.append((edited.status, edited.consecutive_failures))

    in_threads(workers + 4, work)

    stored = stored_subscription(store, subscription.id)
    assert (stored.status, stored.consecutive_failures) == (Failed, len(deliveries))
    # The count only grows, and FAILED, once reached, is never undone by an edit.
    assert all(failures <= len(deliveries) for _, failures in seen)
    assert all(status is Failed for status, failures in seen if failures >= threshold)


def test_an_edit_after_the_threshold_keeps_the_subscription_failed(
    store: OutboundWebhookHandler, now: datetime
) -> None:
    # The same lost update, one step at a time: no edit writes a field it was not asked to.
    subscription = store.add_subscription(make_subscription())
    deliveries = [make_delivery(subscription.id, now) for _ in range(3)]
    store.log_deliveries(deliveries)
    for delivery in deliveries:
        fail_once(store, delivery, now, threshold=3)

    described = store.update_subscription(subscription.id, SubscriptionChanges(description="edited"))
    rotated = store.rotate_secret(subscription.id, OTHER_SECRET, previous_expires_at=now)

    for seen in (described, rotated, stored_subscription(store, subscription.id)):
        assert (seen.status, seen.consecutive_failures) == (Failed, 3)
    assert stored_subscription(store, subscription.id).description == "edited"


# -- capabilities ------------------------------------------------------------------------------


def test_capabilities(store: OutboundWebhookHandler) -> None:
    capabilities = store.capabilities
    assert store.supports_transactions is capabilities.transactions
    if isinstance(store, SqlOutboundWebhookStore):
        assert capabilities == StoreCapabilities(
            transactions=True, engine=store.engine, schema=True, ordering=True
        )
    else:
        assert capabilities == StoreCapabilities(ordering=True)
    # Asking a store for its schema is always safe: a store without tables has nothing to do.
    store.ensure_schema()
    store.ensure_schema()


def test_transactions_need_an_engine() -> None:
    with pytest.raises(ValueError, match="engine"):
        StoreCapabilities(transactions=True)


# -- bad input ---------------------------------------------------------------------------------

BAD_SECRET = "whsec_not*base64!"


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"target_url": "not a url"}, "target_url"),
        ({"target_url": "ftp://receiver.example/x"}, "target_url"),
        ({"target_url": "https://"}, "target_url"),
        ({"event_topics": []}, "event_topics"),
        ({"event_topics": ["order..created"]}, "event_topics"),
        ({"secret": ""}, "secret"),
        ({"secret": BAD_SECRET}, "secret"),
    ],
)
def test_invalid_subscription_is_refused(
    store: OutboundWebhookHandler, changes: dict[str, Any], field: str
) -> None:
    # Every case carries the bad secret too, to show no message echoes it.
    with pytest.raises(InvalidFieldError) as info:
        store.add_subscription(make_subscription(**{"secret": BAD_SECRET, **changes}))
    assert info.value.field == field
    assert field in str(info.value)
    assert BAD_SECRET not in str(info.value)
    assert store.list_subscriptions() == []


def test_invalid_update_leaves_the_stored_subscription(store: OutboundWebhookHandler, now: datetime) -> None:
    subscription = store.add_subscription(make_subscription())
    with pytest.raises(InvalidFieldError, match="target_url"):
        store.update_subscription(subscription.id, SubscriptionChanges(target_url="javascript:alert(1)"))
    with pytest.raises(InvalidFieldError, match="secret") as info:
        store.rotate_secret(subscription.id, BAD_SECRET, previous_expires_at=now)
    assert BAD_SECRET not in str(info.value)
    with pytest.raises(InvalidFieldError, match="previous_secret_expires_at"):
        store.rotate_secret(subscription.id, OTHER_SECRET, previous_expires_at=now.replace(tzinfo=None))
    assert store.get_subscription(subscription.id) == subscription


def test_secret_stays_out_of_repr(store: OutboundWebhookHandler) -> None:
    subscription = store.add_subscription(make_subscription())
    assert SECRET not in repr(subscription)
    assert SECRET not in repr(store.list_subscriptions())
    assert SECRET not in repr(store)
    assert SECRET not in str(subscription.to_dict())


# -- finish_attempts: a batch of outcomes ---------------------------------------------------------


def _claimed(store: OutboundWebhookHandler, subscription_id: str, now: datetime) -> Claim:
    delivery = make_delivery(subscription_id, now)
    store.log_deliveries([delivery])
    claim = store.claim_delivery(delivery.id, now=now, lease_seconds=LEASE, max_attempts=5)
    assert claim is not None
    return claim


def _written(store: OutboundWebhookHandler, delivery_id: str) -> tuple[Any, ...]:
    """What an outcome writes to a delivery and its attempts, without the id."""
    d = stored_delivery(store, delivery_id)
    attempts = [dataclasses.replace(a, delivery_id="-") for a in store.list_attempts(delivery_id)]
    return (
        d.state, d.attempt, d.next_attempt_at, d.last_error, d.timestamp, d.lease_expires_at,
        {k: v for k, v in d.request_headers.items() if k != "webhook-id"},
        d.response_status, d.response_body, d.elapsed_ms, attempts,
    )  # fmt: skip


def test_finish_attempts_writes_what_finish_attempt_writes(
    store: OutboundWebhookHandler, now: datetime
) -> None:
    subscription = store.add_subscription(make_subscription())
    later = now + timedelta(seconds=30)

    def results(claim: Claim) -> list[AttemptResult]:
        delivery = claim.delivery
        return [
            result_for(delivery, now, state=DeliveryState.DELIVERED, status=200, headers={"x-a": "1"}),
            result_for(delivery, now, state=DeliveryState.PENDING, next_attempt_at=later, status=503),
            result_for(delivery, now, state=DeliveryState.SKIPPED, headers={}, with_attempt=False),
            result_for(delivery, now, state=DeliveryState.DLQ, status=None),
        ]

    singles = [_claimed(store, subscription.id, now) for _ in range(4)]
    for claim, result in zip(singles, results(singles[0]), strict=True):
        assert store.finish_attempt(claim.delivery.id, claim.lease_token, result) is None
    batch = [_claimed(store, subscription.id, now) for _ in range(4)]
    outcomes = [
        Outcome(claim.delivery.id, claim.lease_token, dataclasses.replace(result, attempt=attempt))
        for claim, result in zip(batch, results(batch[0]), strict=True)
        for attempt in [
            dataclasses.replace(result.attempt, delivery_id=claim.delivery.id) if result.attempt else None
        ]
    ]

    recorded = store.finish_attempts(outcomes)

    assert recorded == [Recorded(held=True)] * 4
    for single, batched in zip(singles, batch, strict=True):
        assert _written(store, batched.delivery.id) == _written(store, single.delivery.id)


def test_finish_attempts_skips_lost_leases_and_applies_effects_in_order(
    store: OutboundWebhookHandler, now: datetime
) -> None:
    failing = store.add_subscription(make_subscription())
    gone = store.add_subscription(make_subscription())
    first, second, lost, disabled = (
        _claimed(store, failing.id, now),
        _claimed(store, failing.id, now),
        _claimed(store, failing.id, now),
        _claimed(store, gone.id, now),
    )

    def count(delivery: DeliveryLog) -> AttemptResult:
        return result_for(
            delivery, now, state=DeliveryState.PENDING, effect=SubscriptionEffect.COUNT_FAILURE, threshold=2
        )

    outcomes = [
        Outcome(first.delivery.id, first.lease_token, count(first.delivery)),
        Outcome(lost.delivery.id, "0" * 32, count(lost.delivery)),
        Outcome("dlv_missing", first.lease_token, count(first.delivery)),
        Outcome(second.delivery.id, second.lease_token, count(second.delivery)),
        Outcome(
            disabled.delivery.id,
            disabled.lease_token,
            result_for(disabled.delivery, now, state=DeliveryState.DLQ, effect=SubscriptionEffect.DISABLE),
        ),
    ]

    recorded = store.finish_attempts(outcomes)

    assert recorded == [
        Recorded(held=True),
        Recorded(held=False),
        Recorded(held=False),
        Recorded(held=True, changed=Failed),
        Recorded(held=True, changed=Disabled),
    ]
    subscription = stored_subscription(store, failing.id)
    assert (subscription.status, subscription.consecutive_failures) == (Failed, 2)
    assert stored_subscription(store, gone.id).status is Disabled
    assert store.get_delivery(lost.delivery.id) == lost.delivery
    assert store.list_attempts(lost.delivery.id) == []
    assert store.finish_attempts([]) == []
