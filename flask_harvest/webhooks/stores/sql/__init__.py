"""A durable store on SQLAlchemy: subscriptions, delivery logs and every attempt, in SQL tables.

Works on PostgreSQL (psycopg 3) and SQLite 3.35 or later. Every method that moves a delivery is one
short transaction built from conditional ``UPDATE ... RETURNING`` statements, so two workers (or
two processes, or two replicas) calling it at once never both win, and no lock is held while a
worker talks to a receiver.

:class:`SqlOutboundWebhookStore` is composed of three parts on one :class:`~flask_harvest._sql.SqlDatabase`,
one per reason to change: :mod:`.subscriptions` (subscriptions and their topic index),
:mod:`.deliveries` (the delivery pipeline) and :mod:`.reporting` (what operators and metrics read);
the statements built once live in :mod:`._statements`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime

from sqlalchemy import Engine

from ...._sql import SqlDatabase
from ...models import (
    AttemptResult,
    Claim,
    DeliveryAttempt,
    DeliveryLog,
    DeliveryState,
    DeliveryStats,
    DeliverySummary,
    SubscriptionChanges,
    WebhookSubscription,
    WebhookSubscriptionStatus,
)
from ...tenants import ALL_TENANTS, TenantScope
from .._schema import (
    WEBHOOK_TABLES,
    UTCDateTime,
    attempts_table,
    deliveries_table,
    metadata,
    schema_sql,
    subscription_topics_table,
    subscriptions_table,
)
from ..base import (
    ANY_ROTATION,
    AnyRotation,
    BlockedKey,
    DeliverySchedule,
    DlqCursor,
    OutboundWebhookHandler,
    Outcome,
    Recorded,
    StoreCapabilities,
    SubscriptionCursor,
)
from .deliveries import DeliveryPipeline
from .reporting import DeliveryPage, DeliveryReports
from .subscriptions import SubscriptionRows

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
        self._subscriptions = SubscriptionRows(self.db)
        self._deliveries = DeliveryPipeline(self.db, self._subscriptions)
        self._reports = DeliveryReports(self.db)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.engine.url.render_as_string(hide_password=True)}>"

    @property
    def capabilities(self) -> StoreCapabilities:
        return StoreCapabilities(transactions=True, engine=self.engine, schema=True, ordering=True)

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
        return self._subscriptions.index_unindexed()

    # -- subscriptions -------------------------------------------------------------------------

    def add_subscription(self, subscription: WebhookSubscription) -> WebhookSubscription:
        return self._subscriptions.add(subscription)

    def get_subscription(
        self, subscription_id: str, *, tenant: TenantScope = ALL_TENANTS
    ) -> WebhookSubscription | None:
        return self._subscriptions.get(subscription_id, tenant)

    def subscriptions_for_topic(
        self, topic: str, *, tenant: TenantScope = ALL_TENANTS
    ) -> list[WebhookSubscription]:
        return self._subscriptions.for_topic(topic, tenant)

    def subscriptions_for_topics(
        self, topics: Sequence[str], *, tenant: TenantScope = ALL_TENANTS
    ) -> dict[str, list[WebhookSubscription]]:
        return self._subscriptions.for_topics(topics, tenant)

    def list_subscriptions(self, *, tenant: TenantScope = ALL_TENANTS) -> list[WebhookSubscription]:
        return self._subscriptions.list_all(tenant)

    def list_subscriptions_page(
        self,
        *,
        limit: int,
        after: SubscriptionCursor | None = None,
        status: WebhookSubscriptionStatus | None = None,
        topic: str | None = None,
        tenant: TenantScope = ALL_TENANTS,
    ) -> list[WebhookSubscription]:
        return self._subscriptions.page(limit=limit, after=after, status=status, topic=topic, tenant=tenant)

    def troubled_subscriptions(
        self, *, limit: int, tenant: TenantScope = ALL_TENANTS
    ) -> list[WebhookSubscription]:
        return self._subscriptions.troubled(limit=limit, tenant=tenant)

    def update_subscription(
        self, subscription_id: str, changes: SubscriptionChanges, *, tenant: TenantScope = ALL_TENANTS
    ) -> WebhookSubscription:
        return self._subscriptions.update(subscription_id, changes, tenant)

    def rotate_secret(
        self,
        subscription_id: str,
        secret: str,
        *,
        previous_expires_at: datetime,
        tenant: TenantScope = ALL_TENANTS,
        after: datetime | AnyRotation | None = ANY_ROTATION,
    ) -> WebhookSubscription:
        return self._subscriptions.rotate_secret(
            subscription_id, secret, previous_expires_at=previous_expires_at, tenant=tenant, after=after
        )

    def remove_subscription(self, subscription_id: str, *, tenant: TenantScope = ALL_TENANTS) -> bool:
        return self._subscriptions.remove(subscription_id, tenant)

    # -- delivery logs -------------------------------------------------------------------------

    def log_deliveries(self, deliveries: Sequence[DeliveryLog]) -> list[str]:
        return self._deliveries.log_deliveries(deliveries)

    def log_deliveries_for_topic(
        self,
        topic: str,
        build: Callable[[WebhookSubscription], DeliveryLog | None],
        *,
        tenant: TenantScope = ALL_TENANTS,
    ) -> list[tuple[WebhookSubscription, DeliveryLog]]:
        return self._deliveries.log_deliveries_for_topic(topic, build, tenant)

    def get_delivery(self, delivery_id: str, *, tenant: TenantScope = ALL_TENANTS) -> DeliveryLog | None:
        return self._reports.get_delivery(delivery_id, tenant)

    def get_deliveries(
        self, delivery_ids: Sequence[str], *, tenant: TenantScope = ALL_TENANTS
    ) -> list[DeliveryLog]:
        return self._reports.get_deliveries(delivery_ids, tenant)

    def get_schedules(self, delivery_ids: Sequence[str]) -> list[DeliverySchedule]:
        return self._deliveries.get_schedules(delivery_ids)

    def list_attempts(self, delivery_id: str, *, tenant: TenantScope = ALL_TENANTS) -> list[DeliveryAttempt]:
        return self._reports.list_attempts(delivery_id, tenant)

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
        tenant: TenantScope = ALL_TENANTS,
    ) -> list[DeliveryLog]:
        page = DeliveryPage(limit, before, state, subscription_id, topic, since, until, tenant)
        return self._reports.list_deliveries(page)

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
        tenant: TenantScope = ALL_TENANTS,
    ) -> list[DeliverySummary]:
        page = DeliveryPage(limit, before, state, subscription_id, topic, since, until, tenant)
        return self._reports.list_delivery_summaries(page)

    def count_deliveries(
        self,
        *,
        cap: int,
        state: DeliveryState | None = None,
        subscription_id: str | None = None,
        topic: str | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
        tenant: TenantScope = ALL_TENANTS,
    ) -> int:
        page = DeliveryPage(max(0, cap), None, state, subscription_id, topic, since, until, tenant)
        return self._reports.count_deliveries(page)

    def attempts_per_minute(self, *, since: datetime, until: datetime) -> list[tuple[datetime, int, int]]:
        return self._reports.attempts_per_minute(since=since, until=until)

    def delivery_stats(
        self, *, cap: int | None = None, tenant: TenantScope = ALL_TENANTS
    ) -> tuple[DeliveryStats, dict[str, DeliveryStats]]:
        return self._reports.delivery_stats(cap=cap, tenant=tenant)

    def recent_attempts(
        self, subscription_id: str, *, since: datetime, limit: int, tenant: TenantScope = ALL_TENANTS
    ) -> list[tuple[int | None, int | None]]:
        return self._reports.recent_attempts(subscription_id, since=since, limit=limit, tenant=tenant)

    def queue_gauges(self, *, now: datetime, dlq_limit: int) -> tuple[int, datetime | None]:
        return self._reports.queue_gauges(now=now, dlq_limit=dlq_limit)

    def count_subscription_states(self, *, cap: int) -> dict[WebhookSubscriptionStatus, int]:
        return self._reports.count_subscription_states(cap=cap)

    def count_states(self, *, cap: int) -> dict[DeliveryState, int]:
        return self._reports.count_states(cap=cap)

    def purge_deliveries_before(self, cutoff: datetime) -> int:
        return self._deliveries.purge_deliveries_before(cutoff)

    # -- the delivery pipeline -----------------------------------------------------------------

    def claim_delivery(
        self,
        delivery_id: str,
        *,
        now: datetime,
        lease_seconds: float,
        max_attempts: int,
    ) -> Claim | None:
        return self._deliveries.claim_delivery(
            delivery_id, now=now, lease_seconds=lease_seconds, max_attempts=max_attempts
        )

    def claim_deliveries(
        self,
        delivery_ids: Sequence[str],
        *,
        now: datetime,
        lease_seconds: float,
        max_attempts: int,
    ) -> list[Claim]:
        return self._deliveries.claim_deliveries(
            delivery_ids, now=now, lease_seconds=lease_seconds, max_attempts=max_attempts
        )

    def finish_attempt(
        self, delivery_id: str, lease_token: str, result: AttemptResult
    ) -> WebhookSubscriptionStatus | None:
        return self._deliveries.finish_attempt(delivery_id, lease_token, result)

    def finish_attempts(self, outcomes: Sequence[Outcome]) -> list[Recorded]:
        """Record the outcomes in one transaction; on PostgreSQL in one statement for the batch
        (``_statements.FINISH_MANY``), so a worker pays one round trip and one commit per
        batch. The next deliveries of the keys the batch released are found (and leased, for the
        outcomes that follow) in the same transaction."""
        return self._deliveries.finish_attempts(outcomes)

    def dead_letter(self, delivery_ids: Sequence[str], error: str, *, now: datetime) -> list[str]:
        return self._deliveries.dead_letter(delivery_ids, error, now=now)

    def replay_delivery(
        self, delivery_id: str, *, now: datetime, tenant: TenantScope = ALL_TENANTS
    ) -> DeliveryLog:
        return self._deliveries.replay_delivery(delivery_id, now=now, tenant=tenant)

    def release_expired_leases(self, *, now: datetime) -> list[str]:
        return self._deliveries.release_expired_leases(now=now)

    def due_deliveries(self, *, now: datetime, limit: int) -> list[str]:
        return self._deliveries.due_deliveries(now=now, limit=limit)

    def next_in_line(self, subscription_id: str, ordering_key: str) -> list[DeliverySchedule]:
        return self._deliveries.next_in_line(subscription_id, ordering_key)

    def waiting_in_line(self, delivery_ids: Sequence[str]) -> set[str]:
        return self._deliveries.waiting_in_line(delivery_ids)

    def skip_delivery(
        self, delivery_id: str, *, reason: str, now: datetime, tenant: TenantScope = ALL_TENANTS
    ) -> DeliveryLog:
        return self._deliveries.skip_delivery(delivery_id, reason=reason, now=now, tenant=tenant)

    def blocked_keys(
        self, subscription_id: str, *, limit: int = 50, tenant: TenantScope = ALL_TENANTS
    ) -> list[BlockedKey]:
        return self._deliveries.blocked_keys(subscription_id, limit=limit, tenant=tenant)
