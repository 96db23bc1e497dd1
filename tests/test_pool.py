"""A worker's thread pool: many attempts in flight, and a slow endpoint cannot take every slot."""

from __future__ import annotations

import itertools
import threading
import time
from typing import Any

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
from flask_harvest.jobs.rq import TASK, take_jobs
from flask_harvest.outbound.admission import INITIAL_LIMIT
from flask_harvest.outbound.rate import RateLimit
from flask_harvest.testing import CapturingReceiver
from flask_harvest.webhooks.delivery import WEBHOOK_JOB, delivery_job
from flask_harvest.worker import DeliveryPool, HarvestWorker

from .pipeline import rq_app, rq_backend, wait_final

pytestmark = pytest.mark.redis
SECRET = generate_secret()


def dispatched(
    store: OutboundWebhookHandler, redis_url: str, endpoints: dict[str, str], events: int
) -> tuple[Flask, list[str]]:
    """Subscribe each of ``endpoints`` (subscription id: URL) to ``a.*`` and dispatch ``events``
    ``a.b`` events on the rq backend; return the app and the delivery ids (none delivered yet)."""
    for sub_id, url in endpoints.items():
        store.add_subscription(WebhookSubscription(url, ["a.*"], SECRET, id=sub_id))
    app = rq_app(store, redis_url)
    with app.app_context():
        ids = [i for n in range(events) for i in get_engine(app).manager.dispatch("a.b", {"n": n})]
    return app, ids


def pool_of(app: Flask, size: int, per_subscription: int, **options: Any) -> DeliveryPool:
    """A delivery pool of ``size`` slots, ``per_subscription`` at most to one endpoint, on ``app``."""
    return DeliveryPool(
        get_engine(app).runner,
        size=size,
        per_subscription=per_subscription,
        context=app.app_context,
        **options,
    )


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

    @classmethod
    def at(
        cls, receiver: CapturingReceiver, path: str, delay: float, gate: threading.Event | None = None
    ) -> CountingEndpoint:
        """A counting endpoint answering at ``path`` of ``receiver``."""
        endpoint = cls(delay, gate)
        receiver.handle(path, endpoint)
        return endpoint

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
    slow = CountingEndpoint.at(receiver, "/slow", delay=0, gate=gate)
    app, ids = dispatched(
        store, redis_url, {"sub_slow": receiver.url("/slow"), "sub_fast": receiver.url("/fast")}, 6
    )
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
    try:
        run_pooled_worker(app, pool_of(app, 4, 2, slow_after=0.2))
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
            run_pooled_worker(app, pool_of(app, 4, 2, slow_after=0.2), with_scheduler=True)
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


def run_pooled_worker(app: Flask, pool: DeliveryPool, *, with_scheduler: bool = False) -> CountingWorker:
    """Run one burst of a worker delivering through ``pool``; return it (it counted its jobs)."""
    backend = rq_backend(app)
    worker = CountingWorker([backend.queue], connection=backend.connection, app=app, pool=pool)
    worker.work(burst=True, with_scheduler=with_scheduler)
    return worker


def test_a_worker_takes_queued_deliveries_in_batches_without_rq_running_a_job_for_them(
    store: OutboundWebhookHandler, redis_conn: redis.Redis, redis_url: str, receiver: CapturingReceiver
) -> None:
    app, ids = dispatched(store, redis_url, {"sub": receiver.url("/hook")}, 40)
    pool = pool_of(app, 8, 8)

    worker = run_pooled_worker(app, pool)

    assert wait_final(store, ids, timeout=5) == [DeliveryState.DELIVERED]
    assert len(receiver.wait_for(40, path="/hook", timeout=1)) == 40
    # The worker took the jobs off the queue's head a batch of free slots at a time: RQ ran none.
    assert worker.jobs_run == 0
    assert redis_conn.keys("rq:job:harvest-*") == []  # no job hash left behind


def test_a_healthy_endpoint_past_its_cap_waits_its_turn_in_the_process(
    store: OutboundWebhookHandler, redis_conn: redis.Redis, redis_url: str, receiver: CapturingReceiver
) -> None:
    busy = CountingEndpoint.at(receiver, "/busy", delay=0.05)
    app, ids = dispatched(store, redis_url, {"sub": receiver.url("/busy")}, 12)
    pool = pool_of(app, 8, 2)

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
    busy = CountingEndpoint.at(receiver, "/busy", delay=0.05)
    app, ids = dispatched(store, redis_url, {"sub": receiver.url("/busy")}, 60)
    pool = pool_of(app, 16, 16)
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
    app, ids = dispatched(store, redis_url, {"sub": receiver.url("/full")}, 20)
    pool = pool_of(app, 8, 8)

    run_pooled_worker(app, pool)  # one burst: the refused deliveries are retried later

    assert 1 <= pool.limit("sub") < INITIAL_LIMIT
    assert answered  # it was asked, and said no
    assert all(d.attempt <= 2 for d in store.get_deliveries(ids))  # no delivery was hammered


def _deliver_while_held(
    app: Flask, pool: DeliveryPool, receiver: CapturingReceiver, gate: threading.Event, fast: int
) -> bool:
    """Run a burst worker on ``pool``; return whether ``fast`` deliveries reached ``/fast`` within
    4 s, while ``gate`` held the other endpoints' attempts (the client's timeout is 5 s, so nothing
    held frees a slot before then). The gate opens afterwards, so the burst can end."""
    arrived: list[bool] = []

    def open_once_the_fast_ones_arrived() -> None:
        try:
            receiver.wait_for(fast, path="/fast", timeout=4)
            arrived.append(True)
        except TimeoutError:
            arrived.append(False)
        finally:
            gate.set()

    opener = threading.Thread(target=open_once_the_fast_ones_arrived, daemon=True)
    opener.start()
    try:
        run_pooled_worker(app, pool)
    finally:
        gate.set()
        opener.join(10)
    return arrived == [True]


def test_failing_endpoints_together_hold_at_most_a_quarter_of_the_slots(
    store: OutboundWebhookHandler, redis_conn: redis.Redis, redis_url: str, receiver: CapturingReceiver
) -> None:
    # Four endpoints that failed before (at their starting limit of 4, they would fill all 16
    # slots) and never answer in time; the fast endpoint must not wait for their timeouts.
    gate = threading.Event()
    silent = CountingEndpoint(delay=0, gate=gate)
    for n in range(4):
        receiver.handle(f"/silent{n}", silent)  # one counter over the four
        store.add_subscription(
            WebhookSubscription(
                receiver.url(f"/silent{n}"), ["s.*"], SECRET, id=f"sub_s{n}", consecutive_failures=1
            )
        )
    store.add_subscription(WebhookSubscription(receiver.url("/fast"), ["f.*"], SECRET, id="sub_fast"))
    app = rq_app(store, redis_url)
    state = get_engine(app)
    with app.app_context():
        for n in range(4):
            state.manager.dispatch("s.x", {"n": n})
        fast = [i for n in range(6) for i in state.manager.dispatch("f.x", {"n": n})]
    pool = pool_of(app, 16, 16)
    assert pool.failing_slots == INITIAL_LIMIT == 16 // 4

    assert _deliver_while_held(app, pool, receiver, gate, len(fast))
    assert silent.most == pool.failing_slots  # the rest were given back unsent, for later
    assert wait_final(store, fast, timeout=5) == [DeliveryState.DELIVERED]


def test_a_worker_takes_jobs_for_fewer_than_a_batch_of_slots_when_a_batch_does_not_come_free(
    store: OutboundWebhookHandler, redis_conn: redis.Redis, redis_url: str, receiver: CapturingReceiver
) -> None:
    # Seven healthy endpoints hold 7 of 8 slots for seconds: one slot is free, under the batch of
    # 2 the worker waits for; it must still take the fast deliveries through that slot.
    gate = threading.Event()
    held = CountingEndpoint(delay=0, gate=gate)
    for n in range(7):
        receiver.handle(f"/held{n}", held)
        store.add_subscription(
            WebhookSubscription(receiver.url(f"/held{n}"), ["h.*"], SECRET, id=f"sub_h{n}")
        )
    store.add_subscription(WebhookSubscription(receiver.url("/fast"), ["f.*"], SECRET, id="sub_fast"))
    app = rq_app(store, redis_url)
    state = get_engine(app)
    backend = rq_backend(app)
    with app.app_context():
        held_ids = state.manager.dispatch("h.x", {"n": 0})  # one batch job of 7
        # A job of another kind stops the batch take (take_jobs), so the fast deliveries come
        # after the held ones instead of being taken with them.
        backend.queue.enqueue("builtins.abs", -1)
        fast = [i for n in range(5) for i in state.manager.dispatch("f.x", {"n": n})]
    pool = pool_of(app, 8, 8)
    assert pool.batch == 2

    assert _deliver_while_held(app, pool, receiver, gate, len(fast))
    assert held.most == 7
    assert wait_final(store, [*held_ids, *fast], timeout=5) == [DeliveryState.DELIVERED]


def test_deliveries_given_back_for_their_rate_keep_their_place_and_come_back_at_its_pace(
    store: OutboundWebhookHandler, redis_conn: redis.Redis, redis_url: str, receiver: CapturingReceiver
) -> None:
    # One every two seconds: the held one's turn is far enough off for the steps below to see it held.
    limit = RateLimit(per_second=0.5, burst=1)
    store.add_subscription(
        WebhookSubscription(receiver.url("/slow-rate"), ["a.*"], SECRET, id="sub", rate_limit=limit)
    )
    app = rq_app(store, redis_url)
    with app.app_context():
        ids = [i for n in range(6) for i in get_engine(app).manager.dispatch("a.b", {"n": n})]
    pool = pool_of(app, 8, 2, min_per_subscription=2)  # a fixed in-flight limit of 2
    try:
        # The first goes at once (the burst), the second is held for its turn two seconds later,
        # lending its slot meanwhile: every slot is free again once the first was answered.
        pool.deliver_many(ids[:2])
        receiver.wait_for(1, path="/slow-rate", timeout=10)
        end = time.monotonic() + 10
        while pool.free_slots() < pool.size and time.monotonic() < end:
            time.sleep(0.01)
        assert pool.free_slots() == pool.size
        # Now its rate sets the pace: the third takes the last place under the in-flight limit
        # (and waits for its turn), the others go back to the queue, to its head when due, due
        # one interval of the limit apart rather than all at once.
        states = pool.deliver_many(ids[2:])
        given_back = [d for d in store.get_deliveries(ids[2:]) if d.state is DeliveryState.PENDING]
    finally:
        pool.shutdown(wait=False)  # the held ones go back too, due at their turns
    assert states == [DeliveryState.INFLIGHT] + [DeliveryState.PENDING] * 3
    assert len(given_back) == 3
    assert {d.attempt for d in given_back} == {1}  # no attempt used
    dues = sorted(d.next_attempt_at for d in given_back if d.next_attempt_at is not None)
    gaps = [(later - earlier).total_seconds() for earlier, later in itertools.pairwise(dues)]
    assert len(gaps) == 2 and min(gaps) >= 1.9, gaps
    for delivery in given_back:
        assert Job.fetch(delivery_job(delivery).job_id, connection=redis_conn).enqueue_at_front
