"""The workflow tables, on the one shared :data:`flask_harvest._sql.metadata`, and the row mapping."""

from __future__ import annotations

from typing import Any

from sqlalchemy import JSON, Boolean, Column, Index, Integer, PrimaryKeyConstraint, String, Table, Text, text
from sqlalchemy.engine import Row

from .._sql import UTCDateTime, metadata
from .models import Execution, ExecutionState, StepRecord, decode_json

__all__ = ["WORKFLOW_TABLES", "executions_table", "row_to_execution", "row_to_step", "steps_table"]

#: An execution id is a UUID in its 36-character text form.
EXECUTION_ID_LENGTH = 36
NAME_LENGTH = 255

# The partial index's condition, as literal SQL both PostgreSQL and SQLite accept (it is compiled
# into DDL, where bound parameters are not allowed).
_OPEN = "state IN ('Pending', 'Running')"
# Queue indexes hold queued runs only: unqueued runs (most) pay nothing for them. The running
# keyed runs' index holds only those: a key's count reads exactly its running runs.
_QUEUED = "queue_name IS NOT NULL"
_RUNNING_KEYED = "queue_name IS NOT NULL AND concurrency_key IS NOT NULL AND state = 'Running'"

executions_table = Table(
    "harvest_workflow_executions",
    metadata,
    Column("execution_id", String(EXECUTION_ID_LENGTH), primary_key=True),
    Column("workflow_name", String(NAME_LENGTH), nullable=False),
    Column("workflow_id", String(NAME_LENGTH), nullable=False),
    # JSON as text: the exact bytes encode_json produced, so size limits and replays see one form.
    Column("input", Text, nullable=False),
    Column("output", Text, nullable=True),
    Column("error", Text, nullable=True),
    Column("state", String(16), nullable=False),
    Column("created_at", UTCDateTime, nullable=False),
    Column("started_at", UTCDateTime, nullable=True),
    Column("completed_at", UTCDateTime, nullable=True),
    Column("deadline", UTCDateTime, nullable=True),
    Column("attempt", Integer, nullable=False, default=0),
    Column("recovery_count", Integer, nullable=False, default=0),
    Column("lease_token", String(32), nullable=True),
    Column("lease_expires_at", UTCDateTime, nullable=True),
    Column("next_run_at", UTCDateTime, nullable=True),
    Column("cancel_requested", Boolean, nullable=False, default=False),
    Column("cancel_reason", Text, nullable=True),
    Column("trigger_depth", Integer, nullable=False, default=0),
    Column("completion_callbacks", JSON(none_as_null=True), nullable=True),
    # Continue-as-new: the chain of runs of one workflow_id, linked both ways.
    Column("continued_from", String(EXECUTION_ID_LENGTH), nullable=True),
    Column("continued_to", String(EXECUTION_ID_LENGTH), nullable=True),
    # Child runs: the parent, what the child does when the parent closes, and (on a parent that
    # sleeps until a child ends) the workflow_id of the child it waits for.
    Column("parent_execution_id", String(EXECUTION_ID_LENGTH), nullable=True),
    Column("parent_close_policy", String(16), nullable=True),
    Column("waiting_on", String(NAME_LENGTH), nullable=True),
    # Forks: the source run, the fork point and the mode.
    Column("forked_from", String(EXECUTION_ID_LENGTH), nullable=True),
    Column("fork_from_step", Integer, nullable=True),
    Column("fork_mode", String(16), nullable=True),
    # Queues: where the run is claimed, its concurrency key and limit, and its priority.
    Column("queue_name", String(NAME_LENGTH), nullable=True),
    Column("concurrency_key", String(NAME_LENGTH), nullable=True),
    Column("concurrency_limit", Integer, nullable=True),
    Column("priority", Integer, nullable=False, default=0, server_default=text("0")),
    # The start's W3C trace context (flask_harvest.tracing): the run's spans join that trace.
    Column("trace_context", Text, nullable=True),
    # Quarantine (models.Isolation): NULL, or the run must run alone, or its claim runs it alone.
    Column("isolation", String(16), nullable=True),
    Column("charged_recoveries", Integer, nullable=False, default=0, server_default=text("0")),
    # At most one open run per workflow_id: what makes concurrent starts collapse into one.
    Index(
        "ux_harvest_workflow_executions_open_workflow_id",
        "workflow_id",
        unique=True,
        postgresql_where=text(_OPEN),
        sqlite_where=text(_OPEN),
    ),
    # The id reuse policy's look at earlier runs.
    Index("ix_harvest_workflow_executions_workflow_id", "workflow_id", "created_at"),
    # The sweeper: due pending runs, expired leases, overdue deadlines.
    Index("ix_harvest_workflow_executions_due", "state", "next_run_at"),
    Index("ix_harvest_workflow_executions_lease", "state", "lease_expires_at"),
    Index("ix_harvest_workflow_executions_deadline", "state", "deadline"),
    # Listing's keyset paging, filtered by name or not.
    Index("ix_harvest_workflow_executions_name_created", "workflow_name", "created_at", "execution_id"),
    Index("ix_harvest_workflow_executions_created", "created_at", "execution_id"),
    # The dashboard's list filtered by state alone (a rare state is not found by walking every
    # row of the created index), and its bounded counts by state.
    Index("ix_harvest_workflow_executions_state_created", "state", "created_at", "execution_id"),
    # A parent's children: the parent-close cascade, waking a waiting parent, the dashboard.
    Index("ix_harvest_workflow_executions_parent", "parent_execution_id"),
    # Queued claims: a queue's due runs in the claim's order (so the claim stops at the first
    # eligible one, never sorts them all) and its running count; the running runs of a
    # concurrency key; the first starts in a rate limit's window.
    Index(
        "ix_harvest_workflow_executions_queue",
        "queue_name",
        "state",
        "priority",
        "next_run_at",
        "execution_id",
        postgresql_where=text(_QUEUED),
        sqlite_where=text(_QUEUED),
    ),
    Index(
        "ix_harvest_workflow_executions_queue_key",
        "queue_name",
        "concurrency_key",
        postgresql_where=text(_RUNNING_KEYED),
        sqlite_where=text(_RUNNING_KEYED),
    ),
    Index(
        "ix_harvest_workflow_executions_queue_started",
        "queue_name",
        "started_at",
        postgresql_where=text(_QUEUED),
        sqlite_where=text(_QUEUED),
    ),
    # The metrics scrape's bounded counts by workflow and state.
    Index("ix_harvest_workflow_executions_name_state", "workflow_name", "state"),
)

# One checkpoint per (execution, position). No foreign key: the sweeper may purge executions and
# their steps separately, and SQLite does not enforce foreign keys by default anyway.
steps_table = Table(
    "harvest_workflow_steps",
    metadata,
    Column("execution_id", String(EXECUTION_ID_LENGTH), nullable=False),
    Column("seq", Integer, nullable=False),
    Column("name", String(NAME_LENGTH), nullable=False),
    Column("output", Text, nullable=True),
    Column("error", Text, nullable=True),
    Column("created_at", UTCDateTime, nullable=False),
    PrimaryKeyConstraint("execution_id", "seq"),
)


#: The workflow tables, in creation order.
WORKFLOW_TABLES = (executions_table, steps_table)


def row_to_execution(row: Row[Any]) -> Execution:
    return Execution(
        execution_id=row.execution_id,
        workflow_name=row.workflow_name,
        workflow_id=row.workflow_id,
        input=decode_json(row.input),
        state=ExecutionState(row.state),
        created_at=row.created_at,
        output=decode_json(row.output),
        error=row.error,
        started_at=row.started_at,
        completed_at=row.completed_at,
        deadline=row.deadline,
        attempt=row.attempt,
        recovery_count=row.recovery_count,
        lease_token=row.lease_token,
        lease_expires_at=row.lease_expires_at,
        next_run_at=row.next_run_at,
        cancel_requested=bool(row.cancel_requested),
        cancel_reason=row.cancel_reason,
        trigger_depth=row.trigger_depth,
        completion_callbacks=row.completion_callbacks,
        continued_from=row.continued_from,
        continued_to=row.continued_to,
        parent_execution_id=row.parent_execution_id,
        parent_close_policy=row.parent_close_policy,
        waiting_on=row.waiting_on,
        forked_from=row.forked_from,
        fork_from_step=row.fork_from_step,
        fork_mode=row.fork_mode,
        queue_name=row.queue_name,
        concurrency_key=row.concurrency_key,
        concurrency_limit=row.concurrency_limit,
        priority=row.priority,
        trace_context=row.trace_context,
        isolation=row.isolation,
        charged_recoveries=row.charged_recoveries,
    )


def row_to_step(row: Row[Any]) -> StepRecord:
    return StepRecord(
        execution_id=row.execution_id,
        seq=row.seq,
        name=row.name,
        output=decode_json(row.output),
        error=row.error,
        created_at=row.created_at,
    )
