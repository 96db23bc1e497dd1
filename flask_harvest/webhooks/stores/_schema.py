"""The SQL store's tables, as SQLAlchemy ``Table`` objects on one ``MetaData``, and the row mapping.

Alembic (or Flask-Migrate) autogenerates migrations from :data:`metadata`, :func:`schema_sql` compiles
the same objects to DDL, and the store queries them, so the three cannot drift apart.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Column,
    ColumnElement,
    Index,
    Integer,
    String,
    Table,
    Text,
    literal_column,
    text,
)
from sqlalchemy.engine import Row

from ..._sql import UTCDateTime as UTCDateTime
from ..._sql import drop_indexes_sql
from ..._sql import metadata as metadata
from ..._sql import schema_sql as _schema_sql
from ...conditions import Condition, parse_condition
from ...outbound.rate import RateLimit
from ..models import (
    MAX_ID_LENGTH,
    MAX_URL_LENGTH,
    DeliveryAttempt,
    DeliveryLog,
    DeliveryState,
    WebhookSubscription,
    WebhookSubscriptionStatus,
    filter_json,
)
from ..ordering import DEFAULT_ORDERING_POLICY, LINE_STATES, MAX_ORDERING_KEY_LENGTH, OrderingPolicy
from ..tenants import ALL_TENANTS, MAX_TENANT_LENGTH, TenantScope
from ..topic_index import MAX_KEY_LENGTH, pattern_key

#: Ids are at most this long (the models' limit).
ID_LENGTH = MAX_ID_LENGTH


#: The subscriptions an operator should look at: disabled ones and failing ones (a literal, as the
#: partial index's predicate must be for the planner to use it).
TROUBLED_SQL = f"status <> '{WebhookSubscriptionStatus.ACTIVE.value}' OR consecutive_failures > 0"

#: The rows of some tenant: the predicate of the deliveries' tenant indexes.
TENANTED_SQL = "tenant IS NOT NULL"
# The outbox messages that hold their key's line: keyed and not relayed yet.
UNRELAYED_KEYED_SQL = "ordering_key IS NOT NULL AND relayed_at IS NULL"

subscriptions_table = Table(
    "harvest_webhook_subscriptions",
    metadata,
    Column("id", String(ID_LENGTH), primary_key=True),
    Column("target_url", String(MAX_URL_LENGTH), nullable=False),
    Column("event_topics", JSON, nullable=False),
    # The signing secret, in clear: receivers verify with it, so it cannot be hashed.
    Column("secret", Text, nullable=False),
    Column("status", String(16), nullable=False),
    Column("consecutive_failures", Integer, nullable=False, default=0),
    Column("description", Text, nullable=False, default=""),
    Column("created_at", UTCDateTime, nullable=False),
    Column("updated_at", UTCDateTime, nullable=False),
    # After a rotation, the old secret still signs deliveries until it expires.
    Column("previous_secret", Text, nullable=True),
    Column("previous_secret_expires_at", UTCDateTime, nullable=True),
    # The payload filter's JSON form; NULL: every payload (rows of earlier versions too).
    Column("payload_filter", JSON(none_as_null=True), nullable=True),
    # The custom headers, a JSON object; NULL (rows of earlier versions): none.
    Column("headers", JSON(none_as_null=True), nullable=True),
    # The rate limit, {"per_second": ..., "burst": ...}; NULL (rows of earlier versions): none.
    Column("rate_limit", JSON(none_as_null=True), nullable=True),
    # What an ordering key does after its head is dead-lettered; NULL (rows of earlier versions):
    # the default policy (ordering.DEFAULT_ORDERING_POLICY).
    Column("ordering_policy", String(16), nullable=True),
    # The tenant (flask_harvest.webhooks.tenants); NULL (rows of earlier versions too): no tenant.
    Column("tenant", String(MAX_TENANT_LENGTH), nullable=True),
    # The dashboard's subscription list, oldest first, a keyset walk.
    Index("ix_harvest_webhook_subscriptions_created", "created_at", "id"),
    # A tenant's subscriptions, oldest first (a scoped listing).
    Index("ix_harvest_webhook_subscriptions_tenant_created", "tenant", "created_at", "id"),
    # The overview's failing and disabled subscriptions: the few rows TROUBLED selects.
    Index(
        "ix_harvest_webhook_subscriptions_troubled",
        "consecutive_failures",
        postgresql_where=text(TROUBLED_SQL),
        sqlite_where=text(TROUBLED_SQL),
    ),
)

# The topic index: one row per key of a subscription's patterns (topic_index.pattern_key), written
# in the transaction that writes the subscription, so dispatch reads only the subscriptions filed
# under the topic's candidate keys instead of every subscription. No foreign key: the store keeps
# the two tables in step itself, and a key row never outlives its subscription's transaction.
subscription_topics_table = Table(
    "harvest_webhook_subscription_topics",
    metadata,
    # The primary key leads with the key: it is the index dispatch looks keys up in.
    Column("pattern_key", String(MAX_KEY_LENGTH), primary_key=True),
    Column("subscription_id", String(ID_LENGTH), primary_key=True),
    # The subscription's tenant, copied: a dispatch for a tenant looks up its keys only, however
    # many other tenants subscribe to the same topics. NULL (rows of earlier versions): no tenant.
    Column("tenant", String(MAX_TENANT_LENGTH), nullable=True),
    # Rewriting or removing one subscription's keys.
    Index("ix_harvest_webhook_subscription_topics_subscription", "subscription_id"),
    # A dispatch's lookup within its tenant (an untenanted one: tenant IS NULL).
    Index("ix_harvest_webhook_subscription_topics_tenant", "tenant", "pattern_key"),
)

#: The rows of the ordering index: keyed, in a state that may hold a key's line. A literal, which
#: the head-of-line query repeats word for word (SQLite uses a partial index only then).
LINE_ROWS_SQL = "ordering_key IS NOT NULL AND state IN ({})".format(
    ", ".join(f"'{state.value}'" for state in LINE_STATES)
)

# No foreign key to the subscriptions: a delivery log outlives its removed subscription.
deliveries_table = Table(
    "harvest_webhook_deliveries",
    metadata,
    Column("id", String(ID_LENGTH), primary_key=True),
    Column("subscription_id", String(ID_LENGTH), nullable=False),
    Column("topic", Text, nullable=False),
    Column("payload", Text, nullable=False),
    Column("state", String(16), nullable=False),
    Column("attempt", Integer, nullable=False),
    Column("max_attempts", Integer, nullable=False),
    Column("request_headers", JSON, nullable=False),
    Column("response_status", Integer, nullable=True),
    Column("response_body", Text, nullable=True),
    Column("elapsed_ms", Integer, nullable=True),
    Column("last_error", Text, nullable=True),
    Column("timestamp", UTCDateTime, nullable=False),
    Column("next_attempt_at", UTCDateTime, nullable=True),
    Column("created_at", UTCDateTime, nullable=False),
    Column("lease_expires_at", UTCDateTime, nullable=True),
    # Who holds the lease: finish_attempt writes only with the token its claim returned.
    Column("lease_token", String(32), nullable=True),
    # The dispatch's W3C trace context (flask_harvest.tracing); added to older tables on start-up.
    Column("trace_context", Text, nullable=True),
    # Ordered delivery (webhooks.ordering): the key, and its sequence number at dispatch.
    Column("ordering_key", String(MAX_ORDERING_KEY_LENGTH), nullable=True),
    Column("ordering_seq", BigInteger, nullable=True),
    # The subscription's tenant, copied when the delivery is made, so a tenant's listings read
    # their own index; NULL (rows of earlier versions too): no tenant.
    Column("tenant", String(MAX_TENANT_LENGTH), nullable=True),
    # The due scan, the claim and the queue-lag gauge: pending rows only (a partial index), so it
    # stays the size of the backlog however much history the table keeps. Queries name the state as
    # a literal (PENDING_ROWS) so the planner can match the predicate in a prepared statement too.
    # No id after next_attempt_at: with it, PostgreSQL planned a batch claim (id IN a list, due)
    # as one walk of this index per listed id (measured 58 ms for 100 ids) instead of 100 probes
    # of the primary key; the due scan sorts its ties by id itself.
    Index(
        "ix_harvest_webhook_deliveries_pending_due",
        "next_attempt_at",
        postgresql_where=text(f"state = '{DeliveryState.PENDING.value}'"),
        sqlite_where=text(f"state = '{DeliveryState.PENDING.value}'"),
    ),
    # release_expired_leases: in-flight rows only.
    Index(
        "ix_harvest_webhook_deliveries_inflight_lease",
        "lease_expires_at",
        postgresql_where=text(f"state = '{DeliveryState.INFLIGHT.value}'"),
        sqlite_where=text(f"state = '{DeliveryState.INFLIGHT.value}'"),
    ),
    # The listings in one state (the DLQ page, the dashboard's state filter), the purge of old
    # delivered rows, and the capped stats, which read a state's newest rows from it alone: on
    # PostgreSQL it carries their subscription and creation time (an index-only scan).
    Index(
        "ix_harvest_webhook_deliveries_state_recent",
        "state",
        "timestamp",
        "id",
        postgresql_include=["subscription_id", "created_at"],
    ),
    # The dashboard's delivery list in every state, newest first, and its time filter.
    Index("ix_harvest_webhook_deliveries_timestamp", "timestamp", "id"),
    # A subscription's deliveries newest first (its page, the subscription filter).
    Index("ix_harvest_webhook_deliveries_subscription_recent", "subscription_id", "timestamp", "id"),
    # The topic filter, newest first: without it a rare topic walks the whole time index.
    Index("ix_harvest_webhook_deliveries_topic_recent", "topic", "timestamp", "id"),
    # The head-of-line check of ordered deliveries: the earlier rows of a (subscription, key) that
    # may hold its line. Partial, so it holds the keyed backlog only, never the delivered history.
    Index(
        "ix_harvest_webhook_deliveries_ordering_line",
        "subscription_id",
        "ordering_key",
        "ordering_seq",
        "id",
        postgresql_where=text(LINE_ROWS_SQL),
        sqlite_where=text(LINE_ROWS_SQL),
    ),
    # A tenant's listings newest first, in every state and in one (its DLQ, its stats). Partial: an
    # application without tenants pays nothing for them on each insert, and a query for one tenant
    # (tenant = ..., which implies the predicate) still reads them.
    Index(
        "ix_harvest_webhook_deliveries_tenant_recent",
        "tenant",
        "timestamp",
        "id",
        postgresql_where=text(TENANTED_SQL),
        sqlite_where=text(TENANTED_SQL),
    ),
    Index(
        "ix_harvest_webhook_deliveries_tenant_state_recent",
        "tenant",
        "state",
        "timestamp",
        "id",
        postgresql_where=text(TENANTED_SQL),
        sqlite_where=text(TENANTED_SQL),
    ),
    # A tenant's listing of one of its subscriptions (the portal's endpoint page and filter). The
    # subscription's own index is not enough: the planner cannot know that a subscription implies
    # its tenant, so for a tenant with many deliveries it read both indexes' bitmaps and sorted
    # every row of the subscription (16 ms at 20,000 deliveries, against 1 ms walking this one).
    Index(
        "ix_harvest_webhook_deliveries_tenant_subscription_recent",
        "tenant",
        "subscription_id",
        "timestamp",
        "id",
        postgresql_where=text(TENANTED_SQL),
        sqlite_where=text(TENANTED_SQL),
    ),
)

# The last sequence number of each ordering key of each tenant: a dispatch with a key takes the next
# one with an upsert, whose row lock makes dispatches of one key number in the order they commit.
# Per tenant: one tenant's open transaction never holds another's key of the same name.
ordering_keys_table = Table(
    "harvest_webhook_ordering_keys",
    metadata,
    # '' for no tenant: a primary key column cannot be NULL.
    Column("tenant", String(MAX_TENANT_LENGTH), primary_key=True, server_default=""),
    Column("ordering_key", String(MAX_ORDERING_KEY_LENGTH), primary_key=True),
    Column("last_seq", BigInteger, nullable=False),
)

#: The literal conditions of the partial indexes' rows, for queries: a bound parameter would hide
#: the state from the planner of a generic (prepared) plan, which then could not use them.
PENDING_ROWS = deliveries_table.c.state == literal_column(f"'{DeliveryState.PENDING.value}'")
INFLIGHT_ROWS = deliveries_table.c.state == literal_column(f"'{DeliveryState.INFLIGHT.value}'")
TROUBLED_ROWS = text(TROUBLED_SQL)

#: Indexes of earlier versions that the ones above replace. ensure_schema leaves them (processes of
#: the previous version query them during a rolling upgrade); schema_sql ends by dropping them.
RETIRED_INDEXES = (
    # Full (state, ...) indexes that grew with the history: now partial.
    "ix_harvest_webhook_deliveries_due",
    "ix_harvest_webhook_deliveries_lease",
    # Now ix_harvest_webhook_deliveries_state_recent, which also covers the stats.
    "ix_harvest_webhook_deliveries_state_timestamp",
    # (subscription_id, state) could not order a subscription's deliveries by time.
    "ix_harvest_webhook_deliveries_subscription",
)

attempts_table = Table(
    "harvest_webhook_attempts",
    metadata,
    # BIGINT on PostgreSQL; SQLite only autoincrements a column declared exactly INTEGER.
    Column("id", BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True),
    Column("delivery_id", String(ID_LENGTH), nullable=False),
    Column("attempt", Integer, nullable=False),
    Column("started_at", UTCDateTime, nullable=False),
    Column("response_status", Integer, nullable=True),
    Column("response_body", Text, nullable=True),
    Column("elapsed_ms", Integer, nullable=True),
    Column("error", Text, nullable=True),
    Index("ix_harvest_webhook_attempts_delivery", "delivery_id"),
    # The dashboard's attempts-per-minute chart reads one window of it.
    Index("ix_harvest_webhook_attempts_started", "started_at"),
)


# The transactional outbox: written in the application's own transaction by dispatch_in_tx, then
# relayed into deliveries. A claim (token and expiry) keeps concurrent relays off the same row.
outbox_table = Table(
    "harvest_outbox",
    metadata,
    Column("id", String(ID_LENGTH), primary_key=True),
    Column("topic", Text, nullable=False),
    Column("payload", Text, nullable=False),
    Column("created_at", UTCDateTime, nullable=False),
    Column("relayed_at", UTCDateTime, nullable=True),
    Column("claim_token", String(32), nullable=True),
    Column("claimed_until", UTCDateTime, nullable=True),
    Column("relay_attempts", Integer, nullable=False, default=0),
    Column("last_error", Text, nullable=True),
    # The W3C trace context of dispatch_in_tx, handed to the deliveries the relay makes.
    Column("trace_context", Text, nullable=True),
    # dispatch_in_tx's ordering key, and the key's number taken in the writer's transaction.
    Column("ordering_key", String(MAX_ORDERING_KEY_LENGTH), nullable=True),
    Column("ordering_seq", BigInteger, nullable=True),
    # The tenant of dispatch_in_tx: the relay delivers to its subscriptions only. NULL: no tenant.
    Column("tenant", String(MAX_TENANT_LENGTH), nullable=True),
    # The relay's scan of unrelayed messages, and the purge of relayed ones.
    Index("ix_harvest_outbox_relayed_created", "relayed_at", "created_at"),
    # The unrelayed keyed messages, which hold their key's line (the head-of-line check). Partial:
    # it holds the few messages not yet relayed, never the relayed history.
    Index(
        "ix_harvest_outbox_unrelayed_key",
        "ordering_key",
        "ordering_seq",
        postgresql_where=text(UNRELAYED_KEYED_SQL),
        sqlite_where=text(UNRELAYED_KEYED_SQL),
    ),
)


#: The webhook tables, in creation order.
WEBHOOK_TABLES = (
    subscriptions_table,
    subscription_topics_table,
    deliveries_table,
    attempts_table,
    outbox_table,
    ordering_keys_table,
)


def schema_sql(dialect: str = "postgresql") -> str:
    """Return the DDL that creates the webhook tables and their indexes where they are absent, and
    drops the indexes of earlier versions that they replace (:data:`RETIRED_INDEXES`).

    :param dialect: a SQLAlchemy dialect name such as ``postgresql`` or ``sqlite``.
    """
    return _schema_sql(WEBHOOK_TABLES, dialect) + drop_indexes_sql(RETIRED_INDEXES)


# -- rows <-> models ------------------------------------------------------------------------------
# Each table has a column per field of its model, named alike (a test holds them together), so a
# row is the model's fields; only the fields stored in another type are converted, below. The
# store reads and writes rows only through these functions.

#: Columns that are not model fields.
_DELIVERY_ONLY = {"lease_token": None}


def subscription_column_values(values: Mapping[str, Any]) -> dict[str, Any]:
    """Return subscription field values (all or some) as column values."""
    columns = dict(values)
    if "event_topics" in columns:
        columns["event_topics"] = list(columns["event_topics"])
    if "status" in columns:
        columns["status"] = WebhookSubscriptionStatus(columns["status"]).value
    if "payload_filter" in columns:
        columns["payload_filter"] = filter_json(columns["payload_filter"])
    if "headers" in columns:
        columns["headers"] = dict(columns["headers"])
    if "rate_limit" in columns:
        limit = columns["rate_limit"]
        columns["rate_limit"] = None if limit is None else limit.to_dict()
    if "ordering_policy" in columns:
        columns["ordering_policy"] = OrderingPolicy(columns["ordering_policy"]).value
    return columns


# A model's __dict__ holds exactly its fields (plain frozen dataclasses): copying it is the
# cheapest way to read them all, and delivery_values runs once per delivery logged.


def topic_rows(
    subscription_id: str, patterns: Iterable[str], tenant: str | None = None
) -> list[dict[str, Any]]:
    """Return the topic index rows of a subscription of ``tenant`` with ``patterns`` (one per
    distinct key)."""
    keys = dict.fromkeys(pattern_key(pattern) for pattern in patterns)
    return [{"pattern_key": key, "subscription_id": subscription_id, "tenant": tenant} for key in keys]


def in_scope_sql(column: ColumnElement[Any], scope: TenantScope) -> ColumnElement[bool] | None:
    """The condition that keeps the rows of ``scope`` (a ``tenant`` column), ``None`` for every row."""
    if scope is ALL_TENANTS:
        return None
    return column.is_(None) if scope is None else column == scope


def subscription_values(subscription: WebhookSubscription) -> dict[str, Any]:
    return subscription_column_values(vars(subscription))


def delivery_values(delivery: DeliveryLog) -> dict[str, Any]:
    columns = vars(delivery).copy()
    columns["state"] = DeliveryState(delivery.state).value
    columns["request_headers"] = dict(delivery.request_headers)
    columns.update(_DELIVERY_ONLY)
    return columns


# Parsed filters by their stored JSON (as ``repr`` spells the decoded value), bounded.
_FILTERS: dict[str, Condition] = {}
_MAX_FILTERS = 1024


def _stored_filter(stored: Any) -> Condition:
    """The condition a stored filter's JSON describes.

    Every dispatch reads its subscriptions' rows again; parsing their filters each time was most
    of what a filter cost a dispatch, and a filter rarely changes. Keyed by the value itself, so
    a changed filter is parsed afresh; conditions are immutable, so sharing one is safe."""
    key = repr(stored)
    found = _FILTERS.get(key)
    if found is None:
        found = parse_condition(stored)
        if len(_FILTERS) >= _MAX_FILTERS:
            _FILTERS.clear()
        _FILTERS[key] = found
    return found


def row_to_subscription(row: Row[Any]) -> WebhookSubscription:
    # Rows were validated on the way in: re-validating every one on each read (URL parsing, topic
    # patterns, secret decoding) was a measurable part of dispatch.
    values = row._asdict()
    values["event_topics"] = tuple(values["event_topics"])
    values["status"] = WebhookSubscriptionStatus(values["status"])
    # Parsed, not validated again: the condition was checked when it was stored.
    stored_filter = values["payload_filter"]
    values["payload_filter"] = None if stored_filter is None else _stored_filter(stored_filter)
    values["headers"] = dict(values["headers"] or {})
    stored_limit = values["rate_limit"]
    values["rate_limit"] = None if stored_limit is None else RateLimit(**stored_limit)
    stored_policy = values["ordering_policy"]
    values["ordering_policy"] = (
        DEFAULT_ORDERING_POLICY if stored_policy is None else OrderingPolicy(stored_policy)
    )
    return WebhookSubscription.from_trusted(values)


def row_to_delivery(row: Row[Any]) -> DeliveryLog:
    values = row._asdict()
    for column in _DELIVERY_ONLY:
        del values[column]
    values["state"] = DeliveryState(values["state"])
    values["request_headers"] = dict(values["request_headers"] or {})
    return DeliveryLog(**values)


def row_to_attempt(row: Row[Any]) -> DeliveryAttempt:
    values = row._asdict()
    del values["id"]  # the history's own sequence, not part of the model
    return DeliveryAttempt(**values)
