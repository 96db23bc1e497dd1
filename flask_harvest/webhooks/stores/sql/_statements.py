"""The SQL store's statements that are built once: with bind parameters, so that building and
cache-keying a statement is not paid on every call, and on PostgreSQL as constant texts that
psycopg prepares once per connection."""

from __future__ import annotations

import dataclasses
import functools
import json
from collections.abc import Iterator, Sequence
from datetime import datetime, timezone
from typing import Any

from sqlalchemy import (
    Integer,
    String,
    TextClause,
    any_,
    bindparam,
    case,
    func,
    insert,
    literal_column,
    select,
    text,
    union_all,
    update,
)
from sqlalchemy.dialects import postgresql
from sqlalchemy.sql import Executable

from ...models import WAITING_STATES, DeliveryAttempt, DeliveryState
from ...ordering import DEFAULT_ORDERING_POLICY, LINE_STATES
from ...tenants import ALL_TENANTS, TenantScope
from .._schema import attempts_table as _atts
from .._schema import deliveries_table as _dels
from .._schema import ordering_keys_table as _okeys
from .._schema import outbox_table as _box
from .._schema import subscription_topics_table as _keys
from .._schema import subscriptions_table as _subs
from ..base import Outcome

# Rows per statement: 500 rows of ~17 columns stay far below SQLite's bound-variable limit.
CHUNK = 500

_PENDING = DeliveryState.PENDING.value
_INFLIGHT = DeliveryState.INFLIGHT.value


def chunks(items: Sequence[Any], size: int = CHUNK) -> Iterator[Sequence[Any]]:
    """``items`` in slices of at most ``size``: one statement each."""
    for start in range(0, len(items), size):
        yield items[start : start + size]


# -- ordered delivery (webhooks.ordering) ------------------------------------------------------
# A keyed delivery is at the head of its line when no earlier row of its subscription and key holds
# the line: pending or in flight, or dead-lettered under the "block" policy. The earlier rows are
# read through the partial ordering index, whose predicate the query repeats word for word. An
# earlier outbox message of its key and tenant that is not relayed yet holds the line too: its
# deliveries do not exist yet, and a dispatch() of the key after it must not overtake them.

_DLQ = DeliveryState.DLQ.value
_BLOCK = DEFAULT_ORDERING_POLICY.value
_LINE_IN = ", ".join(f"'{state.value}'" for state in LINE_STATES)


def head_of_line_sql(row: str) -> str:
    """The head-of-line condition as SQL text, for the delivery row aliased ``row``."""
    return f"""({row}.ordering_key IS NULL OR NOT EXISTS (
        SELECT 1 FROM {_dels.name} AS earlier
        WHERE earlier.subscription_id = {row}.subscription_id
            AND earlier.ordering_key = {row}.ordering_key
            AND earlier.ordering_key IS NOT NULL AND earlier.state IN ({_LINE_IN})
            AND (earlier.ordering_seq < {row}.ordering_seq
                OR (earlier.ordering_seq = {row}.ordering_seq AND earlier.id < {row}.id))
            AND (earlier.state <> '{_DLQ}' OR COALESCE((
                SELECT s.ordering_policy FROM {_subs.name} AS s WHERE s.id = {row}.subscription_id
            ), '{_BLOCK}') = '{_BLOCK}')
    ) AND NOT EXISTS (
        SELECT 1 FROM {_box.name} AS unrelayed
        WHERE unrelayed.ordering_key = {row}.ordering_key
            AND unrelayed.ordering_key IS NOT NULL AND unrelayed.relayed_at IS NULL
            AND unrelayed.ordering_seq < {row}.ordering_seq
            AND (unrelayed.tenant = {row}.tenant OR (unrelayed.tenant IS NULL AND {row}.tenant IS NULL))
    ))"""  # noqa: S608 (table, column and state names, no input)


#: The next number of an ordering key of a tenant: an upsert whose row lock orders one key's
#: dispatches by commit (PostgreSQL and SQLite 3.35+ both take ON CONFLICT ... RETURNING). Bind
#: :func:`ordering_seq_params`.
NEXT_ORDERING_SEQ = text(
    f"""
INSERT INTO {_okeys.name} (tenant, ordering_key, last_seq) VALUES (:tenant, :key, 1)
ON CONFLICT (tenant, ordering_key) DO UPDATE SET last_seq = {_okeys.name}.last_seq + 1
RETURNING last_seq
"""  # noqa: S608
)


def ordering_seq_params(tenant: str | None, key: str) -> dict[str, str]:
    """:data:`NEXT_ORDERING_SEQ`'s parameters: no tenant is stored as ''."""
    return {"tenant": tenant or "", "key": key}


def _next_in_line_sql(sub: str, key: str) -> str:
    """The pending delivery of the line of subscription ``sub`` and key ``key`` (SQL expressions)
    that may go next, if any: at most one."""
    return f"""
SELECT d.id, d.attempt, d.next_attempt_at FROM {_dels.name} AS d
WHERE d.subscription_id = {sub} AND d.ordering_key = {key}
    AND d.ordering_key IS NOT NULL AND d.state IN ({_LINE_IN}) AND d.state = '{_PENDING}'
    AND {head_of_line_sql("d")}
ORDER BY d.ordering_seq, d.id
LIMIT 1
"""  # noqa: S608


#: The pending delivery of a (subscription, key) that may go next, if any: at most one.
NEXT_IN_LINE = text(_next_in_line_sql(":sub", ":key")).columns(
    _dels.c.id, _dels.c.attempt, _dels.c.next_attempt_at
)

#: The next delivery of each of several lines, given as two arrays (PostgreSQL): one round trip
#: for the lines that a batch of recorded outcomes released.
NEXT_IN_LINES = text(
    f"""
SELECT n.id, n.attempt, n.next_attempt_at, line.sub, line.key
FROM unnest(CAST(:subs AS varchar[]), CAST(:keys AS varchar[])) AS line(sub, key)
CROSS JOIN LATERAL ({_next_in_line_sql("line.sub", "line.key")}) AS n
"""  # noqa: S608
).columns(_dels.c.id, _dels.c.attempt, _dels.c.next_attempt_at, sub=String, key=String)

#: Which of an array of deliveries wait behind an earlier delivery of their key (PostgreSQL).
WAITING_AMONG = text(
    f"""
SELECT d.id FROM {_dels.name} AS d
WHERE d.id = ANY(CAST(:ids AS varchar[])) AND NOT {head_of_line_sql("d")}
"""  # noqa: S608
)


def blocked_keys_query(tenant: TenantScope = ALL_TENANTS) -> TextClause:
    """The keys of a subscription whose line is held by a dead-lettered head (the "block"
    policy), of the heads in ``tenant``'s scope; bind :func:`scope_params` too."""
    return _blocked_keys_query(_scope_kind(tenant))


@functools.cache
def _blocked_keys_query(kind: str) -> TextClause:
    scoped = {"all": "", "none": "AND d.tenant IS NULL", "tenant": "AND d.tenant = :tenant"}[kind]
    return text(
        f"""
SELECT d.ordering_key, d.id, COUNT(w.id) AS waiting FROM {_dels.name} AS d
LEFT JOIN {_dels.name} AS w ON w.subscription_id = d.subscription_id
    AND w.ordering_key = d.ordering_key AND w.state = '{_PENDING}'
WHERE d.subscription_id = :sub AND d.ordering_key IS NOT NULL AND d.state IN ({_LINE_IN})
    AND d.state = '{_DLQ}' AND {head_of_line_sql("d")} {scoped}
    AND COALESCE((SELECT s.ordering_policy FROM {_subs.name} AS s WHERE s.id = :sub), '{_BLOCK}') = '{_BLOCK}'
GROUP BY d.ordering_key, d.id
ORDER BY d.ordering_key
LIMIT :limit
"""  # noqa: S608
    )


#: The head-of-line condition on the deliveries table itself (the claim and the due scan).
AT_HEAD = text(head_of_line_sql(_dels.name))
#: Its negation: a delivery that waits behind an earlier one of its key.
NOT_AT_HEAD = text(f"NOT {head_of_line_sql(_dels.name)}")


# PostgreSQL's batch claim, a constant text so psycopg prepares it once per connection. The rows
# are found by primary key alone and locked in id order (two claims with overlapping ids never
# deadlock); whether each is still claimable is checked on the locked version. Putting the state
# and due time in the locking SELECT's WHERE (as the SQLAlchemy statement for SQLite does) let the
# planner, with statistics that had not yet seen a burst of new rows, read every PENDING row
# through the due index for each claim: tens of milliseconds per claim with a 20,000-row backlog.
CLAIM_MANY_SQL = f"""
WITH locked AS MATERIALIZED (
    SELECT id, state, next_attempt_at, subscription_id, ordering_key, ordering_seq, tenant
    FROM {_dels.name}
    WHERE id = ANY(CAST(:ids AS varchar[]))
    ORDER BY id
    FOR UPDATE
)
UPDATE {_dels.name} AS d SET
    state = '{_INFLIGHT}',
    lease_expires_at = :until,
    lease_token = :token,
    max_attempts = :max_attempts
FROM locked
WHERE d.id = locked.id AND locked.state = '{_PENDING}'
    AND (locked.next_attempt_at IS NULL OR locked.next_attempt_at <= :now)
    AND {head_of_line_sql("locked")}
RETURNING {", ".join(f'd."{column.name}"' for column in _dels.c)}
"""  # noqa: S608 (table and column names, no input)
CLAIM_MANY = text(CLAIM_MANY_SQL).columns(*_dels.c)

# The next attempt and due time of an array of deliveries, for the sweeper (PostgreSQL).
SCHEDULES_BY_IDS = text(
    f"SELECT id, attempt, next_attempt_at FROM {_dels.name} WHERE id = ANY(CAST(:ids AS varchar[]))"  # noqa: S608
).columns(_dels.c.id, _dels.c.attempt, _dels.c.next_attempt_at)

# The subscriptions of an array of ids, for the claim (PostgreSQL).
SUBSCRIPTIONS_BY_IDS = text(
    f"""
SELECT {", ".join(f'"{column.name}"' for column in _subs.c)} FROM {_subs.name}
WHERE id = ANY(CAST(:ids AS varchar[]))
"""  # noqa: S608 (table and column names, no input)
).columns(*_subs.c)


@functools.cache
def attempts_per_minute_query(postgresql: bool) -> Executable:
    """attempts_per_minute's statement, built once per dialect: grouped in the database, since an
    hour of a busy worker is over a million attempts, which must not travel to Python; the
    started_at index bounds the scan to the window (``since`` to ``until``)."""
    if postgresql:
        minute: Any = func.date_trunc("minute", _atts.c.started_at)
    else:
        minute = func.strftime("%Y-%m-%d %H:%M:00", _atts.c.started_at)
    ok = case((_atts.c.response_status.between(200, 299), 1), else_=0)
    return (
        select(minute.label("minute"), func.sum(ok), func.count())
        .where(
            _atts.c.started_at >= bindparam("since", type_=_atts.c.started_at.type),
            _atts.c.started_at < bindparam("until", type_=_atts.c.started_at.type),
        )
        .group_by(minute)
        .order_by(minute)
    )


def capped_stats_query(tenant: TenantScope = ALL_TENANTS) -> Executable:
    """:func:`_capped_stats_query` for ``tenant``'s scope (bind :func:`scope_params` too): one
    tenant's branches walk the (tenant, state, timestamp, id) index instead."""
    return _capped_stats_query(_scope_kind(tenant))


@functools.cache
def _capped_stats_query(kind: str) -> Executable:
    """delivery_stats' statement with a cap: for each state, its first ``cap_read`` rows in the
    order of the (state, timestamp, id) index (the longest-waiting for pending and in-flight rows,
    the newest for the others), grouped by subscription. Each state's branch is one bounded walk
    of the index (index-only on PostgreSQL, which keeps the subscription and creation time in it),
    so the cost never grows with the history. ``counted`` and ``oldest`` cover the first ``cap``
    rows; ``read`` above ``cap`` says the state has more. States are literals, as in
    :data:`~._schema.PENDING_ROWS`, so each branch's plan is the index's."""
    branches = []
    for state in DeliveryState:
        waiting = state.value in WAITING_STATES
        order = (_dels.c.timestamp, _dels.c.id) if waiting else (_dels.c.timestamp.desc(), _dels.c.id.desc())
        branch = (
            select(
                _dels.c.subscription_id,
                _dels.c.state,
                _dels.c.created_at,
                func.row_number().over(order_by=order).label("position"),
            )
            .where(_dels.c.state == literal_column(f"'{state.value}'"), *_in_scope(_dels.c.tenant, kind))
            .order_by(*order)
            .limit(bindparam("cap_read", type_=Integer))
            .subquery()
        )
        branches.append(select(branch))
    read = union_all(*branches).subquery()
    kept = read.c.position <= bindparam("cap", type_=Integer)
    return select(
        read.c.subscription_id,
        read.c.state,
        func.sum(case((kept, 1), else_=0)).label("counted"),
        func.min(case((kept, read.c.created_at))).label("oldest"),
        func.max(read.c.position).label("read"),
    ).group_by(read.c.subscription_id, read.c.state)


def _scope_kind(tenant: TenantScope) -> str:
    """Which statement a scope takes: every row, the untenanted rows, or one tenant's (bound)."""
    return "all" if tenant is ALL_TENANTS else "none" if tenant is None else "tenant"


def scope_params(tenant: TenantScope) -> dict[str, str]:
    """The bound parameters of a statement built for ``tenant``'s scope (:func:`under_keys`)."""
    return {"tenant": tenant} if isinstance(tenant, str) else {}


def _in_scope(column: Any, kind: str) -> list[Any]:
    if kind == "all":
        return []
    return [column.is_(None)] if kind == "none" else [column == bindparam("tenant", type_=String)]


@functools.cache
def _under_keys(dialect: str, kind: str) -> Executable:
    # SQLite: an expanding IN, one index probe per key. PostgreSQL: one array parameter, so the
    # statement text never changes with the number of keys and psycopg keeps it prepared (the
    # expanding IN cost about 40 us more per dispatch).
    if dialect == "postgresql":
        keyed = _keys.c.pattern_key == any_(bindparam("keys", type_=postgresql.ARRAY(String)))
    else:
        keyed = _keys.c.pattern_key.in_(bindparam("keys", expanding=True))
    # The key rows' tenant (a copy) narrows the lookup to one tenant's keys, and the subscription's
    # own has the last word.
    filed = select(_keys.c.subscription_id).where(keyed, *_in_scope(_keys.c.tenant, kind))
    return select(_subs).where(_subs.c.id.in_(filed), *_in_scope(_subs.c.tenant, kind))


def under_keys(dialect: str, tenant: TenantScope = ALL_TENANTS) -> Executable:
    """The subscriptions of ``tenant``'s scope filed under any of the ``keys`` (a bound list),
    built once per dialect and kind of scope; bind :func:`scope_params` too."""
    return _under_keys(dialect, _scope_kind(tenant))


INSERT_DELIVERY = insert(_dels)

# -- finish_attempt's statements ----------------------------------------------------------------
# Built once, with bind parameters: building and cache-keying a statement on every call cost about
# as much CPU as sending it. Parameter names carry a prefix so none is taken for a column name.

ATTEMPT_COLUMNS = tuple(f.name for f in dataclasses.fields(DeliveryAttempt))

#: The attempt row, where it cannot ride in the delivery's UPDATE (SQLite).
APPEND_ATTEMPT = insert(_atts).values({name: bindparam(f"a_{name}") for name in ATTEMPT_COLUMNS})

# A success resets the count only when it is not zero already: busy subscriptions must not
# serialise on their row.
RESET_FAILURES = (
    update(_subs)
    .where(_subs.c.id == bindparam("p_sub"), _subs.c.consecutive_failures != 0)
    .values(consecutive_failures=0, updated_at=bindparam("p_now"))
)

COUNT_FAILURE = (
    update(_subs)
    .where(_subs.c.id == bindparam("p_sub"))
    .values(consecutive_failures=_subs.c.consecutive_failures + 1, updated_at=bindparam("p_now"))
    .returning(_subs.c.consecutive_failures)
)


@functools.cache
def finish_statement(*, headers: bool, attempt: bool, fold: bool) -> Executable:
    """The UPDATE that records an outcome if the lease is still held, returning the delivery's
    subscription id and that subscription's failure count (``None`` if it is gone).

    The count is read in the same statement so that a success can skip the reset when there is
    nothing to reset; a failure counted by a call that returned before this one is visible to it.
    ``headers``: the request headers are written; ``attempt``: the response columns are written;
    ``fold``: the attempt row is inserted by the same statement, in a CTE (PostgreSQL only), and
    only if the UPDATE found the lease.
    """
    columns = ["state", "attempt", "next_attempt_at", "last_error", "timestamp"]
    if headers:
        columns.append("request_headers")
    if attempt:
        columns += ["response_status", "response_body", "elapsed_ms"]
    values: dict[str, Any] = {name: bindparam(f"d_{name}") for name in columns}
    values.update(lease_expires_at=None, lease_token=None)
    failures = (
        select(_subs.c.consecutive_failures)
        .where(_subs.c.id == _dels.c.subscription_id)
        .scalar_subquery()
        .label("failures")
    )
    recorded = (
        update(_dels)
        .where(
            _dels.c.id == bindparam("p_id"),
            _dels.c.state == _INFLIGHT,
            _dels.c.lease_token == bindparam("p_token"),
        )
        .values(values)
        .returning(_dels.c.subscription_id, failures)
    )
    if not fold:
        return recorded
    updated = recorded.cte("recorded")
    row = select(*(bindparam(f"a_{name}", type_=_atts.c[name].type) for name in ATTEMPT_COLUMNS))
    appended = insert(_atts).from_select(list(ATTEMPT_COLUMNS), row.select_from(updated))
    return select(updated.c.subscription_id, updated.c.failures).add_cte(appended.cte("appended"))


# -- finish_attempts' statement (PostgreSQL) -----------------------------------------------------
# One statement records a batch: the outcomes arrive as one array per column, unnest() turns them
# into rows, the UPDATE keeps only those whose lease is still held, and the attempt rows are
# inserted for those only. Its text never changes with the batch's size, so psycopg prepares it
# once per connection. Written out rather than composed in Core: unnest's column list and the
# casts are PostgreSQL's own.

FINISH_MANY = text(
    f"""
WITH v AS (
    SELECT * FROM unnest(
        CAST(:ids AS varchar[]), CAST(:tokens AS varchar[]), CAST(:states AS varchar[]),
        CAST(:attempts AS integer[]), CAST(:next_attempt_at AS timestamp[]),
        CAST(:last_errors AS text[]), CAST(:timestamps AS timestamp[]), CAST(:headers AS text[]),
        CAST(:sent AS boolean[]), CAST(:a_attempts AS integer[]), CAST(:a_started_at AS timestamp[]),
        CAST(:a_status AS integer[]), CAST(:a_body AS text[]), CAST(:a_elapsed AS integer[]),
        CAST(:a_error AS text[])
    ) AS v(id, token, state, attempt, next_attempt_at, last_error, ts, headers, sent,
           a_attempt, a_started_at, a_status, a_body, a_elapsed, a_error)
), recorded AS (
    UPDATE {_dels.name} AS d SET
        state = v.state,
        attempt = v.attempt,
        next_attempt_at = v.next_attempt_at,
        last_error = v.last_error,
        "timestamp" = v.ts,
        request_headers = COALESCE(CAST(v.headers AS json), d.request_headers),
        response_status = CASE WHEN v.sent THEN v.a_status ELSE d.response_status END,
        response_body = CASE WHEN v.sent THEN v.a_body ELSE d.response_body END,
        elapsed_ms = CASE WHEN v.sent THEN v.a_elapsed ELSE d.elapsed_ms END,
        lease_expires_at = NULL,
        lease_token = NULL
    FROM v
    WHERE d.id = v.id AND d.state = '{_INFLIGHT}' AND d.lease_token = v.token
    RETURNING d.id, d.subscription_id,
        (SELECT s.consecutive_failures FROM {_subs.name} AS s WHERE s.id = d.subscription_id)
        AS failures
), appended AS (
    INSERT INTO {_atts.name}
        (delivery_id, attempt, started_at, response_status, response_body, elapsed_ms, error)
    SELECT v.id, v.a_attempt, v.a_started_at, v.a_status, v.a_body, v.a_elapsed, v.a_error
    FROM v JOIN recorded ON recorded.id = v.id
    WHERE v.sent
)
SELECT id, subscription_id, failures FROM recorded
"""  # noqa: S608
)


def naive_utc(value: datetime | None) -> datetime | None:
    """A datetime as the tables keep it (naive UTC; see :class:`UTCDateTime`)."""
    if value is None or value.tzinfo is None:
        return value
    return value.astimezone(timezone.utc).replace(tzinfo=None)


FINISH_MANY_COLUMNS = [
    "ids",
    "tokens",
    "states",
    "attempts",
    "next_attempt_at",
    "last_errors",
    "timestamps",
    "headers",
    "sent",
    "a_attempts",
    "a_started_at",
    "a_status",
    "a_body",
    "a_elapsed",
    "a_error",
]


def finish_many_params(outcomes: Sequence[Outcome]) -> dict[str, list[Any]]:
    """:data:`FINISH_MANY`'s parameters: one list per column, one item per outcome."""
    columns: dict[str, list[Any]] = {name: [] for name in FINISH_MANY_COLUMNS}
    for outcome in outcomes:
        result, attempt = outcome.result, outcome.result.attempt
        columns["ids"].append(outcome.delivery_id)
        columns["tokens"].append(outcome.lease_token)
        columns["states"].append(DeliveryState(result.state).value)
        columns["attempts"].append(result.attempt_number)
        columns["next_attempt_at"].append(naive_utc(result.next_attempt_at))
        columns["last_errors"].append(result.last_error)
        columns["timestamps"].append(naive_utc(result.timestamp))
        # Empty headers keep the stored ones, as finish_attempt does.
        headers = result.request_headers
        columns["headers"].append(json.dumps(dict(headers)) if headers else None)
        columns["sent"].append(attempt is not None)
        columns["a_attempts"].append(attempt.attempt if attempt else None)
        columns["a_started_at"].append(naive_utc(attempt.started_at) if attempt else None)
        columns["a_status"].append(attempt.response_status if attempt else None)
        columns["a_body"].append(attempt.response_body if attempt else None)
        columns["a_elapsed"].append(attempt.elapsed_ms if attempt else None)
        columns["a_error"].append(attempt.error if attempt else None)
    return columns
