"""Delivery through Redis Queue: real Redis, real RQ workers (in-process and as subprocesses)."""

from __future__ import annotations

import signal
import time
from datetime import timedelta
from pathlib import Path

import pytest
import redis
from flask import Flask
from rq.scheduler import RQScheduler
from werkzeug.wrappers import Request, Response

from flask_harvest import (
    DeliveryState,
    OutboundWebhookHandler,
    WebhookSubscription,
    generate_secret,
    get_engine,
)
from flask_harvest._time import utcnow
from flask_harvest.jobs.base import JobRef, row_id_of
from flask_harvest.jobs.rq import RqBackend
from flask_harvest.testing import CapturingReceiver
from flask_harvest.webhooks.stores.sql import SqlOutboundWebhookStore
from flask_harvest.worker import HarvestWorker

from .pipeline import rq_app, rq_backend, wait_final
from .worker_process import start_worker, stop

pytestmark = pytest.mark.redis
SECRET = generate_secret()


def work_until_final(app: Flask, delivery_ids: list[str], rounds: int = 10) -> list[DeliveryState]:
    """Run burst workers (each also moves due scheduled retries) until every delivery is final."""
    state = get_engine(app)
    backend = rq_backend(app)
    for _ in range(rounds):
        HarvestWorker([backend.queue], connection=backend.connection, app=app).work(
            burst=True, with_scheduler=True
        )
        try:
            return wait_final(state.store, delivery_ids, timeout=0.1)
        except TimeoutError:
            time.sleep(1.0)  # RQ's scheduler works in whole seconds
    return wait_final(state.store, delivery_ids, timeout=0.1)


def test_simple_worker_delivers_and_retries(
    store: OutboundWebhookHandler, redis_conn: redis.Redis, redis_url: str, receiver: CapturingReceiver
) -> None:
    app = rq_app(store, redis_url)
    store.add_subscription(WebhookSubscription(receiver.url("/hook"), ["order.*"], SECRET, id="sub_1"))
    receiver.respond("/hook", 500)
    with app.app_context():
        ids = get_engine().manager.dispatch("order.created", {"n": 1})
    assert len(redis_conn.lrange("rq:queue:harvest-webhooks", 0, -1)) == 1
    assert work_until_final(app, ids) == [DeliveryState.DELIVERED]
    first, second = receiver.requests
    assert first.webhook_id == second.webhook_id == ids[0]


def test_lowering_the_attempt_limit_dead_letters_a_waiting_delivery_without_a_request(
    store: OutboundWebhookHandler, redis_conn: redis.Redis, redis_url: str, receiver: CapturingReceiver
) -> None:
    app = rq_app(store, redis_url, HARVEST_WEBHOOKS_MAX_ATTEMPTS=5)
    store.add_subscription(WebhookSubscription(receiver.url("/hook"), ["order.*"], SECRET, id="sub_1"))
    receiver.respond("/hook", 500, times=2)
    with app.app_context():
        [delivery_id] = get_engine().manager.dispatch("order.created", {})
        assert get_engine().runner.run(delivery_id) is DeliveryState.PENDING
    time.sleep(0.1)  # the retry becomes due (backoff is at most 20 ms)
    lowered = rq_app(store, redis_url, HARVEST_WEBHOOKS_MAX_ATTEMPTS=1)
    with lowered.app_context():
        assert get_engine().runner.run(delivery_id) is DeliveryState.DLQ
    assert len(receiver.requests) == 1
    stored = store.get_delivery(delivery_id)
    assert stored is not None
    assert stored.last_error == "attempt limit is 1; attempt 2 was not made"


def test_sweeper_rebuilds_the_queue_after_redis_loses_it(
    store: OutboundWebhookHandler, redis_conn: redis.Redis, redis_url: str, receiver: CapturingReceiver
) -> None:
    app = rq_app(store, redis_url)
    store.add_subscription(WebhookSubscription(receiver.url("/hook"), ["order.*"], SECRET, id="sub_1"))
    with app.app_context():
        ids = [get_engine().manager.dispatch("order.created", {"n": n})[0] for n in range(5)]
    redis_conn.flushdb()  # Redis restarted empty: every job is gone, the rows are not
    time.sleep(2.1)  # the sweeper leaves alone rows due less than its grace period ago
    with app.app_context():
        report = get_engine().sweep()
        assert report.requeued == 5
        assert get_engine().sweep().requeued == 0  # the jobs exist now: no duplicates
    assert work_until_final(app, ids) == [DeliveryState.DELIVERED]
    assert sorted(r.webhook_id or "" for r in receiver.requests) == sorted(ids)


#: The worker's app as the delivery tests want it: a short connect timeout (the receiver is local).
WORKER_CONFIG = {"HARVEST_WEBHOOKS_CONNECT_TIMEOUT_SECONDS": 1}


def test_flask_harvest_worker_command_delivers(
    sql_store: SqlOutboundWebhookStore,
    redis_conn: redis.Redis,
    redis_url: str,
    receiver: CapturingReceiver,
    tmp_path: Path,
) -> None:
    app = rq_app(sql_store, redis_url)
    sql_store.add_subscription(WebhookSubscription(receiver.url("/hook"), ["order.*"], SECRET, id="sub_1"))
    with app.app_context():
        ids = [get_engine().manager.dispatch("order.created", {"n": n})[0] for n in range(3)]
    worker = start_worker(tmp_path, sql_store, redis_url, "--burst", config=WORKER_CONFIG)
    try:
        assert worker.wait(timeout=60) == 0, (tmp_path / "worker.log").read_text()
    finally:
        stop(worker, signal.SIGTERM)
    assert wait_final(sql_store, ids, timeout=1) == [DeliveryState.DELIVERED]
    assert sorted(r.webhook_id or "" for r in receiver.requests) == sorted(ids)


def test_a_killed_worker_is_recovered_after_one_lease(
    sql_store: SqlOutboundWebhookStore,
    redis_conn: redis.Redis,
    redis_url: str,
    receiver: CapturingReceiver,
    tmp_path: Path,
) -> None:
    hang = {"first": True}

    def stall_once(_request: Request) -> Response:
        if hang.pop("first", False):
            time.sleep(20)  # the worker holding this request is killed meanwhile
        return Response("", 200)

    receiver.handle("/slow", stall_once)
    app = rq_app(sql_store, redis_url)
    sql_store.add_subscription(WebhookSubscription(receiver.url("/slow"), ["order.*"], SECRET, id="sub_1"))
    with app.app_context():
        [delivery_id] = get_engine().manager.dispatch("order.created", {})
    lease = {**WORKER_CONFIG, "HARVEST_WEBHOOKS_LEASE_SECONDS": 3, "HARVEST_WEBHOOKS_DEADLINE_SECONDS": 2.5}
    doomed = start_worker(tmp_path, sql_store, redis_url, config=lease)
    try:
        receiver.wait_for(1, timeout=30)
        stored = sql_store.get_delivery(delivery_id)
        assert stored is not None
        assert stored.state is DeliveryState.INFLIGHT
    finally:
        stop(doomed, signal.SIGKILL)
    killed_at = time.monotonic()
    survivor = start_worker(tmp_path, sql_store, redis_url, config=lease)
    try:
        assert wait_final(sql_store, [delivery_id], timeout=30) == [DeliveryState.DELIVERED]
        recovery = time.monotonic() - killed_at
    finally:
        stop(survivor, signal.SIGTERM)
    second = receiver.wait_for(2, timeout=1)[1]
    assert second.webhook_id == delivery_id
    # Not RQ's abandoned-job timeout (minutes): about one lease plus a sweep interval.
    assert recovery < 15, recovery


def test_a_job_scheduled_at_the_front_goes_to_the_head_of_the_queue_when_due(redis_conn: redis.Redis) -> None:
    # Work given back only to wait for its turn (a rate limit's) must not then wait behind the
    # backlog queued meanwhile; other scheduled work (retries) keeps its place at the back.
    backend = RqBackend(redis_conn, "harvest-front", job_timeout=60, batch_size=1)
    backend.enqueue([JobRef("webhook", "queued_1"), JobRef("webhook", "queued_2")])
    due = utcnow() - timedelta(seconds=2)
    front, back = JobRef("webhook", "turn", 1, due), JobRef("webhook", "retry", 2, due)
    backend.schedule(front, at_front=True)
    backend.schedule(back)
    # RQ's scheduler, once, as a worker's runs it every second (RQ leaves these untyped).
    scheduler = RQScheduler([backend.queue], connection=redis_conn)
    assert scheduler.acquire_locks()  # type: ignore[no-untyped-call]
    try:
        scheduler.enqueue_scheduled_jobs()  # type: ignore[no-untyped-call]
    finally:
        scheduler.release_locks()  # type: ignore[no-untyped-call]
    queued = [row_id_of(job_id, "webhook") for job_id in backend.queue.job_ids]
    assert queued == ["turn", "queued_1", "queued_2", "retry"]
