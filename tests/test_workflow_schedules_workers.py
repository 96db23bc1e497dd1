"""A schedule every second across two real ``flask harvest worker`` processes (RQ on the test Redis),
on SQLite and PostgreSQL: one run per tick, none missing, none doubled; and an outage of every
worker, after which at most ``HARVEST_WORKFLOW_SCHEDULE_CATCHUP`` missed ticks start."""

from __future__ import annotations

import signal
import subprocess
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import redis
import sqlalchemy as sa
from flask import Flask

from flask_harvest import get_engine
from flask_harvest.webhooks.stores.sql import SqlOutboundWebhookStore
from flask_harvest.workflows import Execution, ExecutionState
from flask_harvest.workflows.schedules import schedule_grace

from .pipeline import close_later
from .schedule_app import make_app
from .worker_process import start_worker, stop, stop_group
from .workflow_app import database_url_fixture  # noqa: F401 (a fixture)

pytestmark = [pytest.mark.redis, pytest.mark.slow]

APP = "tests.schedule_app:create_app"
#: The workers' sweep interval (tests.schedule_app) and the grace it gives.
GRACE = schedule_grace(0.25)
#: How long a test waits for something the workers do at most: a liveness bound, not a timing.
PATIENCE = 60.0


def heartbeat_runs(app: Flask) -> list[Execution]:
    with app.app_context():
        page, _ = get_engine(app).workflows.list_executions(name="heartbeat", limit=500)  # type: ignore[union-attr]
    return page


def tick_of(execution: Execution) -> datetime:
    assert isinstance(execution.input, dict)
    return datetime.fromisoformat(str(execution.input["scheduled_at"]))


def wait_until(what: str, done: Any) -> None:
    deadline = time.monotonic() + PATIENCE
    while not done():
        assert time.monotonic() < deadline, f"never: {what}"
        time.sleep(0.1)


@contextmanager
def workers(folder: Path, database_url: str, redis_url: str, count: int, **config: Any) -> Iterator[Any]:
    """``count`` worker processes on the schedule app; yields a function that stops them all."""
    engine = sa.create_engine(database_url)
    store = SqlOutboundWebhookStore(engine)
    processes: list[subprocess.Popen[bytes]] = []

    def start() -> None:
        for n in range(count):
            place = folder / f"worker-{n}"
            place.mkdir(exist_ok=True)
            processes.append(start_worker(place, store, redis_url, app=APP, config=config))

    def stop_all() -> None:
        while processes:
            stop(processes.pop(), signal.SIGTERM)

    try:
        start()
        yield start, stop_all
    finally:
        for process in processes:
            stop_group(process, signal.SIGKILL)
        engine.dispose()


def test_two_workers_start_one_run_per_second_none_missing_none_doubled(
    database_url: str, redis_conn: redis.Redis, redis_url: str, tmp_path: Path
) -> None:
    """Exactly one run per tick across every worker: a schedule every second for 20 s, two workers."""
    app = close_later(make_app(database_url))
    # A high catch-up, so that a stall of this busy machine cannot skip a tick: this test is about
    # two workers never doubling a tick, and never losing one.
    with workers(tmp_path, database_url, redis_url, 2, HARVEST_WORKFLOW_SCHEDULE_CATCHUP=100) as (
        _,
        stop_all,
    ):
        wait_until("a scheduled run started", lambda: heartbeat_runs(app))
        first = max(tick_of(e) for e in heartbeat_runs(app)) + timedelta(seconds=1)
        last = first + timedelta(seconds=20)
        wait_until(
            "20 s of ticks ran to completion",
            lambda: (
                sum(
                    1
                    for e in heartbeat_runs(app)
                    if first <= tick_of(e) <= last and e.state is ExecutionState.COMPLETED
                )
                >= 21
            ),
        )
        stop_all()
    runs = [e for e in heartbeat_runs(app) if first <= tick_of(e) <= last]
    expected = [first + timedelta(seconds=n) for n in range(21)]
    assert Counter(tick_of(e) for e in runs) == Counter(expected)  # none missing, none doubled
    assert all(e.workflow_id == f"heartbeat@{tick_of(e).isoformat()}" for e in runs)
    assert all(e.output == tick_of(e).isoformat() for e in runs)
    every = Counter(e.workflow_id for e in heartbeat_runs(app))
    assert max(every.values()) == 1


def test_after_every_worker_was_down_at_most_catchup_missed_ticks_start(
    database_url: str, redis_conn: redis.Redis, redis_url: str, tmp_path: Path
) -> None:
    """After a 10 s outage of all workers at most HARVEST_WORKFLOW_SCHEDULE_CATCHUP (here 1) missed
    ticks start, the most recent ones; the older ones are skipped."""
    app = close_later(make_app(database_url))
    with workers(tmp_path, database_url, redis_url, 2) as (start, stop_all):
        wait_until("a scheduled run started", lambda: heartbeat_runs(app))
        stop_all()
        with app.app_context():
            schedules = get_engine(app).schedules
            assert schedules is not None
            down_from = schedules.get("heartbeat").last_tick_at
        before = {e.execution_id for e in heartbeat_runs(app)}
        time.sleep(10)  # the outage: no worker sweeps
        start()
        wait_until("the workers are back", lambda: len(heartbeat_runs(app)) > len(before))
        back = min(e.created_at for e in heartbeat_runs(app) if e.execution_id not in before)
        stop_all()
        with app.app_context():
            schedules = get_engine(app).schedules
            assert schedules is not None
            swept_to = schedules.get("heartbeat").last_tick_at  # the latest tick a sweep decided
    outage = _seconds_between(down_from, back)
    started = sorted(tick_of(e) for e in heartbeat_runs(app) if down_from < tick_of(e) <= back)
    assert len(outage) >= 10
    # The first sweep after the outage ran a moment before ``back`` (when it created its first
    # run): every tick more than the grace and a second older than ``back`` was missed by then,
    # and of those at most the catch-up (1) started.
    surely_missed = back - GRACE - timedelta(seconds=1)
    assert len([t for t in started if t <= surely_missed]) <= 1
    # All in all: the one caught up, the ticks still on time (two whole seconds in the 2 s grace),
    # and one whose second began in that moment before ``back``.
    assert 1 <= len(started) <= 1 + int(GRACE.total_seconds()) + 1
    # The ones started are the most recent: every skipped tick is older than every started one.
    # A tick later than every sweep's reading of the clock (its second began while the first sweep
    # ran) is not skipped: it is the next sweep's, which the workers, stopped at once, never ran.
    skipped = [t for t in outage if t not in started and t <= swept_to]
    assert max(skipped) < min(started)
    assert len(set(started)) == len(started)


def _seconds_between(after: datetime, until: datetime) -> list[datetime]:
    ticks = []
    tick = after + timedelta(seconds=1)
    while tick <= until:
        ticks.append(tick)
        tick += timedelta(seconds=1)
    return ticks
