"""The completion-callback tables, on the one shared :data:`flask_harvest._sql.metadata`."""

from __future__ import annotations

from sqlalchemy import Column, Index, Integer, String, Table, Text, UniqueConstraint

from .._sql import UTCDateTime, metadata

__all__ = ["CALLBACK_TABLES", "dead_letters_table", "deliveries_table"]

deliveries_table = Table(
    "harvest_completion_deliveries",
    metadata,
    Column("delivery_id", String(36), primary_key=True),
    Column("execution_id", String(36), nullable=False),
    Column("callback_index", Integer, nullable=False),
    Column("target_url", Text, nullable=False),
    Column("filter", Text, nullable=False),
    Column("state", String(16), nullable=False),
    Column("attempts", Integer, nullable=False, default=0),
    # The retry policy, frozen when the row is enqueued.
    Column("max_attempts", Integer, nullable=False),
    Column("initial_backoff_ms", Integer, nullable=False),
    Column("max_backoff_ms", Integer, nullable=False),
    # The exact bytes that are signed and POSTed on every attempt and redrive.
    Column("body", Text, nullable=False),
    Column("next_attempt_at", UTCDateTime, nullable=True),
    Column("lease_token", String(32), nullable=True),
    Column("lease_expires_at", UTCDateTime, nullable=True),
    Column("last_status", Integer, nullable=True),
    Column("last_error", Text, nullable=True),
    Column("created_at", UTCDateTime, nullable=False),
    Column("updated_at", UTCDateTime, nullable=False),
    Column("delivered_at", UTCDateTime, nullable=True),
    # The W3C trace context of the run's end (flask_harvest.tracing): every attempt joins it.
    Column("trace_context", Text, nullable=True),
    # What makes re-running the terminal hooks a no-op: one row per (execution, target).
    UniqueConstraint("execution_id", "callback_index"),
    Index("ix_harvest_completion_deliveries_due", "state", "next_attempt_at"),
    Index("ix_harvest_completion_deliveries_lease", "state", "lease_expires_at"),
    # The dashboard's list of failed deliveries across executions, newest first, a page at a time.
    Index("ix_harvest_completion_deliveries_state_updated", "state", "updated_at", "delivery_id"),
)

# One entry per FAILED delivery; a redrive removes it.
dead_letters_table = Table(
    "harvest_completion_dead_letters",
    metadata,
    Column("delivery_id", String(36), primary_key=True),
    Column("execution_id", String(36), nullable=False),
    Column("reason_type", String(64), nullable=False),
    Column("reason", Text, nullable=False),
    Column("created_at", UTCDateTime, nullable=False),
    Index("ix_harvest_completion_dead_letters_created", "created_at"),
)

#: The completion-callback tables, in creation order.
CALLBACK_TABLES = (deliveries_table, dead_letters_table)
