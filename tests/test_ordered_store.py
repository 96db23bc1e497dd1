"""Ordered delivery per key in every store (memory, SQLite, PostgreSQL): the head-of-line claim,
the policies after a dead letter, replay and skip, a lost lease, the sweeper's due scan."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import pytest

from flask_harvest.errors import InvalidStateError
from flask_harvest.webhooks.models import (
    DeliveryLog,
    DeliveryState,
    SubscriptionChanges,
    SubscriptionEffect,
    utcnow,
)
from flask_harvest.webhooks.ordering import OrderingPolicy
from flask_harvest.webhooks.stores import OutboundWebhookHandler

from .test_store_contract import make_delivery, make_subscription, result_for, success_for

LEASE = 30.0


def log_keyed(
    store: OutboundWebhookHandler, subscription_id: str, now: datetime, key: str | None
) -> DeliveryLog:
    """Log one delivery (a dispatch of its own: it takes its key's next number)."""
    delivery = make_delivery(subscription_id, now, ordering_key=key)
    store.log_deliveries([delivery])
    stored = store.get_delivery(delivery.id)
    assert stored is not None
    return stored


def _claim(store: OutboundWebhookHandler, delivery: DeliveryLog, now: datetime) -> Any:
    return store.claim_delivery(delivery.id, now=now, lease_seconds=LEASE, max_attempts=5)


def fail_attempt(
    store: OutboundWebhookHandler, delivery: DeliveryLog, now: datetime, state: DeliveryState
) -> None:
    claim = _claim(store, delivery, now)
    assert claim is not None
    retry_at = now + timedelta(hours=1) if state is DeliveryState.PENDING else None
    result = result_for(
        claim.delivery, now, state=state, effect=SubscriptionEffect.COUNT_FAILURE, next_attempt_at=retry_at
    )
    store.finish_attempt(delivery.id, claim.lease_token, result)


def _deliver(store: OutboundWebhookHandler, delivery: DeliveryLog, now: datetime) -> None:
    claim = _claim(store, delivery, now)
    assert claim is not None, f"{delivery.id} was not claimable"
    store.finish_attempt(delivery.id, claim.lease_token, success_for(claim.delivery, now))


def _subscription(store: OutboundWebhookHandler, policy: OrderingPolicy = OrderingPolicy.BLOCK) -> str:
    return store.add_subscription(make_subscription(ordering_policy=policy)).id


def test_deliveries_of_a_key_are_numbered_in_dispatch_order(store: OutboundWebhookHandler) -> None:
    now = utcnow()
    sub = _subscription(store)
    line = [log_keyed(store, sub, now, "order-42") for _ in range(4)]
    seqs = [d.ordering_seq or 0 for d in line]
    assert all(d.ordering_seq is not None for d in line)
    assert seqs == sorted(seqs) and len(set(seqs)) == 4


def test_only_the_head_of_a_line_is_claimable(store: OutboundWebhookHandler) -> None:
    now = utcnow()
    sub = _subscription(store)
    first, second, third = (log_keyed(store, sub, now, "k") for _ in range(3))
    assert _claim(store, second, now) is None
    assert _claim(store, third, now) is None
    claims = store.claim_deliveries(
        [third.id, second.id, first.id], now=now, lease_seconds=LEASE, max_attempts=5
    )
    assert [c.delivery.id for c in claims] == [first.id]
    assert store.due_deliveries(now=now, limit=10) == []  # the head is in flight, the rest wait
    store.finish_attempt(first.id, claims[0].lease_token, success_for(claims[0].delivery, now))
    assert [s.id for s in store.next_in_line(sub, "k")] == [second.id]
    assert store.due_deliveries(now=now, limit=10) == [second.id]
    _deliver(store, second, now)
    _deliver(store, third, now)
    assert store.next_in_line(sub, "k") == []


def test_a_failing_key_blocks_neither_other_keys_nor_unordered_traffic(store: OutboundWebhookHandler) -> None:
    now = utcnow()
    sub = _subscription(store)
    a1, a2 = log_keyed(store, sub, now, "a"), log_keyed(store, sub, now, "a")
    b1 = log_keyed(store, sub, now, "b")
    plain = log_keyed(store, sub, now, None)
    fail_attempt(store, a1, now, DeliveryState.PENDING)  # a retry an hour away holds key a
    later = now + timedelta(minutes=1)
    assert _claim(store, a2, later) is None
    assert store.get_delivery(a2.id).attempt == 1  # type: ignore[union-attr]  # not charged
    assert set(store.due_deliveries(now=later, limit=10)) == {b1.id, plain.id}
    _deliver(store, b1, later)
    _deliver(store, plain, later)
    # Key a's next is still its head, due at its retry.
    assert [s.id for s in store.next_in_line(sub, "a")] == [a1.id]


def test_block_policy_waits_for_a_replay_of_the_dead_lettered_head(store: OutboundWebhookHandler) -> None:
    now = utcnow()
    sub = _subscription(store, OrderingPolicy.BLOCK)
    head, waiting = log_keyed(store, sub, now, "k"), log_keyed(store, sub, now, "k")
    fail_attempt(store, head, now, DeliveryState.DLQ)
    assert _claim(store, waiting, now) is None
    assert store.next_in_line(sub, "k") == []
    assert store.due_deliveries(now=now, limit=10) == []
    [blocked] = store.blocked_keys(sub)
    assert (blocked.ordering_key, blocked.delivery_id, blocked.waiting) == ("k", head.id, 1)
    replayed = store.replay_delivery(head.id, now=now)
    assert _claim(store, waiting, now) is None  # the replayed head goes first
    _deliver(store, replayed, now)
    assert [s.id for s in store.next_in_line(sub, "k")] == [waiting.id]
    assert store.blocked_keys(sub) == []
    _deliver(store, waiting, now)


def test_skip_policy_moves_on_after_a_dead_letter(store: OutboundWebhookHandler) -> None:
    now = utcnow()
    sub = _subscription(store, OrderingPolicy.SKIP)
    head, following = log_keyed(store, sub, now, "k"), log_keyed(store, sub, now, "k")
    fail_attempt(store, head, now, DeliveryState.DLQ)
    assert [s.id for s in store.next_in_line(sub, "k")] == [following.id]
    assert store.blocked_keys(sub) == []
    _deliver(store, following, now)


def test_changing_the_policy_to_skip_releases_a_blocked_key(store: OutboundWebhookHandler) -> None:
    now = utcnow()
    sub = _subscription(store, OrderingPolicy.BLOCK)
    head, following = log_keyed(store, sub, now, "k"), log_keyed(store, sub, now, "k")
    fail_attempt(store, head, now, DeliveryState.DLQ)
    assert store.due_deliveries(now=now, limit=10) == []
    store.update_subscription(sub, SubscriptionChanges(ordering_policy=OrderingPolicy.SKIP))
    # The sweeper's due scan now finds it: it queues it.
    assert store.due_deliveries(now=now, limit=10) == [following.id]


def test_an_operator_skip_releases_the_key(store: OutboundWebhookHandler) -> None:
    now = utcnow()
    sub = _subscription(store, OrderingPolicy.BLOCK)
    head, following = log_keyed(store, sub, now, "k"), log_keyed(store, sub, now, "k")
    with pytest.raises(InvalidStateError):
        store.skip_delivery(head.id, reason="skipped", now=now)  # not dead-lettered
    fail_attempt(store, head, now, DeliveryState.DLQ)
    skipped = store.skip_delivery(head.id, reason="skipped by an operator", now=now)
    assert skipped.state is DeliveryState.SKIPPED
    assert [s.id for s in store.next_in_line(sub, "k")] == [following.id]


def test_a_lost_lease_keeps_its_place_at_the_head(store: OutboundWebhookHandler) -> None:
    now = utcnow()
    sub = _subscription(store)
    head, following = log_keyed(store, sub, now, "k"), log_keyed(store, sub, now, "k")
    assert _claim(store, head, now) is not None  # then the worker dies
    after = now + timedelta(seconds=LEASE + 1)
    assert store.release_expired_leases(now=after) == [head.id]
    assert _claim(store, following, after) is None
    assert store.due_deliveries(now=after, limit=10) == [head.id]
    _deliver(store, store.get_delivery(head.id), after)  # type: ignore[arg-type]
    _deliver(store, following, after)


def test_lines_are_per_subscription(store: OutboundWebhookHandler) -> None:
    now = utcnow()
    one, two = _subscription(store), _subscription(store)
    head = log_keyed(store, one, now, "k")
    other = log_keyed(store, two, now, "k")
    fail_attempt(store, head, now, DeliveryState.PENDING)
    _deliver(store, other, now)
