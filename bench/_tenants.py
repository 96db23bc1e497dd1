"""A multi-tenant history seeded in PostgreSQL by ``INSERT ... SELECT generate_series``: many
tenants, each with one to three endpoints (webhook subscriptions with a tenant), and deliveries
spread over them and over 30 days, with their attempts; what S24 (the consumer portal's render
time) measures on.

One tenant, :data:`BIG`, has a share of the deliveries many times an ordinary tenant's (and so a
DLQ of hundreds); the others share the rest. Like ``bench._history``, a seeded database records
its spec and is kept for the next run while the spec and the schema are unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa

from flask_harvest.webhooks.stores.sql import (
    attempts_table,
    deliveries_table,
    subscription_topics_table,
    subscriptions_table,
)
from flask_harvest.webhooks.topic_index import pattern_key

from ._history import database_url, kept_or_seeded, schema_fingerprint

#: The event types of the catalog; each endpoint subscribes to two of them.
EVENT_TYPES = ("order.created", "order.paid", "order.shipped", "invoice.issued", "customer.updated")
#: The deliveries spread over this many days up to the seeding, newest last.
DAYS = 30
#: The newest share of the history (1 in this many rows) holds the pending retries.
RECENT_EVERY = 100
#: Out of 1,000 rows: dead-lettered (below DLQ_PER_MILLE), skipped (below SKIPPED_PER_MILLE), the
#: rest delivered, 1 in 10 of those at the second attempt and 1 in 20 at the third. In the recent
#: share, PENDING_PER_MILLE of the rows wait for a retry instead.
DLQ_PER_MILLE = 30
SKIPPED_PER_MILLE = 45
PENDING_PER_MILLE = 300
#: A dead-lettered delivery made this many attempts.
MAX_ATTEMPTS = 8
#: The tenant with many deliveries (all three of its endpoints active).
BIG = "t00000"


def tenant_id(number: int) -> str:
    return f"t{number:05d}"


def endpoint_id(tenant: str, number: int) -> str:
    """The id of endpoint ``number`` (0 to 2) of ``tenant``, as the seeding makes it."""
    return f"sub_{tenant}_{number}"


@dataclass(frozen=True)
class Tenants:
    """A seeded database: its URL, its size, and how long the seeding took (0 when kept)."""

    database_url: str
    tenants: int
    deliveries: int
    big_deliveries: int
    seed_seconds: float


def seeded(tenants: int, deliveries: int, big_deliveries: int) -> Tenants:
    """The database ``<bench db>_portal_<tenants>`` with ``tenants`` tenants and ``deliveries``
    deliveries, ``big_deliveries`` of them :data:`BIG`'s; seeded unless it holds exactly that."""
    url = database_url(f"portal_{tenants}")
    spec = (
        f"tenants={tenants} deliveries={deliveries} big={big_deliveries} "
        f"schema={schema_fingerprint()} tenants v1"
    )
    seconds = kept_or_seeded(url, spec, lambda engine: _seed(engine, tenants, deliveries, big_deliveries))
    return Tenants(url, tenants, deliveries, big_deliveries, seconds)


def _seed(engine: sa.Engine, tenants: int, deliveries: int, big_deliveries: int) -> None:
    subs, topics = subscriptions_table.name, subscription_topics_table.name
    dels, atts = deliveries_table.name, attempts_table.name
    params: dict[str, Any] = {
        "tenants": tenants,
        "deliveries": deliveries,
        "big_every": deliveries // big_deliveries,
        "span": DAYS * 86_400,
        "types": list(EVENT_TYPES),
        "keys": [pattern_key(name) for name in EVENT_TYPES],
        "recent": deliveries - deliveries // RECENT_EVERY,
    }
    kinds = len(EVENT_TYPES)
    now = "now() AT TIME ZONE 'UTC'"
    # Tenant i has 3 - i % 3 endpoints (BIG, i = 0, has three); endpoint k subscribes to types
    # (i + k) and (i + k + 2) modulo their number. One endpoint in 50 is disabled.
    endpoints = f"""FROM generate_series(0, :tenants - 1) AS i,
            LATERAL generate_series(0, 2 - i % 3) AS k,
            LATERAL (SELECT 't' || lpad(i::text, 5, '0') AS tenant) AS t,
            LATERAL (SELECT 'sub_' || t.tenant || '_' || k AS id,
                1 + (i + k) % {kinds} AS first, 1 + (i + k + 2) % {kinds} AS second) AS e"""
    # Row n (1 is the oldest): BIG's when n is a multiple of big_every, else a hashed other tenant;
    # a hashed endpoint of the tenant and one of that endpoint's two types; r picks the state.
    rows = f"""FROM generate_series(1, :deliveries) AS n,
            LATERAL (SELECT CASE WHEN n % :big_every = 0 THEN 0
                ELSE 1 + abs(hashtext('i' || n)) % (:tenants - 1) END AS i,
                abs(hashtext('r' || n)) % 1000 AS r,
                {now} - make_interval(secs => CAST(:span AS float8) * (:deliveries - n) / :deliveries)
                    AS ts) AS x,
            LATERAL (SELECT abs(hashtext('k' || n)) % (3 - x.i % 3) AS k,
                't' || lpad(x.i::text, 5, '0') AS tenant) AS y,
            LATERAL (SELECT CASE
                WHEN n > :recent AND x.r < {PENDING_PER_MILLE} THEN 'pending'
                WHEN x.r < {DLQ_PER_MILLE} THEN 'dlq'
                WHEN x.r < {SKIPPED_PER_MILLE} THEN 'skipped'
                ELSE 'delivered' END AS state) AS s,
            LATERAL (SELECT CASE s.state
                WHEN 'pending' THEN 2 + x.r % 2
                WHEN 'dlq' THEN {MAX_ATTEMPTS}
                WHEN 'skipped' THEN 1
                ELSE 1 + CAST(x.r % 10 = 0 AS int) + CAST(x.r % 20 = 0 AS int) END AS attempt) AS a"""
    statements = [
        f"""INSERT INTO {subs} (id, target_url, event_topics, secret, status, consecutive_failures,
                description, created_at, updated_at, tenant)
            SELECT e.id, 'https://hooks.' || t.tenant || '.example/harvest/' || k,
                json_build_array((CAST(:types AS varchar[]))[e.first], (CAST(:types AS varchar[]))[e.second]),
                'whsec_' || encode(sha256(e.id::bytea), 'base64'),
                CASE WHEN (3 * i + k) % 50 = 49 THEN 'disabled' ELSE 'active' END, 0,
                'Endpoint ' || k || ' of ' || t.tenant,
                {now} - interval '{DAYS + 10} days' + make_interval(secs => i), {now}, t.tenant
            {endpoints}""",
        f"""INSERT INTO {topics} (pattern_key, subscription_id, tenant)
            SELECT (CAST(:keys AS varchar[]))[e.first], e.id, t.tenant {endpoints}
            UNION ALL
            SELECT (CAST(:keys AS varchar[]))[e.second], e.id, t.tenant {endpoints}""",
        f"""INSERT INTO {dels} (id, subscription_id, topic, payload, state, attempt, max_attempts,
                request_headers, response_status, response_body, elapsed_ms, last_error, "timestamp",
                next_attempt_at, created_at, lease_expires_at, lease_token, tenant)
            SELECT 'dlv_' || md5('p' || n), 'sub_' || y.tenant || '_' || y.k,
                (CAST(:types AS varchar[]))[1 + (x.i + y.k + 2 * (n % 2)) % {kinds}],
                '{{"id": "obj_' || n || '", "total": 4200, "currency": "EUR"}}',
                s.state, a.attempt, {MAX_ATTEMPTS}, '{{}}',
                CASE s.state WHEN 'delivered' THEN 200 WHEN 'skipped' THEN NULL ELSE 503 END,
                CASE WHEN s.state = 'skipped' THEN NULL ELSE '' END,
                CASE WHEN s.state = 'skipped' THEN NULL ELSE 40 + x.r % 200 END,
                CASE s.state WHEN 'dlq' THEN 'HTTP 503' WHEN 'pending' THEN 'HTTP 503'
                    WHEN 'skipped' THEN 'the endpoint was disabled' END,
                x.ts, CASE WHEN s.state = 'pending' THEN x.ts + make_interval(mins => 5 * a.attempt) END,
                x.ts - make_interval(mins => a.attempt - 1), NULL, NULL, y.tenant
            {rows}""",
        # Every attempt made: a pending row's current one is not made yet, a skipped row made none.
        f"""INSERT INTO {atts} (delivery_id, attempt, started_at, response_status, response_body,
                elapsed_ms, error)
            SELECT d.id, m, d."timestamp" - make_interval(mins => d.attempt - m),
                CASE WHEN d.state = 'delivered' AND m = d.attempt THEN 200 ELSE 503 END, '',
                d.elapsed_ms, CASE WHEN d.state = 'delivered' AND m = d.attempt THEN NULL ELSE 'HTTP 503' END
            FROM {dels} AS d, LATERAL generate_series(1, CASE d.state WHEN 'pending' THEN d.attempt - 1
                WHEN 'skipped' THEN 0 ELSE d.attempt END) AS m""",  # noqa: S608
    ]
    with engine.begin() as conn:
        for statement in statements:
            conn.execute(sa.text(statement), params)
    # As autovacuum soon would: statistics for the planner, the visibility map for index-only scans.
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.exec_driver_sql(f"VACUUM ANALYZE {subs}, {topics}, {dels}, {atts}")


def newest(url: str, tenant: str, state: str | None = None) -> str:
    """The id of ``tenant``'s newest delivery (in ``state``, if given)."""
    query = sa.select(deliveries_table.c.id).where(deliveries_table.c.tenant == tenant)
    if state is not None:
        query = query.where(deliveries_table.c.state == state)
    query = query.order_by(deliveries_table.c.timestamp.desc(), deliveries_table.c.id.desc()).limit(1)
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            found = conn.execute(query).scalar()
    finally:
        engine.dispose()
    if found is None:
        raise AssertionError(f"{tenant} has no {state or ''} delivery")
    return str(found)


def ordinary(url: str, tenants: int) -> str:
    """An ordinary tenant: the first from the middle of the ids on with three endpoints and a
    dead-lettered delivery (so every page of the portal has something to show)."""
    dels = deliveries_table
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            for number in range(tenants // 2 - tenants // 2 % 3, tenants, 3):
                candidate = tenant_id(number)
                query = sa.select(dels.c.id).where(dels.c.tenant == candidate, dels.c.state == "dlq")
                if conn.execute(query.limit(1)).first() is not None:
                    return candidate
    finally:
        engine.dispose()
    raise AssertionError("no tenant with a dead-lettered delivery")
