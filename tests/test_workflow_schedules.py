"""Scheduled workflows through the engine on SQLite and PostgreSQL: sync, one run per tick, the
guarded advance, catch-up after downtime, pause and resume. The tests sweep by hand with a clock
they set, so every tick is decided by the test, not by the time it takes."""

from __future__ import annotations

import json
import threading
from collections import Counter
from datetime import datetime, timedelta
from typing import Any

import pytest
from flask import Flask
from flask_sqlalchemy import SQLAlchemy
from sqlalchemy import update

from flask_harvest import Harvest, StoreError, get_engine
from flask_harvest.workflows import Execution
from flask_harvest.workflows._schedule_store import ScheduleNotFoundError, schedules_table
from flask_harvest.workflows.schedules import WorkflowSchedules, schedule_grace, scheduled_workflow_id

from .pipeline import close_later
from .schedule_app import EVERY_SECOND, NIGHTLY, make_app
from .workflow_app import database_url_fixture  # noqa: F401 (a fixture)
from .workflow_support import Clock


@pytest.fixture
def app(database_url: str) -> Flask:
    return close_later(make_app(database_url))


def schedules_of(app: Flask) -> WorkflowSchedules:
    schedules = get_engine(app).schedules
    assert schedules is not None
    return schedules


def set_clock(app: Flask, at: datetime) -> Clock:
    """Give the app's schedules a clock at ``at``, and a 2 s grace (the app sweeps hourly)."""
    schedules = schedules_of(app)
    clock = Clock(at)
    schedules.clock = clock
    schedules.grace = timedelta(seconds=2)
    return clock


def runs(app: Flask) -> list[Execution]:
    with app.app_context():
        page, _ = get_engine(app).workflows.list_executions(limit=500)  # type: ignore[union-attr]
    return page


def ticks(app: Flask, name: str = "heartbeat") -> list[str]:
    return sorted(e.input["scheduled_at"] for e in runs(app) if e.workflow_name == name)


def base(app: Flask) -> datetime:
    """The heartbeat's last tick handled: the tick at or before its declaration."""
    return schedules_of(app).get("heartbeat").last_tick_at


def at(start: datetime, seconds: float) -> datetime:
    return start + timedelta(seconds=seconds)


def test_declared_schedules_are_written_into_the_table(app: Flask) -> None:
    """The start-up sync writes the declared schedules (upsert cron, keep paused and last tick)."""
    views = {v.name: v for v in schedules_of(app).list_schedules()}
    assert set(views) == {"heartbeat", "nightly"}
    assert views["heartbeat"].cron == EVERY_SECOND and views["nightly"].cron == NIGHTLY
    assert not views["heartbeat"].paused and views["heartbeat"].declared
    last = views["heartbeat"].last_tick_at
    assert last.microsecond == 0
    assert views["heartbeat"].next_tick_at is not None and views["heartbeat"].next_tick_at > last
    assert views["nightly"].next_tick_at is not None
    assert (views["nightly"].next_tick_at.hour, views["nightly"].next_tick_at.minute) == (3, 0)


def test_each_due_tick_starts_one_run_with_its_time_as_input(app: Flask) -> None:
    """One run per tick: a deterministic workflow_id per tick, input {"scheduled_at": tick}."""
    start = base(app)
    clock = set_clock(app, at(start, 3.5))
    assert schedules_of(app).sweep().scheduled == 3
    expected = [at(start, n).isoformat() for n in (1, 2, 3)]
    assert ticks(app) == expected
    assert sorted(e.workflow_id for e in runs(app)) == [f"heartbeat@{t}" for t in expected]
    # The same sweep again, or another process's at the same moment, starts nothing more.
    assert schedules_of(app).sweep().scheduled == 0
    clock.advance(seconds=1)
    assert schedules_of(app).sweep().scheduled == 1
    assert schedules_of(app).get("heartbeat").last_tick_at == at(start, 4)


def test_two_apps_sweeping_the_same_moment_start_each_tick_once(app: Flask, database_url: str) -> None:
    """Two workers' sweeps never double-start: one moves the last tick, the other finds none due."""
    other = close_later(make_app(database_url))
    start = base(app)
    set_clock(app, at(start, 2.5))
    set_clock(other, at(start, 2.5))
    assert schedules_of(app).sweep().scheduled + schedules_of(other).sweep().scheduled == 2
    assert Counter(ticks(app)) == Counter({at(start, n).isoformat(): 1 for n in (1, 2)})


def test_a_sweep_that_read_the_row_before_another_moved_it_starts_nothing(app: Flask) -> None:
    """The advance is guarded by the last tick read: a stale reader loses, and starts no run."""
    schedules = schedules_of(app)
    row = schedules.store.get("heartbeat")
    now = at(row.last_tick_at, 2.5)
    with schedules.store.db.transaction("first") as conn:
        assert schedules.store.advance(conn, row, at(row.last_tick_at, 2), now=now)
    with schedules.store.db.transaction("second") as conn:
        assert not schedules.store.advance(conn, row, at(row.last_tick_at, 2), now=now)


def test_a_tick_whose_run_exists_is_not_started_again(app: Flask, database_url: str) -> None:
    """The deterministic workflow_id is the second line of defence: a replayed tick starts nothing."""
    start = base(app)
    set_clock(app, at(start, 2.5))
    assert schedules_of(app).sweep().scheduled == 2
    with app.app_context():
        for execution in runs(app):
            get_engine(app).workflows.wait(execution.execution_id, 20)  # type: ignore[union-attr]
    # As if the last tick had not moved (a restored backup): the same ticks are due again.
    with schedules_of(app).store.db.transaction("rewind") as conn:
        conn.execute(
            update(schedules_table).where(schedules_table.c.name == "heartbeat").values(last_tick_at=start)
        )
    assert schedules_of(app).sweep().scheduled == 0
    assert ticks(app) == [at(start, 1).isoformat(), at(start, 2).isoformat()]
    assert sorted(e.workflow_id for e in runs(app)) == [
        scheduled_workflow_id("heartbeat", at(start, n)) for n in (1, 2)
    ]


@pytest.mark.parametrize("catchup", [0, 1, 3])
def test_after_downtime_at_most_catchup_missed_ticks_start(app: Flask, catchup: int) -> None:
    """After downtime at most HARVEST_WORKFLOW_SCHEDULE_CATCHUP missed ticks are started (the
    most recent ones); the rest are skipped, and the ticks within the grace start as usual."""
    schedules = schedules_of(app)
    schedules.catchup = catchup
    start = base(app)
    set_clock(app, at(start, 60.5))  # a minute without a sweep
    schedules.sweep()
    on_time = [at(start, n).isoformat() for n in (59, 60)]  # within the 2 s grace
    missed = [at(start, n).isoformat() for n in range(59 - catchup, 59)]
    assert ticks(app) == missed + on_time
    assert schedules.get("heartbeat").last_tick_at == at(start, 60)


def test_the_catchup_setting_is_read_from_the_config(database_url: str) -> None:
    app = close_later(make_app(database_url, HARVEST_WORKFLOW_SCHEDULE_CATCHUP=0))
    assert schedules_of(app).catchup == 0
    assert schedule_grace(0.25) == timedelta(seconds=2)
    assert schedule_grace(5) == timedelta(seconds=15)


def test_a_paused_schedule_starts_nothing_and_resuming_does_not_replay(app: Flask) -> None:
    """A paused schedule starts nothing; resuming does not replay the ticks missed while paused."""
    schedules = schedules_of(app)
    start = base(app)
    clock = set_clock(app, at(start, 1.5))
    assert schedules.pause("heartbeat").paused
    assert schedules.pause("heartbeat").paused  # pausing again changes nothing
    assert schedules.get("heartbeat").next_tick_at is None
    clock.advance(seconds=5)
    assert schedules.sweep().scheduled == 0
    resumed = schedules.resume("heartbeat")
    assert not resumed.paused
    assert resumed.last_tick_at == at(start, 6)
    clock.advance(seconds=2)
    assert schedules.sweep().scheduled == 2
    assert ticks(app) == [at(start, 7).isoformat(), at(start, 8).isoformat()]
    # Resuming a running schedule changes nothing.
    assert schedules.resume("heartbeat").last_tick_at == at(start, 8)


def test_pausing_an_unknown_schedule_is_refused(app: Flask) -> None:
    schedules = schedules_of(app)
    for name in ("nope", "", "a\x00b", "x" * 300):
        with pytest.raises(ScheduleNotFoundError):
            schedules.pause(name)
        with pytest.raises(ScheduleNotFoundError):
            schedules.resume(name)


def test_a_schedule_removed_from_the_code_is_left_inert(app: Flask, database_url: str) -> None:
    """A schedule no longer declared stays in the table, and starts nothing."""
    start = base(app)
    without = close_later(make_app(database_url, every_second=False))
    set_clock(without, at(start, 4.5))
    assert schedules_of(without).sweep().scheduled == 0
    views = {v.name: v for v in schedules_of(without).list_schedules()}
    assert not views["heartbeat"].declared and views["heartbeat"].next_tick_at is None
    assert views["heartbeat"].last_tick_at == start
    assert ticks(without) == []


def test_a_redeclared_schedule_gets_the_new_cron_and_keeps_its_state(app: Flask, database_url: str) -> None:
    """The sync upserts the cron text and keeps paused and last_tick_at."""
    schedules_of(app).pause("nightly")
    before = schedules_of(app).get("nightly")
    other = Flask("harvest_schedule_test_2")
    other.config.update(SQLALCHEMY_DATABASE_URI=database_url, HARVEST_SWEEP_INTERVAL_SECONDS=3600)
    harvest = Harvest(db=SQLAlchemy(other))

    @harvest.workflow("nightly", schedule="0 30 4 * * *")
    def nightly(ctx: Any, value: Any) -> Any:
        return value

    harvest.init_app(close_later(other))
    after = schedules_of(other).get("nightly")
    assert after.cron == "0 30 4 * * *"
    assert after.paused and after.last_tick_at == before.last_tick_at


def test_a_workflow_declared_after_init_app_is_synced_by_the_next_sweep(app: Flask) -> None:
    registry = schedules_of(app).workflows.registry

    @registry.workflow("late", schedule="*/2 * * * * *")
    def late(ctx: Any, value: Any) -> Any:
        return value

    with pytest.raises(ScheduleNotFoundError):
        schedules_of(app).store.get("late")
    schedules_of(app).sweep()
    assert schedules_of(app).get("late").cron == "*/2 * * * * *"


def test_an_app_whose_migrations_have_not_created_the_table_still_starts(tmp_path: Any) -> None:
    """With create_tables=False and no schedules table, init_app logs and the sweep retries."""
    url = f"sqlite:///{tmp_path / 'no_table.db'}"
    other = Flask("harvest_schedule_no_table")
    other.config.update(SQLALCHEMY_DATABASE_URI=url, HARVEST_SWEEP_INTERVAL_SECONDS=3600)
    db = SQLAlchemy(other)
    harvest = Harvest(db=db, create_tables=False)

    @harvest.workflow("tick", schedule=EVERY_SECOND)
    def tick(ctx: Any, value: Any) -> Any:
        return value

    harvest.init_app(close_later(other))
    schedules = schedules_of(other)
    with pytest.raises(StoreError):
        schedules.sweep()
    schedules.store.ensure_schema()
    get_engine(other).workflows.store.ensure_schema()  # type: ignore[union-attr]
    schedules.sweep()
    assert schedules.get("tick").cron == EVERY_SECOND


def test_eight_concurrent_sweeps_start_each_tick_once(app: Flask) -> None:
    """Sweeps racing on the same row (threads here, workers in production) never double-start."""
    start = base(app)
    set_clock(app, at(start, 2.5))
    schedules = schedules_of(app)
    barrier = threading.Barrier(8)
    counts: list[int] = []

    def sweep() -> None:
        barrier.wait(timeout=20)
        counts.append(schedules.sweep().scheduled)

    threads = [threading.Thread(target=sweep) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert sorted(counts) == [0] * 7 + [2]
    assert Counter(ticks(app)) == Counter({at(start, n).isoformat(): 1 for n in (1, 2)})


@pytest.mark.redis
def test_a_scheduled_run_is_an_ordinary_run_with_the_apps_callbacks_and_timeout(
    database_url: str, redis_url: str, redis_conn: Any
) -> None:
    """A scheduled run gets the app-wide completion callbacks and its workflow's timeout (the
    documented choice); queued on Redis with no worker, so that it does not run here."""
    target = {"url": "https://hooks.example.com/done", "filter": {"type": "AnyTerminal"}}
    app = close_later(
        make_app(
            database_url,
            HARVEST_JOBS_BACKEND="rq",
            HARVEST_REDIS_URL=redis_url,
            HARVEST_COMPLETION_CALLBACK_DEFAULTS=json.dumps([target]),
            HARVEST_COMPLETION_CALLBACK_ALLOWLIST="hooks.example.com",
            HARVEST_COMPLETION_CALLBACK_SECRET="schedule-callback-secret-0123456789",
        )
    )
    registry = schedules_of(app).workflows.registry

    @registry.workflow("bounded", schedule=EVERY_SECOND, timeout=timedelta(minutes=5))
    def bounded(ctx: Any, value: Any) -> Any:
        return value

    schedules_of(app).sync()
    last = schedules_of(app).get("bounded").last_tick_at
    set_clock(app, at(last, 1.5))
    schedules_of(app).sweep()
    [run] = [e for e in runs(app) if e.workflow_name == "bounded"]
    assert run.input == {"scheduled_at": at(last, 1).isoformat()}
    assert run.deadline is not None and run.deadline - run.created_at == timedelta(minutes=5)
    assert isinstance(run.completion_callbacks, list) and len(run.completion_callbacks) == 1
    assert "hooks.example.com" in json.dumps(run.completion_callbacks)
