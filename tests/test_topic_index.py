"""The topic index: candidate keys (a pure core) and the stores that look subscriptions up by them."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from flask import Flask
from flask_sqlalchemy import SQLAlchemy
from hypothesis import example, given
from hypothesis import strategies as st

from flask_harvest import OutboundWebhookPlugin, get_engine
from flask_harvest.webhooks.models import SubscriptionChanges, WebhookSubscription
from flask_harvest.webhooks.stores import OutboundWebhookHandler
from flask_harvest.webhooks.stores._schema import (
    metadata,
    subscription_topics_table,
    subscription_values,
    subscriptions_table,
)
from flask_harvest.webhooks.stores.sql import SqlOutboundWebhookStore
from flask_harvest.webhooks.topic_index import (
    KEY_SEGMENT_LENGTH,
    KEY_SEGMENTS,
    MAX_KEY_LENGTH,
    pattern_key,
    topic_keys,
)
from flask_harvest.webhooks.topics import topic_matches

from .pipeline import FAST, close_later
from .properties import BUDGET, TEXT

SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
LONG = "l" * (KEY_SEGMENT_LENGTH + 1)

# Few distinct segments, so that patterns and topics often match; a long one exercises digests.
SEGMENTS = st.sampled_from(["a", "b", "c-1", "d:e", LONG, LONG + "x"])
TOPICS = st.lists(SEGMENTS, min_size=1, max_size=KEY_SEGMENTS + 3).map(".".join)
PATTERNS = st.lists(st.one_of(SEGMENTS, st.just("*")), min_size=1, max_size=KEY_SEGMENTS + 3).map(".".join)


def short(pattern: str) -> bool:
    """Whether the pattern's key is the pattern itself (no head cut, no digest)."""
    segments = pattern.split(".")
    return len(segments) <= KEY_SEGMENTS and all(len(s) <= KEY_SEGMENT_LENGTH for s in segments)


# -- the pure core --------------------------------------------------------------------------------


def test_candidates_of_a_three_segment_topic() -> None:
    # The example, in full: same length with any segment '*', or shorter ending in '*'.
    assert set(topic_keys("a.b.c")) == {
        "a.b.c", "a.b.*", "a.*.c", "a.*.*", "*.b.c", "*.b.*", "*.*.c", "*.*.*",
        "a.*", "*.*", "*",
    }  # fmt: skip
    assert len(topic_keys("a.b.c")) == 11


def test_long_patterns_share_the_key_of_their_head() -> None:
    head = ".".join("abcdef")
    assert pattern_key(head) == head
    assert pattern_key(head + ".g") == pattern_key(head + ".*.h") == head + ".#"
    assert pattern_key(head + ".g") in topic_keys(head + ".g")
    assert pattern_key(head + ".g") not in topic_keys(head)
    assert len(pattern_key(LONG)) < len(LONG)


@given(pattern=PATTERNS, topic=TOPICS)
@example(pattern="*", topic="a")
@example(pattern="a.*", topic="a")
@example(pattern="a.*.*", topic="a.b.c.d")
@example(pattern=".".join("abcdefa"), topic=".".join("abcdefa"))
@BUDGET
def test_a_matching_pattern_is_always_a_candidate(pattern: str, topic: str) -> None:
    # The index never misses: whatever matches is filed under one of the topic's keys, and for a
    # pattern whose key is itself the candidates are exact (the index selects nothing extra).
    candidate = pattern_key(pattern) in topic_keys(topic)
    if topic_matches(pattern, topic):
        assert candidate
    if short(pattern):
        assert candidate == topic_matches(pattern, topic)


@given(patterns=st.lists(st.lists(PATTERNS, min_size=1, max_size=3), max_size=8), topic=TOPICS)
@BUDGET
def test_candidate_lookup_equals_the_matcher(patterns: list[list[str]], topic: str) -> None:
    # What a store does: file each subscription under its keys, select the topic's, match those.
    index: dict[str, set[int]] = {}
    for number, subscription in enumerate(patterns):
        for pattern in subscription:
            index.setdefault(pattern_key(pattern), set()).add(number)
    selected = {n for key in topic_keys(topic) for n in index.get(key, ())}
    found = {n for n in selected if any(topic_matches(p, topic) for p in patterns[n])}
    expected = {
        n for n, subscription in enumerate(patterns) if any(topic_matches(p, topic) for p in subscription)
    }
    assert found == expected


@given(topic=st.one_of(TEXT, st.text(max_size=400), TOPICS))
@BUDGET
def test_candidates_are_bounded_for_any_text(topic: str) -> None:
    # Topics are unbounded: the keys are not, in number or in length (a btree entry's limit).
    keys = topic_keys(topic)
    assert len(keys) < 2 ** (KEY_SEGMENTS + 1)
    assert all(len(key) <= MAX_KEY_LENGTH for key in keys)
    assert "*" in keys  # the catch-all selects every topic


def test_a_deep_topic_has_bounded_candidates() -> None:
    keys = topic_keys(".".join(["a"] * 500))
    assert len(keys) == len(set(keys)) == 2 ** (KEY_SEGMENTS + 1) - 1


# -- the stores keep the index with the subscription ---------------------------------------------


def make(*patterns: str, **changes: Any) -> WebhookSubscription:
    return WebhookSubscription("https://receiver.example/hooks", list(patterns), SECRET, **changes)


def ids(store: OutboundWebhookHandler, topic: str) -> set[str]:
    return {s.id for s in store.subscriptions_for_topic(topic)}


def test_edits_and_removals_move_the_index(store: OutboundWebhookHandler) -> None:
    moved = store.add_subscription(make("order.created", "order.*"))
    stays = store.add_subscription(make("order.*"))
    assert ids(store, "order.created") == {moved.id, stays.id}

    store.update_subscription(moved.id, SubscriptionChanges(event_topics=["invoice.paid"]))
    assert ids(store, "order.created") == {stays.id}
    assert ids(store, "invoice.paid") == {moved.id}
    # An edit of other fields keeps the topics filed.
    store.update_subscription(moved.id, SubscriptionChanges(description="renamed"))
    store.rotate_secret(moved.id, SECRET, previous_expires_at=moved.created_at)
    assert ids(store, "invoice.paid") == {moved.id}

    assert store.remove_subscription(moved.id)
    assert ids(store, "invoice.paid") == set()
    assert ids(store, "order.created") == {stays.id}


def test_long_patterns_are_matched_exactly(store: OutboundWebhookHandler) -> None:
    head = ".".join("abcdef")
    deep = store.add_subscription(make(head + ".g.h"))
    sibling = store.add_subscription(make(head + ".x.h"))
    trailing = store.add_subscription(make(head + ".*"))
    long_segment = store.add_subscription(make(LONG + ".*"))

    assert ids(store, head + ".g.h") == {deep.id, trailing.id}
    assert ids(store, head + ".x.h") == {sibling.id, trailing.id}
    assert ids(store, head + ".g") == {trailing.id}
    assert ids(store, LONG + ".a") == {long_segment.id}
    assert ids(store, LONG + "x.a") == set()


@given(
    patterns=st.lists(st.lists(PATTERNS, min_size=1, max_size=3), min_size=1, max_size=5),
    topics=st.lists(TOPICS, max_size=4),
)
@BUDGET
def test_a_store_matches_as_the_matcher(
    store: OutboundWebhookHandler, patterns: list[list[str]], topics: list[str]
) -> None:
    for subscription in store.list_subscriptions():
        store.remove_subscription(subscription.id)
    added = [store.add_subscription(make(*p)) for p in patterns]
    for topic in topics:
        assert ids(store, topic) == {s.id for s in added if s.matches(topic)}
    batched = store.subscriptions_for_topics(topics)
    assert {t: {s.id for s in found} for t, found in batched.items()} == {
        t: {s.id for s in added if s.matches(t)} for t in topics
    }


def test_many_topics_are_looked_up_in_chunks(store: OutboundWebhookHandler) -> None:
    # More topics than one lookup takes (the relay's batches hold up to 500 messages).
    tenants = [store.add_subscription(make(f"t{n}.*")) for n in range(30)]
    every = store.add_subscription(make("*"))
    topics = [f"t{n}.created" for n in range(45)]
    found = store.subscriptions_for_topics([*topics, *topics])
    assert list(found) == topics
    for n, topic in enumerate(topics):
        assert {s.id for s in found[topic]} == ({tenants[n].id} if n < 30 else set()) | {every.id}


# -- upgrading a database from before the index ---------------------------------------------------


def test_ensure_schema_indexes_subscriptions_written_before_the_index(
    sql_store: SqlOutboundWebhookStore,
) -> None:
    engine = sql_store.engine
    old = [sql_store.add_subscription(make(f"tenant{n}.*", "order.created")) for n in range(3)]
    # A database from before the index: the table did not exist.
    subscription_topics_table.drop(engine)
    sql_store.ensure_schema()
    assert ids(sql_store, "order.created") == {s.id for s in old}
    assert ids(sql_store, "tenant1.x") == {old[1].id}

    # An older process added one meanwhile (a rolling upgrade): the next ensure_schema files it,
    # and nothing else is written twice.
    late = make("late.topic")
    with engine.begin() as conn:
        conn.execute(sa.insert(subscriptions_table), [subscription_values(late)])
    assert ids(sql_store, "late.topic") == set()
    assert sql_store.index_unindexed_subscriptions() == 1
    assert sql_store.index_unindexed_subscriptions() == 0
    sql_store.ensure_schema()
    assert ids(sql_store, "late.topic") == {late.id}
    with engine.connect() as conn:
        rows = conn.execute(sa.select(sa.func.count()).select_from(subscription_topics_table)).scalar()
    assert rows == 3 * 2 + 1


def test_an_app_on_a_database_from_before_the_index_indexes_it_at_startup(tmp_path: Path) -> None:
    # The upgrade path most apps take: OutboundWebhookPlugin.sql(db) calls ensure_schema().
    url = f"sqlite:///{tmp_path / 'old.db'}"
    engine = sa.create_engine(url)
    old = make("order.*")
    try:
        metadata.create_all(engine, tables=[subscriptions_table])  # the schema before the index
        with engine.begin() as conn:
            conn.execute(sa.insert(subscriptions_table), [subscription_values(old)])
    finally:
        engine.dispose()

    app = Flask("upgraded")
    app.config.update(FAST, SQLALCHEMY_DATABASE_URI=url)
    OutboundWebhookPlugin.sql(SQLAlchemy(app), app)
    close_later(app)
    with app.app_context():
        assert ids(get_engine(app).store, "order.created") == {old.id}


def test_keys_of_a_real_pattern_set_are_distinct() -> None:
    # One row per key: two patterns of a subscription with one key make one row, not a conflict.
    patterns = [".".join(p) for p in itertools.product("ab*", repeat=3)]
    keys = [pattern_key(p) for p in patterns]
    assert len(set(keys)) == len(patterns)


@pytest.mark.parametrize("patterns", [[".".join("abcdefg"), ".".join("abcdefh")]])
def test_patterns_sharing_a_key_make_one_row(sql_store: SqlOutboundWebhookStore, patterns: list[str]) -> None:
    subscription = sql_store.add_subscription(make(*patterns))
    with sql_store.engine.connect() as conn:
        keys = conn.execute(sa.select(subscription_topics_table.c.pattern_key)).scalars().all()
    assert keys == [pattern_key(patterns[0])]
    assert ids(sql_store, patterns[1]) == {subscription.id}
