"""Keyset pages of the subscription and trigger listings, filtered in the store's query: the
subscriptions over every store, the trigger definitions over SQLite and PostgreSQL."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest

from flask_harvest import CompletionTrigger, OutboundWebhookHandler, WebhookSubscriptionStatus
from flask_harvest.triggers.store import SqlTriggerStore
from flask_harvest.webhooks.models import WebhookSubscription, utcnow
from flask_harvest.webhooks.stores.sql import SqlOutboundWebhookStore

from .test_store_contract import make_subscription

DISABLED = WebhookSubscriptionStatus.DISABLED
TOPICS = [["order.created"], ["order.*"], ["invoice.paid"], ["*"]]


def walk(store: OutboundWebhookHandler, limit: int, **filters: object) -> list[list[WebhookSubscription]]:
    """Every page of the listing, each read after the last row of the one before."""
    pages, after = [], None
    while page := store.list_subscriptions_page(limit=limit, after=after, **filters):  # type: ignore[arg-type]
        pages.append(page)
        after = (page[-1].created_at, page[-1].id)
    return pages


def test_subscription_pages_walk_oldest_first_with_the_filters(store: OutboundWebhookHandler) -> None:
    start = utcnow()
    subscriptions = [
        store.add_subscription(
            make_subscription(
                id=f"sub_{11 - n:02d}",  # ids against the time order: the tie-break must be the id
                event_topics=TOPICS[n % len(TOPICS)],
                status=DISABLED if n % 3 == 0 else WebhookSubscriptionStatus.ACTIVE,
                # Two rows per timestamp, so paging must break ties on the id.
                created_at=start + timedelta(seconds=n // 2),
            )
        )
        for n in range(12)
    ]
    oldest_first = sorted(subscriptions, key=lambda s: (s.created_at, s.id))

    pages = walk(store, 5)
    assert [len(page) for page in pages] == [5, 5, 2]
    assert [s.id for page in pages for s in page] == [s.id for s in oldest_first]
    assert store.list_subscriptions_page(limit=100) == store.list_subscriptions()

    def ids(**filters: object) -> list[str]:
        return [s.id for page in walk(store, 2, **filters) for s in page]

    disabled = [s.id for s in oldest_first if s.status is DISABLED]
    assert ids(status=DISABLED) == disabled and len(disabled) == 4
    receivers = [s.id for s in oldest_first if s.matches("order.created")]
    assert ids(topic="order.created") == receivers and len(receivers) == 9
    both = [s.id for s in oldest_first if s.matches("order.created") and s.status is DISABLED]
    assert ids(topic="order.created", status=DISABLED) == both and both
    assert ids(topic="nobody.sends.this") == [s.id for s in oldest_first if list(s.event_topics) == ["*"]]


def test_a_page_of_long_patterns_is_filled_past_the_keys_that_do_not_match(
    store: OutboundWebhookHandler,
) -> None:
    """Patterns longer than the topic index's head share a key; the matcher narrows them, and the
    page still holds ``limit`` matches when non-matching ones come first."""
    start = utcnow()
    head = "a.b.c.d.e.f"
    topic = f"{head}.wanted"
    after_misses = start + timedelta(seconds=1)
    for n in range(5):
        store.add_subscription(
            make_subscription(id=f"sub_miss_{n}", event_topics=[f"{head}.other"], created_at=start)
        )
    wanted = [
        store.add_subscription(  # after every miss
            make_subscription(id=f"sub_hit_{n}", event_topics=[topic], created_at=after_misses + timedelta(n))
        )
        for n in range(3)
    ]
    page = store.list_subscriptions_page(limit=2, topic=topic)
    assert [s.id for s in page] == [s.id for s in wanted[:2]]
    rest = store.list_subscriptions_page(limit=2, topic=topic, after=(page[-1].created_at, page[-1].id))
    assert [s.id for s in rest] == [wanted[2].id]


@pytest.fixture
def trigger_store(sql_store: SqlOutboundWebhookStore) -> SqlTriggerStore:
    triggers = SqlTriggerStore(sql_store.engine)
    triggers.ensure_schema()
    return triggers


def test_trigger_pages_walk_oldest_first(trigger_store: SqlTriggerStore) -> None:
    start = utcnow().replace(microsecond=0)
    for n in range(7):
        trigger = CompletionTrigger("source", "target", id=f"00000000-0000-4000-8000-{6 - n:012d}")
        # Two rows per timestamp, so paging must break ties on the id.
        trigger_store.upsert(trigger, now=start + timedelta(seconds=n // 2))
    everything = trigger_store.list_triggers()
    assert [(t.created_at, t.id) for t in everything] == sorted((t.created_at, t.id) for t in everything)

    pages: list[list[str]] = []
    after: tuple[datetime, str] | None = None
    while page := trigger_store.list_triggers(limit=3, after=after):
        pages.append([t.id for t in page])
        after = (page[-1].created_at, page[-1].id)
    assert [len(page) for page in pages] == [3, 3, 1]
    assert [ident for page in pages for ident in page] == [t.id for t in everything]


def test_troubled_subscriptions_are_the_disabled_and_failing_most_failures_first(
    store: OutboundWebhookHandler,
) -> None:
    start = utcnow()
    kinds = [  # (status, consecutive failures); the healthy ones must never be listed
        (WebhookSubscriptionStatus.ACTIVE, 0),
        (WebhookSubscriptionStatus.ACTIVE, 3),
        (DISABLED, 0),
        (WebhookSubscriptionStatus.ACTIVE, 7),
        (DISABLED, 12),
        (WebhookSubscriptionStatus.ACTIVE, 0),
        (WebhookSubscriptionStatus.ACTIVE, 3),
    ]
    for n, (status, failures) in enumerate(kinds):
        store.add_subscription(
            make_subscription(
                id=f"sub_{n}",
                status=status,
                consecutive_failures=failures,
                created_at=start + timedelta(seconds=n),
            )
        )

    troubled = store.troubled_subscriptions(limit=10)
    # Most failures first; equal counts oldest first.
    assert [s.id for s in troubled] == ["sub_4", "sub_3", "sub_1", "sub_6", "sub_2"]
    assert [s.id for s in store.troubled_subscriptions(limit=2)] == ["sub_4", "sub_3"]
