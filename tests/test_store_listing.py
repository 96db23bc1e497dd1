"""Store contract, continued: the listings behind the dashboard, over every store."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import pytest

from flask_harvest import DeliveryState, OutboundWebhookHandler
from flask_harvest.webhooks.models import DeliverySummary, utcnow

from .test_store_contract import fail_once, make_delivery, seed, success_for


@pytest.fixture
def now() -> datetime:
    return utcnow()


STATES = [DeliveryState.PENDING, DeliveryState.DLQ, DeliveryState.DELIVERED, DeliveryState.SKIPPED]


def test_list_deliveries_pages_newest_first_in_every_state(
    store: OutboundWebhookHandler, now: datetime
) -> None:
    deliveries = [
        make_delivery(
            "sub_a" if n % 2 else "sub_b",
            now,
            id=f"dlv_{n:02d}",
            topic="order.created" if n % 3 else "order.paid",
            state=STATES[n % len(STATES)],
            # Two rows per timestamp, so paging must break ties on the id.
            timestamp=now + timedelta(seconds=n // 2),
        )
        for n in range(12)
    ]
    store.log_deliveries(deliveries)
    newest_first = sorted(deliveries, key=lambda d: (d.timestamp, d.id), reverse=True)

    assert store.list_deliveries() == newest_first
    pages, before = [], None
    while page := store.list_deliveries(limit=5, before=before):
        pages.append(page)
        before = (page[-1].timestamp, page[-1].id)
    assert [len(page) for page in pages] == [5, 5, 2]
    assert [d.id for page in pages for d in page] == [d.id for d in newest_first]

    for state in STATES:
        listed = store.list_deliveries(state=state)
        assert [d.id for d in listed] == [d.id for d in newest_first if d.state is state]
        assert listed
    paid_b = store.list_deliveries(subscription_id="sub_b", topic="order.paid")
    expected = [d.id for d in newest_first if d.subscription_id == "sub_b" and d.topic == "order.paid"]
    assert [d.id for d in paid_b] == expected and expected

    since, until = now + timedelta(seconds=2), now + timedelta(seconds=4)
    windowed = store.list_deliveries(since=since, until=until)
    assert [d.id for d in windowed] == [d.id for d in newest_first if since <= d.timestamp < until]
    assert len(windowed) == 4
    assert store.list_deliveries(subscription_id="sub_\x00") == []
    # The DLQ listing is the same listing, in one state.
    assert store.list_dlq() == store.list_deliveries(state=DeliveryState.DLQ)


def test_list_delivery_summaries_are_the_listing_summarized(
    store: OutboundWebhookHandler, now: datetime
) -> None:
    deliveries = [
        make_delivery(
            "sub_a" if n % 2 else "sub_b",
            now,
            id=f"dlv_{n:02d}",
            topic="order.created" if n % 3 else "order.paid",
            state=STATES[n % len(STATES)],
            attempt=1 + n % 3,
            response_status=500 if n % 2 else None,
            last_error=f"error {n}" if n % 2 else None,
            timestamp=now + timedelta(seconds=n // 2),
        )
        for n in range(12)
    ]
    store.log_deliveries(deliveries)
    newest = store.list_deliveries(limit=1)[0]
    filters: list[dict[str, Any]] = [
        {},
        {"limit": 5},
        {"limit": 5, "before": (newest.timestamp, newest.id)},
        {"state": DeliveryState.DLQ},
        {"subscription_id": "sub_b", "topic": "order.paid"},
        {"since": now + timedelta(seconds=2), "until": now + timedelta(seconds=4)},
        {"subscription_id": "sub_\x00"},
    ]
    for chosen in filters:
        summaries = store.list_delivery_summaries(**chosen)
        assert summaries == [DeliverySummary.of(d) for d in store.list_deliveries(**chosen)], chosen
    summaries = store.list_delivery_summaries()
    assert len(summaries) == 12
    assert {s.response_status for s in summaries} == {500, None}
    assert {s.last_error for s in summaries} >= {"error 1", None}
    # The same types as the full rows, not just equal values (a state's text equals its member).
    assert all(type(s.state) is DeliveryState and s.timestamp.tzinfo is not None for s in summaries)


def test_attempts_per_minute(store: OutboundWebhookHandler, now: datetime) -> None:
    minute = now.replace(second=0, microsecond=0) - timedelta(minutes=10)
    for offset, ok in [(0, True), (0, False), (1, False), (3, True)]:
        _, delivery = seed(store, now, next_attempt_at=minute)
        at = minute + timedelta(minutes=offset, seconds=7)
        if ok:
            claim = store.claim_delivery(delivery.id, now=at, lease_seconds=30, max_attempts=5)
            assert claim is not None
            store.finish_attempt(delivery.id, claim.lease_token, success_for(delivery, at))
        else:
            fail_once(store, delivery, at, threshold=50)
    buckets = store.attempts_per_minute(since=minute, until=minute + timedelta(minutes=4))
    assert buckets == [
        (minute, 1, 1),
        (minute + timedelta(minutes=1), 0, 1),
        (minute + timedelta(minutes=3), 1, 0),
    ]
    assert all(when.tzinfo is not None for when, _, _ in buckets)
    assert (
        store.attempts_per_minute(since=minute + timedelta(minutes=4), until=now + timedelta(hours=1)) == []
    )


def test_delivery_stats_with_a_cap(store: OutboundWebhookHandler, now: datetime) -> None:
    """Capped, a store reads at most ``cap`` rows per state: the pending (and in-flight) rows that
    waited longest, the newest of the others; a state with more is marked capped."""
    old = now - timedelta(hours=1)
    pending = [
        make_delivery(
            "sub_a" if n < 3 else "sub_b", now, id=f"dlv_p{n}", timestamp=old + timedelta(seconds=n)
        )
        for n in range(5)
    ]
    delivered = [
        make_delivery(
            "sub_a" if n < 2 else "sub_b",
            now,
            id=f"dlv_d{n}",
            state=DeliveryState.DELIVERED,
            timestamp=now - timedelta(seconds=n),
        )
        for n in range(6)
    ]
    dead = [make_delivery("sub_a", now, id="dlv_x", state=DeliveryState.DLQ)]
    store.log_deliveries([*pending, *delivered, *dead])

    exact, per_sub = store.delivery_stats()
    assert exact.cap is None and exact.capped == frozenset()
    assert exact.counts == {"pending": 5, "delivered": 6, "dlq": 1}

    overall, capped_per_sub = store.delivery_stats(cap=3)
    assert overall.cap == 3
    assert overall.capped == {"pending", "delivered"}
    assert overall.counts == {"pending": 3, "delivered": 3, "dlq": 1}
    # The three longest-waiting pending rows are sub_a's; the three newest delivered rows are
    # sub_a's two and one of sub_b's.
    assert capped_per_sub["sub_a"].counts == {"pending": 3, "delivered": 2, "dlq": 1}
    assert capped_per_sub["sub_b"].counts == {"delivered": 1}
    assert overall.oldest_pending_at == exact.oldest_pending_at == now
    shown = overall.to_dict(now)
    assert shown["capped"] == {
        "pending": True,
        "inflight": False,
        "delivered": True,
        "dlq": False,
        "skipped": False,
    }
    assert shown["count_cap"] == 3 and shown["dlq_depth"] == 1
    assert capped_per_sub["sub_b"].to_dict(now)["capped"]["delivered"] is True

    # A cap above every count is exact.
    roomy, roomy_per_sub = store.delivery_stats(cap=6)
    assert roomy.counts == exact.counts and roomy.capped == frozenset()
    assert {sub: s.counts for sub, s in roomy_per_sub.items()} == {
        sub: s.counts for sub, s in per_sub.items()
    }
