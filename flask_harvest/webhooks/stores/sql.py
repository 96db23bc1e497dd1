"""A durable store on SQLAlchemy: subscriptions, delivery logs and every attempt, in SQL tables.

Works on PostgreSQL (psycopg 3) and SQLite 3.35 or later. Every method that moves a delivery is one
short transaction built from conditional ``UPDATE ... RETURNING`` statements, so two workers (or
two processes, or two replicas) calling it at once never both win, and no lock is held while a
worker talks to a receiver.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import uuid
from collections.abc import Callable, Iterator, Sequence
from datetime import datetime, timedelta, timezone
from typing import Any

from sqlalchemy import (
    ColumnElement,
    Connection,
    Engine,
    Integer,
    Row,
    Select,
    String,
    and_,
    any_,
    bindparam,
    case,
    delete,
    func,
    insert,
    literal,
    literal_column,
    or_,
    select,
    text,
    union_all,
    update,
)
from sqlalchemy.dialects import postgresql
from sqlalchemy.sql import Executable

from ..._input import id_problem
from ..._sql import SqlDatabase, after_position
from ...errors import (
    DeliveryNotFoundError,
    DuplicateSubscriptionError,
    InvalidStateError,
    SubscriptionNotFoundError,
)
from ..models import (
    WAITING_STATES,
    AttemptResult,
    Claim,
    DeliveryAttempt,
    DeliveryLog,
    DeliveryState,
    DeliveryStats,
    DeliverySummary,
    SubscriptionChanges,
    SubscriptionEffect,
    WebhookSubscription,
    WebhookSubscriptionStatus,
    utcnow,
    validate_datetime,
    validate_secret,
)
from ..topic_index import topic_keys
from ..topics import topic_matches
from ._schema import (
    INFLIGHT_ROWS,
    PENDING_ROWS,
    TROUBLED_ROWS,
    WEBHOOK_TABLES,
    UTCDateTime,
    attempts_table,
    deliveries_table,
    delivery_values,
    metadata,
    row_to_attempt,
    row_to_delivery,
    row_to_subscription,
    schema_sql,
    subscription_column_values,
    subscription_topics_table,
    subscription_values,
    subscriptions_table,
    topic_rows,
)
from .base import (
    DeliverySchedule,
    DlqCursor,
    OutboundWebhookHandler,
    Outcome,
    Recorded,
    StoreCapabilities,
    fold_stats,
)

_SCHEMA_HINT = "create the tables with ensure_schema() or apply WEBHOOK_SCHEMA_SQL"

__all__ = [
    "WEBHOOK_SCHEMA_SQL",
    "SqlOutboundWebhookStore",
    "UTCDateTime",
    "attempts_table",
    "deliveries_table",
    "metadata",
    "schema_sql",
    "subscription_topics_table",
    "subscriptions_table",
]

#: The PostgreSQL DDL of the store's tables, to apply before a deploy instead of ``ensure_schema``.
WEBHOOK_SCHEMA_SQL = schema_sql("postgresql")

# Topics per lookup of subscriptions_for_topics: at most 127 keys each, so a statement binds at
# most a few thousand keys, under SQLite's bound-variable limit (32,766).
_TOPICS_PER_LOOKUP = 20

# Rows per statement: 500 rows of ~17 columns stay far below SQLite's bound-variable limit.
_CHUNK = 500

_subs = subscriptions_table
_keys = subscription_topics_table
_dels = deliveries_table
_atts = attempts_table

_ACTIVE = WebhookSubscriptionStatus.ACTIVE.value
_PENDING = DeliveryState.PENDING.value
_INFLIGHT = DeliveryState.INFLIGHT.value
_DLQ = DeliveryState.DLQ.value


def _chunks(items: Sequence[Any], size: int = _CHUNK) -> Iterator[Sequence[Any]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


#: A stored state's value to its member, without the enum's lookup per row.
_STATES = {state.value: state for state in DeliveryState}


def _listing(
    query: Select[Any],
    limit: int,
    before: DlqCursor | None,
    state: DeliveryState | None,
    subscription_id: str | None,
    topic: str | None,
    since: datetime | None,
    until: datetime | None,
) -> Select[Any] | None:
    """``query`` (of the deliveries table) narrowed to the delivery listing's page, newest first by
    ``(timestamp, id)``; ``None`` when a filter cannot match a stored row."""
    if any(key is not None and id_problem(key) is not None for key in (subscription_id, topic)):
        return None
    if state is not None:
        query = query.where(_dels.c.state == state.value)
    if since is not None:
        query = query.where(_dels.c.timestamp >= since)
    if until is not None:
        query = query.where(_dels.c.timestamp < until)
    if subscription_id is not None:
        query = query.where(_dels.c.subscription_id == subscription_id)
    if topic is not None:
        query = query.where(_dels.c.topic == topic)
    if before is not None:
        # (timestamp, id) < before, spelled out so every backend can use the index for it.
        stamp, last_id = before
        query = query.where(
            or_(_dels.c.timestamp < stamp, and_(_dels.c.timestamp == stamp, _dels.c.id < last_id))
        )
    return query.order_by(_dels.c.timestamp.desc(), _dels.c.id.desc()).limit(limit)


class SqlOutboundWebhookStore(OutboundWebhookHandler):
    """Subscriptions and delivery logs in the app database, shared by every process and replica.

    Call :meth:`ensure_schema` at startup, or apply :data:`WEBHOOK_SCHEMA_SQL` (or an Alembic
    migration generated from :data:`metadata`) before the deploy. The ``secret`` column holds each
    signing secret in clear: limit read access to it. Nothing deletes delivery logs for you; call
    :meth:`purge_deliveries_before` on a schedule. Unlike the in-memory store, every attempt is
    kept (:meth:`list_attempts`).

    :param engine: a SQLAlchemy engine on PostgreSQL or SQLite (a file database, since the
        workers' threads must all see the same one).
    """

    def __init__(self, engine: Engine) -> None:
        self.db = SqlDatabase(engine, owner="SqlOutboundWebhookStore", hint=_SCHEMA_HINT)
        self.engine = engine
        self._under_keys = _UNDER_KEYS[engine.dialect.name]
        # Only PostgreSQL has data-modifying CTEs; on SQLite a statement is an in-process call.
        self._fold_attempt_insert = engine.dialect.name == "postgresql"
        self._custom_plans = engine.dialect.name == "postgresql"

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.engine.url.render_as_string(hide_password=True)}>"

    @property
    def capabilities(self) -> StoreCapabilities:
        return StoreCapabilities(transactions=True, engine=self.engine, schema=True)

    def ensure_schema(self) -> None:
        """Create the webhook tables and indexes where they do not exist yet, and file every
        subscription missing from the topic index under its keys. Indexes of earlier versions
        (:data:`~._schema.RETIRED_INDEXES`) stay for their processes; the DDL drops them.

        The second part upgrades a database from before the index (0.x: see the upgrade notes in
        the stores guide); it is idempotent, and on an up-to-date database one indexed query.
        """
        self.db.create_tables(WEBHOOK_TABLES, what="the webhook tables")
        self.index_unindexed_subscriptions()

    def index_unindexed_subscriptions(self) -> int:
        """File every subscription that has no row in the topic index under its pattern keys, in
        one transaction; return how many subscriptions that was.

        Every subscription has at least one pattern, so one without a row was written by a version
        before the index. Safe to run at any time and from several processes at once.
        """
        unindexed = select(_subs.c.id, _subs.c.event_topics).where(
            ~select(_keys.c.subscription_id).where(_keys.c.subscription_id == _subs.c.id).exists()
        )
        insert_keys = self.db.insert(_keys).on_conflict_do_nothing()
        with self.db.transaction("index the subscriptions' topics") as conn:
            found = conn.execute(unindexed).all()
            rows = [key for row in found for key in topic_rows(row.id, row.event_topics)]
            for chunk in _chunks(rows):
                conn.execute(insert_keys, list(chunk))
        return len(found)

    # -- subscriptions -------------------------------------------------------------------------

    def add_subscription(self, subscription: WebhookSubscription) -> WebhookSubscription:
        # ON CONFLICT on the id only: any other integrity error is a StoreError, never reported
        # as a taken id.
        statement = (
            self.db.insert(_subs)
            .values(subscription_values(subscription))
            .on_conflict_do_nothing(index_elements=[_subs.c.id])
            .returning(_subs.c.id)
        )
        with self.db.transaction("add a subscription", secrets=[subscription.secret]) as conn:
            inserted = conn.execute(statement).first()
            if inserted is not None:
                conn.execute(insert(_keys), topic_rows(subscription.id, subscription.event_topics))
        if inserted is None:
            raise DuplicateSubscriptionError(subscription.id)
        return subscription

    def get_subscription(self, subscription_id: str) -> WebhookSubscription | None:
        if id_problem(subscription_id) is not None:
            return None
        with self.db.transaction("read a subscription") as conn:
            row = conn.execute(select(_subs).where(_subs.c.id == subscription_id)).first()
        return row_to_subscription(row) if row is not None else None

    def subscriptions_for_topic(self, topic: str) -> list[WebhookSubscription]:
        if id_problem(topic) is not None:
            return []
        with self.db.transaction("read the subscriptions of a topic") as conn:
            return self._subscriptions_for_topic(conn, topic)

    def subscriptions_for_topics(self, topics: Sequence[str]) -> dict[str, list[WebhookSubscription]]:
        unique = list(dict.fromkeys(topics))
        found: dict[str, list[WebhookSubscription]] = {topic: [] for topic in unique}
        stored = [topic for topic in unique if id_problem(topic) is None]
        with self.db.transaction("read the subscriptions of topics") as conn:
            # One lookup for a chunk of topics: the union of their candidate keys.
            for chunk in _chunks(stored, _TOPICS_PER_LOOKUP):
                keys = list(dict.fromkeys(key for topic in chunk for key in topic_keys(topic)))
                rows = conn.execute(self._under_keys, {"keys": keys}).all()
                subscriptions = [row_to_subscription(row) for row in rows]
                for topic in chunk:
                    found[topic] = [s for s in subscriptions if s.matches(topic)]
        return found

    def _subscriptions_for_topic(self, conn: Connection, topic: str) -> list[WebhookSubscription]:
        # Only the subscriptions filed under one of the topic's candidate keys: an indexed lookup
        # whose cost does not grow with the number of subscriptions. A long pattern's key selects
        # a superset, so the patterns are still matched, on the raw rows, so no model is built
        # for a row that does not match.
        rows = conn.execute(self._under_keys, {"keys": list(topic_keys(topic))}).all()
        return [
            row_to_subscription(row)
            for row in rows
            if any(topic_matches(pattern, topic) for pattern in row.event_topics)
        ]

    def list_subscriptions(self) -> list[WebhookSubscription]:
        with self.db.read("list subscriptions") as conn:
            rows = conn.execute(select(_subs).order_by(_subs.c.created_at, _subs.c.id)).all()
        return [row_to_subscription(row) for row in rows]

    def list_subscriptions_page(
        self,
        *,
        limit: int,
        after: tuple[datetime, str] | None = None,
        status: WebhookSubscriptionStatus | None = None,
        topic: str | None = None,
    ) -> list[WebhookSubscription]:
        if topic is not None and id_problem(topic) is not None:
            return []
        query = select(_subs).order_by(_subs.c.created_at, _subs.c.id).limit(limit)
        if status is not None:
            query = query.where(_subs.c.status == status.value)
        if topic is not None:
            # Only the subscriptions filed under one of the topic's candidate keys (the topic index).
            filed = select(_keys.c.subscription_id).where(_keys.c.pattern_key.in_(topic_keys(topic)))
            query = query.where(_subs.c.id.in_(filed))
        found: list[WebhookSubscription] = []
        with self.db.transaction("list subscriptions") as conn:
            while True:
                page = query.where(after_position(_subs.c.created_at, _subs.c.id, after)) if after else query
                rows = conn.execute(page).all()
                found.extend(
                    row_to_subscription(row)
                    for row in rows
                    if topic is None or any(topic_matches(pattern, topic) for pattern in row.event_topics)
                )
                # A long pattern's key selects a superset that the matcher narrows: a page short
                # of matches reads on until it is full or the rows run out.
                if len(found) >= limit or len(rows) < limit:
                    return found[:limit]
                after = (rows[-1].created_at, rows[-1].id)

    def troubled_subscriptions(self, *, limit: int) -> list[WebhookSubscription]:
        query = (
            select(_subs)
            .where(TROUBLED_ROWS)
            .order_by(_subs.c.consecutive_failures.desc(), _subs.c.created_at, _subs.c.id)
            .limit(limit)
        )
        with self.db.read("list troubled subscriptions") as conn:
            return [row_to_subscription(row) for row in conn.execute(query)]

    def update_subscription(self, subscription_id: str, changes: SubscriptionChanges) -> WebhookSubscription:
        values = {**subscription_column_values(changes.values()), "updated_at": utcnow()}
        return self._change(
            subscription_id, "update a subscription", values, secrets=(), topics=changes.event_topics
        )

    def rotate_secret(
        self, subscription_id: str, secret: str, *, previous_expires_at: datetime
    ) -> WebhookSubscription:
        validate_secret(secret)
        validate_datetime(previous_expires_at, "previous_secret_expires_at")
        # One UPDATE: the right-hand side reads the row as it was, so the old secret moves over.
        values = {
            "previous_secret": _subs.c.secret,
            "secret": secret,
            "previous_secret_expires_at": previous_expires_at,
            "updated_at": utcnow(),
        }
        return self._change(subscription_id, "rotate a secret", values, secrets=(secret,))

    def _change(
        self,
        subscription_id: str,
        action: str,
        values: dict[str, Any],
        *,
        secrets: Sequence[str],
        topics: Sequence[str] | None = None,
    ) -> WebhookSubscription:
        """One UPDATE of only the columns in ``values``, and new index keys if ``topics`` is set
        (in the same transaction); return the row as it now is."""
        with self.db.transaction(action, secrets=secrets) as conn:
            row = conn.execute(
                update(_subs).where(_subs.c.id == subscription_id).values(values).returning(*_subs.c)
            ).first()
            if row is not None and topics is not None:
                # The UPDATE holds the row's lock, so concurrent edits rewrite the keys in turn.
                conn.execute(delete(_keys).where(_keys.c.subscription_id == subscription_id))
                conn.execute(insert(_keys), topic_rows(subscription_id, topics))
        if row is None:
            raise SubscriptionNotFoundError(subscription_id)
        return row_to_subscription(row)

    def remove_subscription(self, subscription_id: str) -> bool:
        if id_problem(subscription_id) is not None:
            return False
        with self.db.transaction("remove a subscription") as conn:
            row = conn.execute(
                delete(_subs).where(_subs.c.id == subscription_id).returning(_subs.c.id)
            ).first()
            conn.execute(delete(_keys).where(_keys.c.subscription_id == subscription_id))
        return row is not None

    # -- delivery logs -------------------------------------------------------------------------

    def log_deliveries(self, deliveries: Sequence[DeliveryLog]) -> list[str]:
        if not deliveries:
            return []
        with self.db.transaction("log deliveries") as conn:
            return self._insert_deliveries(conn, deliveries)

    def log_deliveries_for_topic(
        self, topic: str, build: Callable[[WebhookSubscription], DeliveryLog]
    ) -> list[tuple[WebhookSubscription, DeliveryLog]]:
        # One transaction, and a plain INSERT: the ids are new, so neither ON CONFLICT nor
        # RETURNING (which only the outbox relay needs) is worth its cost here. An executemany of
        # one prebuilt statement: psycopg pipelines the rows in one round trip, and building a
        # multi-row VALUES statement per call measured 2 to 3 times slower in Python.
        with self.db.transaction("log deliveries") as conn:
            pairs = [(s, build(s)) for s in self._subscriptions_for_topic(conn, topic)]
            if pairs:
                conn.execute(_INSERT_DELIVERY, [delivery_values(delivery) for _, delivery in pairs])
        return pairs

    def _insert_deliveries(self, conn: Connection, deliveries: Sequence[DeliveryLog]) -> list[str]:
        """Insert on ``conn`` (the caller's transaction); return the ids that were new."""
        rows = list({d.id: delivery_values(d) for d in deliveries}.values())
        stmt = self.db.insert(_dels).on_conflict_do_nothing(index_elements=[_dels.c.id]).returning(_dels.c.id)
        # SQLAlchemy's "insertmanyvalues" sends this as multi-row INSERTs of _CHUNK rows each.
        result = conn.execution_options(insertmanyvalues_page_size=_CHUNK).execute(stmt, rows)
        return list(result.scalars())

    def get_delivery(self, delivery_id: str) -> DeliveryLog | None:
        if id_problem(delivery_id) is not None:
            return None
        with self.db.transaction("read a delivery") as conn:
            row = conn.execute(select(_dels).where(_dels.c.id == delivery_id)).first()
        return row_to_delivery(row) if row is not None else None

    def get_deliveries(self, delivery_ids: Sequence[str]) -> list[DeliveryLog]:
        unique = [i for i in dict.fromkeys(delivery_ids) if id_problem(i) is None]
        found: list[DeliveryLog] = []
        with self.db.transaction("read deliveries") as conn:
            for chunk in _chunks(unique):
                rows = conn.execute(select(_dels).where(_dels.c.id.in_(chunk))).all()
                found.extend(row_to_delivery(row) for row in rows)
        return found

    def get_schedules(self, delivery_ids: Sequence[str]) -> list[DeliverySchedule]:
        unique = [i for i in dict.fromkeys(delivery_ids) if id_problem(i) is None]
        found: list[DeliverySchedule] = []
        columns = (_dels.c.id, _dels.c.attempt, _dels.c.next_attempt_at)
        with self.db.transaction("read delivery schedules") as conn:
            for chunk in _chunks(unique):
                # PostgreSQL: one array parameter, so psycopg neither rewrites a statement of
                # 500 placeholders each time nor keeps one such statement per chunk size.
                rows = (
                    conn.execute(_SCHEDULES_BY_IDS, {"ids": list(chunk)})
                    if self._fold_attempt_insert
                    else conn.execute(select(*columns).where(_dels.c.id.in_(chunk)))
                )
                found.extend(DeliverySchedule(*row) for row in rows)
        return found

    def list_attempts(self, delivery_id: str) -> list[DeliveryAttempt]:
        if id_problem(delivery_id) is not None:
            return []
        with self.db.transaction("list a delivery's attempts") as conn:
            rows = conn.execute(
                select(_atts).where(_atts.c.delivery_id == delivery_id).order_by(_atts.c.id)
            ).all()
        return [row_to_attempt(row) for row in rows]

    def list_deliveries(
        self,
        *,
        limit: int = 100,
        before: DlqCursor | None = None,
        state: DeliveryState | None = None,
        subscription_id: str | None = None,
        topic: str | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
    ) -> list[DeliveryLog]:
        query = _listing(select(_dels), limit, before, state, subscription_id, topic, since, until)
        custom = subscription_id is not None or topic is not None
        return [row_to_delivery(row) for row in self._list(query, custom)] if query is not None else []

    def list_delivery_summaries(
        self,
        *,
        limit: int = 100,
        before: DlqCursor | None = None,
        state: DeliveryState | None = None,
        subscription_id: str | None = None,
        topic: str | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
    ) -> list[DeliverySummary]:
        # Only the listed columns: the payload and the response body can be kilobytes a row.
        columns = select(*(_dels.c[name] for name in DeliverySummary._fields))
        query = _listing(columns, limit, before, state, subscription_id, topic, since, until)
        if query is None:
            return []
        return [
            DeliverySummary(id_, sub, topic_, _STATES[state_], attempt, max_attempts, status, error, stamp)
            for id_, sub, topic_, state_, attempt, max_attempts, status, error, stamp in self._list(
                query, subscription_id is not None or topic is not None
            )
        ]

    def _list(self, query: Select[Any], by_key: bool) -> Sequence[Any]:
        if not (by_key and self._custom_plans):
            with self.db.read("list deliveries") as conn:
                return conn.execute(query).all()
        with self.db.transaction("list deliveries") as conn:
            # Planned for these values, not as a prepared statement's generic plan: a generic
            # plan cannot tell a rare topic or a new subscription from a common one, and for
            # them walked the whole time index (0.8 s at a million rows) instead of theirs. The
            # other filters (state, time) walk the same index whatever their values.
            conn.exec_driver_sql("SET LOCAL plan_cache_mode = force_custom_plan")
            return conn.execute(query).all()

    def attempts_per_minute(self, *, since: datetime, until: datetime) -> list[tuple[datetime, int, int]]:
        query = _attempts_per_minute(self.engine.dialect.name == "postgresql")
        with self.db.read("count attempts per minute") as conn:
            rows = conn.execute(query, {"since": since, "until": until}).all()
        result = []
        for when, good, total in rows:
            stamp = datetime.fromisoformat(when) if isinstance(when, str) else when
            stamp = stamp.replace(tzinfo=timezone.utc) if stamp.tzinfo is None else stamp
            result.append((stamp, int(good or 0), int(total) - int(good or 0)))
        return result

    def delivery_stats(self, *, cap: int | None = None) -> tuple[DeliveryStats, dict[str, DeliveryStats]]:
        if cap is None:
            # Every row: a grouped scan of the whole table (tests, small tables).
            query = select(
                _dels.c.subscription_id, _dels.c.state, func.count(), func.min(_dels.c.created_at)
            ).group_by(_dels.c.subscription_id, _dels.c.state)
            with self.db.transaction("count deliveries") as conn:
                groups = [(row[0], row[1], int(row[2]), row[3]) for row in conn.execute(query)]
            return fold_stats(groups)
        check_cap = int(cap)
        if check_cap < 1:
            raise ValueError("cap must be at least 1")
        with self.db.read("count deliveries") as conn:
            rows = conn.execute(_capped_stats(), {"cap": check_cap, "cap_read": check_cap + 1}).all()
        # A group whose only row is the one past the cap was read to learn that there is more.
        groups = [
            (row.subscription_id, row.state, int(row.counted), row.oldest) for row in rows if row.counted
        ]
        capped = {row.state for row in rows if row.read > check_cap}
        return fold_stats(groups, cap=check_cap, capped=capped)

    def queue_gauges(self, *, now: datetime, dlq_limit: int) -> tuple[int, datetime | None]:
        # Both read the (state, ...) indexes: the count stops at dlq_limit rows, the minimum is the
        # first entry of (state, next_attempt_at); a scrape never scans the whole table.
        dlq_rows = (
            select(literal(1)).select_from(_dels).where(_dels.c.state == _DLQ).limit(dlq_limit).subquery()
        )
        oldest_due = select(func.min(_dels.c.next_attempt_at)).where(
            PENDING_ROWS, _dels.c.next_attempt_at <= now
        )
        with self.db.transaction("read the queue gauges") as conn:
            dlq = int(conn.execute(select(func.count()).select_from(dlq_rows)).scalar_one())
            due_at = conn.execute(oldest_due).scalar()
        return dlq, due_at

    def purge_deliveries_before(self, cutoff: datetime) -> int:
        with self.db.transaction("purge delivered logs") as conn:
            purged = list(
                conn.execute(
                    delete(_dels)
                    .where(_dels.c.state == DeliveryState.DELIVERED.value, _dels.c.timestamp < cutoff)
                    .returning(_dels.c.id)
                ).scalars()
            )
            for chunk in _chunks(purged):
                conn.execute(delete(_atts).where(_atts.c.delivery_id.in_(chunk)))
        return len(purged)

    # -- the delivery pipeline -----------------------------------------------------------------

    def claim_delivery(
        self,
        delivery_id: str,
        *,
        now: datetime,
        lease_seconds: float,
        max_attempts: int,
    ) -> Claim | None:
        token = uuid.uuid4().hex
        with self.db.transaction("claim a delivery") as conn:
            rows = conn.execute(
                _lease(_dels.c.id == delivery_id, now, lease_seconds, token, max_attempts)
            ).all()
            claims = _with_subscriptions(conn, rows, token)
        return claims[0] if claims else None

    def claim_deliveries(
        self,
        delivery_ids: Sequence[str],
        *,
        now: datetime,
        lease_seconds: float,
        max_attempts: int,
    ) -> list[Claim]:
        # Sorted so that every caller locks rows in the same order (see below), across chunks too.
        unique = sorted(set(delivery_ids))
        if not unique:
            return []
        token = uuid.uuid4().hex
        rows: list[Row[Any]] = []
        with self.db.transaction("claim deliveries") as conn:
            if self._fold_attempt_insert:  # PostgreSQL: one prepared statement per chunk
                until = now + timedelta(seconds=lease_seconds)
                for chunk in _chunks(unique):
                    params = {
                        "ids": list(chunk),
                        "now": _naive_utc(now),
                        "until": _naive_utc(until),
                        "token": token,
                        "max_attempts": max_attempts,
                    }
                    rows.extend(conn.execute(_CLAIM_MANY, params).all())
                return _with_subscriptions(conn, rows, token, by_ids=_SUBSCRIPTIONS_BY_IDS)
            for chunk in _chunks(unique):
                # PostgreSQL locks the rows of a plain UPDATE ... IN in plan order, so two batch
                # claims with overlapping ids could deadlock; the subquery locks them in id order.
                # As in claim_delivery, a row another claim took meanwhile fails the recheck after
                # the lock wait. SQLite has no FOR UPDATE (SQLAlchemy leaves it out) and needs
                # none: it runs one writer at a time.
                locked = (
                    select(_dels.c.id)
                    .where(_dels.c.id.in_(chunk), *_due(now))
                    .order_by(_dels.c.id)
                    .with_for_update()
                )
                rows.extend(
                    conn.execute(
                        _lease(_dels.c.id.in_(locked), now, lease_seconds, token, max_attempts)
                    ).all()
                )
            claims = _with_subscriptions(conn, rows, token)
        return claims

    def finish_attempt(
        self, delivery_id: str, lease_token: str, result: AttemptResult
    ) -> WebhookSubscriptionStatus | None:
        with self.db.transaction("record a delivery attempt") as conn:
            row = self._finish_one(conn, delivery_id, lease_token, result)
            if row is None:
                raise InvalidStateError(
                    f"the lease on delivery {delivery_id!r} was lost (it expired or was never held); "
                    "nothing was recorded"
                )
            return self._apply_effect(conn, row.subscription_id, row.failures, result)

    def finish_attempts(self, outcomes: Sequence[Outcome]) -> list[Recorded]:
        """Record the outcomes in one transaction; on PostgreSQL in one statement for the batch
        (:data:`_FINISH_MANY`), so a worker pays one round trip and one commit per batch."""
        if not outcomes:
            return []
        with self.db.transaction("record delivery attempts") as conn:
            rows: dict[str, Row[Any]] = {}
            if self._fold_attempt_insert:
                for row in conn.execute(_FINISH_MANY, _finish_many_params(outcomes)):
                    rows[row.id] = row
            else:
                for outcome in outcomes:
                    one = self._finish_one(conn, outcome.delivery_id, outcome.lease_token, outcome.result)
                    if one is not None:
                        rows[outcome.delivery_id] = one
            recorded = []
            for outcome in outcomes:
                # pop: an id given twice is recorded once, as a second finish_attempt would find
                # the lease gone.
                found = rows.pop(outcome.delivery_id, None)
                if found is None:
                    recorded.append(Recorded(held=False))
                    continue
                changed = self._apply_effect(conn, found.subscription_id, found.failures, outcome.result)
                recorded.append(Recorded(held=True, changed=changed))
        return recorded

    def _finish_one(
        self, conn: Connection, delivery_id: str, lease_token: str, result: AttemptResult
    ) -> Row[Any] | None:
        """Record one outcome if the lease is held; return (subscription_id, failures) or ``None``."""
        attempt = result.attempt
        params: dict[str, Any] = {
            "p_id": delivery_id,
            "p_token": lease_token,
            "d_state": DeliveryState(result.state).value,
            "d_attempt": result.attempt_number,
            "d_next_attempt_at": result.next_attempt_at,
            "d_last_error": result.last_error,
            "d_timestamp": result.timestamp,
        }
        if result.request_headers:
            params["d_request_headers"] = dict(result.request_headers)
        attempt_params: dict[str, Any] = {}
        if attempt is not None:
            params.update(
                d_response_status=attempt.response_status,
                d_response_body=attempt.response_body,
                d_elapsed_ms=attempt.elapsed_ms,
            )
            attempt_params = {f"a_{name}": getattr(attempt, name) for name in _ATTEMPT_COLUMNS}
            attempt_params["a_delivery_id"] = delivery_id
        fold = attempt is not None and self._fold_attempt_insert
        statement = _finish_statement(
            headers=bool(result.request_headers), attempt=attempt is not None, fold=fold
        )
        row = conn.execute(statement, {**params, **attempt_params} if fold else params).first()
        if row is not None and attempt_params and not fold:
            conn.execute(_APPEND_ATTEMPT, attempt_params)
        return row

    def _apply_effect(
        self,
        conn: Connection,
        subscription_id: str,
        failures: int | None,
        result: AttemptResult,
    ) -> WebhookSubscriptionStatus | None:
        """Apply ``result.effect`` with conditional UPDATEs; return a status this call set.

        ``failures`` is the subscription's failure count as this transaction read it (``None``
        if the subscription is gone).
        """
        effect = SubscriptionEffect(result.effect)
        params = {"p_sub": subscription_id, "p_now": utcnow()}
        if effect is SubscriptionEffect.RESET_FAILURES:
            if failures:
                conn.execute(_RESET_FAILURES, params)
            return None
        if effect is SubscriptionEffect.COUNT_FAILURE:
            counted = conn.execute(_COUNT_FAILURE, params).scalar()
            if counted is None or counted < result.failure_threshold:
                return None
            return self._deactivate(conn, subscription_id, WebhookSubscriptionStatus.FAILED)
        if effect is SubscriptionEffect.DISABLE:
            return self._deactivate(conn, subscription_id, WebhookSubscriptionStatus.DISABLED)
        return None

    def _deactivate(
        self, conn: Connection, subscription_id: str, status: WebhookSubscriptionStatus
    ) -> WebhookSubscriptionStatus | None:
        # Only an ACTIVE row moves, so among concurrent callers exactly one reports the change.
        changed = conn.execute(
            update(_subs)
            .where(_subs.c.id == subscription_id, _subs.c.status == _ACTIVE)
            .values(status=status.value, updated_at=utcnow())
            .returning(_subs.c.id)
        ).first()
        return status if changed is not None else None

    def dead_letter(self, delivery_ids: Sequence[str], error: str, *, now: datetime) -> list[str]:
        moved: list[str] = []
        with self.db.transaction("dead-letter deliveries") as conn:
            for chunk in _chunks(list(dict.fromkeys(delivery_ids))):
                moved.extend(
                    conn.execute(
                        update(_dels)
                        .where(_dels.c.id.in_(chunk), _dels.c.state == _PENDING)
                        .values(
                            state=DeliveryState.DLQ.value,
                            last_error=error,
                            timestamp=now,
                            next_attempt_at=None,
                        )
                        .returning(_dels.c.id)
                    ).scalars()
                )
        return moved

    def replay_delivery(self, delivery_id: str, *, now: datetime) -> DeliveryLog:
        with self.db.transaction("replay a delivery") as conn:
            row = conn.execute(
                update(_dels)
                .where(_dels.c.id == delivery_id, _dels.c.state == DeliveryState.DLQ.value)
                .values(
                    state=_PENDING,
                    attempt=1,
                    next_attempt_at=now,
                    timestamp=now,
                    lease_expires_at=None,
                    lease_token=None,
                )
                .returning(*_dels.c)
            ).first()
            if row is not None:
                return row_to_delivery(row)
            state = conn.execute(select(_dels.c.state).where(_dels.c.id == delivery_id)).scalar()
        if state is None:
            raise DeliveryNotFoundError(delivery_id)
        raise InvalidStateError(
            f"delivery {delivery_id!r} is {state}, not dead-lettered; "
            "only deliveries in the DLQ can be replayed"
        )

    def release_expired_leases(self, *, now: datetime) -> list[str]:
        with self.db.transaction("release expired leases") as conn:
            return list(
                conn.execute(
                    update(_dels)
                    .where(INFLIGHT_ROWS, _dels.c.lease_expires_at < now)
                    .values(state=_PENDING, lease_expires_at=None, lease_token=None, next_attempt_at=now)
                    .returning(_dels.c.id)
                ).scalars()
            )

    def due_deliveries(self, *, now: datetime, limit: int) -> list[str]:
        with self.db.transaction("list due deliveries") as conn:
            return list(
                conn.execute(
                    select(_dels.c.id)
                    .where(PENDING_ROWS, _dels.c.next_attempt_at <= now)
                    .order_by(_dels.c.next_attempt_at, _dels.c.id)
                    .limit(limit)
                ).scalars()
            )


# -- claims -------------------------------------------------------------------------------------


def _due(now: datetime) -> tuple[ColumnElement[bool], ...]:
    """The conditions of a claimable delivery: ``PENDING`` and due at ``now``."""
    return (
        PENDING_ROWS,
        or_(_dels.c.next_attempt_at.is_(None), _dels.c.next_attempt_at <= now),
    )


def _lease(
    which: ColumnElement[bool], now: datetime, lease_seconds: float, token: str, max_attempts: int
) -> Executable:
    """The UPDATE that leases the claimable deliveries among ``which``, returning their rows."""
    return (
        update(_dels)
        .where(which, *_due(now))
        .values(
            state=_INFLIGHT,
            lease_expires_at=now + timedelta(seconds=lease_seconds),
            lease_token=token,
            max_attempts=max_attempts,
        )
        .returning(*_dels.c)
    )


def _with_subscriptions(
    conn: Connection, rows: Sequence[Row[Any]], token: str, *, by_ids: Executable | None = None
) -> list[Claim]:
    """Pair leased rows with their subscriptions as they are now (``None`` if removed).

    :param by_ids: a statement reading the subscriptions of an ``ids`` array in one round trip
        (PostgreSQL); without it, an expanding ``IN`` per chunk.
    """
    subscriptions: dict[str, WebhookSubscription] = {}
    for chunk in _chunks(list({row.subscription_id for row in rows})):
        found = (
            conn.execute(by_ids, {"ids": list(chunk)})
            if by_ids is not None
            else conn.execute(select(_subs).where(_subs.c.id.in_(chunk)))
        )
        for sub_row in found:
            subscriptions[sub_row.id] = row_to_subscription(sub_row)
    return [Claim(row_to_delivery(row), subscriptions.get(row.subscription_id), token) for row in rows]


# -- statements built once ----------------------------------------------------------------------

# PostgreSQL's batch claim, a constant text so psycopg prepares it once per connection. The rows
# are found by primary key alone and locked in id order (two claims with overlapping ids never
# deadlock); whether each is still claimable is checked on the locked version. Putting the state
# and due time in the locking SELECT's WHERE (as the SQLAlchemy statement for SQLite does) let the
# planner, with statistics that had not yet seen a burst of new rows, read every PENDING row
# through the due index for each claim: tens of milliseconds per claim with a 20,000-row backlog.
_CLAIM_MANY_SQL = f"""
WITH locked AS MATERIALIZED (
    SELECT id, state, next_attempt_at FROM {_dels.name}
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
RETURNING {", ".join(f'd."{column.name}"' for column in _dels.c)}
"""  # noqa: S608 (table and column names, no input)
_CLAIM_MANY = text(_CLAIM_MANY_SQL).columns(*_dels.c)

# The next attempt and due time of an array of deliveries, for the sweeper (PostgreSQL).
_SCHEDULES_BY_IDS = text(
    f"SELECT id, attempt, next_attempt_at FROM {_dels.name} WHERE id = ANY(CAST(:ids AS varchar[]))"  # noqa: S608
).columns(_dels.c.id, _dels.c.attempt, _dels.c.next_attempt_at)

# The subscriptions of an array of ids, for the claim (PostgreSQL).
_SUBSCRIPTIONS_BY_IDS = text(
    f"""
SELECT {", ".join(f'"{column.name}"' for column in _subs.c)} FROM {_subs.name}
WHERE id = ANY(CAST(:ids AS varchar[]))
"""  # noqa: S608 (table and column names, no input)
).columns(*_subs.c)


@functools.cache
def _attempts_per_minute(postgresql: bool) -> Executable:
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


@functools.cache
def _capped_stats() -> Executable:
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
            .where(_dels.c.state == literal_column(f"'{state.value}'"))
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


# The subscriptions filed under any of the keys, by dialect.
_UNDER_KEYS: dict[str, Executable] = {
    # SQLite: an expanding IN, one index probe per key.
    "sqlite": select(_subs).where(
        _subs.c.id.in_(
            select(_keys.c.subscription_id).where(_keys.c.pattern_key.in_(bindparam("keys", expanding=True)))
        )
    ),
    # PostgreSQL: one array parameter, so the statement text never changes with the number of
    # keys and psycopg keeps it prepared (the expanding IN cost about 40 us more per dispatch).
    "postgresql": select(_subs).where(
        _subs.c.id.in_(
            select(_keys.c.subscription_id).where(
                _keys.c.pattern_key == any_(bindparam("keys", type_=postgresql.ARRAY(String)))
            )
        )
    ),
}
_INSERT_DELIVERY = insert(_dels)

# -- finish_attempt's statements ----------------------------------------------------------------
# Built once, with bind parameters: building and cache-keying a statement on every call cost about
# as much CPU as sending it. Parameter names carry a prefix so none is taken for a column name.

_ATTEMPT_COLUMNS = tuple(f.name for f in dataclasses.fields(DeliveryAttempt))

#: The attempt row, where it cannot ride in the delivery's UPDATE (SQLite).
_APPEND_ATTEMPT = insert(_atts).values({name: bindparam(f"a_{name}") for name in _ATTEMPT_COLUMNS})

# A success resets the count only when it is not zero already: busy subscriptions must not
# serialise on their row.
_RESET_FAILURES = (
    update(_subs)
    .where(_subs.c.id == bindparam("p_sub"), _subs.c.consecutive_failures != 0)
    .values(consecutive_failures=0, updated_at=bindparam("p_now"))
)

_COUNT_FAILURE = (
    update(_subs)
    .where(_subs.c.id == bindparam("p_sub"))
    .values(consecutive_failures=_subs.c.consecutive_failures + 1, updated_at=bindparam("p_now"))
    .returning(_subs.c.consecutive_failures)
)


@functools.cache
def _finish_statement(*, headers: bool, attempt: bool, fold: bool) -> Executable:
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
    row = select(*(bindparam(f"a_{name}", type_=_atts.c[name].type) for name in _ATTEMPT_COLUMNS))
    appended = insert(_atts).from_select(list(_ATTEMPT_COLUMNS), row.select_from(updated))
    return select(updated.c.subscription_id, updated.c.failures).add_cte(appended.cte("appended"))


# -- finish_attempts' statement (PostgreSQL) -----------------------------------------------------
# One statement records a batch: the outcomes arrive as one array per column, unnest() turns them
# into rows, the UPDATE keeps only those whose lease is still held, and the attempt rows are
# inserted for those only. Its text never changes with the batch's size, so psycopg prepares it
# once per connection. Written out rather than composed in Core: unnest's column list and the
# casts are PostgreSQL's own.

_FINISH_MANY = text(
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


def _naive_utc(value: datetime | None) -> datetime | None:
    """A datetime as the tables keep it (naive UTC; see :class:`UTCDateTime`)."""
    if value is None or value.tzinfo is None:
        return value
    return value.astimezone(timezone.utc).replace(tzinfo=None)


_FINISH_MANY_COLUMNS = [
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


def _finish_many_params(outcomes: Sequence[Outcome]) -> dict[str, list[Any]]:
    """:data:`_FINISH_MANY`'s parameters: one list per column, one item per outcome."""
    columns: dict[str, list[Any]] = {name: [] for name in _FINISH_MANY_COLUMNS}
    for outcome in outcomes:
        result, attempt = outcome.result, outcome.result.attempt
        columns["ids"].append(outcome.delivery_id)
        columns["tokens"].append(outcome.lease_token)
        columns["states"].append(DeliveryState(result.state).value)
        columns["attempts"].append(result.attempt_number)
        columns["next_attempt_at"].append(_naive_utc(result.next_attempt_at))
        columns["last_errors"].append(result.last_error)
        columns["timestamps"].append(_naive_utc(result.timestamp))
        # Empty headers keep the stored ones, as finish_attempt does.
        headers = result.request_headers
        columns["headers"].append(json.dumps(dict(headers)) if headers else None)
        columns["sent"].append(attempt is not None)
        columns["a_attempts"].append(attempt.attempt if attempt else None)
        columns["a_started_at"].append(_naive_utc(attempt.started_at) if attempt else None)
        columns["a_status"].append(attempt.response_status if attempt else None)
        columns["a_body"].append(attempt.response_body if attempt else None)
        columns["a_elapsed"].append(attempt.elapsed_ms if attempt else None)
        columns["a_error"].append(attempt.error if attempt else None)
    return columns
