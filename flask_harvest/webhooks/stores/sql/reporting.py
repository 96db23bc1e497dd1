"""The SQL store's reads for operators and metrics: deliveries and their attempts, the listing
pages, attempts per minute, counts by state and the queue gauges.

Every listing and count is a bounded walk of an index, so its cost does not grow with the history.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from sqlalchemy import Select, and_, func, literal, or_, select

from ...._bounded import bounded_counts
from ...._input import id_problem
from ...._sql import SqlDatabase
from ...models import (
    DeliveryAttempt,
    DeliveryLog,
    DeliveryState,
    DeliveryStats,
    DeliverySummary,
    WebhookSubscriptionStatus,
)
from ...tenants import ALL_TENANTS, TenantScope
from .._schema import PENDING_ROWS, in_scope_sql, row_to_attempt, row_to_delivery
from .._schema import attempts_table as _atts
from .._schema import deliveries_table as _dels
from .._schema import subscriptions_table as _subs
from ..base import DlqCursor, fold_stats
from ._statements import attempts_per_minute_query, capped_stats_query, chunks, scope_params

_DLQ = DeliveryState.DLQ.value

#: A stored state's value to its member, without the enum's lookup per row.
_STATES = {state.value: state for state in DeliveryState}


@dataclass(frozen=True)
class DeliveryPage:
    """A page of the delivery listing, in one value: the parameters of
    :meth:`~flask_harvest.webhooks.stores.base.OutboundWebhookHandler.list_deliveries`."""

    limit: int
    before: DlqCursor | None
    state: DeliveryState | None
    subscription_id: str | None
    topic: str | None
    since: datetime | None
    until: datetime | None
    tenant: TenantScope = ALL_TENANTS

    def narrow(self, query: Select[Any]) -> Select[Any] | None:
        """``query`` (of the deliveries table) narrowed to this page, newest first by
        ``(timestamp, id)``; ``None`` when a filter cannot match a stored row."""
        subscription_id, topic, before = self.subscription_id, self.topic, self.before
        if any(key is not None and id_problem(key) is not None for key in (subscription_id, topic)):
            return None
        query = _scoped(query, self.tenant)
        if self.state is not None:
            query = query.where(_dels.c.state == self.state.value)
        if self.since is not None:
            query = query.where(_dels.c.timestamp >= self.since)
        if self.until is not None:
            query = query.where(_dels.c.timestamp < self.until)
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
        return query.order_by(_dels.c.timestamp.desc(), _dels.c.id.desc()).limit(self.limit)

    @property
    def by_key(self) -> bool:
        """Whether the page is filtered by subscription, topic or tenant (values a generic plan
        misjudges)."""
        return self.subscription_id is not None or self.topic is not None or isinstance(self.tenant, str)


class DeliveryReports:
    """What operators and metrics read about the deliveries in ``db``."""

    def __init__(self, db: SqlDatabase) -> None:
        self.db = db
        self._custom_plans = db.postgres

    def get_delivery(self, delivery_id: str, tenant: TenantScope = ALL_TENANTS) -> DeliveryLog | None:
        if id_problem(delivery_id) is not None:
            return None
        with self.db.transaction("read a delivery") as conn:
            row = conn.execute(_scoped(select(_dels).where(_dels.c.id == delivery_id), tenant)).first()
        return row_to_delivery(row) if row is not None else None

    def get_deliveries(
        self, delivery_ids: Sequence[str], tenant: TenantScope = ALL_TENANTS
    ) -> list[DeliveryLog]:
        unique = [i for i in dict.fromkeys(delivery_ids) if id_problem(i) is None]
        found: list[DeliveryLog] = []
        with self.db.transaction("read deliveries") as conn:
            for chunk in chunks(unique):
                rows = conn.execute(_scoped(select(_dels).where(_dels.c.id.in_(chunk)), tenant)).all()
                found.extend(row_to_delivery(row) for row in rows)
        return found

    def list_attempts(self, delivery_id: str, tenant: TenantScope = ALL_TENANTS) -> list[DeliveryAttempt]:
        if id_problem(delivery_id) is not None:
            return []
        query = select(_atts).where(_atts.c.delivery_id == delivery_id).order_by(_atts.c.id)
        if tenant is not ALL_TENANTS:
            # Attempts carry no tenant: their delivery's is the one that counts.
            owned = _scoped(select(_dels.c.id).where(_dels.c.id == delivery_id), tenant)
            query = query.where(owned.exists())
        with self.db.transaction("list a delivery's attempts") as conn:
            rows = conn.execute(query).all()
        return [row_to_attempt(row) for row in rows]

    def list_deliveries(self, page: DeliveryPage) -> list[DeliveryLog]:
        query = page.narrow(select(_dels))
        return [row_to_delivery(row) for row in self._list(query, page.by_key)] if query is not None else []

    def list_delivery_summaries(self, page: DeliveryPage) -> list[DeliverySummary]:
        # Only the listed columns: the payload and the response body can be kilobytes a row.
        query = page.narrow(select(*(_dels.c[name] for name in DeliverySummary._fields)))
        if query is None:
            return []
        return [
            DeliverySummary(id_, sub, topic_, _STATES[state_], attempt, max_attempts, status, error, stamp)
            for id_, sub, topic_, state_, attempt, max_attempts, status, error, stamp in self._list(
                query, page.by_key
            )
        ]

    def count_deliveries(self, page: DeliveryPage) -> int:
        # The page's own walk (same filters, same order, so the same index), of page.limit rows.
        query = page.narrow(select(literal(1)).select_from(_dels))
        if query is None:
            return 0
        counted = select(func.count()).select_from(query.subquery())
        return int(self._list(counted, page.by_key)[0][0])

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
        query = attempts_per_minute_query(self.db.postgres)
        with self.db.read("count attempts per minute") as conn:
            rows = conn.execute(query, {"since": since, "until": until}).all()
        result = []
        for when, good, total in rows:
            stamp = datetime.fromisoformat(when) if isinstance(when, str) else when
            stamp = stamp.replace(tzinfo=timezone.utc) if stamp.tzinfo is None else stamp
            result.append((stamp, int(good or 0), int(total) - int(good or 0)))
        return result

    def recent_attempts(
        self, subscription_id: str, *, since: datetime, limit: int, tenant: TenantScope = ALL_TENANTS
    ) -> list[tuple[int | None, int | None]]:
        # The deliveries attempted last walk (subscription_id, timestamp): a delivery's timestamp
        # is its latest attempt's, so one attempted in the window has timestamp >= since.
        recent = (
            _scoped(select(_dels.c.id), tenant)
            .where(_dels.c.subscription_id == subscription_id, _dels.c.timestamp >= since)
            .order_by(_dels.c.timestamp.desc(), _dels.c.id.desc())
            .limit(limit)
            .subquery()
        )
        query = select(_atts.c.response_status, _atts.c.elapsed_ms).where(
            _atts.c.delivery_id.in_(select(recent.c.id)), _atts.c.started_at >= since
        )
        with self.db.read("read a subscription's recent attempts") as conn:
            return [(status, elapsed) for status, elapsed in conn.execute(query).all()]

    def delivery_stats(
        self, *, cap: int | None = None, tenant: TenantScope = ALL_TENANTS
    ) -> tuple[DeliveryStats, dict[str, DeliveryStats]]:
        if cap is None:
            # Every row: a grouped scan of the whole table (tests, small tables).
            query = _scoped(
                select(_dels.c.subscription_id, _dels.c.state, func.count(), func.min(_dels.c.created_at)),
                tenant,
            ).group_by(_dels.c.subscription_id, _dels.c.state)
            with self.db.transaction("count deliveries") as conn:
                groups = [(row[0], row[1], int(row[2]), row[3]) for row in conn.execute(query)]
            return fold_stats(groups)
        check_cap = int(cap)
        if check_cap < 1:
            raise ValueError("cap must be at least 1")
        with self.db.read("count deliveries") as conn:
            params = {"cap": check_cap, "cap_read": check_cap + 1, **scope_params(tenant)}
            rows = conn.execute(capped_stats_query(tenant), params).all()
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

    def count_states(self, *, cap: int) -> dict[DeliveryState, int]:
        # One round trip of bounded walks of the index that leads with state (state_recent).
        states = list(DeliveryState)
        with self.db.read("count deliveries by state") as conn:
            counts = bounded_counts(
                conn,
                _dels,
                lambda: [_dels.c.state == state.value for state in states],
                cap=cap,
                key=("webhook deliveries by state",),
            )
        return dict(zip(states, counts, strict=True))

    def count_subscription_states(self, *, cap: int) -> dict[WebhookSubscriptionStatus, int]:
        statuses = list(WebhookSubscriptionStatus)
        with self.db.read("count subscriptions by status") as conn:
            counts = bounded_counts(
                conn,
                _subs,
                lambda: [_subs.c.status == status.value for status in statuses],
                cap=cap,
                key=("webhook subscriptions by status",),
            )
        return dict(zip(statuses, counts, strict=True))


def _scoped(query: Select[Any], tenant: TenantScope) -> Select[Any]:
    """``query`` (of the deliveries table) narrowed to the rows of ``tenant``'s scope."""
    condition = in_scope_sql(_dels.c.tenant, tenant)
    return query if condition is None else query.where(condition)
