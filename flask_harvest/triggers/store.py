"""Trigger definitions and the fires ledger in SQL (SQLAlchemy 2 Core, PostgreSQL or SQLite).

Registration is a full-replacement upsert keyed by the trigger's id. The ledger's primary key
``(source_exec_id, trigger_id)`` with ``INSERT ... ON CONFLICT DO NOTHING`` decides each pair once,
on both databases, without an error that would abort the caller's PostgreSQL transaction.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, Engine, delete, exists, select, true, update
from sqlalchemy.engine import Row
from sqlalchemy.sql.elements import ColumnElement

from .._bounded import bounded_counts
from .._sql import SqlDatabase, after_position
from ..conditions import condition_to_json, parse_condition
from ..errors import InvalidFieldError
from ..workflows._schema import executions_table
from ._schema import TRIGGER_TABLES, fires_table, outbox_table, triggers_table
from .definitions import QUEUE_FIELDS, CompletionTrigger, parse_terminal_states
from .mappings import mapping_to_json, parse_mapping

__all__ = [
    "FAILED_START_OUTCOMES",
    "Fire",
    "OutboxStart",
    "SqlTriggerStore",
    "StoredTrigger",
    "loads_column",
]

_t = triggers_table
_f = fires_table
_o = outbox_table
_HINT = "create the tables with SqlTriggerStore.ensure_schema() (Harvest does it at init_app)"
#: Ledger outcomes of a target that could not be started (an unknown target workflow, a mapped input
#: it cannot take). Such a row shows the failure to operators but leaves the pair open: a later
#: evaluation (``flask harvest triggers evaluate``) that can start the target takes the row over.
FAILED_START_OUTCOMES = ("validation_failed", "payload_too_large")


@dataclass(frozen=True)
class Fire:
    """One row of the fires ledger: how a (source execution, trigger) pair was decided.

    :param outcome: ``None`` when the target was started, else the durable skip reason
        (``condition_unmet``, ``chain_depth_exceeded``) or why the target could not be started
        (one of :data:`FAILED_START_OUTCOMES`).
    :param fired_at: when the pair was decided (fired, skipped, or last failed to start).
    """

    source_exec_id: str
    trigger_id: str
    fired_at: datetime
    outcome: str | None
    target_execution_id: str | None

    @property
    def failed_start(self) -> bool:
        """Whether the target could not be started (the pair stays open to a later evaluation)."""
        return self.outcome in FAILED_START_OUTCOMES


@dataclass(frozen=True)
class StoredTrigger:
    """A trigger row as stored, its JSON columns still text: the terminal hook parses each one
    itself, so that a row it cannot understand fails closed instead of failing the transition."""

    id: str
    source_workflow_name: str
    target_workflow_name: str
    terminal_states: str
    input_mapping: str
    condition: str | None
    created_at: datetime
    updated_at: datetime
    queue_name: str | None = None
    concurrency_key: str | None = None
    concurrency_limit: int | None = None
    priority: int | None = None

    def parse(self) -> CompletionTrigger:
        """Return the trigger this row holds.

        :raises InvalidFieldError: a column does not hold a valid definition (or is not JSON).
        """
        return CompletionTrigger(
            source_workflow_name=self.source_workflow_name,
            target_workflow_name=self.target_workflow_name,
            terminal_states=parse_terminal_states(loads_column(self.terminal_states, "terminal_states")),
            input_mapping=parse_mapping(loads_column(self.input_mapping, "input_mapping")),
            condition=(
                parse_condition(loads_column(self.condition, "condition"))
                if self.condition is not None
                else None
            ),
            id=self.id,
            created_at=self.created_at,
            updated_at=self.updated_at,
            **{name: getattr(self, name) for name in QUEUE_FIELDS},
        )

    def start_queue(self) -> dict[str, Any]:
        """The target start's queue fields, by the names ``WorkflowRunner.start`` takes them."""
        return {
            "queue": self.queue_name,
            "concurrency_key": self.concurrency_key,
            "concurrency_limit": self.concurrency_limit,
            "priority": self.priority,
        }


@dataclass(frozen=True)
class OutboxStart:
    """A cross-shard target start waiting in the outbox: everything the start needs.

    :param target_input: the mapped input, as JSON text (checked against the limit at fire time).
    :param id: the row's id; a fresh one when not given.
    """

    source_exec_id: str
    trigger_id: str
    target_shard: int
    target_workflow_name: str
    target_workflow_id: str
    target_input: str
    queue_name: str | None
    concurrency_key: str | None
    concurrency_limit: int | None
    priority: int | None
    max_workflow_input_bytes: int
    trigger_depth: int
    created_at: datetime
    id: str = ""

    def start_queue(self) -> dict[str, Any]:
        """The start's queue fields, by the names ``WorkflowRunner.start`` takes them."""
        return {
            "queue": self.queue_name,
            "concurrency_key": self.concurrency_key,
            "concurrency_limit": self.concurrency_limit,
            "priority": self.priority,
        }


def loads_column(text: str, field: str) -> Any:
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        raise InvalidFieldError(field, "is not valid JSON") from None


def _dumps(value: Any) -> str:
    return json.dumps(value, allow_nan=False, ensure_ascii=False, separators=(",", ":"))


class SqlTriggerStore:
    """Completion-trigger definitions and their fires ledger.

    :param engine: the workflow store's engine (the ledger commits in the source's terminal
        transaction, so it lives in the same database).
    """

    def __init__(self, engine: Engine) -> None:
        self.db = SqlDatabase(engine, owner="SqlTriggerStore", hint=_HINT)
        self.engine = engine

    def __repr__(self) -> str:
        return f"<SqlTriggerStore {self.engine.url.render_as_string(hide_password=True)}>"

    @property
    def engines(self) -> list[Engine]:
        """Every database a source's terminal transaction may be on (one here; each shard's)."""
        return [self.engine]

    def on_shard(self, shard: int) -> SqlTriggerStore:
        """The store of one shard's database (this one: it is shard 0 when there are no shards)."""
        return self

    def of_execution(self, execution_id: str) -> SqlTriggerStore:
        """The store of the database an execution's terminal transaction runs on."""
        return self

    def ensure_schema(self) -> None:
        """Create the completion-trigger tables and indexes where they do not exist yet."""
        self.db.create_tables(TRIGGER_TABLES, what="the completion-trigger tables")

    # -- definitions ---------------------------------------------------------------------------

    def upsert(self, trigger: CompletionTrigger, *, now: datetime) -> CompletionTrigger:
        """Register ``trigger``, replacing every field of a trigger with the same id (an omitted
        condition clears the stored one); ``created_at`` is kept.

        :returns: the trigger as stored, with its timestamps.
        """
        with self.db.transaction("register a completion trigger") as conn:
            return self._upsert(conn, trigger, now)

    def sync(self, triggers: Sequence[CompletionTrigger], *, now: datetime) -> list[CompletionTrigger]:
        """Upsert every trigger in one transaction, leaving rows that already hold the same
        definition untouched (so ``updated_at`` says when a definition last changed)."""
        stored = []
        with self.db.transaction("sync the static completion triggers") as conn:
            for trigger in triggers:
                row = conn.execute(select(_t).where(_t.c.id == trigger.id)).first()
                if row is not None and _same(row, trigger):
                    stored.append(_row(row).parse())
                else:
                    stored.append(self._upsert(conn, trigger, now))
        return stored

    def _upsert(self, conn: Connection, trigger: CompletionTrigger, now: datetime) -> CompletionTrigger:
        values = _values(trigger)
        stmt = self.db.insert(_t).values(id=trigger.id, created_at=now, updated_at=now, **values)
        stmt = stmt.on_conflict_do_update(index_elements=[_t.c.id], set_={**values, "updated_at": now})
        conn.execute(stmt)
        row = conn.execute(select(_t).where(_t.c.id == trigger.id)).one()
        return _row(row).parse()

    def put(self, rows: Sequence[StoredTrigger]) -> None:
        """Write ``rows`` exactly as another database holds them (timestamps too), replacing rows
        with the same ids: how a shard gets shard 0's definitions."""
        if not rows:
            return
        with self.db.transaction("copy completion triggers") as conn:
            for row in rows:
                self._put(conn, row)

    def _put(self, conn: Connection, row: StoredTrigger) -> None:
        values = {column.name: getattr(row, column.name) for column in _t.c}
        stmt = self.db.insert(_t).values(values)
        conn.execute(stmt.on_conflict_do_update(index_elements=[_t.c.id], set_=values))

    def mirror(self, rows: Sequence[StoredTrigger]) -> int:
        """Make this database's definitions exactly ``rows`` (shard 0's): write what is missing or
        differs, delete what ``rows`` lacks (with its fires rows, as :meth:`delete` does).

        :returns: how many definitions were written or deleted.
        """
        wanted = {row.id: row for row in rows}
        with self.db.transaction("repair the completion triggers") as conn:
            held = {row.id: _row(row) for row in conn.execute(select(_t)).all()}
            changed = [row for key, row in wanted.items() if held.get(key) != row]
            for row in changed:
                self._put(conn, row)
            gone = [key for key in held if key not in wanted]
            if gone:
                conn.execute(delete(_f).where(_f.c.trigger_id.in_(gone)))
                conn.execute(delete(_t).where(_t.c.id.in_(gone)))
        return len(changed) + len(gone)

    def get(self, trigger_id: str) -> StoredTrigger | None:
        """Return the stored row of a trigger, or ``None``."""
        with self.db.transaction("read a completion trigger") as conn:
            row = conn.execute(select(_t).where(_t.c.id == trigger_id)).first()
        return _row(row) if row is not None else None

    def list_triggers(
        self, *, limit: int | None = None, after: tuple[datetime, str] | None = None
    ) -> list[StoredTrigger]:
        """Return the stored triggers, oldest first by ``(created_at, id)``: every one, or at most
        ``limit`` after the position ``after`` (a keyset walk of the listing's index)."""
        query = select(_t).order_by(_t.c.created_at, _t.c.id).limit(limit)
        if after is not None:
            query = query.where(after_position(_t.c.created_at, _t.c.id, after))
        with self.db.read("list completion triggers") as conn:
            rows = conn.execute(query).all()
        return [_row(row) for row in rows]

    def delete(self, trigger_id: str) -> bool:
        """Delete a trigger and its fires rows; ``False`` if there was none."""
        with self.db.transaction("delete a completion trigger") as conn:
            conn.execute(delete(_f).where(_f.c.trigger_id == trigger_id))
            return (
                conn.execute(delete(_t).where(_t.c.id == trigger_id).returning(_t.c.id)).first() is not None
            )

    def for_source(self, conn: Connection, workflow_name: str) -> list[StoredTrigger]:
        """Return the triggers of ``workflow_name``, in the caller's transaction."""
        rows = conn.execute(
            select(_t).where(_t.c.source_workflow_name == workflow_name).order_by(_t.c.created_at, _t.c.id)
        ).all()
        return [_row(row) for row in rows]

    # -- the fires ledger ----------------------------------------------------------------------

    def fire_decided(self, conn: Connection, source_exec_id: str, trigger_id: str) -> bool:
        """Whether the pair has a ledger row already (in the caller's transaction), other than a
        failed start's."""
        query = select(_f.c.trigger_id).where(
            _f.c.source_exec_id == source_exec_id,
            _f.c.trigger_id == trigger_id,
            _f.c.outcome.is_(None) | _f.c.outcome.not_in(FAILED_START_OUTCOMES),
        )
        return conn.execute(query).first() is not None

    def record_fire(
        self, conn: Connection, source_exec_id: str, trigger_id: str, *, outcome: str | None, now: datetime
    ) -> bool:
        """Insert the pair's ledger row, or take over its failed start's row; return whether this
        call wrote it (``False``: the pair was decided already).

        On PostgreSQL a concurrent writer of the same pair makes this wait for its commit, then
        check again: exactly one transaction decides a pair.
        """
        stmt = self.db.insert(_f).values(
            source_exec_id=source_exec_id, trigger_id=trigger_id, fired_at=now, outcome=outcome
        )
        stmt = stmt.on_conflict_do_update(
            index_elements=[_f.c.source_exec_id, _f.c.trigger_id],
            set_={"fired_at": now, "outcome": outcome},
            where=_f.c.outcome.in_(FAILED_START_OUTCOMES),
        ).returning(_f.c.trigger_id)
        return conn.execute(stmt).first() is not None

    def set_target(
        self, conn: Connection, source_exec_id: str, trigger_id: str, target_execution_id: str
    ) -> None:
        conn.execute(
            update(_f)
            .where(_f.c.source_exec_id == source_exec_id, _f.c.trigger_id == trigger_id)
            .values(target_execution_id=target_execution_id)
        )

    def fires(
        self, *, trigger_id: str | None = None, source_exec_id: str | None = None, limit: int = 100
    ) -> list[Fire]:
        """Return ledger rows, newest first."""
        query = select(_f)
        if trigger_id is not None:
            query = query.where(_f.c.trigger_id == trigger_id)
        if source_exec_id is not None:
            query = query.where(_f.c.source_exec_id == source_exec_id)
        query = query.order_by(_f.c.fired_at.desc(), _f.c.source_exec_id).limit(max(0, limit))
        with self.db.read("list completion trigger fires") as conn:
            return [_fire(row) for row in conn.execute(query).all()]

    def count_outcomes(self, outcomes: Sequence[str | None], *, cap: int) -> list[int]:
        """How many ledger rows record each of ``outcomes`` (``None``: fired), counting at most
        ``cap`` of each (bounded walks of the outcome index: a metrics scrape's read)."""
        wanted = tuple(outcomes)

        def conditions() -> list[ColumnElement[bool]]:
            return [_f.c.outcome.is_(None) if each is None else _f.c.outcome == each for each in wanted]

        with self.db.read("count completion trigger fires by outcome") as conn:
            return bounded_counts(conn, _f, conditions, cap=cap, key=("trigger fires by outcome", wanted))

    def purge_fires(self, *, before: datetime) -> int:
        """Delete ledger rows decided before ``before`` whose source execution no longer exists and
        whose cross-shard target start is not waiting in the outbox.

        :returns: how many rows were deleted.
        """
        ex = executions_table
        source_exists = exists().where(ex.c.execution_id == _f.c.source_exec_id)
        start_waits = exists().where(
            _o.c.source_exec_id == _f.c.source_exec_id, _o.c.trigger_id == _f.c.trigger_id
        )
        with self.db.transaction("purge completion trigger fires") as conn:
            result = conn.execute(delete(_f).where(_f.c.fired_at < before, ~source_exists, ~start_waits))
        return int(result.rowcount or 0)

    # -- the cross-shard outbox ----------------------------------------------------------------

    def write_outbox(self, conn: Connection, start: OutboxStart) -> str:
        """Insert a cross-shard start in the caller's transaction (the source's terminal one).

        :returns: the row's id.
        """
        row_id = start.id or str(uuid.uuid4())
        values = {column.name: getattr(start, column.name) for column in _o.c}
        conn.execute(self.db.insert(_o).values({**values, "id": row_id}))
        return row_id

    def take_outbox(
        self,
        conn: Connection,
        *,
        limit: int,
        ids: Sequence[str] | None = None,
        names: Sequence[str] | None = None,
    ) -> list[OutboxStart]:
        """The oldest waiting starts (among ``ids``, or any; of the target workflows ``names``, or
        any), at most ``limit``, in the caller's transaction. On PostgreSQL they stay locked until
        it ends and rows another transaction holds are skipped: two drainers never take the same
        row at once."""
        query = select(_o).order_by(_o.c.created_at, _o.c.id).limit(max(limit, 0))
        if ids is not None:
            query = query.where(_o.c.id.in_(list(ids)))
        if names is not None:
            query = query.where(_o.c.target_workflow_name.in_(list(names)))
        if self.db.postgres:
            query = query.with_for_update(skip_locked=True)
        return [OutboxStart(**row._mapping) for row in conn.execute(query).all()]

    def started_outbox(self, conn: Connection, start: OutboxStart, target_execution_id: str) -> None:
        """Delete a start's row once its target runs, and name the target on its ledger row."""
        conn.execute(delete(_o).where(_o.c.id == start.id))
        self.set_target(conn, start.source_exec_id, start.trigger_id, target_execution_id)

    def count_outbox(self, *, cap: int) -> int:
        """How many starts wait in the outbox, counting at most ``cap`` (a metrics scrape's read)."""
        with self.db.read("count the completion trigger outbox") as conn:
            counts = bounded_counts(conn, _o, lambda: [true()], cap=cap, key=("trigger outbox",))
        return counts[0]


def _values(trigger: CompletionTrigger) -> dict[str, Any]:
    return {
        "source_workflow_name": trigger.source_workflow_name,
        "terminal_states": _dumps(list(trigger.terminal_states)),
        "target_workflow_name": trigger.target_workflow_name,
        "input_mapping": _dumps(mapping_to_json(trigger.input_mapping)),
        "condition": _dumps(condition_to_json(trigger.condition)) if trigger.condition is not None else None,
        **{name: getattr(trigger, name) for name in QUEUE_FIELDS},
    }


def _same(row: Row[Any], trigger: CompletionTrigger) -> bool:
    return all(getattr(row, key) == value for key, value in _values(trigger).items())


def _row(row: Row[Any]) -> StoredTrigger:
    return StoredTrigger(
        id=row.id,
        source_workflow_name=row.source_workflow_name,
        target_workflow_name=row.target_workflow_name,
        terminal_states=row.terminal_states,
        input_mapping=row.input_mapping,
        condition=row.condition,
        created_at=row.created_at,
        updated_at=row.updated_at,
        **{name: getattr(row, name) for name in QUEUE_FIELDS},
    )


def _fire(row: Row[Any]) -> Fire:
    return Fire(row.source_exec_id, row.trigger_id, row.fired_at, row.outcome, row.target_execution_id)
