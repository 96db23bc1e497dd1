"""A fan-out travels as batch jobs: fewer RQ jobs, and every delivery still accounted for."""

from __future__ import annotations

import pytest
import redis
from flask import Flask

from flask_harvest import (
    DeliveryLog,
    DeliveryState,
    OutboundWebhookHandler,
    WebhookSubscription,
    generate_secret,
    get_engine,
)
from flask_harvest.jobs.rq import BATCH_TASK, TASK, RqBackend, take_jobs
from flask_harvest.testing import CapturingReceiver
from flask_harvest.webhooks.delivery import WEBHOOK_JOB, delivery_job
from flask_harvest.webhooks.sweeper import sweep
from flask_harvest.worker import DeliveryPool, HarvestWorker

from .pipeline import rq_app, rq_backend, wait_final

pytestmark = pytest.mark.redis
SECRET = generate_secret()


def fan_out(
    store: OutboundWebhookHandler, redis_url: str, receiver: CapturingReceiver, subscribers: int
) -> tuple[Flask, RqBackend, list[str]]:
    """Subscribe ``subscribers`` endpoints to ``a.*``, dispatch one ``a.b`` event on the rq
    backend, and return the app, its backend and the delivery ids (nothing is delivered yet)."""
    for n in range(subscribers):
        store.add_subscription(
            WebhookSubscription(receiver.url(f"/hook/{n}"), ["a.*"], SECRET, id=f"sub_{n}")
        )
    # A worker concurrency of 32 makes batches of 8.
    app = rq_app(store, redis_url, HARVEST_WORKER_CONCURRENCY=32)
    with app.app_context():
        ids = get_engine(app).manager.dispatch("a.b", {"n": 1})
    return app, rq_backend(app), ids


def live(backend: RqBackend, deliveries: list[DeliveryLog]) -> set[str]:
    """The ids of the deliveries whose job the backend says is alive."""
    return {ref.id for ref in backend.live_jobs([delivery_job(d) for d in deliveries])}


def harvest_keys(redis_conn: redis.Redis) -> list[bytes | str]:
    """What delivery jobs leave in Redis: job hashes, batch member lists, alias entries."""
    keys = redis_conn.keys("rq:job:harvest-*") + redis_conn.keys("harvest:batch:*")
    return keys + [k for k in redis_conn.keys("harvest:batch-of:*") if redis_conn.hlen(k)]


def test_a_fan_out_is_queued_as_jobs_of_a_batch_each_and_all_delivered(
    store: OutboundWebhookHandler, redis_conn: redis.Redis, redis_url: str, receiver: CapturingReceiver
) -> None:
    app, backend, ids = fan_out(store, redis_url, receiver, subscribers=20)

    jobs = backend.queue.jobs
    assert [job.func_name for job in jobs] == [BATCH_TASK] * 3
    assert sorted(len(job.args[2]) for job in jobs) == [4, 8, 8]  # (kind, batch id, members)
    assert live(backend, store.get_deliveries(ids)) == set(ids)

    pool = DeliveryPool(get_engine(app).runner, size=32, per_subscription=16, context=app.app_context)
    HarvestWorker([backend.queue], connection=backend.connection, app=app, pool=pool).work(burst=True)

    assert wait_final(store, ids, timeout=5) == [DeliveryState.DELIVERED]
    assert len(receiver.wait_for(20, timeout=1)) == 20
    assert harvest_keys(redis_conn) == []


def test_a_worker_without_a_pool_runs_a_batch_job_itself(
    store: OutboundWebhookHandler, redis_conn: redis.Redis, redis_url: str, receiver: CapturingReceiver
) -> None:
    app, backend, ids = fan_out(store, redis_url, receiver, subscribers=3)

    HarvestWorker([backend.queue], connection=backend.connection, app=app).work(burst=True)

    assert wait_final(store, ids, timeout=5) == [DeliveryState.DELIVERED]
    assert harvest_keys(redis_conn) == []


def test_a_batched_delivery_whose_batch_job_is_lost_is_requeued_by_the_sweeper(
    store: OutboundWebhookHandler, redis_conn: redis.Redis, redis_url: str, receiver: CapturingReceiver
) -> None:
    _app, backend, ids = fan_out(store, redis_url, receiver, subscribers=3)
    (batch,) = backend.queue.jobs
    deliveries = store.get_deliveries(ids)
    assert live(backend, deliveries) == set(ids)

    batch.delete()  # Redis lost the job: the member list and the aliases are all that is left

    assert live(backend, deliveries) == set()
    assert redis_conn.hlen(f"harvest:batch-of:{backend.queue.name}") == 0  # stale aliases dropped
    assert sweep(store, backend, grace_seconds=0).requeued == 3
    assert live(backend, deliveries) == set(ids)
    assert sweep(store, backend, grace_seconds=0).requeued == 0  # queued now: left alone


def test_take_jobs_takes_a_batch_whole_or_not_at_all(
    store: OutboundWebhookHandler, redis_conn: redis.Redis, redis_url: str, receiver: CapturingReceiver
) -> None:
    store.add_subscription(WebhookSubscription(receiver.url("/other"), ["b.*"], SECRET, id="sub_other"))
    app, backend, ids = fan_out(store, redis_url, receiver, subscribers=3)
    with app.app_context():
        (single,) = get_engine(app).manager.dispatch("b.c", {"n": 2})

    assert take_jobs(backend.queue, WEBHOOK_JOB, 2) == []  # the batch of 3 does not fit
    assert sorted(take_jobs(backend.queue, WEBHOOK_JOB, 3)) == sorted(ids)
    assert [job.func_name for job in backend.queue.jobs] == [TASK]
    assert take_jobs(backend.queue, WEBHOOK_JOB, 5) == [single]
    assert harvest_keys(redis_conn) == []
