"""The completion-trigger tables, on the one shared :data:`flask_harvest._sql.metadata`."""

from __future__ import annotations

from sqlalchemy import BigInteger, Column, Index, Integer, PrimaryKeyConstraint, String, Table, Text

from .._sql import UTCDateTime, metadata
from .definitions import MAX_NAME_LENGTH

__all__ = ["TRIGGER_TABLES", "fires_table", "outbox_table", "triggers_table"]

#: Ids are UUIDs in their 36-character text form.
ID_LENGTH = 36

# JSON columns are text, as the workflow tables keep theirs: the definition as registered, and a
# row another build wrote (or a hand edit) that no longer parses is read as text, never an error.
triggers_table = Table(
    "harvest_completion_triggers",
    metadata,
    Column("id", String(ID_LENGTH), primary_key=True),
    Column("source_workflow_name", String(MAX_NAME_LENGTH), nullable=False),
    Column("terminal_states", Text, nullable=False),
    Column("target_workflow_name", String(MAX_NAME_LENGTH), nullable=False),
    Column("input_mapping", Text, nullable=False),
    Column("condition", Text, nullable=True),
    Column("created_at", UTCDateTime, nullable=False),
    # The target start's queue fields; NULL leaves each to the target workflow's default.
    Column("queue_name", String(MAX_NAME_LENGTH), nullable=True),
    Column("concurrency_key", String(MAX_NAME_LENGTH), nullable=True),
    Column("concurrency_limit", Integer, nullable=True),
    Column("priority", Integer, nullable=True),
    Column("updated_at", UTCDateTime, nullable=False),
    # The terminal hook's one query: the triggers of the workflow that just ended.
    Index("ix_harvest_completion_triggers_source", "source_workflow_name"),
    # The dashboard's and the admin API's paged listing, oldest first.
    Index("ix_harvest_completion_triggers_created", "created_at", "id"),
)

# The ledger: one row per (source execution, trigger) once the pair is decided. The primary key
# with ON CONFLICT DO NOTHING is what makes a fire happen at most once. No foreign key (SQLite does
# not enforce them by default): deleting a trigger deletes its rows in the same transaction.
fires_table = Table(
    "harvest_completion_trigger_fires",
    metadata,
    Column("source_exec_id", String(ID_LENGTH), nullable=False),
    Column("trigger_id", String(ID_LENGTH), nullable=False),
    Column("fired_at", UTCDateTime, nullable=False),
    # NULL: fired; otherwise why it was durably skipped (condition_unmet, chain_depth_exceeded).
    Column("outcome", String(32), nullable=True),
    Column("target_execution_id", String(ID_LENGTH), nullable=True),
    PrimaryKeyConstraint("source_exec_id", "trigger_id"),
    Index("ix_harvest_completion_trigger_fires_trigger", "trigger_id", "fired_at"),
    Index("ix_harvest_completion_trigger_fires_fired_at", "fired_at"),
    # The metrics scrape's bounded counts by outcome (NULL, fired, included).
    Index("ix_harvest_completion_trigger_fires_outcome", "outcome"),
)

# Cross-shard target starts not made yet: a row is written on the source's shard in its terminal
# transaction, beside the ledger row, when the target's workflow_id routes to another shard, and
# deleted once the target started there (see triggers/outbox.py). Each row carries everything the
# start needs, so a drainer reads nothing else (the trigger may have been deleted since).
outbox_table = Table(
    "harvest_completion_trigger_outbox",
    metadata,
    Column("id", String(ID_LENGTH), primary_key=True),
    Column("source_exec_id", String(ID_LENGTH), nullable=False),
    Column("trigger_id", String(ID_LENGTH), nullable=False),
    Column("target_shard", Integer, nullable=False),
    Column("target_workflow_name", String(MAX_NAME_LENGTH), nullable=False),
    Column("target_workflow_id", String(MAX_NAME_LENGTH), nullable=False),
    Column("target_input", Text, nullable=False),
    Column("queue_name", String(MAX_NAME_LENGTH), nullable=True),
    Column("concurrency_key", String(MAX_NAME_LENGTH), nullable=True),
    Column("concurrency_limit", Integer, nullable=True),
    # An integer as on the triggers table (NULL: the target workflow's default priority).
    Column("priority", Integer, nullable=True),
    Column("max_workflow_input_bytes", BigInteger, nullable=False),
    # The target's trigger depth (the source's plus one), so the chain limit holds across shards.
    Column("trigger_depth", Integer, nullable=False),
    Column("created_at", UTCDateTime, nullable=False),
    # The drain takes the oldest rows first; retention asks whether a fire's row is still here.
    Index("ix_harvest_completion_trigger_outbox_created", "created_at", "id"),
    Index("ix_harvest_completion_trigger_outbox_source", "source_exec_id", "trigger_id"),
)

#: The completion-trigger tables, in creation order.
TRIGGER_TABLES = (triggers_table, fires_table, outbox_table)
