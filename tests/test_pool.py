"""A worker's thread pool: many attempts in flight, and a slow endpoint cannot take every slot."""

from __future__ import annotations

import threading
import time

import pytest
import redis
from flask import Flask
from rq import Queue
from rq.job import Job
from werkzeug.wrappers import Request, Response

from flask_harvest import (
    DeliveryState,
    OutboundWebhookHandler,
    WebhookSubscription,
    generate_secret,
    get_engine,
)
from flask_harvest.admission import INITIAL_LIMIT
from flask_harvest.jobs.rq import TASK, RqBackend, take_jobs
from flask_harvest.testing import CapturingReceiver
from flask_harvest.webhooks.delivery import WEBHOOK_JOB
from flask_harvest.worker import DeliveryPool, HarvestWorker

from .pipeline import make_app, wait_final

pytestmark = pytest.mark.redis
SECRET = generate_secret()


class CountingEndpoint:
    """A receiver handler that answers 200 after ``delay`` seconds (or once ``gate`` is set, 30 s
    at most), counting requests in flight and answered."""

    def __init__(self, delay: float, gate: threading.Event | None = None) -> None:
        self.delay = delay
        self.gate = gate
        self.most = 0  # the most requests in flight at once
        self.answered = 0
        self.started: list[float] = []  # when each request arrived, on the receiver's clock
        self._now = 0
        self._lock = threading.Lock()

    def __call__(self, _request: Request) -> Response:
        with self._lock:
            self._now += 1
            self.most = max(self.most, self._now)
            self.started.append(time.time())
        if self.gate is not None:
            self.gate.wait(30)
        else:
            time.sleep(self.delay)
        with self._lock:
            self._now -= 1
            self.answered += 1
        return Response("", 200)


def test_a_slow_endpoint_holds_at_most_its_cap_and_never_delays_the_others(
    store: OutboundWebhookHandler, redis_conn: redis.Redis, redis_url: str, receiver: CapturingReceiver
) -> None:
    gate = threading.Event()
    slow = CountingEndpoint(delay=0, gate=gate)
    receiver.handle("/slow", slow)
    store.add_subscription(WebhookSubscription(receiver.url("/slow"), ["a.*"], SECRET, id="sub_slow"))
    store.add_subscription(WebhookSubscription(receiver.url("/fast"), ["a.*"], SECRET, id="sub_fast"))
    app = make_app(store, HARVEST_JOBS_BACKEND="rq", HARVEST_REDIS_URL=redis_url)
    state = get_engine(app)
    backend = state.backend
    assert isinstance(backend, RqBackend)
    with app.app_context():
        ids = [i for n in range(6) for i in state.manager.dispatch("a.b", {"n": n})]
    # The slow endpoint answers nothing until every fast delivery has arrived (its gate opens
    # then): a fast delivery stuck behind a slow one would never arrive, and the gate would only
    # open after 30 s with answered_then empty. Its deliveries over the cap wait their turn until
    # it counts as slow (0.2 s here), then are given back.
    answered_then: list[int] = []

    def open_once_the_fast_ones_arrived() -> None:
        try:
            receiver.wait_for(6, path="/fast", timeout=30)
            answered_then.append(slow.answered)
        finally:
            gate.set()

    opener = threading.Thread(target=open_once_the_fast_ones_arrived, daemon=True)
    opener.start()
    pool = DeliveryPool(state.runner, size=4, per_subscription=2, context=app.app_context, slow_after=0.2)
    try:
        HarvestWorker([backend.queue], connection=backend.connection, app=app, pool=pool).work(burst=True)
    finally:
        gate.set()
        opener.join(35)
    assert answered_then == [0]  # every fast delivery arrived while the slow endpoint held two
    assert slow.most == 2  # the cap, not the pool size
    # The deferred slow deliveries come round again (without using an attempt) and get through.
    for _ in range(10):
        try:
            assert wait_final(store, ids, timeout=0.2) == [DeliveryState.DELIVERED]
            break
        except TimeoutError:
            pool = DeliveryPool(
                state.runner, size=4, per_subscription=2, context=app.app_context, slow_after=0.2
            )
            HarvestWorker([backend.queue], connection=backend.connection, app=app, pool=pool).work(
                burst=True, with_scheduler=True
            )
            time.sleep(0.5)
    assert wait_final(store, ids, timeout=1) == [DeliveryState.DELIVERED]
    for delivery in store.get_deliveries(ids):
        assert delivery.attempt == 1  # deferral is not an attempt
    assert slow.most == 2


class CountingWorker(HarvestWorker):
    """The real worker, counting the jobs RQ runs through it."""

    jobs_run = 0

    def execute_job(self, job: Job, queue: Queue) -> object:
        self.jobs_run += 1
        return super().execute_job(job, queue)


def run_pooled_worker(app: Flask, pool: DeliveryPool) -> CountingWorker:
    backend = get_engine(app).backend
    assert isinstance(backend, RqBackend)
    worker = CountingWorker([backend.queue], connection=backend.connection, app=app, pool=pool)
    worker.work(burst=True)
    return worker


def test_a_worker_takes_queued_deliveries_in_batches_without_rq_running_a_job_for_them(
    store: OutboundWebhookHandler, redis_conn: redis.Redis, redis_url: str, receiver: CapturingReceiver
) -> None:
    store.add_subscription(WebhookSubscription(receiver.url("/hook"), ["a.*"], SECRET, id="sub"))
    app = make_app(store, HARVEST_JOBS_BACKEND="rq", HARVEST_REDIS_URL=redis_url)
    state = get_engine(app)
    with app.app_context():
        ids = [i for n in range(40) for i in state.manager.dispatch("a.b", {"n": n})]
    pool = DeliveryPool(state.runner, size=8, per_subscription=8, context=app.app_context)

    worker = run_pooled_worker(app, pool)

    assert wait_final(store, ids, timeout=5) == [DeliveryState.DELIVERED]
    assert len(receiver.wait_for(40, path="/hook", timeout=1)) == 40
    # The worker took the jobs off the queue's head a batch of free slots at a time: RQ ran none.
    assert worker.jobs_run == 0
    assert redis_conn.keys("rq:job:harvest-*") == []  # no job hash left behind


def test_a_healthy_endpoint_past_its_cap_waits_its_turn_in_the_process(
    store: OutboundWebhookHandler, redis_conn: redis.Redis, redis_url: str, receiver: CapturingReceiver
) -> None:
    busy = CountingEndpoint(delay=0.05)
    receiver.handle("/busy", busy)
    store.add_subscription(WebhookSubscription(receiver.url("/busy"), ["a.*"], SECRET, id="sub"))
    app = make_app(store, HARVEST_JOBS_BACKEND="rq", HARVEST_REDIS_URL=redis_url)
    state = get_engine(app)
    with app.app_context():
        ids = [i for n in range(12) for i in state.manager.dispatch("a.b", {"n": n})]
    pool = DeliveryPool(state.runner, size=8, per_subscription=2, context=app.app_context)

    run_pooled_worker(app, pool)  # one burst, without RQ's scheduler: nothing given back returns

    assert wait_final(store, ids, timeout=5) == [DeliveryState.DELIVERED]
    assert busy.most == 2


def test_take_jobs_stops_at_a_job_of_another_kind(
    redis_conn: redis.Redis,
) -> None:
    queue = Queue("harvest-take-test", connection=redis_conn)
    for n in range(3):
        queue.enqueue(TASK, WEBHOOK_JOB, f"d-{n}", job_id=f"harvest-webhook-d-{n}-1-0")
    queue.enqueue(TASK, "workflow", "w-1", job_id="harvest-workflow-w-1-0-0")
    queue.enqueue("builtins.print", "other", job_id="not-a-harvest-job")
    queue.enqueue(TASK, WEBHOOK_JOB, "d-9", job_id="harvest-webhook-d-9-1-0")

    assert take_jobs(queue, WEBHOOK_JOB, 2) == ["d-0", "d-1"]
    assert take_jobs(queue, WEBHOOK_JOB, 10) == ["d-2"]
    assert queue.job_ids == ["harvest-workflow-w-1-0-0", "not-a-harvest-job", "harvest-webhook-d-9-1-0"]
    assert not redis_conn.exists(Job.key_for("harvest-webhook-d-0-1-0"))
    assert redis_conn.exists(Job.key_for("harvest-workflow-w-1-0-0"))
    assert take_jobs(queue, WEBHOOK_JOB, 0) == []
    assert take_jobs(queue, "workflow", 5) == ["w-1"]
    assert take_jobs(queue, WEBHOOK_JOB, 5) == []  # the head is not a harvest job


def test_the_limit_grows_on_an_endpoint_that_answers_well(
    store: OutboundWebhookHandler, redis_conn: redis.Redis, redis_url: str, receiver: CapturingReceiver
) -> None:
    busy = CountingEndpoint(delay=0.05)
    receiver.handle("/busy", busy)
    store.add_subscription(WebhookSubscription(receiver.url("/busy"), ["a.*"], SECRET, id="sub"))
    app = make_app(store, HARVEST_JOBS_BACKEND="rq", HARVEST_REDIS_URL=redis_url)
    state = get_engine(app)
    with app.app_context():
        ids = [i for n in range(60) for i in state.manager.dispatch("a.b", {"n": n})]
    pool = DeliveryPool(state.runner, size=16, per_subscription=16, context=app.app_context)
    assert pool.limit("sub") == INITIAL_LIMIT

    run_pooled_worker(app, pool)

    assert wait_final(store, ids, timeout=5) == [DeliveryState.DELIVERED]
    assert pool.limit("sub") > INITIAL_LIMIT
    assert INITIAL_LIMIT < busy.most <= 16  # it used the room it was given, never past the ceiling


@pytest.mark.parametrize("status", [429, 503])
def test_the_limit_shrinks_on_an_endpoint_that_says_it_is_overloaded(
    store: OutboundWebhookHandler,
    redis_conn: redis.Redis,
    redis_url: str,
    receiver: CapturingReceiver,
    status: int,
) -> None:
    answered: list[float] = []

    def full(_request: Request) -> Response:
        answered.append(time.time())
        return Response("", status)

    receiver.handle("/full", full)
    store.add_subscription(WebhookSubscription(receiver.url("/full"), ["a.*"], SECRET, id="sub"))
    app = make_app(store, HARVEST_JOBS_BACKEND="rq", HARVEST_REDIS_URL=redis_url)
    state = get_engine(app)
    with app.app_context():
        ids = [i for n in range(20) for i in state.manager.dispatch("a.b", {"n": n})]
    pool = DeliveryPool(state.runner, size=8, per_subscription=8, context=app.app_context)

    run_pooled_worker(app, pool)  # one burst: the refused deliveries are retried later

    assert 1 <= pool.limit("sub") < INITIAL_LIMIT
    assert answered  # it was asked, and said no
    assert all(d.attempt <= 2 for d in store.get_deliveries(ids))  # no delivery was hammered
