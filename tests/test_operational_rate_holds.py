"""Operational notifications of long rate-limit holds: the episode arithmetic (pure, and the Redis
script against it), and the notification made once per episode, delivered signed to a real
receiver on 127.0.0.1 by the in-process backend and by an RQ worker."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
import redis
from hypothesis import given, settings
from hypothesis import strategies as st

from flask_harvest import (
    ConfigurationError,
    DeliveryState,
    OutboundWebhookHandler,
    WebhookSubscription,
    get_engine,
)
from flask_harvest.config import load_settings
from flask_harvest.outbound.hold_episodes import LocalHoldEpisodes, RedisHoldEpisodes
from flask_harvest.outbound.holds import HoldEpisode, expires_in, note_hold
from flask_harvest.outbound.rate import RateLimit
from flask_harvest.testing import CapturingReceiver
from flask_harvest.webhooks import operational
from flask_harvest.webhooks.models import DeliveryLog
from flask_harvest.webhooks.operational import SUBSCRIPTION_RATE_LIMITED
from flask_harvest.webhooks.stores.sql import SqlOutboundWebhookStore

from .pipeline import make_app, rq_app
from .test_delivery_rq import work_until_final
from .test_operational_webhooks import SECRET, body, check_signed, ops_config, ops_deliveries, wait_ops

S = 1_000_000  # microseconds in a second
#: One delivery per 100 seconds, one at once: the second delivery's turn is 100 s away, past a
#: threshold of 60 s, so its hold makes the episode long at once (no test waits for a clock).
SLOW = RateLimit(per_second=0.01, burst=1)
THRESHOLD = {"HARVEST_OPERATIONAL_RATE_LIMIT_HOLD_SECONDS": 60}


# -- the arithmetic --------------------------------------------------------------------------------


def test_an_episode_is_told_once_when_it_spans_the_threshold() -> None:
    episode, tell = note_hold(None, 0, 10 * S, threshold=60 * S, gap=60 * S)
    assert (episode, tell) == (HoldEpisode(0, 10 * S), False)
    # Each hold stretches the episode to its turn; the one that reaches the threshold tells.
    episode, tell = note_hold(episode, 20 * S, 45 * S, threshold=60 * S, gap=60 * S)
    assert (episode, tell) == (HoldEpisode(0, 65 * S, True), True)
    episode, tell = note_hold(episode, 30 * S, 500 * S, threshold=60 * S, gap=60 * S)
    assert (episode.span, tell) == (530 * S, False)


def test_an_episode_ends_a_gap_after_its_last_turn_and_the_next_starts_afresh() -> None:
    episode, _ = note_hold(None, 0, 100 * S, threshold=60 * S, gap=60 * S)
    assert episode.told
    assert expires_in(episode, 0, 60 * S) == 160 * S
    same, tell = note_hold(episode, 160 * S, 100 * S, threshold=60 * S, gap=60 * S)
    assert (same.since, tell) == (0, False)
    fresh, tell = note_hold(episode, 160 * S + 1, 100 * S, threshold=60 * S, gap=60 * S)
    assert (fresh.since, tell) == (160 * S + 1, True)


HOLDS = st.lists(st.tuples(st.integers(0, 200 * S), st.integers(0, 120 * S)), min_size=1, max_size=30)


def _replay(
    holds: list[tuple[int, int]], threshold: int, gap: int, *, forget: bool = True
) -> list[tuple[bool, int, int]]:
    """Run ``note_hold`` over holds at increasing times (the steps between them given);
    ``forget``: drop an episode once it has expired, as the Redis key's expiry does."""
    episode: HoldEpisode | None = None
    now, seen = 10**12, []
    for step, wait in holds:
        now += step
        if forget and episode is not None and expires_in(episode, now, gap) == 0:
            episode = None  # what the Redis key's expiry does
        episode, tell = note_hold(episode, now, wait, threshold=threshold, gap=gap)
        seen.append((tell, episode.since, episode.until))
    return seen


@given(HOLDS, st.integers(1, 100 * S))
def test_each_episode_is_told_at_most_once_and_exactly_when_it_gets_long(
    holds: list[tuple[int, int]], threshold: int
) -> None:
    told: dict[int, int] = {}
    for tell, since, until in _replay(holds, threshold, threshold):
        if tell:
            told[since] = told.get(since, 0) + 1
            assert until - since >= threshold
        elif since not in told:
            assert until - since < threshold
    assert all(count == 1 for count in told.values())


@pytest.mark.redis
@settings(max_examples=30, deadline=None)
@given(HOLDS, st.integers(1, 100 * S), st.integers(10 * S, 200 * S))
def test_the_redis_script_runs_the_same_arithmetic(
    redis_url: str, holds: list[tuple[int, int]], threshold: int, gap: int
) -> None:
    connection = redis.Redis.from_url(redis_url)
    episodes = RedisHoldEpisodes(connection, "harvest:test-held:")
    connection.delete(episodes.key("sub"))
    try:
        now, seen = 10**12, []
        for step, wait in holds:
            now += step
            # The script runs on a given clock, so its key's real expiry must play no part: a gap
            # of ten seconds and more keeps the key for the test's whole run (a tiny one gave it a
            # millisecond, which a loaded machine let pass between two calls), and the script
            # ends an episode by its own test, as the pure function does.
            seen.append(episodes.run("sub", wait, threshold=threshold, gap=gap, now=now))
        assert seen == _replay(holds, threshold, gap, forget=False)
    finally:
        connection.delete(episodes.key("sub"))
        connection.close()


@pytest.mark.redis
def test_processes_sharing_redis_share_one_episode(redis_conn: redis.Redis, redis_url: str) -> None:
    # Two keepers on two connections stand for two worker processes.
    first = RedisHoldEpisodes(redis.Redis.from_url(redis_url), "harvest:held:q:")
    second = RedisHoldEpisodes(redis.Redis.from_url(redis_url), "harvest:held:q:")
    told = [keeper.note("sub_1", 100.0, threshold=60, gap=60) for keeper in (first, second, first, second)]
    assert [episode is not None for episode in told] == [True, False, False, False]
    # The key lives as long as the episode could go on, no longer.
    assert 0 < redis_conn.pttl("harvest:held:q:sub_1") <= 161_000


def test_the_local_keeper_tells_once_per_endpoint() -> None:
    keeper = LocalHoldEpisodes()
    assert keeper.note("a", 1.0, threshold=60, gap=60) is None
    assert keeper.note("a", 100.0, threshold=60, gap=60) is not None
    assert keeper.note("a", 100.0, threshold=60, gap=60) is None
    assert keeper.note("b", 100.0, threshold=60, gap=60) is not None


def test_the_kind_is_in_the_catalog_and_its_example_matches() -> None:
    kind = operational.KINDS[SUBSCRIPTION_RATE_LIMITED]
    assert kind.event_type().problem(kind.example) is None


@pytest.mark.parametrize("value", [-1, "x", float("nan"), "inf"])
def test_a_bad_threshold_is_refused(value: Any) -> None:
    with pytest.raises(ConfigurationError, match="HARVEST_OPERATIONAL_RATE_LIMIT_HOLD_SECONDS"):
        load_settings({"HARVEST_OPERATIONAL_RATE_LIMIT_HOLD_SECONDS": value}, {})


def test_zero_turns_the_watch_off(store: OutboundWebhookHandler, receiver: CapturingReceiver) -> None:
    app = make_app(store, **ops_config(receiver), HARVEST_OPERATIONAL_RATE_LIMIT_HOLD_SECONDS=0)
    assert get_engine(app).runner.hold_watch is None
    assert get_engine(make_app(store)).runner.hold_watch is None


# -- delivered -------------------------------------------------------------------------------------


def wait_given_back(
    store: OutboundWebhookHandler, ids: list[str], timeout: float = 20.0
) -> list[DeliveryLog]:
    """Wait until every one of ``ids`` is pending again (held, and given back due at its turn)."""
    end = time.monotonic() + timeout
    while True:
        rows = store.get_deliveries(ids)
        if {d.state for d in rows} == {DeliveryState.PENDING}:
            return rows
        if time.monotonic() > end:
            raise TimeoutError(f"not all given back after {timeout} s: {[d.state for d in rows]}")
        time.sleep(0.02)


def _limited(store: OutboundWebhookHandler, receiver: CapturingReceiver) -> None:
    store.add_subscription(
        WebhookSubscription(receiver.url("/slow"), ["order.*"], SECRET, id="sub_slow", rate_limit=SLOW)
    )


def _check_notice(request_body: dict[str, Any], receiver: CapturingReceiver, held: str) -> None:
    assert request_body["type"] == SUBSCRIPTION_RATE_LIMITED
    data = request_body["data"]
    assert data["subscription_id"] == "sub_slow"
    assert data["subscription_url"] == receiver.url("/slow")
    assert data["rate_limit"] == {"per_second": 0.01, "burst": 1}
    assert data["threshold_seconds"] == 60
    assert data["delivery_id"] == held
    assert data["held_since"] < data["held_until"]
    assert SECRET not in json.dumps(request_body)


def test_a_long_hold_is_notified_once_signed(
    store: OutboundWebhookHandler, receiver: CapturingReceiver
) -> None:
    app = make_app(store, **ops_config(receiver), **THRESHOLD)
    _limited(store, receiver)
    with app.app_context():
        manager = get_engine().manager
        first = manager.dispatch("order.created", {"n": 1})
        receiver.wait_for(1, path="/slow")
        # The second waits 100 s for its turn: the episode is long with its first hold.
        [held] = manager.dispatch("order.created", {"n": 2})
        [notice] = wait_ops(store, 1)
        # More holds in the same episode make no second notification.
        more = [manager.dispatch("order.created", {"n": n})[0] for n in range(3, 6)]
        catalog = get_engine().manager.catalog
    assert store.get_deliveries(first)[0].state is DeliveryState.DELIVERED
    [request] = receiver.wait_for(1, path="/ops")
    check_signed(request)
    assert request.webhook_id == notice.id and notice.topic == SUBSCRIPTION_RATE_LIMITED
    _check_notice(body(request), receiver, held)
    event_type = catalog.get(SUBSCRIPTION_RATE_LIMITED)
    assert event_type is not None and event_type.problem(body(request)) is None
    # The held deliveries wait their turns, unsent and with no attempt used.
    held_rows = wait_given_back(store, [held, *more])
    assert all(store.list_attempts(d.id) == [] for d in held_rows)
    assert len([r for r in receiver.requests if r.path == "/slow"]) == 1
    assert [d.topic for d in ops_deliveries(store)] == [SUBSCRIPTION_RATE_LIMITED]


@pytest.mark.redis
def test_an_rq_worker_notifies_a_long_hold_once(
    sql_store: SqlOutboundWebhookStore, redis_conn: redis.Redis, redis_url: str, receiver: CapturingReceiver
) -> None:
    app = rq_app(sql_store, redis_url, **ops_config(receiver), **THRESHOLD)
    _limited(sql_store, receiver)
    with app.app_context():
        manager = get_engine().manager
        first = manager.dispatch("order.created", {"n": 1})
        assert work_until_final(app, first) == [DeliveryState.DELIVERED]
        held = [manager.dispatch("order.created", {"n": n})[0] for n in range(2, 5)]
    # One round: the worker takes the deliveries and its limit holds them (they go back due at
    # their turns), and the episode, kept in Redis, is told once.
    with pytest.raises(TimeoutError):
        work_until_final(app, held, rounds=1)
    [notice] = ops_deliveries(sql_store)
    assert work_until_final(app, [notice.id]) == [DeliveryState.DELIVERED]
    [request] = receiver.wait_for(1, path="/ops")
    check_signed(request)
    data = body(request)
    assert data["data"]["delivery_id"] in held
    assert redis_conn.exists("harvest:held:harvest-webhooks:sub_slow")
