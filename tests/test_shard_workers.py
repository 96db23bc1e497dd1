"""RQ workers on three PostgreSQL shards: a worker runs the runs of every shard (a job carries only
an id, the store routes it), and a shard that refuses connections holds up nobody else's runs,
nor the sweep; once it is back its runs complete."""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import datetime, timedelta, timezone

import pytest
import redis
from flask import Flask

from flask_harvest import get_engine, workflow_service
from flask_harvest.jobs.rq import RqBackend
from flask_harvest.shards import shard_for_key
from flask_harvest.worker import HarvestWorker
from flask_harvest.workflows import ExecutionState
from flask_harvest.workflows.cron import tick_iso
from flask_harvest.workflows.schedules import scheduled_workflow_id
from flask_harvest.workflows.sharded import ShardedWorkflowStore

from .pipeline import close_later
from .schedule_app import make_app
from .shard_support import allow_connections, pg_shards, shard_database_names
from .workflow_app import make_workflow_app
from .workflow_support import Clock

__all__ = ["pg_shards"]

pytestmark = pytest.mark.redis

S = ExecutionState
RUNS = 60


def _app(urls: list[str], redis_url: str) -> Flask:
    return make_workflow_app(
        urls[0],
        with_triggers=False,
        HARVEST_WORKFLOW_SHARDS=urls,
        HARVEST_JOBS_BACKEND="rq",
        HARVEST_REDIS_URL=redis_url,
    )


def _start(app: Flask, count: int) -> dict[str, int]:
    """Start ``count`` runs (their jobs queued in Redis, no worker yet): execution id -> shard."""
    with app.app_context():
        service = workflow_service()
        return {
            service.start("three_steps", i, workflow_id=f"rq-{i}")[0].execution_id: shard_for_key(
                f"rq-{i}", 3
            )
            for i in range(count)
        }


def _work(app: Flask) -> None:
    """One burst of a real RQ worker in this process, then one sweep (what a worker's sweeper
    thread does every few seconds); the sweep must not fail, whichever shard is down."""
    backend = get_engine(app).backend
    assert isinstance(backend, RqBackend)
    HarvestWorker([backend.queue], connection=backend.connection, app=app).work(burst=True)
    with app.app_context():
        get_engine(app).sweeper.sweep()


def _drive(app: Flask, done: Callable[[], bool], what: str) -> None:
    """Work and sweep until ``done`` (the runs go on on the runner's threads between bursts)."""
    end = time.monotonic() + 120
    while not done():
        assert time.monotonic() < end, f"timed out waiting for {what}"
        _work(app)
        time.sleep(0.05)


def _states(app: Flask, ids: list[str]) -> list[ExecutionState]:
    with app.app_context():
        service = workflow_service()
        return [service.get(i).state for i in ids]


def test_workers_run_the_runs_of_every_shard(
    pg_shards: list[str], redis_url: str, redis_conn: redis.Redis
) -> None:
    app = _app(pg_shards, redis_url)
    started = _start(app, RUNS)
    assert set(started.values()) == {0, 1, 2}
    ids = list(started)
    _drive(app, lambda: all(s is S.COMPLETED for s in _states(app, ids)), "every run to complete")
    with app.app_context():
        store = workflow_service().store
        assert isinstance(store, ShardedWorkflowStore)
        for shard, sub in enumerate(store.stores):
            assert {e.execution_id for e in sub.list_executions(limit=RUNS)} == {
                i for i, k in started.items() if k == shard
            }


def test_a_shard_that_is_down_holds_up_neither_the_others_runs_nor_the_sweep(
    pg_shards: list[str], redis_url: str, redis_conn: redis.Redis
) -> None:
    app = _app(pg_shards, redis_url)
    started = _start(app, RUNS)
    down = [i for i, shard in started.items() if shard == 1]
    up = [i for i, shard in started.items() if shard != 1]
    assert down and up
    name = shard_database_names()[1]
    allow_connections(name, False)
    try:
        # Every job (shard 1's too) is taken; the others' runs complete, and every sweep returns.
        _drive(app, lambda: all(s is S.COMPLETED for s in _states(app, up)), "the other shards' runs")
    finally:
        allow_connections(name, True)
    assert set(_states(app, down)) == {S.PENDING}  # untouched while their shard was away
    _drive(app, lambda: all(s is S.COMPLETED for s in _states(app, down)), "shard 1's runs, once it is back")


def test_a_batch_claim_takes_the_runs_of_the_shards_that_answer(
    pg_shards: list[str], redis_url: str, redis_conn: redis.Redis
) -> None:
    """One worker job may carry runs of several shards: the down shard's are left for the sweeper,
    the others' are claimed (before, the down shard's error lost the whole batch)."""
    app = _app(pg_shards, redis_url)
    started = _start(app, 9)
    one_each = {shard: next(i for i, k in started.items() if k == shard) for shard in range(3)}
    name = shard_database_names()[1]
    with app.app_context():
        store = workflow_service().store
        assert isinstance(store, ShardedWorkflowStore)
        allow_connections(name, False)
        try:
            now = datetime.now(timezone.utc)
            claimed = store.claim_many(list(one_each.values()), now=now, lease_seconds=30)
            assert sorted(e.execution_id for e in claimed) == sorted([one_each[0], one_each[2]])
            assert not store.shards.available(1)  # skipped for a while, so no job waits on it
            assert {r.execution_id for r in store.pending_rows(list(started))} <= {
                i for i, k in started.items() if k != 1
            }
        finally:
            allow_connections(name, True)


def test_a_scheduled_run_starts_on_the_shard_its_workflow_id_routes_to(pg_shards: list[str]) -> None:
    """The schedules table is on shard 0; a tick's run lands where its workflow_id routes, once
    per tick however often the sweep runs (a tick on another shard starts outside the schedule's
    transaction, and its start again is refused as a duplicate)."""
    app = close_later(make_app(pg_shards[0], HARVEST_WORKFLOW_SHARDS=pg_shards))
    schedules = get_engine(app).schedules
    assert schedules is not None
    start = schedules.get("heartbeat").last_tick_at
    clock = Clock(start + timedelta(seconds=12.5))
    schedules.clock = clock
    schedules.grace = timedelta(seconds=2)
    schedules.catchup = 20
    with app.app_context():
        assert schedules.sweep().scheduled == 12
        assert schedules.sweep().scheduled == 0
        # A crash after a run on another shard started, before the tick moved: the next sweep
        # finds it started and starts only the rest.
        store = workflow_service().store
        assert isinstance(store, ShardedWorkflowStore)
        tick = start + timedelta(seconds=13)
        moved = next(
            start + timedelta(seconds=n)
            for n in range(13, 200)
            if shard_for_key(scheduled_workflow_id("heartbeat", start + timedelta(seconds=n)), 3) != 0
        )
        workflow_service().start(
            "heartbeat",
            {"scheduled_at": tick_iso(moved)},
            workflow_id=scheduled_workflow_id("heartbeat", moved),
        )
        clock.advance(seconds=(moved - tick).total_seconds() + 1)
        expected = int((moved - start).total_seconds())
        assert schedules.sweep().scheduled == expected - 12 - 1
        runs = [e for sub in store.stores for e in sub.list_executions(name="heartbeat", limit=100)]
    assert len(runs) == expected == len({e.workflow_id for e in runs})
    shards = {store.shards.for_id(e.execution_id) for e in runs}
    assert shards == {0, 1, 2}
    for e in runs:
        assert store.shards.for_id(e.execution_id) == shard_for_key(e.workflow_id, 3)
