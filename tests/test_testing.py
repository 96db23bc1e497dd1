"""The testing helpers: the harvest_receiver pytest fixture (an installed plugin) and drain()."""

from __future__ import annotations

import http.client
import os
import socket
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import redis
import sqlalchemy as sa
from werkzeug.wrappers import Request, Response

from flask_harvest import (
    ConfigurationError,
    DeliveryState,
    InMemoryOutboundWebhookHandler,
    OutboundWebhookHandler,
    WebhookSubscription,
    generate_secret,
    get_engine,
)
from flask_harvest.jobs.rq import RqBackend
from flask_harvest.testing import CapturingReceiver, drain
from flask_harvest.webhooks.stores.sql import SqlOutboundWebhookStore
from flask_harvest.worker import HarvestWorker

from .pipeline import make_app

SECRET = generate_secret()


def subscribe(store: OutboundWebhookHandler, receiver: CapturingReceiver) -> None:
    store.add_subscription(WebhookSubscription(receiver.url("/hook"), ["order.*"], SECRET, id="sub_1"))


def states(store: OutboundWebhookHandler, ids: list[str]) -> list[DeliveryState]:
    return [d.state for d in store.get_deliveries(ids)]


# -- the fixture -------------------------------------------------------------------------------


def test_the_plugin_is_registered(pytestconfig: pytest.Config) -> None:
    # Through the pytest11 entry point of the installed package, not a conftest.
    assert pytestconfig.pluginmanager.has_plugin("flask_harvest")


def test_harvest_receiver_is_a_started_capturing_receiver(harvest_receiver: CapturingReceiver) -> None:
    import requests

    assert isinstance(harvest_receiver, CapturingReceiver)
    response = requests.post(harvest_receiver.url("/ping"), data=b"hi", timeout=5)
    assert response.status_code == 200
    [request] = harvest_receiver.requests
    assert (request.path, request.body) == ("/ping", b"hi")


def test_a_user_suite_gets_the_fixture_under_warnings_as_errors(tmp_path: Path) -> None:
    """What a user's project sees: no conftest, only the installed plugin; -W error stays green."""
    (tmp_path / "test_user.py").write_text(
        textwrap.dedent(
            """
            from flask import Flask

            from flask_harvest import InMemoryOutboundWebhookHandler, OutboundWebhookPlugin
            from flask_harvest import WebhookSubscription, generate_secret, get_manager
            from flask_harvest.testing import drain


            def test_order_webhook(harvest_receiver):
                app = Flask("user_app")
                app.config["HARVEST_WEBHOOKS_ALLOW_PRIVATE_TARGETS"] = True
                store = InMemoryOutboundWebhookHandler()
                OutboundWebhookPlugin(store, app)
                store.add_subscription(
                    WebhookSubscription(harvest_receiver.url("/hook"), ["order.*"], generate_secret())
                )
                with app.app_context():
                    get_manager().dispatch("order.created", {"id": 1})
                drain(app)
                [request] = harvest_receiver.requests
                assert request.body == b'{"id":1}'
                app.extensions["harvest"].close()
            """
        )
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-W", "error", "-p", "no:cacheprovider", "test_user.py"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "1 passed" in done.stdout


# -- the receiver's lifecycle ------------------------------------------------------------------


def serve_one(receiver: CapturingReceiver) -> None:
    """Have ``receiver`` answer one request: its loop is then back waiting for the next."""
    connection = http.client.HTTPConnection("127.0.0.1", receiver.port, timeout=10)
    try:
        connection.request("GET", "/ping")
        assert connection.getresponse().status == 200
    finally:
        connection.close()


def test_stop_returns_once_the_serving_thread_has_ended_and_the_port_is_closed() -> None:
    receiver = CapturingReceiver().start()
    serve_one(receiver)
    name = f"harvest-receiver-{receiver.port}"
    assert name in {thread.name for thread in threading.enumerate()}
    receiver.stop()
    assert name not in {thread.name for thread in threading.enumerate()}
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", receiver.port), timeout=10).close()
    receiver.stop()  # a second stop does nothing


def test_stop_is_prompt_rather_than_waiting_for_a_poll() -> None:
    # Before, stop() waited for serve_forever's next poll: about 0.5 s on every stop, since the loop
    # has just gone back to waiting after the request served. Now it wakes the loop (about 1 ms).
    # The fastest of five against a fifth of that interval: a busy machine slows a stop or two,
    # never all five by 100 times.
    took = []
    for _ in range(5):
        receiver = CapturingReceiver().start()
        serve_one(receiver)
        began = time.perf_counter()
        receiver.stop()
        took.append(time.perf_counter() - began)
    assert min(took) < 0.1, took


def test_a_receiver_never_started_stops_at_once() -> None:
    # Before, stop() without start() waited forever for a serving loop that never ran.
    stopper = threading.Thread(target=CapturingReceiver().stop, daemon=True)
    stopper.start()
    stopper.join(timeout=30)
    assert not stopper.is_alive()


# -- drain -------------------------------------------------------------------------------------


def test_drain_sends_everything_due_before_returning(
    store: OutboundWebhookHandler, harvest_receiver: CapturingReceiver
) -> None:
    app = make_app(store)
    subscribe(store, harvest_receiver)
    with app.app_context():
        ids = [i for n in range(5) for i in get_engine().manager.dispatch("order.created", {"n": n})]
    drain(app)  # no waiting afterwards: everything was sent when drain returned
    assert states(store, ids) == [DeliveryState.DELIVERED] * 5
    assert sorted(r.webhook_id or "" for r in harvest_receiver.requests) == sorted(ids)


def test_drain_leaves_a_retry_for_later_unless_asked(harvest_receiver: CapturingReceiver) -> None:
    store = InMemoryOutboundWebhookHandler()
    # A long first backoff, so the local backend's own timer does not send the retry meanwhile.
    app = make_app(store, HARVEST_WEBHOOKS_INITIAL_BACKOFF_MS=1500, HARVEST_WEBHOOKS_MAX_BACKOFF_MS=1500)
    subscribe(store, harvest_receiver)
    harvest_receiver.respond("/hook", status=500, times=1)
    with app.app_context():
        ids = get_engine().manager.dispatch("order.created", {"n": 1})
    drain(app)
    [delivery] = store.get_deliveries(ids)
    assert (delivery.state, delivery.attempt) == (DeliveryState.PENDING, 2)
    drain(app, retries=True)
    [delivery] = store.get_deliveries(ids)
    assert (delivery.state, delivery.attempt) == (DeliveryState.DELIVERED, 2)
    assert len(harvest_receiver.requests) == 2


@pytest.mark.redis
def test_drain_runs_rq_jobs_without_a_worker_and_the_jobs_then_do_nothing(
    store: OutboundWebhookHandler,
    redis_conn: redis.Redis,
    redis_url: str,
    harvest_receiver: CapturingReceiver,
) -> None:
    app = make_app(store, HARVEST_JOBS_BACKEND="rq", HARVEST_REDIS_URL=redis_url)
    subscribe(store, harvest_receiver)
    harvest_receiver.respond("/hook", status=503, times=2)
    with app.app_context():
        ids = [i for n in range(3) for i in get_engine().manager.dispatch("order.created", {"n": n})]
    assert redis_conn.llen("rq:queue:harvest-webhooks") == 3
    assert drain(app, retries=True, timeout=20) == 5  # 3 first attempts, 2 retries
    assert states(store, ids) == [DeliveryState.DELIVERED] * 3
    backend = get_engine(app).backend
    assert isinstance(backend, RqBackend)
    HarvestWorker([backend.queue], connection=backend.connection, app=app).work(burst=True)
    assert len(harvest_receiver.requests) == 5  # the queued jobs found their rows delivered


def test_drain_relays_outbox_messages_written_on_a_bare_connection(
    sqlite_engine: sa.Engine, harvest_receiver: CapturingReceiver
) -> None:
    store = SqlOutboundWebhookStore(sqlite_engine)
    app = make_app(store, HARVEST_SWEEP_INTERVAL_SECONDS=3600)  # no sweeper to do it for us
    subscribe(store, harvest_receiver)
    with sqlite_engine.begin() as conn:
        get_engine(app).manager.dispatch_in_tx(conn, "order.created", {"n": 1})
    drain(app)
    [request] = harvest_receiver.requests
    assert request.body == b'{"n":1}'


def test_drain_waits_for_attempts_in_flight_and_times_out(harvest_receiver: CapturingReceiver) -> None:
    store = InMemoryOutboundWebhookHandler()
    app = make_app(store)
    subscribe(store, harvest_receiver)

    def slow(request: Request) -> Response:
        time.sleep(1.5)
        return Response("", status=200)

    harvest_receiver.handle("/hook", slow)
    with app.app_context():
        ids = get_engine().manager.dispatch("order.created", {})
    with pytest.raises(TimeoutError):
        drain(app, timeout=0.3)
    drain(app, timeout=10)
    assert states(store, ids) == [DeliveryState.DELIVERED]


def test_drain_refuses_an_app_with_a_delegate() -> None:
    handed: list[Any] = []
    app = make_app(InMemoryOutboundWebhookHandler(), delegate=lambda d, s: handed.append(d))
    with pytest.raises(ConfigurationError, match="delegate"):
        drain(app)
