"""A key's chain in every store (memory, SQLite, PostgreSQL): the outcome that ends a key's head
finds the next delivery of the key in its own transaction, and leases it to a caller that follows
(the SQL stores; the in-memory store returns it to be queued); dispatch queues no job for the
deliveries that wait behind their key."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest

from flask_harvest.webhooks.models import Claim, DeliveryLog, DeliveryState, SubscriptionEffect, utcnow
from flask_harvest.webhooks.ordering import OrderingPolicy
from flask_harvest.webhooks.stores import OutboundWebhookHandler
from flask_harvest.webhooks.stores.base import LeaseTerms, Outcome, Recorded

from .test_ordered_store import LEASE, log_keyed
from .test_store_contract import make_delivery, make_subscription, result_for, success_for

TERMS = LeaseTerms(LEASE, 5)


def _subscription(store: OutboundWebhookHandler, policy: OrderingPolicy = OrderingPolicy.BLOCK) -> str:
    return store.add_subscription(make_subscription(ordering_policy=policy)).id


def _finish(
    store: OutboundWebhookHandler,
    delivery: DeliveryLog,
    now: datetime,
    *,
    state: DeliveryState = DeliveryState.DELIVERED,
    follow: LeaseTerms | None = None,
) -> Recorded:
    claim = store.claim_delivery(delivery.id, now=now, lease_seconds=LEASE, max_attempts=5)
    assert claim is not None, f"{delivery.id} was not claimable"
    if state is DeliveryState.DELIVERED:
        result = success_for(claim.delivery, now)
    else:
        retry = now + timedelta(hours=1) if state is DeliveryState.PENDING else None
        result = result_for(
            claim.delivery, now, state=state, effect=SubscriptionEffect.COUNT_FAILURE, next_attempt_at=retry
        )
    outcome = Outcome(delivery.id, claim.lease_token, result, delivery.ordering_key, follow)
    [recorded] = store.finish_attempts([outcome])
    assert recorded.held
    return recorded


def _next_ids(recorded: Recorded) -> list[str]:
    """The next delivery an outcome handed back, leased or to queue."""
    return [c.delivery.id for c in recorded.following] + [s.id for s in recorded.released]


def test_the_outcome_that_ends_the_head_returns_the_next_delivery(store: OutboundWebhookHandler) -> None:
    now = utcnow()
    sub = _subscription(store)
    head, second, third = (log_keyed(store, sub, now, "k") for _ in range(3))
    recorded = _finish(store, head, now)
    assert recorded.following == ()
    assert [s.id for s in recorded.released] == [second.id]
    assert store.get_delivery(second.id).state is DeliveryState.PENDING  # type: ignore[union-attr]
    assert _next_ids(_finish(store, second, now)) == [third.id]
    assert _next_ids(_finish(store, third, now)) == []


def test_a_following_outcome_leases_the_next_delivery_and_only_it(store: OutboundWebhookHandler) -> None:
    now = utcnow()
    sub = _subscription(store)
    head, second, third = (log_keyed(store, sub, now, "k") for _ in range(3))
    other_key = log_keyed(store, sub, now, "other")
    recorded = _finish(store, head, now, follow=TERMS)
    assert _next_ids(recorded) == [second.id]
    if recorded.following:  # the SQL stores lease it in the outcome's transaction
        [claim] = recorded.following
        assert isinstance(claim, Claim) and claim.subscription is not None
        assert claim.delivery.state is DeliveryState.INFLIGHT
        stored = store.get_delivery(second.id)
        assert stored is not None and stored.state is DeliveryState.INFLIGHT
        # Leased to the follower: no other claim takes it, and the line behind it stays held.
        assert store.claim_delivery(second.id, now=now, lease_seconds=LEASE, max_attempts=5) is None
        assert store.claim_delivery(third.id, now=now, lease_seconds=LEASE, max_attempts=5) is None
        store.finish_attempt(second.id, claim.lease_token, success_for(claim.delivery, now))
    else:
        _finish(store, second, now)
    assert store.get_delivery(other_key.id).state is DeliveryState.PENDING  # type: ignore[union-attr]
    assert [s.id for s in store.next_in_line(sub, "k")] == [third.id]


def test_a_next_delivery_not_yet_due_is_returned_not_leased(store: OutboundWebhookHandler) -> None:
    now = utcnow()
    sub = _subscription(store)
    head = log_keyed(store, sub, now, "k")
    # Due in an hour (as one given back for its rate limit's turn is): not leased before then.
    later = make_delivery(sub, now, ordering_key="k", next_attempt_at=now + timedelta(hours=1))
    store.log_deliveries([later])
    recorded = _finish(store, head, now, follow=TERMS)
    assert recorded.following == ()
    assert [s.id for s in recorded.released] == [later.id]
    assert store.get_delivery(later.id).state is DeliveryState.PENDING  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("policy", "state", "releases"),
    [
        (OrderingPolicy.BLOCK, DeliveryState.PENDING, False),  # a retry keeps its place
        (OrderingPolicy.BLOCK, DeliveryState.DLQ, False),  # the key waits for an operator
        (OrderingPolicy.SKIP, DeliveryState.DLQ, True),  # the key moves on
    ],
)
def test_only_an_outcome_that_releases_the_line_hands_on(
    store: OutboundWebhookHandler, policy: OrderingPolicy, state: DeliveryState, releases: bool
) -> None:
    now = utcnow()
    sub = _subscription(store, policy)
    head, second = log_keyed(store, sub, now, "k"), log_keyed(store, sub, now, "k")
    recorded = _finish(store, head, now, state=state, follow=TERMS)
    assert _next_ids(recorded) == ([second.id] if releases else [])
    if not releases:
        assert store.get_delivery(second.id).state is DeliveryState.PENDING  # type: ignore[union-attr]


def test_an_unkeyed_outcome_hands_on_nothing(store: OutboundWebhookHandler) -> None:
    now = utcnow()
    sub = _subscription(store)
    plain = log_keyed(store, sub, now, None)
    log_keyed(store, sub, now, None)
    assert _next_ids(_finish(store, plain, now, follow=TERMS)) == []


def test_waiting_in_line_names_the_deliveries_behind_their_key(store: OutboundWebhookHandler) -> None:
    now = utcnow()
    sub, other_sub = _subscription(store), _subscription(store)
    head, second, third = (log_keyed(store, sub, now, "k") for _ in range(3))
    plain = log_keyed(store, sub, now, None)
    other_head = log_keyed(store, sub, now, "other")
    elsewhere = log_keyed(store, other_sub, now, "k")  # lines are per subscription
    ids = [head.id, second.id, third.id, plain.id, other_head.id, elsewhere.id, "dlv_missing", "bad id"]
    assert store.waiting_in_line(ids) == {second.id, third.id}
    _finish(store, head, now)
    assert store.waiting_in_line(ids) == {third.id}


@pytest.mark.parametrize("follow", [TERMS, None])
def test_two_outcomes_of_one_line_in_a_batch_hand_on_its_next_delivery_once(
    store: OutboundWebhookHandler, follow: LeaseTerms | None
) -> None:
    # Two deliveries of one key in flight at once: under "skip" the second went ahead of the
    # dead-lettered first, which an operator then replayed.
    now = utcnow()
    sub = _subscription(store, OrderingPolicy.SKIP)
    first, second, third = (log_keyed(store, sub, now, "k") for _ in range(3))
    claim = store.claim_delivery(first.id, now=now, lease_seconds=LEASE, max_attempts=5)
    assert claim is not None
    dead = result_for(claim.delivery, now, state=DeliveryState.DLQ, effect=SubscriptionEffect.COUNT_FAILURE)
    store.finish_attempt(first.id, claim.lease_token, dead)
    claims = [store.claim_delivery(second.id, now=now, lease_seconds=LEASE, max_attempts=5)]
    store.replay_delivery(first.id, now=now)
    claims.append(store.claim_delivery(first.id, now=now, lease_seconds=LEASE, max_attempts=5))
    outcomes = []
    for leased in claims:
        assert leased is not None
        result = success_for(leased.delivery, now)
        outcomes.append(Outcome(leased.delivery.id, leased.lease_token, result, "k", follow))
    recorded = store.finish_attempts(outcomes)
    assert all(r.held for r in recorded)
    handed = [delivery_id for r in recorded for delivery_id in _next_ids(r)]
    assert handed == [third.id]  # once: two workers would otherwise send it at the same time
