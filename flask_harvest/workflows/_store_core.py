"""The core of the workflow store: its transactions (:class:`StoreCore`) and THE terminal
transition (:class:`TerminalTransition`), which every other part of the store is handed.

Every move of an execution is one short transaction around a guarded ``UPDATE ... RETURNING``
(only a row in the expected state, under the expected lease, moves), so concurrent workers, sweepers
and API calls never both win. Every place an execution ends goes through
:meth:`TerminalTransition.finish_in`, which runs the
:class:`~flask_harvest.workflows.hooks.TerminalHooks` in the same transaction.
"""

from __future__ import annotations

import contextvars
import logging
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import (
    ColumnElement,
    Connection,
    Engine,
    Row,
    and_,
    bindparam,
    case,
    false,
    func,
    literal,
    true,
    update,
)

from .. import tracing
from .._input import check_text
from .._shard_set import shard_map_table
from .._sql import SqlDatabase, UTCDateTime
from .._threads import GroupCommit, PerProcess
from ..errors import InvalidFieldError, InvalidStateError
from ..shards import new_id
from ._schema import NAME_LENGTH, WORKFLOW_TABLES, executions_table, row_to_execution
from .hooks import TerminalHooks, ending_childless, pop_after_commit
from .models import OPEN_STATES, Execution, ExecutionState, JsonValue, encode_json, storable_text

logger = logging.getLogger(__name__)

_ex = executions_table
_OPEN_VALUES = [s.value for s in OPEN_STATES]


#: ``conn.info`` key of the executions created by ``start(conn=...)`` in that transaction.
_STARTED = "harvest_workflows_started"

#: Called with the ids of executions started in a transaction, once it has committed.
OnStarted = Callable[[list[str]], None]


class StoreCore:
    """The database, the terminal hooks and the transactions that every part of the store uses.

    :param engine: a SQLAlchemy engine on PostgreSQL or SQLite (a file database, so that threads
        and processes share it).
    :param hooks: the terminal hooks :class:`TerminalTransition` runs; a fresh empty registry if
        not given.
    :param on_started: called after commit with the ids of the executions that terminal hooks
        started inside a transaction the store owns (bind it to the job backend's schedule); errors
        are logged, and the sweeper's due scan queues those executions anyway.
    :param shard: the database's place in ``HARVEST_WORKFLOW_SHARDS`` (its ids carry it), or
        ``None`` when the deployment is not sharded.
    """

    def __init__(
        self,
        engine: Engine,
        *,
        hooks: TerminalHooks | None = None,
        on_started: OnStarted | None = None,
        shard: int | None = None,
    ) -> None:
        self.db = SqlDatabase(engine, owner="SqlWorkflowStore")
        self.engine = engine
        self.hooks = hooks if hooks is not None else TerminalHooks()
        self.on_started = on_started
        self.shard = shard

    def new_execution_id(self) -> str:
        """A fresh execution id, marked with this database's shard when there are shards."""
        return new_id(self.shard)

    @contextmanager
    def transaction(self, action: str, conn: Connection | None = None) -> Iterator[Connection]:
        """Yield ``conn`` (the caller's transaction) or a new one (:meth:`SqlDatabase.transaction`).

        A transaction of its own runs the after-commit actions its statements registered, and
        hands the executions started in it to ``on_started``, once it has committed.
        """
        if conn is not None:
            with self.db.transaction(action, conn) as caller:
                yield caller
            return
        with self.own_transaction(action) as own:
            yield own
            started = self.started_in(own)
            after = pop_after_commit(own)
        self.settle(after, started)

    @contextmanager
    def own_transaction(self, action: str) -> Iterator[Connection]:
        """A new transaction that leaves its after-commit actions and started executions to the
        caller: take them (:func:`pop_after_commit`, :meth:`started_in`) before it commits, and
        :meth:`settle` them once it has."""
        with self.db.transaction(action) as own:
            # info belongs to the pooled DBAPI connection: drop what a rolled-back use left.
            own.info.pop(_STARTED, None)
            pop_after_commit(own)
            try:
                yield own
            except BaseException:
                own.info.pop(_STARTED, None)
                pop_after_commit(own)
                raise

    def settle(self, after: Sequence[Callable[[], object]], started: list[str]) -> None:
        """Run a committed transaction's after-commit actions and hand its started executions to
        ``on_started``; errors are logged (the sweeper covers both)."""
        for after_action in after:
            try:
                after_action()
            except Exception:
                logger.warning("an after-commit action failed; the sweeper covers it", exc_info=True)
        if started and self.on_started is not None:
            try:
                self.on_started(started)
            except Exception:
                logger.warning("could not schedule started workflow executions %s", started, exc_info=True)

    @staticmethod
    def started_in(conn: Connection) -> list[str]:
        """Return (and forget) the ids of the executions ``start(conn=conn)`` created in ``conn``'s
        transaction: schedule them once it has committed."""
        started: list[str] = conn.info.pop(_STARTED, [])
        return started

    @staticmethod
    def note_started(conn: Connection, execution_id: str) -> None:
        conn.info.setdefault(_STARTED, []).append(execution_id)

    def ensure_schema(self) -> None:
        """Create the workflow tables and indexes where they do not exist yet."""
        # The shard map too: a deployment that lists this database as a shard later (or reads it
        # at start-up to refuse using one shard of several alone) finds it in place.
        self.db.create_tables([*WORKFLOW_TABLES, shard_map_table], what="the workflow tables")


@dataclass(frozen=True)
class _End:
    """One :meth:`TerminalTransition.finish` handed to the group: its arguments, checked and
    encoded, and its caller's context (the hooks run in it, whichever thread writes the batch)."""

    execution_id: str
    state: ExecutionState
    output: str | None
    error: str | None
    now: datetime
    token: str | None
    context: contextvars.Context
    childless: bool = False  # the runner knows the run has no child runs to close


@dataclass(frozen=True)
class _Ended:
    """An end written in a batch: the execution (``None``: it did not land) and what its caller
    runs once the batch has committed."""

    execution: Execution | None
    after: list[Callable[[], object]]
    started: list[str]


#: The most ends one transaction carries.
_GROUP_LIMIT = 32


class TerminalTransition:
    """THE terminal transition: the one place an open execution ends, with its terminal hooks."""

    def __init__(self, core: StoreCore) -> None:
        self.core = core
        # Runs ending at once on this process's threads share one transaction (one per store and
        # process: a forked child must not inherit a write in progress).
        self._group: PerProcess[GroupCommit[_End, _Ended | Exception]] = PerProcess(
            lambda: GroupCommit(self._write_grouped, limit=_GROUP_LIMIT)
        )

    def finish(
        self,
        execution_id: str,
        state: ExecutionState,
        *,
        output: JsonValue = None,
        error: str | None = None,
        now: datetime,
        token: str | None = None,
        conn: Connection | None = None,
        childless: bool = False,
    ) -> Execution | None:
        """Move an open execution to terminal ``state``, once, in ``conn`` or a transaction of its
        own (:meth:`SqlWorkflowStore.finish <flask_harvest.workflows.store.SqlWorkflowStore.finish>`)."""
        state = ExecutionState(state)
        if not state.terminal:
            raise InvalidStateError(f"finish() moves to a terminal state, not {state.value}")
        output_text = encode_json(output, field="output") if state is ExecutionState.COMPLETED else None
        if conn is not None:
            extra = [_ex.c.lease_token == token] if token is not None else []
            with self.core.transaction(f"end a workflow execution as {state.value}", conn) as c:
                return self.finish_in(c, execution_id, state, output_text, error, now, extra)
        # Runs ending at once on this process's threads share one transaction; a lone one writes
        # at once. Each end keeps its guarded UPDATE and its hooks, in its caller's context.
        end = _End(execution_id, state, output_text, error, now, token, contextvars.copy_context(), childless)
        result = self._group.get().submit(end)
        if isinstance(result, Exception):
            raise result
        self.core.settle(result.after, result.started)
        return result.execution

    def _write_grouped(self, ends: list[_End]) -> list[_Ended | Exception]:
        """The group's write: one transaction for the batch. Should it fail (a hook raised, a
        deadlock), each end is written alone, so that the failure reaches only the runs it
        concerns, as it would have without the group."""
        try:
            return list(self._write(ends))
        except Exception as exc:
            if len(ends) == 1:
                return [exc]
        results: list[_Ended | Exception] = []
        for end in ends:
            try:
                results.extend(self._write([end]))
            except Exception as exc:
                results.append(exc)
        return results

    def _write(self, ends: list[_End]) -> list[_Ended]:
        """End runs in one transaction, in id order (the order two batches lock rows in), each
        with its guarded UPDATE and its hooks, as :meth:`finish` does alone."""
        results: dict[int, _Ended] = {}
        order = sorted(range(len(ends)), key=lambda index: ends[index].execution_id)
        action = "end a workflow execution" if len(ends) == 1 else "end workflow executions"
        with self.core.own_transaction(action) as conn:
            for index in order:
                end = ends[index]
                execution = end.context.run(self._finish_end, conn, end)
                results[index] = _Ended(execution, pop_after_commit(conn), self.core.started_in(conn))
        return [results[index] for index in range(len(ends))]

    def _finish_end(self, conn: Connection, end: _End) -> Execution | None:
        params = {
            "end_execution_id": end.execution_id,
            "end_state": end.state.value,
            "end_output": end.output,
            "end_error": storable_text(end.error) if end.error is not None else None,
            "end_completed_at": end.now,
        }
        if end.token is None:
            row = conn.execute(_FINISH, params).first()
        else:
            row = conn.execute(_FINISH_UNDER_LEASE, {**params, "end_token": end.token}).first()
        with ending_childless(conn, end.execution_id, end.childless):
            return self._ended(conn, row, end.state)

    def finish_in(
        self,
        conn: Connection,
        execution_id: str,
        state: ExecutionState,
        output_text: str | None,
        error: str | None,
        now: datetime,
        extra: Sequence[ColumnElement[bool]] = (),
        cancel_reason: str | None = None,
        values: Mapping[str, Any] | None = None,
    ) -> Execution | None:
        """The guarded UPDATE and the terminal hooks, on ``conn``: :meth:`finish`'s work, for a
        caller that already holds the transaction and has encoded the output.

        :param values: more columns to set in the same UPDATE (continue-as-new's ``continued_to``),
            so the hooks see the row as it ends.
        """
        stmt = (
            update(_ex)
            .where(_ex.c.execution_id == execution_id, row_test(_open(), *extra))
            .values(
                state=state.value,
                output=output_text,
                # A message the engine composed (an exception's text) may hold what the database
                # cannot store; callers' reasons were checked already and come through unchanged.
                error=storable_text(error) if error is not None else None,
                completed_at=now,
                lease_token=None,
                lease_expires_at=None,
                next_run_at=None,
                **({"cancel_reason": cancel_reason} if cancel_reason is not None else {}),
                **(values or {}),
            )
            .returning(*_ex.c)
        )
        return self._ended(conn, conn.execute(stmt).first(), state)

    def _ended(self, conn: Connection, row: Row[Any] | None, state: ExecutionState) -> Execution | None:
        """After the guarded UPDATE: the terminal hooks, if it landed."""
        if row is None:
            return None
        execution = row_to_execution(row)
        # The hooks run in the span of the run's end, in its start's trace: what they write
        # (completion callbacks, trigger starts) stores that context and joins the trace.
        with tracing.workflow_end(execution, state.value):
            self.core.hooks.run(conn, execution)
        return execution

    def sweep_finish(
        self,
        execution_id: str,
        state: ExecutionState,
        error: str,
        now: datetime,
        extra: Sequence[ColumnElement[bool]],
    ) -> bool:
        # One transaction per execution: a failing terminal hook leaves that execution open (to be
        # tried again next sweep) without stopping the sweep of the others.
        try:
            with self.core.transaction(f"end a workflow execution as {state.value}") as conn:
                return self.finish_in(conn, execution_id, state, None, error, now, extra) is not None
        except Exception:
            logger.exception("could not end workflow execution %s as %s", execution_id, state.value)
            return False


def _open() -> ColumnElement[bool]:
    return _ex.c.state.in_(_OPEN_VALUES)


def _finish_statement(*extra: ColumnElement[bool]) -> Any:
    """:meth:`TerminalTransition.finish_in`'s UPDATE with its values as parameters, built once:
    building it per call showed in the profile of a worker ending runs."""
    return (
        update(_ex)
        .where(_ex.c.execution_id == bindparam("end_execution_id"), row_test(_open(), *extra))
        .values(
            state=bindparam("end_state"),
            output=bindparam("end_output"),
            error=bindparam("end_error"),
            completed_at=bindparam("end_completed_at"),
            lease_token=None,
            lease_expires_at=None,
            next_run_at=None,
        )
        .returning(*_ex.c)
    )


def row_test(*conditions: ColumnElement[bool]) -> ColumnElement[bool]:
    """``conditions`` as one ``CASE``, for a statement that names its rows by id: no index but
    the primary key can then find them. On a table without statistics yet (new, or just
    truncated) the planner guesses one pending row and would otherwise walk a state index over
    every pending run (17 ms a statement at 20,000 pending, against 0.1 ms by primary key)."""
    return case((and_(*conditions), true()), else_=false())


def _coalesce_time(column: Any, value: datetime) -> Any:
    # Typed literal: a bare datetime would bind as a plain DateTime and keep its time zone.
    return func.coalesce(column, literal(value, UTCDateTime()))


def check_key(field: str, value: str) -> None:
    """Refuse a workflow or step name that is not 1 to 255 characters of storable text."""
    if not isinstance(value, str) or not value or len(value) > NAME_LENGTH:
        raise InvalidFieldError(
            field, f"must be a string of 1 to {NAME_LENGTH} characters, not {value!r:.80}"
        )
    # NUL (PostgreSQL refuses it in text) and lone surrogates (no UTF-8 form) are bad input here,
    # not a driver error later.
    check_text(value, field)


_FINISH = _finish_statement()
_FINISH_UNDER_LEASE = _finish_statement(_ex.c.lease_token == bindparam("end_token"))
