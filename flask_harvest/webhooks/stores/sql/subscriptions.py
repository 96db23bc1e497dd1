"""The SQL store's subscriptions and their topic index: add, read, look up by topic, change, remove.

A subscription's row and its topic index rows change in one transaction, so a lookup by topic never
sees a subscription under keys it no longer has.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any, TypeVar

from sqlalchemy import ColumnElement, Connection, Delete, Select, Update, and_, delete, insert, select, update

from ...._input import id_problem
from ...._sql import SqlDatabase, after_position
from ...._time import utcnow
from ....errors import DuplicateSubscriptionError, InvalidStateError, SubscriptionNotFoundError
from ...models import (
    SubscriptionChanges,
    WebhookSubscription,
    WebhookSubscriptionStatus,
    validate_datetime,
    validate_secret,
)
from ...tenants import ALL_TENANTS, TenantScope
from ...topic_index import topic_keys
from ...topics import topic_matches
from .._schema import (
    TROUBLED_ROWS,
    in_scope_sql,
    row_to_subscription,
    subscription_column_values,
    subscription_values,
    topic_rows,
)
from .._schema import subscription_topics_table as _keys
from .._schema import subscriptions_table as _subs
from ..base import ANY_ROTATION, AnyRotation
from ._statements import chunks, scope_params, under_keys

# Topics per lookup of subscriptions_for_topics: at most 127 keys each, so a statement binds at
# most a few thousand keys, under SQLite's bound-variable limit (32,766).
TOPICS_PER_LOOKUP = 20


class SubscriptionRows:
    """The subscriptions and the topic index in ``db``: the subscription half of the SQL store."""

    def __init__(self, db: SqlDatabase) -> None:
        self.db = db
        self._dialect = db.engine.dialect.name

    def index_unindexed(self) -> int:
        """File the subscriptions that have no row in the topic index; return how many."""
        unindexed = select(_subs.c.id, _subs.c.event_topics, _subs.c.tenant).where(
            ~select(_keys.c.subscription_id).where(_keys.c.subscription_id == _subs.c.id).exists()
        )
        insert_keys = self.db.insert(_keys).on_conflict_do_nothing()
        with self.db.transaction("index the subscriptions' topics") as conn:
            found = conn.execute(unindexed).all()
            rows = [key for row in found for key in topic_rows(row.id, row.event_topics, row.tenant)]
            for chunk in chunks(rows):
                conn.execute(insert_keys, list(chunk))
        return len(found)

    def add(self, subscription: WebhookSubscription) -> WebhookSubscription:
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
                rows = topic_rows(subscription.id, subscription.event_topics, subscription.tenant)
                conn.execute(insert(_keys), rows)
        if inserted is None:
            raise DuplicateSubscriptionError(subscription.id)
        return subscription

    def get(self, subscription_id: str, tenant: TenantScope = ALL_TENANTS) -> WebhookSubscription | None:
        if id_problem(subscription_id) is not None:
            return None
        query = _scoped(select(_subs).where(_subs.c.id == subscription_id), tenant)
        with self.db.transaction("read a subscription") as conn:
            row = conn.execute(query).first()
        return row_to_subscription(row) if row is not None else None

    def for_topic(self, topic: str, tenant: TenantScope = ALL_TENANTS) -> list[WebhookSubscription]:
        if id_problem(topic) is not None:
            return []
        with self.db.transaction("read the subscriptions of a topic") as conn:
            return self.matching(conn, topic, tenant)

    def for_topics(
        self, topics: Sequence[str], tenant: TenantScope = ALL_TENANTS
    ) -> dict[str, list[WebhookSubscription]]:
        unique = list(dict.fromkeys(topics))
        found: dict[str, list[WebhookSubscription]] = {topic: [] for topic in unique}
        stored = [topic for topic in unique if id_problem(topic) is None]
        with self.db.transaction("read the subscriptions of topics") as conn:
            # One lookup for a chunk of topics: the union of their candidate keys.
            for chunk in chunks(stored, TOPICS_PER_LOOKUP):
                keys = list(dict.fromkeys(key for topic in chunk for key in topic_keys(topic)))
                statement = under_keys(self._dialect, tenant)
                rows = conn.execute(statement, {"keys": keys, **scope_params(tenant)}).all()
                subscriptions = [row_to_subscription(row) for row in rows]
                for topic in chunk:
                    found[topic] = [s for s in subscriptions if s.matches(topic)]
        return found

    def matching(
        self, conn: Connection, topic: str, tenant: TenantScope = ALL_TENANTS
    ) -> list[WebhookSubscription]:
        """The subscriptions (of the ``tenant`` scope) whose topics select ``topic``, read on ``conn``."""
        # Only the subscriptions filed under one of the topic's candidate keys: an indexed lookup
        # whose cost does not grow with the number of subscriptions. A long pattern's key selects
        # a superset, so the patterns are still matched, on the raw rows, so no model is built
        # for a row that does not match.
        params = {"keys": list(topic_keys(topic)), **scope_params(tenant)}
        rows = conn.execute(under_keys(self._dialect, tenant), params).all()
        return [
            row_to_subscription(row)
            for row in rows
            if any(topic_matches(pattern, topic) for pattern in row.event_topics)
        ]

    def list_all(self, tenant: TenantScope = ALL_TENANTS) -> list[WebhookSubscription]:
        query = _scoped(select(_subs), tenant).order_by(_subs.c.created_at, _subs.c.id)
        with self.db.read("list subscriptions") as conn:
            rows = conn.execute(query).all()
        return [row_to_subscription(row) for row in rows]

    def page(
        self,
        *,
        limit: int,
        after: tuple[datetime, str] | None = None,
        status: WebhookSubscriptionStatus | None = None,
        topic: str | None = None,
        tenant: TenantScope = ALL_TENANTS,
    ) -> list[WebhookSubscription]:
        if topic is not None and id_problem(topic) is not None:
            return []
        query = _scoped(select(_subs), tenant).order_by(_subs.c.created_at, _subs.c.id).limit(limit)
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

    def troubled(self, *, limit: int, tenant: TenantScope = ALL_TENANTS) -> list[WebhookSubscription]:
        query = (
            _scoped(select(_subs), tenant)
            .where(TROUBLED_ROWS)
            .order_by(_subs.c.consecutive_failures.desc(), _subs.c.created_at, _subs.c.id)
            .limit(limit)
        )
        with self.db.read("list troubled subscriptions") as conn:
            return [row_to_subscription(row) for row in conn.execute(query)]

    def update(
        self, subscription_id: str, changes: SubscriptionChanges, tenant: TenantScope = ALL_TENANTS
    ) -> WebhookSubscription:
        values = {**subscription_column_values(changes.values()), "updated_at": utcnow()}
        return self._change(
            subscription_id,
            "update a subscription",
            values,
            secrets=(),
            topics=changes.event_topics,
            tenant=tenant,
        )

    def rotate_secret(
        self,
        subscription_id: str,
        secret: str,
        *,
        previous_expires_at: datetime,
        tenant: TenantScope = ALL_TENANTS,
        after: datetime | AnyRotation | None = ANY_ROTATION,
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
        if after is ANY_ROTATION:
            return self._change(subscription_id, "rotate a secret", values, secrets=(secret,), tenant=tenant)
        last = _subs.c.previous_secret_expires_at
        unchanged = last.is_(None) if after is None else last == validate_datetime(after, "after")
        try:
            return self._change(
                subscription_id, "rotate a secret", values, secrets=(secret,), tenant=tenant, where=unchanged
            )
        except SubscriptionNotFoundError:
            if self.get(subscription_id, tenant) is None:
                raise
            raise InvalidStateError("the secret was rotated since; it was not rotated again") from None

    def _change(
        self,
        subscription_id: str,
        action: str,
        values: dict[str, Any],
        *,
        secrets: Sequence[str],
        topics: Sequence[str] | None = None,
        tenant: TenantScope = ALL_TENANTS,
        where: ColumnElement[bool] | None = None,
    ) -> WebhookSubscription:
        """One UPDATE of only the columns in ``values`` (of the row only if ``where`` holds on
        it), and new index keys if ``topics`` is set (in the same transaction); return the row as
        it now is."""
        condition = (
            _subs.c.id == subscription_id if where is None else and_(_subs.c.id == subscription_id, where)
        )
        with self.db.transaction(action, secrets=secrets) as conn:
            row = conn.execute(
                _scoped(update(_subs).where(condition), tenant).values(values).returning(*_subs.c)
            ).first()
            if row is not None and topics is not None:
                # The UPDATE holds the row's lock, so concurrent edits rewrite the keys in turn.
                conn.execute(delete(_keys).where(_keys.c.subscription_id == subscription_id))
                conn.execute(insert(_keys), topic_rows(subscription_id, topics, row.tenant))
        if row is None:
            raise SubscriptionNotFoundError(subscription_id)
        return row_to_subscription(row)

    def remove(self, subscription_id: str, tenant: TenantScope = ALL_TENANTS) -> bool:
        if id_problem(subscription_id) is not None:
            return False
        with self.db.transaction("remove a subscription") as conn:
            row = conn.execute(
                _scoped(delete(_subs).where(_subs.c.id == subscription_id), tenant).returning(_subs.c.id)
            ).first()
            # Only the removed subscription's keys: another tenant's row (not removed) keeps its own.
            if row is not None:
                conn.execute(delete(_keys).where(_keys.c.subscription_id == subscription_id))
        return row is not None


_Narrowed = TypeVar("_Narrowed", Select[Any], Update, Delete)


def _scoped(statement: _Narrowed, tenant: TenantScope) -> _Narrowed:
    """``statement`` (on the subscriptions) narrowed to the rows of ``tenant``'s scope."""
    condition = in_scope_sql(_subs.c.tenant, tenant)
    return statement if condition is None else statement.where(condition)
