"""Rate limits per subscription, end to end: real Redis, real ``flask harvest worker`` processes,
a real receiver on 127.0.0.1; and the local backend, whose limiter lives in its one process."""

from __future__ import annotations

import signal
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import redis
from flask import Flask

from flask_harvest import (
    DeliveryState,
    OutboundWebhookHandler,
    WebhookSubscription,
    generate_secret,
    get_engine,
    signals,
)
from flask_harvest._time import utcnow
from flask_harvest.outbound.rate import RateLimit
from flask_harvest.testing import CapturingReceiver, ReceivedRequest
from flask_harvest.webhooks.stores.sql import SqlOutboundWebhookStore

from .pipeline import make_app, rq_app, wait_final
from .worker_process import start_worker, stop

SECRET = generate_secret()
#: The limiter admits at most rate x window + burst in any window of its own (Redis's) time. A
#: delivery reaches the receiver some time after its admission (the worker's threads, the POST),
#: and that lag varies: two admissions one turn apart can arrive closer together. So arrivals are
#: held to the bound over the window widened by this much lag spread, ample on a loaded 2-core
#: machine; a limiter that did not hold would overshoot it many times over.
LAG_SPREAD_SECONDS = 0.2


def arrival_bound(limit: RateLimit, window: float) -> float:
    return limit.per_second * (window + LAG_SPREAD_SECONDS) + limit.burst


def most_in_any_window(requests: Sequence[ReceivedRequest], seconds: float) -> int:
    """The most arrivals within any window of ``seconds`` (half-open), from the receiver's clock."""
    times = sorted(r.received_at for r in requests)
    most, first = 0, 0
    for last, at in enumerate(times):
        while at - times[first] >= seconds:
            first += 1
        most = max(most, last - first + 1)
    return most


def dispatch(app: Flask, topic: str, count: int) -> list[str]:
    with app.app_context():
        manager = get_engine().manager
        return [delivery_id for n in range(count) for delivery_id in manager.dispatch(topic, {"n": n})]


@pytest.mark.redis
@pytest.mark.parametrize("sql_store", ["postgres"], indirect=True)
def test_two_workers_hold_a_subscription_to_its_rate_while_another_gets_everything(
    sql_store: SqlOutboundWebhookStore,
    redis_conn: redis.Redis,
    redis_url: str,
    receiver: CapturingReceiver,
    tmp_path: Path,
) -> None:
    # 10 per second with a burst of 5, over about 8 seconds of sending (shorter than the 20 s
    # the behaviour was first asked about, to keep the suite quick; the bound is the same).
    limit = RateLimit(per_second=10, burst=5)
    limited_count, unlimited_count = 85, 300
    app = rq_app(sql_store, redis_url)
    sql_store.add_subscription(
        WebhookSubscription(
            receiver.url("/limited"), ["limited.*"], SECRET, id="sub_limited", rate_limit=limit
        )
    )
    sql_store.add_subscription(WebhookSubscription(receiver.url("/free"), ["free.*"], SECRET, id="sub_free"))
    limited = dispatch(app, "limited.event", limited_count)
    free = dispatch(app, "free.event", unlimited_count)
    config = {"HARVEST_WEBHOOKS_CONNECT_TIMEOUT_SECONDS": 1}
    workers = [
        start_worker(tmp_path, sql_store, redis_url, "--concurrency", "64", config=config) for _ in range(2)
    ]
    try:
        receiver.wait_for(unlimited_count, timeout=60, path="/free")
        arrived = receiver.wait_for(limited_count, timeout=60, path="/limited")
    finally:
        for worker in workers:
            stop(worker, signal.SIGTERM)
    log = (tmp_path / "worker.log").read_text()
    limited_requests = [r for r in receiver.requests if r.path == "/limited"]
    # Each delivery once, and none used an attempt waiting for its turn.
    assert len(limited_requests) == limited_count, log
    assert wait_final(sql_store, limited + free, timeout=10) == [DeliveryState.DELIVERED]
    assert {d.attempt for d in sql_store.get_deliveries(limited)} == {1}
    # The correctness bound: never more than rate x window + burst in any window (plus the lag).
    for window in (1.0, 2.0, 4.0):
        assert most_in_any_window(limited_requests, window) <= arrival_bound(limit, window)
    # And it was held to the limit, not merely slow: the deliveries spread over their turns.
    span = max(r.received_at for r in arrived) - min(r.received_at for r in arrived)
    assert span >= (limited_count - limit.burst) / limit.per_second * 0.9


def test_the_local_backend_holds_a_subscription_to_its_rate_in_its_one_process(
    store: OutboundWebhookHandler, receiver: CapturingReceiver
) -> None:
    limit = RateLimit(per_second=20, burst=3)
    app = make_app(store, HARVEST_WEBHOOKS_ALLOW_PRIVATE_TARGETS=True)
    store.add_subscription(
        WebhookSubscription(receiver.url("/r"), ["t.*"], SECRET, id="sub_r", rate_limit=limit)
    )
    waits: list[float] = []

    def held(sender: Any, *, seconds: float, **extra: Any) -> None:
        waits.append(seconds)

    signals.delivery_rate_limited.connect(held, sender=app, weak=False)
    try:
        ids = dispatch(app, "t.x", 30)
        requests = receiver.wait_for(30, timeout=30, path="/r")
    finally:
        signals.delivery_rate_limited.disconnect(held, sender=app)
    assert wait_final(store, ids, timeout=10) == [DeliveryState.DELIVERED]
    assert {d.attempt for d in store.get_deliveries(ids)} == {1}
    assert most_in_any_window(requests, 0.5) <= arrival_bound(limit, 0.5)
    # Deliveries past the burst waited their turns (how many depends on how fast the store
    # dispatches), and the signal said for how long.
    assert waits and all(wait > 0 for wait in waits)


@pytest.mark.redis
@pytest.mark.slow
@pytest.mark.parametrize("sql_store", ["postgres"], indirect=True)
def test_over_twenty_seconds_two_full_workers_hold_the_limit_and_serve_a_backlog_beside_it(
    sql_store: SqlOutboundWebhookStore,
    redis_url: str,
    receiver: CapturingReceiver,
    tmp_path: Path,
) -> None:
    # The behaviour as it was asked about: 10 per second (burst 5) for 20 seconds of sending,
    # two worker processes at the default concurrency, and an unlimited subscription whose
    # backlog is queued behind the limited one's, so the limited deliveries given back for their
    # turns come round while that backlog fills the queue.
    limit = RateLimit(per_second=10, burst=5)
    window = 20.0
    limited_count = int(limit.per_second * window) + limit.burst
    unlimited_count = 1500
    app = rq_app(sql_store, redis_url)
    sql_store.add_subscription(
        WebhookSubscription(
            receiver.url("/limited"), ["limited.*"], SECRET, id="sub_limited", rate_limit=limit
        )
    )
    sql_store.add_subscription(WebhookSubscription(receiver.url("/free"), ["free.*"], SECRET, id="sub_free"))
    limited = dispatch(app, "limited.event", limited_count)
    free = dispatch(app, "free.event", unlimited_count)
    config = {"HARVEST_WEBHOOKS_CONNECT_TIMEOUT_SECONDS": 1}
    workers = [start_worker(tmp_path, sql_store, redis_url, config=config) for _ in range(2)]
    try:
        receiver.wait_for(unlimited_count, timeout=120, path="/free")
        receiver.wait_for(limited_count, timeout=120, path="/limited")
    finally:
        for worker in workers:
            stop(worker, signal.SIGTERM)
    log = (tmp_path / "worker.log").read_text()
    limited_requests = [r for r in receiver.requests if r.path == "/limited"]
    free_requests = [r for r in receiver.requests if r.path == "/free"]
    # Every delivery of both, each once, and none used an attempt waiting for its turn.
    assert len(limited_requests) == limited_count, log
    assert len(free_requests) == unlimited_count, log
    assert wait_final(sql_store, limited + free, timeout=10) == [DeliveryState.DELIVERED]
    assert {d.attempt for d in sql_store.get_deliveries(limited)} == {1}
    # The bound, over every window up to the whole run: rate x window + burst (plus the lag).
    for seconds in (1.0, 2.0, 5.0, 10.0, window):
        assert most_in_any_window(limited_requests, seconds) <= arrival_bound(limit, seconds)


@pytest.mark.redis
@pytest.mark.slow
@pytest.mark.parametrize("sql_store", ["postgres"], indirect=True)
def test_a_worker_killed_while_holding_and_giving_back_rate_limited_deliveries_loses_none(
    sql_store: SqlOutboundWebhookStore,
    redis_url: str,
    receiver: CapturingReceiver,
    tmp_path: Path,
) -> None:
    # The killed worker holds some deliveries for their turns (leased rows) and has given others
    # back due later, to the head of the queue (rows due with a scheduled job): the next worker
    # and the sweeper must bring every one of them round, still at the limit's pace.
    limit = RateLimit(per_second=2, burst=1)
    app = rq_app(sql_store, redis_url)
    sql_store.add_subscription(
        WebhookSubscription(
            receiver.url("/limited"), ["limited.*"], SECRET, id="sub_limited", rate_limit=limit
        )
    )
    ids = dispatch(app, "limited.event", 6)
    # A short lease, so the held ones come back soon; long enough that the worker holds them.
    config = {
        "HARVEST_WEBHOOKS_CONNECT_TIMEOUT_SECONDS": 1,
        "HARVEST_WEBHOOKS_DEADLINE_SECONDS": 2.5,
        "HARVEST_WEBHOOKS_LEASE_SECONDS": 12,
    }
    doomed = start_worker(tmp_path, sql_store, redis_url, config=config)
    try:
        receiver.wait_for(2, timeout=60, path="/limited")
        # Its rate sets the pace now: deliveries claimed from here on are given back, due later.
        ids += dispatch(app, "limited.event", 10)
        end = time.monotonic() + 30
        while time.monotonic() < end:
            now = utcnow()
            stored = sql_store.get_deliveries(ids)
            held = [d for d in stored if d.state is DeliveryState.INFLIGHT]
            given_back = [
                d
                for d in stored
                if d.state is DeliveryState.PENDING
                and d.next_attempt_at is not None
                and d.next_attempt_at > now
            ]
            if held and given_back:
                break
            time.sleep(0.05)
        assert held and given_back, [(d.state, d.next_attempt_at) for d in stored]
    finally:
        stop(doomed, signal.SIGKILL)
    survivor = start_worker(tmp_path, sql_store, redis_url, config=config)
    try:
        assert wait_final(sql_store, ids, timeout=90) == [DeliveryState.DELIVERED]
    finally:
        stop(survivor, signal.SIGTERM)
    requests = [r for r in receiver.requests if r.path == "/limited"]
    assert {r.webhook_id for r in requests} == set(ids)  # every one arrived (a POST cut short by
    # the kill may arrive twice: delivery is at least once)
    assert most_in_any_window(requests, 1.0) <= arrival_bound(limit, 1.0)
