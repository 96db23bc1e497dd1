"""A history seeded in PostgreSQL by ``INSERT ... SELECT generate_series``: deliveries (each with
its attempt) and, as many, workflow executions (each with its steps, a completion-callback delivery
and a trigger fire), what S13 (flat costs as history grows) and S16 (the console's render time)
measure against.

A database seeded with a spec (history rows, pending rows, the schema's DDL) records it in a table
of its own, so a second scenario of the run (or the next run) finds it seeded and reuses it instead
of writing a million rows again; a changed spec or schema seeds it afresh. The scenarios leave the
rows as they found them.
"""

from __future__ import annotations

import hashlib
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from flask import Flask

from flask_harvest._sql import metadata, schema_sql
from flask_harvest.callbacks._schema import deliveries_table as callbacks_table
from flask_harvest.triggers._schema import fires_table, triggers_table
from flask_harvest.webhooks.stores.sql import (
    WEBHOOK_SCHEMA_SQL,
    attempts_table,
    deliveries_table,
    subscriptions_table,
)
from flask_harvest.workflows._schema import executions_table, steps_table

from ._report import Context
from ._services import DATABASE_URL, drop_database, ensure_database, reset_database

#: The subscriptions every seeded delivery belongs to (one per tenant of a small SaaS).
SUBSCRIPTIONS = 20
#: Topics the deliveries are spread over.
TOPICS = 5
#: One history row in this many is dead-lettered; the others were delivered.
DLQ_EVERY = 20
#: The history grew by this many rows a day up to the seeding, at every size: both sizes have the
#: same recent traffic (about 42 rows in the last hour), so pages that read the last hour compare
#: the same work, and only the depth of the history differs (1,000 rows: a day; 1,000,000: 1,000 days).
ROWS_PER_DAY = 1_000
#: Pending rows became due over this many seconds before the seeding.
PENDING_DUE_SPAN = 600

#: The baseline's history (S13, S16): a few pages of DLQ, next to nothing else.
SMALL_HISTORY = 1_000
#: Due pending rows in both databases: the same backlog, with or without the history.
PENDING = 10_000

#: The workflows the executions are spread over (S16's app registers them).
WORKFLOWS = [f"bench_flow_{n}" for n in range(5)]
#: Steps each execution recorded.
STEPS = 3
#: One execution in this many failed, one in CANCELLED_EVERY was cancelled; the rest completed.
FAILED_EVERY = 12
CANCELLED_EVERY = 100
#: One execution in this many is a parent, whose next CHILDREN executions are its child runs.
PARENT_EVERY = 10
CHILDREN = 3
#: One execution in this many ran through :data:`QUEUE`.
QUEUED_EVERY = 5
QUEUE = "bench_queue"
#: Runs waiting in :data:`QUEUE` in both databases (open, so not history).
QUEUE_WAITING = 100
#: One completion-callback delivery in this many failed (the others were delivered).
CALLBACK_FAILED_EVERY = 30
#: Rows on a page of the console's lists.
CONSOLE_PAGE = 50
#: Every execution was decided by one trigger: the one declared in code (even rows) or the one
#: registered through the admin API (odd rows); 3 in 10 were skipped by their condition.
CODE_TRIGGER_ID = "5e1f0000-0000-4000-8000-000000000001"
STORED_TRIGGER_ID = "5e1f0000-0000-4000-8000-000000000002"

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


def execution_id(number: int) -> str:
    """The id of history execution ``number`` (1 is the oldest), as the seeding makes it."""
    return str(uuid.UUID(hashlib.md5(f"e{number}".encode()).hexdigest()))  # noqa: S324 (an id, not a secret)


def waiting_execution_id(number: int) -> str:
    """The id of open run ``number`` waiting in :data:`QUEUE` (1 is the newest)."""
    return str(uuid.UUID(hashlib.md5(f"q{number}".encode()).hexdigest()))  # noqa: S324 (an id, not a secret)


def delivery_id(number: int) -> str:
    """The id of history delivery ``number`` (1 is the oldest), as the seeding makes it."""
    return "dlv_" + hashlib.md5(f"h{number}".encode()).hexdigest()  # noqa: S324 (an id, not a secret)


def schema_fingerprint() -> str:
    """A digest of every table's DDL: a seed recorded with another one is seeded afresh, so an
    index added or dropped anywhere is measured as the schema has it."""
    ddl = WEBHOOK_SCHEMA_SQL + schema_sql(metadata.sorted_tables)
    return hashlib.sha256(ddl.encode()).hexdigest()[:16]


def _spec(history: int, pending: int) -> str:
    return (
        f"history={history} pending={pending} subscriptions={SUBSCRIPTIONS} "
        f"schema={schema_fingerprint()} workflows v5"
    )


def kept_or_seeded(url: str, spec: str, seed: Callable[[sa.Engine], None]) -> float:
    """The database at ``url`` as ``seed`` fills it: kept if an earlier seeding recorded ``spec``
    in it, else dropped, created with empty tables and seeded. Return the seconds the seeding took
    (0 when kept)."""
    ensure_database(url)
    engine = sa.create_engine(url)
    try:
        with engine.begin() as conn:
            conn.exec_driver_sql(f"CREATE TABLE IF NOT EXISTS {_MARKER} (spec text NOT NULL)")
            if conn.exec_driver_sql(f"SELECT spec FROM {_MARKER}").scalar() == spec:  # noqa: S608
                return 0.0
    finally:
        engine.dispose()
    # Afresh: an index the schema no longer has must not stay behind to help the planner.
    started = time.perf_counter()
    drop_database(url)
    ensure_database(url)
    engine = sa.create_engine(url)
    try:
        reset_database(engine)
        seed(engine)
        with engine.begin() as conn:
            conn.exec_driver_sql(f"CREATE TABLE {_MARKER} (spec text NOT NULL)")
            conn.execute(sa.text(f"INSERT INTO {_MARKER} (spec) VALUES (:spec)"), {"spec": spec})  # noqa: S608
    finally:
        engine.dispose()
    return time.perf_counter() - started


def seeded(url: str, *, history: int, pending: int) -> History:
    """The database at ``url`` with ``history`` delivered and dead-lettered rows (each with its
    attempt) and ``pending`` due pending rows; seeded unless it already holds exactly that."""
    seconds = kept_or_seeded(url, _spec(history, pending), lambda engine: _seed(engine, history, pending))
    return History(url, history, pending, seconds)


def _every(rate: int, history: int) -> int:
    """One row in ``rate`` (or more often in a small history): the DLQ and the failed callbacks
    span several console pages at every size, so both sizes render a list page with the same
    statements (a list that fits on one page sends no count)."""
    return max(1, min(rate, history // (3 * CONSOLE_PAGE)))


def _dlq_every(history: int) -> int:
    """:func:`_every` for the DLQ, dividing ``history`` so the newest delivery is dead-lettered at
    every size (S16 opens it)."""
    every = _every(DLQ_EVERY, history)
    while history % every:
        every -= 1
    return every


def _seed(engine: sa.Engine, history: int, pending: int) -> None:
    subs, dels, atts = subscriptions_table.name, deliveries_table.name, attempts_table.name
    params = {
        "subs": [subscription_id(n) for n in range(SUBSCRIPTIONS)],
        "history": history,
        "pending": pending,
        "span": history * 86_400 // ROWS_PER_DAY,
        "due_span": PENDING_DUE_SPAN,
        "dlq_every": _dlq_every(history),
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
        for statement in [*statements, *_workflow_statements(history)]:
            conn.execute(sa.text(statement), {**params, **_WORKFLOW_PARAMS})
    # As autovacuum soon would: statistics for the planner, and the visibility map that lets
    # index-only scans skip the heap.
    tables = [subs, dels, atts, executions_table.name, steps_table.name, callbacks_table.name]
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.exec_driver_sql(f"VACUUM ANALYZE {', '.join([*tables, triggers_table.name, fires_table.name])}")


_WORKFLOW_PARAMS = {
    "flows": WORKFLOWS,
    "steps": STEPS,
    "queue": QUEUE,
    "waiting": QUEUE_WAITING,
    "code_trigger": CODE_TRIGGER_ID,
    "stored_trigger": STORED_TRIGGER_ID,
}


def _workflow_statements(history: int) -> list[str]:
    """The executions of the history (as many as its deliveries, over the same days, oldest first),
    each with its steps, a completion-callback delivery and a trigger's fire; the two triggers;
    and :data:`QUEUE_WAITING` open runs waiting in :data:`QUEUE`."""
    callback_failed_every = _every(CALLBACK_FAILED_EVERY, history)
    ex, st, cb = executions_table.name, steps_table.name, callbacks_table.name
    trg, fires = triggers_table.name, fires_table.name
    now = "now() AT TIME ZONE 'UTC'"
    # Row n's time, as the deliveries': the newest row is the last one written.
    at = f"""LATERAL (SELECT {now}
        - make_interval(secs => CAST(:span AS float8) * (:history - n) / :history) AS ts) AS t"""
    eid = "md5('e' || n)::uuid::text"
    return [
        f"""INSERT INTO {trg} (id, source_workflow_name, terminal_states, target_workflow_name,
                input_mapping, condition, created_at, updated_at)
            VALUES (:code_trigger, '{WORKFLOWS[0]}', '["Completed"]', '{WORKFLOWS[1]}',
                    '{{"type":"Passthrough"}}', NULL, {now} - interval '30 days', {now} - interval '30 days'),
                (:stored_trigger, '{WORKFLOWS[2]}', '["Completed","Failed"]', '{WORKFLOWS[3]}',
                    '{{"type":"Passthrough"}}', NULL, {now} - interval '20 days',
                    {now} - interval '20 days')""",  # noqa: S608
        f"""INSERT INTO {ex} (execution_id, workflow_name, workflow_id, input, output, error, state,
                created_at, started_at, completed_at, attempt, recovery_count, cancel_requested,
                trigger_depth, parent_execution_id, parent_close_policy, queue_name, priority)
            SELECT {eid}, (CAST(:flows AS varchar[]))[1 + n % {len(WORKFLOWS)}], 'wf-' || n,
                '{{"order_id": "ord_' || n || '", "total": 4200}}',
                CASE WHEN n % {CANCELLED_EVERY} <> 0 AND n % {FAILED_EVERY} <> 0 THEN '{{"ok": true}}' END,
                CASE WHEN n % {CANCELLED_EVERY} <> 0 AND n % {FAILED_EVERY} = 0
                    THEN 'RuntimeError: the payment service answered 503' END,
                CASE WHEN n % {CANCELLED_EVERY} = 0 THEN 'Cancelled'
                    WHEN n % {FAILED_EVERY} = 0 THEN 'Failed' ELSE 'Completed' END,
                t.ts, t.ts, t.ts + interval '2 seconds', 1, 0, n % {CANCELLED_EVERY} = 0, 0,
                CASE WHEN n % {PARENT_EVERY} BETWEEN 1 AND {CHILDREN}
                    THEN md5('e' || (n - n % {PARENT_EVERY}))::uuid::text END,
                CASE WHEN n % {PARENT_EVERY} BETWEEN 1 AND {CHILDREN} THEN 'Terminate' END,
                CASE WHEN n % {QUEUED_EVERY} = {QUEUED_EVERY - 1} THEN :queue END, 0
            FROM generate_series(1, :history) AS n, {at}""",  # noqa: S608
        f"""INSERT INTO {ex} (execution_id, workflow_name, workflow_id, input, state, created_at,
                next_run_at, attempt, recovery_count, cancel_requested, trigger_depth, queue_name,
                priority)
            SELECT md5('q' || n)::uuid::text, '{WORKFLOWS[4]}', 'wf-waiting-' || n, '{{"n": ' || n || '}}',
                'Pending', {now} - make_interval(secs => n), {now} - make_interval(secs => n), 0, 0,
                false, 0, :queue, 0
            FROM generate_series(1, :waiting) AS n""",  # noqa: S608
        f"""INSERT INTO {st} (execution_id, seq, name, output, error, created_at)
            SELECT {eid}, s, 'step' || s, '{{"n": ' || s || '}}', NULL,
                t.ts + make_interval(secs => 0.5 * s)
            FROM generate_series(1, :history) AS n, {at}, generate_series(0, :steps - 1) AS s""",  # noqa: S608
        f"""INSERT INTO {cb} (delivery_id, execution_id, callback_index, target_url, filter, state,
                attempts, max_attempts, initial_backoff_ms, max_backoff_ms, body, last_status,
                last_error, created_at, updated_at, delivered_at)
            SELECT md5('c' || n)::uuid::text, {eid}, 0, 'http://127.0.0.1:9/completed', '{{}}',
                CASE WHEN n % {callback_failed_every} = 0 THEN 'FAILED' ELSE 'DELIVERED' END,
                CASE WHEN n % {callback_failed_every} = 0 THEN 5 ELSE 1 END, 5, 1000, 60000,
                '{{"execution_id": "' || {eid} || '"}}',
                CASE WHEN n % {callback_failed_every} = 0 THEN 500 ELSE 200 END,
                CASE WHEN n % {callback_failed_every} = 0 THEN 'HTTP 500' END,
                t.ts + interval '2 seconds', t.ts + interval '3 seconds',
                CASE WHEN n % {callback_failed_every} <> 0 THEN t.ts + interval '3 seconds' END
            FROM generate_series(1, :history) AS n, {at}""",  # noqa: S608
        f"""INSERT INTO {fires} (source_exec_id, trigger_id, fired_at, outcome, target_execution_id)
            SELECT {eid}, CASE WHEN n % 2 = 0 THEN :code_trigger ELSE :stored_trigger END,
                t.ts + interval '2 seconds', CASE WHEN n % 10 < 3 THEN 'condition_unmet' END,
                CASE WHEN n % 10 >= 3 AND n < :history THEN md5('e' || (n + 1))::uuid::text END
            FROM generate_series(1, :history) AS n, {at}""",  # noqa: S608
    ]


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
