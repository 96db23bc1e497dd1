"""Delivery through Redis Queue: real Redis, real RQ workers (in-process and as subprocesses)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import redis
from flask import Flask
from werkzeug.wrappers import Request, Response

from flask_harvest import (
    DeliveryState,
    OutboundWebhookHandler,
    WebhookSubscription,
    generate_secret,
    get_engine,
)
from flask_harvest.jobs.rq import RqBackend
from flask_harvest.testing import CapturingReceiver
from flask_harvest.webhooks.stores.sql import SqlOutboundWebhookStore
from flask_harvest.worker import HarvestWorker

from .pipeline import make_app, wait_final

pytestmark = pytest.mark.redis
SECRET = generate_secret()


def rq_app(store: OutboundWebhookHandler, redis_url: str, **config: object) -> Flask:
    return make_app(store, HARVEST_JOBS_BACKEND="rq", HARVEST_REDIS_URL=redis_url, **config)


def work_until_final(app: Flask, delivery_ids: list[str], rounds: int = 10) -> list[DeliveryState]:
    """Run burst workers (each also moves due scheduled retries) until every delivery is final."""
    state = get_engine(app)
    backend = state.backend
    assert isinstance(backend, RqBackend)
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


def _write_app_module(folder: Path) -> None:
    (folder / "worker_app.py").write_text(
        textwrap.dedent(
            """
            import os

            import sqlalchemy as sa
            from flask import Flask

            from flask_harvest import OutboundWebhookPlugin
            from flask_harvest.webhooks.stores.sql import SqlOutboundWebhookStore


            def create_app():
                app = Flask("worker_app")
                app.config.update(
                    HARVEST_JOBS_BACKEND="rq",
                    HARVEST_REDIS_URL=os.environ["TEST_REDIS_URL"],
                    HARVEST_WEBHOOKS_LEASE_SECONDS=float(os.environ.get("TEST_LEASE", "60")),
                    HARVEST_WEBHOOKS_DEADLINE_SECONDS=float(os.environ.get("TEST_DEADLINE", "30")),
                    HARVEST_WEBHOOKS_CONNECT_TIMEOUT_SECONDS=1,
                    HARVEST_SWEEP_INTERVAL_SECONDS=0.5,
                    HARVEST_WEBHOOKS_ALLOW_PRIVATE_TARGETS=True,  # the receiver is on 127.0.0.1
                )
                engine = sa.create_engine(os.environ["TEST_DATABASE_URL"])
                OutboundWebhookPlugin(SqlOutboundWebhookStore(engine), app)
                return app
            """
        )
    )


def _worker(
    folder: Path, store: SqlOutboundWebhookStore, redis_url: str, *extra: str, **env: str
) -> subprocess.Popen[bytes]:
    environment = {
        **os.environ,
        "PYTHONPATH": str(folder),
        "TEST_REDIS_URL": redis_url,
        "TEST_DATABASE_URL": store.engine.url.render_as_string(hide_password=False),
        **env,
    }
    command = [sys.executable, "-m", "flask", "--app", "worker_app:create_app", "harvest", "worker", *extra]
    with open(folder / "worker.log", "ab") as log:  # the child keeps its own copy of the file
        # A session of its own, so that stop() also reaches RQ's forked scheduler process.
        return subprocess.Popen(
            command, cwd=folder, env=environment, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )


def stop(process: subprocess.Popen[bytes], how: signal.Signals) -> None:
    """Send ``how`` to the worker and everything it started; wait for the worker to end."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, how)
    try:
        process.wait(timeout=20)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)  # whatever is left of the group


def test_flask_harvest_worker_command_delivers(
    sql_store: SqlOutboundWebhookStore,
    redis_conn: redis.Redis,
    redis_url: str,
    receiver: CapturingReceiver,
    tmp_path: Path,
) -> None:
    _write_app_module(tmp_path)
    app = rq_app(sql_store, redis_url)
    sql_store.add_subscription(WebhookSubscription(receiver.url("/hook"), ["order.*"], SECRET, id="sub_1"))
    with app.app_context():
        ids = [get_engine().manager.dispatch("order.created", {"n": n})[0] for n in range(3)]
    worker = _worker(tmp_path, sql_store, redis_url, "--burst")
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
    _write_app_module(tmp_path)
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
    lease = {"TEST_LEASE": "3", "TEST_DEADLINE": "2.5"}
    doomed = _worker(tmp_path, sql_store, redis_url, **lease)
    try:
        receiver.wait_for(1, timeout=30)
        stored = sql_store.get_delivery(delivery_id)
        assert stored is not None
        assert stored.state is DeliveryState.INFLIGHT
    finally:
        stop(doomed, signal.SIGKILL)
    killed_at = time.monotonic()
    survivor = _worker(tmp_path, sql_store, redis_url, **lease)
    try:
        assert wait_final(sql_store, [delivery_id], timeout=30) == [DeliveryState.DELIVERED]
        recovery = time.monotonic() - killed_at
    finally:
        stop(survivor, signal.SIGTERM)
    second = receiver.wait_for(2, timeout=1)[1]
    assert second.webhook_id == delivery_id
    # Not RQ's abandoned-job timeout (minutes): about one lease plus a sweep interval.
    assert recovery < 15, recovery
