"""A worker's thread pool: many attempts in flight, and a slow endpoint cannot take every slot."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest
import redis
from werkzeug.wrappers import Request, Response

from flask_harvest import DeliveryState, OutboundWebhookHandler, WebhookSubscription, generate_secret
from flask_harvest.jobs.pool import DeliveryPool
from flask_harvest.jobs.rq import HarvestWorker, RqBackend
from flask_harvest.testing import CapturingReceiver
from flask_harvest.webhooks.plugin import get_state

from .pipeline import make_app, wait_final

pytestmark = pytest.mark.redis
SECRET = generate_secret()


@pytest.fixture
def receiver() -> Iterator[CapturingReceiver]:
    with CapturingReceiver() as running:
        yield running


def test_a_slow_endpoint_holds_at_most_its_cap_and_never_delays_the_others(
    store: OutboundWebhookHandler, redis_conn: redis.Redis, redis_url: str, receiver: CapturingReceiver
) -> None:
    lock = threading.Lock()
    in_flight = {"now": 0, "most": 0}
    slow_started: list[float] = []

    def slow(_request: Request) -> Response:
        with lock:
            in_flight["now"] += 1
            in_flight["most"] = max(in_flight["most"], in_flight["now"])
            slow_started.append(time.time())  # the receiver's clock
        time.sleep(1.0)
        with lock:
            in_flight["now"] -= 1
        return Response("", 200)

    receiver.handle("/slow", slow)
    store.add_subscription(WebhookSubscription(receiver.url("/slow"), ["a.*"], SECRET, id="sub_slow"))
    store.add_subscription(WebhookSubscription(receiver.url("/fast"), ["a.*"], SECRET, id="sub_fast"))
    app = make_app(store, HARVEST_JOBS_BACKEND="rq", HARVEST_REDIS_URL=redis_url)
    state = get_state(app)
    backend = state.backend
    assert isinstance(backend, RqBackend)
    with app.app_context():
        ids = [i for n in range(6) for i in state.manager.dispatch("a.b", {"n": n})]
    pool = DeliveryPool(state.runner, size=4, per_subscription=2, context=app.app_context)
    HarvestWorker([backend.queue], connection=backend.connection, app=app, pool=pool).work(burst=True)

    fast = receiver.wait_for(6, path="/fast", timeout=1)
    # Every fast delivery arrived before the first slow request was answered (it takes 1 s).
    assert max(r.received_at for r in fast) < min(slow_started) + 1.0
    assert in_flight["most"] == 2  # the cap, not the pool size
    # The deferred slow deliveries come round again (without using an attempt) and get through.
    for _ in range(10):
        try:
            assert wait_final(store, ids, timeout=0.2) == [DeliveryState.DELIVERED]
            break
        except TimeoutError:
            pool = DeliveryPool(state.runner, size=4, per_subscription=2, context=app.app_context)
            HarvestWorker([backend.queue], connection=backend.connection, app=app, pool=pool).work(
                burst=True, with_scheduler=True
            )
            time.sleep(0.5)
    assert wait_final(store, ids, timeout=1) == [DeliveryState.DELIVERED]
    for delivery in store.get_deliveries(ids):
        assert delivery.attempt == 1  # deferral is not an attempt
    assert in_flight["most"] == 2
