"""Metrics read from the store at scrape time: a real ``flask harvest worker`` subprocess does the
work, and a scrape of the web app alone, with no ``PROMETHEUS_MULTIPROC_DIR``, shows it (webhook
deliveries and completion-callback deliveries by state, executions by workflow and state, trigger
fires by outcome, the live workers), on SQLite and PostgreSQL."""

from __future__ import annotations

import signal
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import redis
import sqlalchemy as sa
from flask import Flask
from werkzeug.wrappers import Response

from flask_harvest import WebhookSubscription, generate_secret, get_engine, workflow_service
from flask_harvest._bounded import bounded_counts
from flask_harvest._metrics_store import label
from flask_harvest.testing import CapturingReceiver
from flask_harvest.webhooks.stores.sql import SqlOutboundWebhookStore

from .metrics_support import SampleKey, delta, parse, value
from .metrics_worker_app import TOKEN, build
from .pipeline import close_later
from .worker_process import start_worker, stop
from .workflow_app import database_url_fixture

__all__ = ["database_url_fixture"]  # the fixture is used by name

ROUTE = "/actuator/webhooks/metrics"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
QUEUE = "harvest-webhooks"


def scrape(app: Flask) -> dict[SampleKey, float]:
    response = app.test_client().get(ROUTE, headers=AUTH)
    assert response.status_code == 200, response.get_data(as_text=True)
    return parse(response.get_data(as_text=True))


def scrape_until(app: Flask, done: Callable[[dict[SampleKey, float]], bool]) -> dict[SampleKey, float]:
    """Scrape until ``done`` holds (the worker does the work), within a generous deadline."""
    end = time.monotonic() + 120
    while True:
        samples = scrape(app)
        if done(samples) or time.monotonic() > end:
            return samples
        time.sleep(0.2)


def test_label_values_are_lower_snake_case() -> None:
    assert [label(v) for v in ("Completed", "TimedOut", "ContinuedAsNew", "dlq")] == [
        "completed",
        "timed_out",
        "continued_as_new",
        "dlq",
    ]


@pytest.mark.redis
def test_the_web_app_alone_shows_what_a_worker_process_did(
    database_url: str,
    redis_url: str,
    redis_conn: redis.Redis,
    receiver: CapturingReceiver,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The default scrape tells the truth whatever process did the work: 40 deliveries, callbacks,
    runs and trigger fires made by a worker subprocess, seen in the web app's scrape."""
    # No shared directory: the web app's counters never see what the worker counts.
    monkeypatch.delenv("PROMETHEUS_MULTIPROC_DIR", raising=False)
    web = close_later(build(database_url, redis_url))
    receiver.handle("/bad", lambda _request: Response("no", status=500))  # one attempt: dead-lettered
    receiver.handle("/refused", lambda _request: Response("no", status=400))  # a callback's permanent failure
    secret = generate_secret()
    with web.app_context():
        engine = get_engine()
        engine.store.add_subscription(
            WebhookSubscription(receiver.url("/ok"), ["order.*"], secret, id="s_ok")
        )
        engine.store.add_subscription(
            WebhookSubscription(receiver.url("/bad"), ["refund.*"], secret, id="s_bad")
        )
        for n in range(30):
            engine.manager.dispatch("order.created", {"n": n})
        for n in range(10):
            engine.manager.dispatch("refund.created", {"n": n})
        service = workflow_service()
        ok = [{"url": receiver.url("/ok")}]
        for amount in (5, 5, 5, 5, 5000, 5000):
            service.start("echo", {"amount": amount}, completion_callbacks=ok)
        for _ in range(2):
            service.start("boom", None, completion_callbacks=[{"url": receiver.url("/refused")}])
    before = scrape(web)
    assert value(before, "harvest_webhook_deliveries", state="pending") == 40

    def deliveries(s: dict[SampleKey, float], state: str) -> float:
        return value(s, "harvest_webhook_deliveries", state=state)

    def callbacks(s: dict[SampleKey, float], state: str) -> float:
        return value(s, "harvest_completion_callback_deliveries", state=state)

    def runs(s: dict[SampleKey, float], workflow: str, state: str) -> float:
        return value(s, "harvest_workflow_executions", workflow=workflow, state=state)

    def fires(s: dict[SampleKey, float], outcome: str) -> float:
        return value(s, "harvest_completion_trigger_fires_recorded", outcome=outcome)

    def finished(s: dict[SampleKey, float]) -> bool:
        return (
            (deliveries(s, "delivered"), deliveries(s, "dlq")) == (30, 10)
            and (callbacks(s, "delivered"), callbacks(s, "dlq")) == (6, 2)
            and runs(s, "three_steps", "completed") == 2
            and value(s, "harvest_workers", queue=QUEUE) == 1
        )

    store = SqlOutboundWebhookStore(sa.create_engine(database_url))
    worker = start_worker(tmp_path, store, redis_url, app="tests.metrics_worker_app:create_app")
    try:
        after = scrape_until(web, finished)
        gauges = {"harvest_webhook_deliveries", "harvest_completion_callback_deliveries"}
        gauges |= {"harvest_workflow_executions", "harvest_workers"}
        assert finished(after), sorted((k, v) for k, v in after.items() if v and k[0] in gauges)
    finally:
        stop(worker, signal.SIGTERM)
        store.engine.dispose()

    assert [deliveries(after, s) for s in ("pending", "inflight", "delivered", "dlq", "skipped")] == [
        0,
        0,
        30,
        10,
        0,
    ]
    assert value(after, "harvest_webhook_dlq_size") == 10
    assert [callbacks(after, s) for s in ("pending", "inflight", "delivered", "dlq")] == [0, 0, 6, 2]
    assert runs(after, "echo", "completed") == 6
    assert runs(after, "boom", "failed") == 2
    assert runs(after, "echo", "pending") == runs(after, "echo", "running") == 0
    assert fires(after, "started") == 2
    assert fires(after, "skipped") == 4  # the guard was false for the small amounts
    assert fires(after, "chain_depth_exceeded") == 0
    assert value(after, "harvest_metrics_store_up") == 1
    # The counters of the web process saw none of it: the truth above came from the store.
    assert delta(before, after, "harvest_webhook_delivery_attempts_total", outcome="delivered") == 0

    # A worker that stopped leaves RQ's registry: no worker is alive on the queue any more.
    gone = scrape_until(web, lambda s: value(s, "harvest_workers", queue=QUEUE) == 0)
    assert value(gone, "harvest_workers", queue=QUEUE) == 0


@pytest.mark.redis
def test_a_dead_workers_leftover_entry_is_not_counted_alive(
    tmp_path: Path, redis_url: str, redis_conn: redis.Redis
) -> None:
    """RQ keeps a killed worker in the queue's registry until someone cleans it: only entries whose
    worker key still exists (it expires after the worker's last heartbeat) count as alive."""
    app = close_later(build(f"sqlite:///{tmp_path / 'app.db'}", redis_url))
    assert value(scrape(app), "harvest_workers", queue=QUEUE) == 0
    redis_conn.sadd(f"rq:workers:{QUEUE}", "rq:worker:killed-long-ago", "rq:worker:alive")
    redis_conn.hset("rq:worker:alive", "state", "idle")
    assert value(scrape(app), "harvest_workers", queue=QUEUE) == 1


def test_redis_down_shows_no_worker_alive(tmp_path: Path) -> None:
    """With Redis unreachable no worker can take a job: the gauge says 0, and the scrape answers."""
    app = close_later(build(f"sqlite:///{tmp_path / 'app.db'}", "redis://127.0.0.1:1/0"))
    samples = scrape(app)
    assert value(samples, "harvest_workers", queue=QUEUE) == 0
    assert ("harvest_workers", (("queue", QUEUE),)) in samples
    assert value(samples, "harvest_metrics_store_up") == 1


def test_bounded_counts_split_many_conditions_and_stop_at_the_cap(tmp_path: Path) -> None:
    """More conditions than one statement holds (SQLite allows 2,000 result columns) are counted
    over several statements, each count stopping at the cap."""
    table = sa.Table("numbers", sa.MetaData(), sa.Column("n", sa.Integer, index=True))
    engine = sa.create_engine(f"sqlite:///{tmp_path / 'numbers.db'}")
    try:
        with engine.begin() as conn:
            table.create(conn)
            conn.execute(table.insert(), [{"n": n % 7} for n in range(70)])
            wanted = list(range(450))
            counts = bounded_counts(
                conn, table, lambda: [table.c.n == n for n in wanted], cap=8, key=("numbers", 450)
            )
            assert counts == [8] * 7 + [0] * 443
            # The same key reuses the statements built the first time; the cap is a parameter.
            again = bounded_counts(conn, table, lambda: [], cap=3, key=("numbers", 450))
            assert again == [3] * 7 + [0] * 443
    finally:
        engine.dispose()
