"""The schedules table (``harvest_workflow_schedules``) and its statements.

One row per scheduled workflow: its cron text, whether it is paused, and the last tick handled
(started, skipped, or passed while paused). Every move of a row is a guarded ``UPDATE ...
RETURNING``: :meth:`SqlScheduleStore.advance` moves ``last_tick_at`` only from the value the caller
read, so of two sweeps that read the same row one wins, and only the winner starts runs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Boolean, Column, Connection, Engine, String, Table, false, select, true, update
from sqlalchemy.engine import Row

from .._sql import SqlDatabase, UTCDateTime, metadata
from ..errors import NotFoundError
from ._schema import NAME_LENGTH
from .cron import MAX_CRON_LENGTH
from .errors import WorkflowError

__all__ = ["SCHEDULE_TABLES", "ScheduleNotFoundError", "ScheduleRow", "SqlScheduleStore", "schedules_table"]

_HINT = "create the tables with SqlScheduleStore.ensure_schema() (Harvest does it at init_app)"

schedules_table = Table(
    "harvest_workflow_schedules",
    metadata,
    Column("name", String(NAME_LENGTH), primary_key=True),
    Column("cron", String(MAX_CRON_LENGTH), nullable=False),
    Column("paused", Boolean, nullable=False, default=False),
    # Every tick up to this one has been handled: started, skipped as missed, or passed while
    # paused or before the schedule was declared.
    Column("last_tick_at", UTCDateTime, nullable=False),
    Column("updated_at", UTCDateTime, nullable=False),
)
_s = schedules_table
#: The schedules' tables, in creation order.
SCHEDULE_TABLES = (schedules_table,)


class ScheduleNotFoundError(WorkflowError, NotFoundError):
    """No workflow schedule has this name."""

    def __init__(self, name: object) -> None:
        super().__init__(f"no workflow schedule named {name!r}")
        self.name = name


@dataclass(frozen=True)
class ScheduleRow:
    """A schedule as stored."""

    name: str
    cron: str
    paused: bool
    last_tick_at: datetime
    updated_at: datetime


def _row(row: Row[Any]) -> ScheduleRow:
    return ScheduleRow(row.name, row.cron, bool(row.paused), row.last_tick_at, row.updated_at)


class SqlScheduleStore:
    """The schedules of the workflows, in the workflow store's database (a tick's runs commit with
    the move of its ``last_tick_at``)."""

    def __init__(self, engine: Engine) -> None:
        self.db = SqlDatabase(engine, owner="SqlScheduleStore", hint=_HINT)
        self.engine = engine

    def __repr__(self) -> str:
        return f"<SqlScheduleStore {self.engine.url.render_as_string(hide_password=True)}>"

    def ensure_schema(self) -> None:
        """Create the schedules table where it does not exist yet."""
        self.db.create_tables(SCHEDULE_TABLES, what="the workflow schedules table")

    def sync(self, name: str, cron: str, first_tick: datetime, *, now: datetime) -> None:
        """Declare ``name`` on ``cron``: insert it (unpaused, ticks after ``first_tick`` due), or
        update its cron text, keeping ``paused`` and ``last_tick_at``."""
        with self.db.transaction("sync a workflow schedule") as conn:
            conn.execute(
                self.db.insert(_s)
                .values(name=name, cron=cron, paused=False, last_tick_at=first_tick, updated_at=now)
                .on_conflict_do_nothing(index_elements=[_s.c.name])
            )
            conn.execute(
                update(_s).where(_s.c.name == name, _s.c.cron != cron).values(cron=cron, updated_at=now)
            )

    def all(self) -> list[ScheduleRow]:
        """Every schedule, by name."""
        with self.db.read("list the workflow schedules") as conn:
            return [_row(row) for row in conn.execute(select(_s).order_by(_s.c.name))]

    def get(self, name: str) -> ScheduleRow:
        """The schedule ``name``.

        :raises ScheduleNotFoundError: there is none.
        """
        with self.db.read("read a workflow schedule") as conn:
            row = conn.execute(select(_s).where(_s.c.name == name)).first()
        if row is None:
            raise ScheduleNotFoundError(name)
        return _row(row)

    def pause(self, name: str, *, now: datetime) -> ScheduleRow:
        """Pause ``name`` (a paused one is left as it is).

        :raises ScheduleNotFoundError: there is none.
        """
        with self.db.transaction("pause a workflow schedule") as conn:
            row = conn.execute(
                update(_s)
                .where(_s.c.name == name, _s.c.paused == false())
                .values(paused=True, updated_at=now)
                .returning(*_s.c)
            ).first()
            if row is None:
                row = conn.execute(select(_s).where(_s.c.name == name)).first()
        if row is None:
            raise ScheduleNotFoundError(name)
        return _row(row)

    def resume(self, name: str, last_tick: Callable[[str], datetime], *, now: datetime) -> ScheduleRow:
        """Resume ``name`` with ``last_tick(cron)`` as its last tick handled, so that the ticks that
        fell while it was paused are not started (a running one is left as it is).

        :raises ScheduleNotFoundError: there is none.
        """
        with self.db.transaction("resume a workflow schedule") as conn:
            # Locks the row (PostgreSQL) so the cron read is the one the update applies to.
            current = conn.execute(select(_s).where(_s.c.name == name).with_for_update()).first()
            if current is None:
                raise ScheduleNotFoundError(name)
            row = conn.execute(
                update(_s)
                .where(_s.c.name == name, _s.c.paused == true())
                .values(paused=False, last_tick_at=last_tick(current.cron), updated_at=now)
                .returning(*_s.c)
            ).first()
        return _row(row if row is not None else current)

    def advance(self, conn: Connection, current: ScheduleRow, last_tick: datetime, *, now: datetime) -> bool:
        """Move ``current``'s ``last_tick_at`` to ``last_tick`` in ``conn``'s transaction, only if
        the row is still as ``current`` was read (same cron, same last tick) and not paused.

        :returns: whether it moved: only then does the caller start the ticks' runs, in ``conn``.
        """
        row = conn.execute(
            update(_s)
            .where(
                _s.c.name == current.name,
                _s.c.cron == current.cron,
                _s.c.paused == false(),
                _s.c.last_tick_at == current.last_tick_at,
            )
            .values(last_tick_at=last_tick, updated_at=now)
            .returning(_s.c.name)
        ).first()
        return row is not None
