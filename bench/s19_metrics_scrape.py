"""S19: the metrics scrape with 1,000,000 rows in each table it counts, in PostgreSQL: webhook
deliveries, workflow executions (over ten registered workflows), completion-callback deliveries and
completion-trigger fires, seeded fast with ``INSERT ... SELECT generate_series``.

A scrape reads every gauge from the database (bounded counts on indexes), so its cost must not grow
with the history: the same scrape on 1,000 rows of each is the baseline. Goal: p95 < 50 ms. The
scrape goes through the Flask test client, the whole route (the store reads and the rendering).
"""

from __future__ import annotations

import sys
import time
from typing import Any

import sqlalchemy as sa
from flask import Flask
from flask_sqlalchemy import SQLAlchemy

from flask_harvest import CompletionTrigger, Harvest, get_engine
from flask_harvest.callbacks._schema import deliveries_table as callbacks_table
from flask_harvest.triggers._schema import fires_table
from flask_harvest.webhooks.stores.sql import deliveries_table, subscriptions_table
from flask_harvest.workflows import WorkflowContext
from flask_harvest.workflows._schema import executions_table

from ._history import alternate, database_url
from ._report import Context, Result, Row, percentile
from ._services import drop_database, ensure_database

ID = "S19"
TITLE = "metrics scrape with 1M rows in each counted table"
GOAL_MS = 50.0
WORKFLOWS = [f"bench_flow_{n}" for n in range(10)]
SMALL = 1_000
_MARKER = "bench_metrics_seed"


def make_app(url: str) -> Flask:
    """An app on ``url`` with the ten workflows and a trigger registered and the metrics route open."""
    app = Flask("bench_metrics")
    app.config.update(
        SQLALCHEMY_DATABASE_URI=url,
        HARVEST_METRICS=True,
        HARVEST_METRICS_PATH="/metrics",
        HARVEST_METRICS_UNAUTHENTICATED=True,
        HARVEST_SWEEP_INTERVAL_SECONDS=3600,
    )
    db = SQLAlchemy(app)
    harvest = Harvest(db=db)
    harvest.completion_triggers([CompletionTrigger(WORKFLOWS[0], WORKFLOWS[1])])
    for name in WORKFLOWS:
        harvest.workflow(name)(_noop)
    harvest.init_app(app)
    app.extensions["bench_db"] = db
    return app


def _noop(ctx: WorkflowContext, value: Any) -> Any:
    return value


def seeded(url: str, rows: int) -> float:
    """Seed ``rows`` rows in each counted table unless the database holds exactly that; return the
    seconds it took (0 when reused)."""
    spec = f"rows={rows} workflows={len(WORKFLOWS)} v1"
    ensure_database(url)
    engine = sa.create_engine(url)
    try:
        with engine.begin() as conn:
            conn.exec_driver_sql(f"CREATE TABLE IF NOT EXISTS {_MARKER} (spec text NOT NULL)")
            if conn.exec_driver_sql(f"SELECT spec FROM {_MARKER}").scalar() == spec:  # noqa: S608
                return 0.0
    finally:
        engine.dispose()
    started = time.perf_counter()
    drop_database(url)
    ensure_database(url)
    app = make_app(url)  # creates the tables and indexes, as init_app does
    get_engine(app).close()
    engine = sa.create_engine(url)
    try:
        _seed(engine, rows)
        with engine.begin() as conn:
            conn.exec_driver_sql(f"CREATE TABLE {_MARKER} (spec text NOT NULL)")
            conn.execute(sa.text(f"INSERT INTO {_MARKER} (spec) VALUES (:spec)"), {"spec": spec})  # noqa: S608
    finally:
        engine.dispose()
        with app.app_context():
            app.extensions["bench_db"].engine.dispose()
    return time.perf_counter() - started


def _seed(engine: sa.Engine, rows: int) -> None:
    ex, cb, fires = executions_table.name, callbacks_table.name, fires_table.name
    dels, subs = deliveries_table.name, subscriptions_table.name
    params = {"rows": rows, "flows": WORKFLOWS}
    now = "now() AT TIME ZONE 'UTC'"
    statements = [
        f"""INSERT INTO {subs} (id, target_url, event_topics, secret, status, consecutive_failures,
                description, created_at, updated_at)
            SELECT 'sub_' || n, 'http://127.0.0.1:9/', '["bench.*"]', 'whsec_x',
                CASE WHEN n % 10 = 0 THEN 'failed' ELSE 'active' END, 0, '', {now}, {now}
            FROM generate_series(1, 20) AS n""",  # noqa: S608
        # Deliveries: 1 in 20 dead-lettered, 1 in 1,000 pending, the rest delivered.
        f"""INSERT INTO {dels} (id, subscription_id, topic, payload, state, attempt, max_attempts,
                request_headers, "timestamp", next_attempt_at, created_at)
            SELECT 'dlv_' || md5('d' || n), 'sub_' || (1 + n % 20), 'bench.event', '{{}}',
                CASE WHEN n % 1000 = 0 THEN 'pending' WHEN n % 20 = 0 THEN 'dlq' ELSE 'delivered' END,
                1, 8, '{{}}', {now} - make_interval(secs => n), {now} - make_interval(secs => n),
                {now} - make_interval(secs => n)
            FROM generate_series(1, :rows) AS n""",  # noqa: S608
        # Executions over the ten workflows: 1 in 12 failed, 1 in 100 cancelled, 1 in 1,000 running.
        f"""INSERT INTO {ex} (execution_id, workflow_name, workflow_id, input, state, created_at,
                completed_at, attempt, recovery_count, cancel_requested, trigger_depth, priority)
            SELECT md5('e' || n)::uuid::text, (CAST(:flows AS varchar[]))[1 + n % 10], 'wf-' || n, 'null',
                CASE WHEN n % 1000 = 0 THEN 'Running' WHEN n % 100 = 0 THEN 'Cancelled'
                    WHEN n % 12 = 0 THEN 'Failed' ELSE 'Completed' END,
                {now} - make_interval(secs => n), {now} - make_interval(secs => n), 1, 0, false, 0, 0
            FROM generate_series(1, :rows) AS n""",  # noqa: S608
        # Callback deliveries: 1 in 30 failed, the rest delivered.
        f"""INSERT INTO {cb} (delivery_id, execution_id, callback_index, target_url, filter, state,
                attempts, max_attempts, initial_backoff_ms, max_backoff_ms, body, created_at,
                updated_at)
            SELECT md5('c' || n)::uuid::text, md5('e' || n)::uuid::text, 0, 'http://127.0.0.1:9/',
                '{{}}', CASE WHEN n % 30 = 0 THEN 'FAILED' ELSE 'DELIVERED' END, 1, 5, 1000, 60000,
                '{{}}', {now}, {now}
            FROM generate_series(1, :rows) AS n""",  # noqa: S608
        # Trigger fires: 3 in 10 skipped by their guard, the rest fired.
        f"""INSERT INTO {fires} (source_exec_id, trigger_id, fired_at, outcome)
            SELECT md5('e' || n)::uuid::text, md5('t')::uuid::text, {now},
                CASE WHEN n % 10 < 3 THEN 'condition_unmet' END
            FROM generate_series(1, :rows) AS n""",  # noqa: S608
    ]
    with engine.begin() as conn:
        for statement in statements:
            conn.execute(sa.text(statement), params)
    # As autovacuum soon would: planner statistics, and the visibility map of index-only scans.
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.exec_driver_sql(f"VACUUM ANALYZE {subs}, {dels}, {ex}, {cb}, {fires}")


def scrape(app: Flask) -> None:
    answer = app.test_client().get("/metrics")
    if answer.status_code != 200 or b"harvest_metrics_store_up 1.0" not in answer.data:
        raise AssertionError(f"the scrape answered {answer.status_code} or could not read the store")


def run(ctx: Context) -> Result:
    rows = ctx.pick(1_000_000, 100_000)
    reps = ctx.pick(200, 40)
    big = "metrics" if rows == 1_000_000 else f"metrics_{rows}"  # quick runs keep their own
    urls = {"big": database_url(big), "small": database_url("metrics_small")}
    seconds = {"big": seeded(urls["big"], rows), "small": seeded(urls["small"], SMALL)}
    apps = {name: make_app(url) for name, url in urls.items()}
    try:
        times = alternate(apps, scrape, reps)
    finally:
        for app in apps.values():
            get_engine(app).close()
            with app.app_context():
                app.extensions["bench_db"].engine.dispose()
    p95, small_p95 = percentile(times["big"], 95), percentile(times["small"], 95)
    result = Result()
    result.rows.append(
        Row(
            ID,
            f"metrics scrape, {rows:,} rows in each table (p95)",
            p95,
            "ms",
            f"< {GOAL_MS:.0f} ms",
            p95 < GOAL_MS,
            baseline=small_p95,
            baseline_label=f"the same scrape on {SMALL:,} rows",
            ratio=p95 / small_p95,
            note=f"p50 {percentile(times['big'], 50):.1f} ms",
        )
    )
    result.details = {
        "scrape_ms": {
            name: {"p50": percentile(t, 50), "p95": percentile(t, 95), "reps": len(t)}
            for name, t in times.items()
        },
        "seed_seconds": seconds,
    }
    return result


if __name__ == "__main__":
    from .__main__ import main

    raise SystemExit(main(["--only", ID, *sys.argv[1:]]))
