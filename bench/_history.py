"""A delivery table with history, seeded in PostgreSQL by ``INSERT ... SELECT generate_series``:
what S13 (flat costs as history grows) and S16 (dashboard render time) measure against.

A database seeded with a spec (history rows, pending rows, the schema's DDL) records it in a table
of its own, so a second scenario of the run (or the next run) finds it seeded and reuses it instead
of writing a million rows again; a changed spec or schema seeds it afresh. The scenarios leave the
rows as they found them.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from flask import Flask

from flask_harvest.webhooks.stores.sql import (
    WEBHOOK_SCHEMA_SQL,
    attempts_table,
    deliveries_table,
    subscriptions_table,
)

from ._report import Context
from ._services import DATABASE_URL, drop_database, ensure_database, reset_database

#: The subscriptions every seeded delivery belongs to (one per tenant of a small SaaS).
SUBSCRIPTIONS = 20
#: Topics the deliveries are spread over.
TOPICS = 5
#: One history row in this many is dead-lettered; the others were delivered.
DLQ_EVERY = 20
#: The history spans this many days up to the seeding, so the last hour holds its share.
HISTORY_DAYS = 10
#: Pending rows became due over this many seconds before the seeding.
PENDING_DUE_SPAN = 600

#: The baseline's history (S13, S16): a full DLQ page, next to nothing else.
SMALL_HISTORY = 1_000
#: Due pending rows in both databases: the same backlog, with or without the history.
PENDING = 10_000

_MARKER = "bench_history_seed"


@dataclass(frozen=True)
class History:
    """A seeded database: its URL, its rows, and how long the seeding took (0 when reused)."""

    database_url: str
    history: int
    pending: int
    seed_seconds: float

    @property
    def topics(self) -> list[str]:
        return [f"bench.event.{n}" for n in range(TOPICS)]


def subscription_id(number: int) -> str:
    return f"sub_bench_{number:04d}"


def database_url(suffix: str) -> str:
    """A database of its own on the benchmark's server: ``<bench database>_<suffix>``."""
    url = sa.make_url(DATABASE_URL)
    return url.set(database=f"{url.database}_{suffix}").render_as_string(hide_password=False)


def _spec(history: int, pending: int) -> str:
    schema = hashlib.sha256(WEBHOOK_SCHEMA_SQL.encode()).hexdigest()[:16]
    return f"history={history} pending={pending} subscriptions={SUBSCRIPTIONS} schema={schema} v2"


def seeded(url: str, *, history: int, pending: int) -> History:
    """The database at ``url`` with ``history`` delivered and dead-lettered rows (each with its
    attempt) and ``pending`` due pending rows; seeded unless it already holds exactly that."""
    spec = _spec(history, pending)
    ensure_database(url)
    engine = sa.create_engine(url)
    try:
        with engine.begin() as conn:
            conn.exec_driver_sql(f"CREATE TABLE IF NOT EXISTS {_MARKER} (spec text NOT NULL)")
            if conn.exec_driver_sql(f"SELECT spec FROM {_MARKER}").scalar() == spec:  # noqa: S608
                return History(url, history, pending, 0.0)
    finally:
        engine.dispose()
    # Afresh: an index the schema no longer has must not stay behind to help the planner.
    started = time.perf_counter()
    drop_database(url)
    ensure_database(url)
    engine = sa.create_engine(url)
    try:
        reset_database(engine)
        _seed(engine, history, pending)
        with engine.begin() as conn:
            conn.exec_driver_sql(f"CREATE TABLE {_MARKER} (spec text NOT NULL)")
            conn.execute(sa.text(f"INSERT INTO {_MARKER} (spec) VALUES (:spec)"), {"spec": spec})  # noqa: S608
    finally:
        engine.dispose()
    return History(url, history, pending, time.perf_counter() - started)


def _seed(engine: sa.Engine, history: int, pending: int) -> None:
    subs, dels, atts = subscriptions_table.name, deliveries_table.name, attempts_table.name
    params = {
        "subs": [subscription_id(n) for n in range(SUBSCRIPTIONS)],
        "history": history,
        "pending": pending,
        "span": HISTORY_DAYS * 86_400,
        "due_span": PENDING_DUE_SPAN,
        "dlq_every": DLQ_EVERY,
        "topics": TOPICS,
    }
    # Ids as random as uuid4's (md5 of the row number); the same in every database seeded alike.
    # n runs oldest to newest, so the newest rows are the last ones written, as in production.
    statements = [
        f"""INSERT INTO {subs} (id, target_url, event_topics, secret, status, consecutive_failures,
                description, created_at, updated_at)
            SELECT s, 'http://127.0.0.1:9/' || s, '["bench.event.*"]', 'whsec_'
                || encode(sha256(s::bytea), 'base64'), 'active', 0, '', now() AT TIME ZONE 'UTC'
                - interval '30 days', now() AT TIME ZONE 'UTC'
            FROM unnest(CAST(:subs AS varchar[])) AS s""",  # noqa: S608
        f"""INSERT INTO {dels} (id, subscription_id, topic, payload, state, attempt, max_attempts,
                request_headers, response_status, response_body, elapsed_ms, last_error, "timestamp",
                next_attempt_at, created_at, lease_expires_at, lease_token)
            SELECT 'dlv_' || md5('h' || n),
                (CAST(:subs AS varchar[]))[1 + abs(hashtext('s' || n)) % {SUBSCRIPTIONS}],
                'bench.event.' || abs(hashtext('t' || n)) % :topics,
                '{{"order_id": "ord_' || n || '", "total": 4200, "currency": "EUR"}}',
                CASE WHEN n % :dlq_every = 0 THEN 'dlq' ELSE 'delivered' END,
                CASE WHEN n % :dlq_every = 0 THEN 8 ELSE 1 END, 8, '{{}}',
                CASE WHEN n % :dlq_every = 0 THEN 500 ELSE 200 END, '', 12,
                CASE WHEN n % :dlq_every = 0 THEN 'HTTP 500' END,
                t.ts, NULL, t.ts - interval '1 second', NULL, NULL
            FROM generate_series(1, :history) AS n,
                LATERAL (SELECT now() AT TIME ZONE 'UTC'
                    - make_interval(secs => CAST(:span AS float8) * (:history - n) / :history) AS ts) AS t""",  # noqa: S608
        f"""INSERT INTO {atts} (delivery_id, attempt, started_at, response_status, response_body,
                elapsed_ms, error)
            SELECT id, attempt, "timestamp", response_status, '', 12, last_error FROM {dels}""",  # noqa: S608
        f"""INSERT INTO {dels} (id, subscription_id, topic, payload, state, attempt, max_attempts,
                request_headers, response_status, response_body, elapsed_ms, last_error, "timestamp",
                next_attempt_at, created_at, lease_expires_at, lease_token)
            SELECT 'dlv_' || md5('p' || n), (CAST(:subs AS varchar[]))[1 + n % {SUBSCRIPTIONS}],
                'bench.event.' || (n % :topics), '{{"order_id": "ord_p' || n || '"}}', 'pending', 1, 8,
                '{{}}', NULL, NULL, NULL, NULL, t.ts, t.ts, t.ts, NULL, NULL
            FROM generate_series(1, :pending) AS n,
                LATERAL (SELECT now() AT TIME ZONE 'UTC' - make_interval(
                    secs => CAST(:due_span AS float8) * (:pending - n) / :pending) AS ts) AS t""",  # noqa: S608
    ]
    with engine.begin() as conn:
        for statement in statements:
            conn.execute(sa.text(statement), params)
    # As autovacuum soon would: statistics for the planner, and the visibility map that lets
    # index-only scans skip the heap.
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.exec_driver_sql(f"VACUUM ANALYZE {subs}, {dels}, {atts}")


def history_apps(
    ctx: Context, history: int, config: dict[str, Any] | None = None
) -> tuple[dict[str, Flask], dict[str, History]]:
    """Apps (with ``config``) on a database with ``history`` rows (``big``) and one with
    :data:`SMALL_HISTORY` (``small``), each with :data:`PENDING` due pending rows: what S13 and S16
    compare."""
    seeds = {
        "small": seeded(database_url("history_small"), history=SMALL_HISTORY, pending=PENDING),
        "big": seeded(database_url("history"), history=history, pending=PENDING),
    }
    apps = {
        name: ctx.app({**(config or {}), "SQLALCHEMY_DATABASE_URI": seed.database_url})
        for name, seed in seeds.items()
    }
    return apps, seeds


def alternate(
    apps: dict[str, Flask], operation: Callable[[Flask], None], reps: int, warmup: int = 5
) -> dict[str, list[float]]:
    """Time ``operation`` on every app, alternating call by call in a rotating order; return each
    app's milliseconds (after ``warmup`` rounds)."""
    names = list(apps)
    times: dict[str, list[float]] = {name: [] for name in names}
    for rep in range(reps + warmup):
        shift = rep % len(names)
        for name in names[shift:] + names[:shift]:
            with apps[name].app_context():
                started = time.perf_counter()
                operation(apps[name])
                elapsed = time.perf_counter() - started
            if rep >= warmup:
                times[name].append(elapsed * 1000)
    return times
