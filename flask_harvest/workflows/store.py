"""Workflow executions and step checkpoints in SQL (SQLAlchemy 2 Core, PostgreSQL or SQLite).

Start-or-load, reads, the lease of a running execution, its step checkpoints, cancel and terminate.
The terminal transition and the transactions live in :mod:`._store_base`, the sweeper's queries in
:mod:`._sweep`.
"""

from __future__ import annotations

import functools
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Connection, Integer, Select, Text, bindparam, func, literal, or_, select, text, update

from .._input import check_id, check_text, id_problem
from .._sql import UTCDateTime
from ..errors import InvalidFieldError, StoreError
from ._schema import _OPEN, NAME_LENGTH, row_to_execution, row_to_step, steps_table
from ._store_base import _coalesce_time, _ex, _open
from ._sweep import LeaseSweep, _SweepQueries
from .errors import ExecutionNotFoundError, WorkflowIdReusedError
from .models import (
    Execution,
    ExecutionState,
    IdReusePolicy,
    JsonValue,
    StepRecord,
    check_reason,
    encode_json,
    storable_text,
)

__all__ = ["ExecutionCursor", "LeaseSweep", "LeaseView", "SqlWorkflowStore"]

_steps = steps_table
_PENDING = ExecutionState.PENDING.value
_RUNNING = ExecutionState.RUNNING.value
_OPEN_STATES = frozenset((_PENDING, _RUNNING))
# A start that keeps losing the race between "the open run closed" and "ours conflicts" gives up.
_START_ROUNDS = 5

#: A listing position: the ``(created_at, execution_id)`` of the last execution of a page.
ExecutionCursor = tuple[datetime, str]


@dataclass(frozen=True)
class LeaseView:
    """What a running execution's code must act on, as its lease renewal read it."""

    cancel_requested: bool
    cancel_reason: str | None
    deadline: datetime | None


class SqlWorkflowStore(_SweepQueries):
    """Executions and their step checkpoints, shared by every process through the database.

    :param engine: a SQLAlchemy engine on PostgreSQL or SQLite (a file database, so that threads
        and processes share it).
    :param hooks: the terminal hooks :meth:`finish` runs; a fresh empty registry if not given.
    """

    # -- starting ------------------------------------------------------------------------------

    def start(
        self,
        name: str,
        input: JsonValue,
        workflow_id: str | None = None,
        policy: IdReusePolicy = IdReusePolicy.ALLOW_DUPLICATE,
        *,
        now: datetime,
        deadline: datetime | None = None,
        trigger_depth: int = 0,
        completion_callbacks: JsonValue = None,
        max_input_bytes: int | None = None,
        conn: Connection | None = None,
    ) -> tuple[Execution, bool]:
        """Start a run of ``name``, or load the open run of ``workflow_id``.

        While a run with ``workflow_id`` is open it is returned (``created`` False); once closed,
        ``policy`` decides. At most one open run per ``workflow_id`` is enforced by a unique index,
        so concurrent starts give one run. The caller schedules a created run after commit; with
        ``conn``, :meth:`started_in` lists the runs created in it (and a terminal hook's starts are
        handed to ``on_started`` by the store itself).

        :param workflow_id: the business key; a fresh UUID when absent.
        :param conn: run inside the caller's transaction (the run exists once it commits).
        :returns: ``(execution, created)``.
        :raises WorkflowIdReusedError: ``policy`` refuses a new run after a closed one.
        :raises InvalidFieldError: ``input`` is not JSON, or too large (``InputTooLargeError``); the
            name or ``workflow_id`` is empty or longer than 255 characters, or ``workflow_id``
            holds a control character; an unknown policy.
        """
        input_text = encode_json(input, field="input", max_bytes=max_input_bytes)
        _check_key("name", name)
        if workflow_id is not None:
            check_id(workflow_id, "workflow_id", max_chars=NAME_LENGTH)
        try:
            policy = IdReusePolicy(policy)
        except ValueError:
            choices = ", ".join(p.value for p in IdReusePolicy)
            raise InvalidFieldError("policy", f"must be one of {choices}, not {policy!r}") from None
        if isinstance(trigger_depth, bool) or not isinstance(trigger_depth, int) or trigger_depth < 0:
            raise InvalidFieldError("trigger_depth", f"must be an integer, 0 or more, not {trigger_depth!r}")
        key = workflow_id if workflow_id is not None else str(uuid.uuid4())
        with self._transaction("start a workflow execution", conn) as c:
            for _ in range(_START_ROUNDS):
                found = c.execute(_open_or_last_run(key, policy)).first()
                if found is not None and found.state in _OPEN_STATES:
                    return row_to_execution(found), False
                if found is not None:
                    _check_reuse(key, policy, found.execution_id, found.state)
                execution_id = str(uuid.uuid4())
                values = {
                    "execution_id": execution_id,
                    "workflow_name": name,
                    "workflow_id": key,
                    "input": input_text,
                    "state": _PENDING,
                    "created_at": now,
                    "next_run_at": now,
                    "deadline": deadline,
                    "attempt": 0,
                    "recovery_count": 0,
                    "cancel_requested": False,
                    "trigger_depth": trigger_depth,
                    "completion_callbacks": completion_callbacks,
                }
                # DO NOTHING rather than catching IntegrityError: an error would abort the caller's
                # PostgreSQL transaction. PostgreSQL waits here for a concurrent inserter to commit.
                stmt = (
                    self.db.insert(_ex)
                    .values(values)
                    .on_conflict_do_nothing(index_elements=[_ex.c.workflow_id], index_where=text(_OPEN))
                    .returning(*_ex.c)
                )
                row = c.execute(stmt).first()
                if row is not None:
                    if conn is not None:
                        self._note_started(conn, execution_id)
                    return row_to_execution(row), True
        raise StoreError(f"could not start workflow_id {key!r}: its open run kept changing; try again")

    # -- reading -------------------------------------------------------------------------------

    def get(self, execution_id: str) -> Execution | None:
        """Return the execution with this id, or ``None`` (also for an id no row could have)."""
        if id_problem(execution_id) is not None:
            return None
        with self._transaction("read a workflow execution") as conn:
            row = conn.execute(select(_ex).where(_ex.c.execution_id == execution_id)).first()
        return row_to_execution(row) if row is not None else None

    def get_by_workflow_id(self, workflow_id: str) -> Execution | None:
        """Return the latest run of ``workflow_id`` (the open one if any), or ``None``."""
        if id_problem(workflow_id) is not None:
            return None
        with self._transaction("read a workflow execution") as conn:
            row = conn.execute(
                select(_ex)
                .where(_ex.c.workflow_id == workflow_id)
                .order_by(_ex.c.created_at.desc(), _ex.c.execution_id.desc())
                .limit(1)
            ).first()
        return row_to_execution(row) if row is not None else None

    def list_executions(
        self,
        *,
        name: str | None = None,
        state: ExecutionState | None = None,
        cursor: ExecutionCursor | None = None,
        limit: int = 100,
    ) -> list[Execution]:
        """Return executions newest first by ``(created_at, execution_id)``.

        :param cursor: return only executions after this position (the last one of the previous
            page: ``(execution.created_at, execution.execution_id)``).
        :raises InvalidFieldError: ``name`` is not text a workflow name could be.
        """
        query = select(_ex)
        if name is not None:
            _check_key("name", name)
            query = query.where(_ex.c.workflow_name == name)
        if state is not None:
            query = query.where(_ex.c.state == ExecutionState(state).value)
        if cursor is not None:
            created, last_id = cursor
            query = query.where(
                or_(
                    _ex.c.created_at < created, (_ex.c.created_at == created) & (_ex.c.execution_id < last_id)
                )
            )
        query = query.order_by(_ex.c.created_at.desc(), _ex.c.execution_id.desc()).limit(max(0, limit))
        with self._transaction("list workflow executions") as conn:
            return [row_to_execution(row) for row in conn.execute(query).all()]

    def count_states(self, *, cap: int) -> dict[ExecutionState, int]:
        """Return how many executions are in each state, counting at most ``cap`` of each.

        Each count reads at most ``cap`` entries of an index that leads with ``state``, never the
        whole table (a page view must stay fast at millions of rows): a count equal to ``cap``
        means "at least".
        """
        with self.db.read("count workflow executions by state") as conn:
            row = conn.execute(_state_counts(), {"cap": max(0, cap)}).one()
        return {state: int(count) for state, count in zip(ExecutionState, row, strict=True)}

    def list_steps(self, execution_id: str) -> list[StepRecord]:
        """Return the execution's step checkpoints in order."""
        if id_problem(execution_id) is not None:
            return []
        with self._transaction("list workflow steps") as conn:
            rows = conn.execute(
                select(_steps).where(_steps.c.execution_id == execution_id).order_by(_steps.c.seq)
            ).all()
        return [row_to_step(row) for row in rows]

    def get_step(self, execution_id: str, seq: int) -> StepRecord | None:
        """Return the checkpoint at position ``seq``, or ``None``."""
        if id_problem(execution_id) is not None:
            return None
        with self._transaction("read a workflow step") as conn:
            row = conn.execute(
                select(_steps).where(_steps.c.execution_id == execution_id, _steps.c.seq == seq)
            ).first()
        return row_to_step(row) if row is not None else None

    # -- running -------------------------------------------------------------------------------

    def claim(self, execution_id: str, *, now: datetime, lease_seconds: float) -> Execution | None:
        """Lease a due ``Pending`` execution to the caller: ``Running`` with a fresh lease token.

        :returns: the claimed execution (its ``lease_token`` is the caller's), or ``None`` when it
            is not due, already running, terminal or absent.
        """
        stmt = (
            update(_ex)
            .where(_ex.c.execution_id == execution_id, *_due(now))
            .values(**_claim_values(now, lease_seconds))
            .returning(*_ex.c)
        )
        with self._transaction("claim a workflow execution") as conn:
            row = conn.execute(stmt).first()
        return row_to_execution(row) if row is not None else None

    def claim_many(
        self, execution_ids: Sequence[str], *, now: datetime, lease_seconds: float
    ) -> list[Execution]:
        """:meth:`claim` several executions in one statement (a worker's batch of jobs).

        Each claim is the same as :meth:`claim`'s; the rows share one fresh lease token, which is
        still new for each execution. Rows are locked in id order, so batches that overlap do not
        deadlock.

        :returns: the executions claimed, in id order (those not due, running, ended or absent are
            left out).
        """
        unique = sorted(set(execution_ids))
        if not unique:
            return []
        due = _due(now)
        locked = (
            select(_ex.c.execution_id)
            .where(_ex.c.execution_id.in_(unique), *due)
            .order_by(_ex.c.execution_id)
            .with_for_update()
        )
        stmt = (
            update(_ex)
            .where(_ex.c.execution_id.in_(locked), *due)
            .values(**_claim_values(now, lease_seconds))
            .returning(*_ex.c)
        )
        with self._transaction("claim workflow executions") as conn:
            rows = conn.execute(stmt).all()
        return sorted((row_to_execution(row) for row in rows), key=lambda e: e.execution_id)

    def renew(
        self, execution_id: str, token: str, *, now: datetime, lease_seconds: float
    ) -> Execution | None:
        """Extend the caller's lease and return the row (to see a cancel request or the deadline).

        :returns: ``None`` when the lease is lost: the execution ended (terminated, timed out) or
            another worker holds it.
        """
        stmt = (
            update(_ex)
            .where(_ex.c.execution_id == execution_id, _ex.c.state == _RUNNING, _ex.c.lease_token == token)
            .values(lease_expires_at=now + timedelta(seconds=lease_seconds))
            .returning(*_ex.c)
        )
        with self._transaction("renew a workflow lease") as conn:
            row = conn.execute(stmt).first()
        return row_to_execution(row) if row is not None else None

    def heartbeat(self, execution_id: str, token: str, *, now: datetime, lease_seconds: float) -> bool:
        """Extend the caller's lease; ``False`` when it is lost (see :meth:`renew`)."""
        return self.renew(execution_id, token, now=now, lease_seconds=lease_seconds) is not None

    def record_step(
        self,
        execution_id: str,
        token: str,
        seq: int,
        name: str,
        *,
        output: JsonValue = None,
        error: str | None = None,
        now: datetime,
    ) -> bool:
        """Checkpoint step ``seq``'s result (or its ``error``) while the caller still runs the execution.

        The insert is guarded in SQL by the execution being ``Running`` under ``token`` (and, on
        PostgreSQL, share-locks that row), so once a terminate commits no checkpoint lands.

        :returns: whether the checkpoint was written.
        :raises InvalidFieldError: ``output`` is not a JSON value.
        """
        _check_key("name", name)
        if error is not None:
            error = storable_text(error)
        output_text = None if error is not None else encode_json(output, field=f"step {name!r} result")
        with self._transaction("record a workflow step") as conn:
            return (
                conn.execute(
                    self._guarded_step(execution_id, token, seq, name, output_text, error, now)
                ).first()
                is not None
            )

    def _guarded_step(
        self,
        execution_id: str,
        token: str,
        seq: int,
        name: str,
        output_text: str | None,
        error: str | None,
        now: datetime,
    ) -> Any:
        """The INSERT of a checkpoint that lands only while the execution runs under ``token``."""
        guard = (
            select(
                literal(execution_id),
                literal(seq),
                literal(name),
                literal(output_text, Text()),
                literal(error, Text()),
                literal(now, UTCDateTime()),
            )
            .select_from(_ex)
            .where(_ex.c.execution_id == execution_id, _ex.c.state == _RUNNING, _ex.c.lease_token == token)
        )
        if self.db.postgres:
            # Waits for a concurrent terminal UPDATE, then sees its result: no checkpoint after it.
            guard = guard.with_for_update(read=True)
        columns = ["execution_id", "seq", "name", "output", "error", "created_at"]
        return (
            self.db.insert(_steps)
            .from_select(columns, guard)
            .on_conflict_do_nothing(index_elements=[_steps.c.execution_id, _steps.c.seq])
            .returning(_steps.c.seq)
        )

    def checkpoint(
        self,
        execution_id: str,
        token: str,
        seq: int,
        name: str,
        *,
        output: JsonValue = None,
        error: str | None = None,
        now: datetime,
        lease_seconds: float | None = None,
    ) -> LeaseView | None:
        """Checkpoint step ``seq`` and read the execution's row, in one transaction; with
        ``lease_seconds``, renew the caller's lease in it too.

        The checkpoint lands only while the execution is ``Running`` under ``token``, holding its
        row (share-locked on PostgreSQL, or locked by the renewal's ``UPDATE``) until the commit,
        so once a terminate commits no checkpoint lands (as with :meth:`record_step`). What it read
        serves as the lease check of the next step's boundary. Without ``lease_seconds`` the row is
        not written: each write of it updates every index of the executions table.

        :returns: the row as read, or ``None`` when nothing was written: the lease is lost (ended,
            taken over) or position ``seq`` has a checkpoint already.
        :raises InvalidFieldError: ``output`` is not a JSON value.
        """
        output_text = None if error is not None else encode_json(output, field=f"step {name!r} result")
        flags = (_ex.c.cancel_requested, _ex.c.cancel_reason, _ex.c.deadline)
        with self._transaction("record a workflow step") as conn:
            if lease_seconds is not None:
                row = conn.execute(
                    update(_ex)
                    .where(
                        _ex.c.execution_id == execution_id,
                        _ex.c.state == _RUNNING,
                        _ex.c.lease_token == token,
                    )
                    .values(lease_expires_at=now + timedelta(seconds=lease_seconds))
                    .returning(*flags)
                ).first()
                if row is None:
                    return None
            step = self._guarded_step(execution_id, token, seq, name, output_text, error, now)
            if conn.execute(step).first() is None:
                return None
            if lease_seconds is None:
                # The guard holds the row (or SQLite's write lock): it is still ours as read here.
                row = conn.execute(select(*flags).where(_ex.c.execution_id == execution_id)).first()
        if row is None:  # the guarded step above holds the row: it cannot have gone
            raise StoreError(f"workflow execution {execution_id} vanished during its checkpoint")
        return LeaseView(bool(row.cancel_requested), row.cancel_reason, row.deadline)

    def suspend(
        self, execution_id: str, token: str, *, wake_at: datetime, now: datetime | None = None
    ) -> bool:
        """Give the execution back until ``wake_at`` (a durable sleep): ``Pending``, lease released.

        Refused, in the same guarded UPDATE, when a cancel was requested or (given ``now``) the
        deadline passed since the caller last looked at the row: the caller ends the run at once
        instead of leaving it asleep with a cancel request or past its deadline until it wakes.

        :returns: whether the execution went to sleep (else nothing changed).
        """
        guard = [
            _ex.c.execution_id == execution_id,
            _ex.c.state == _RUNNING,
            _ex.c.lease_token == token,
            _ex.c.cancel_requested.is_(False),
        ]
        if now is not None:
            guard.append(or_(_ex.c.deadline.is_(None), _ex.c.deadline >= now))
        stmt = (
            update(_ex)
            .where(*guard)
            .values(state=_PENDING, next_run_at=wake_at, lease_token=None, lease_expires_at=None)
            .returning(_ex.c.execution_id)
        )
        with self._transaction("suspend a workflow execution") as conn:
            return conn.execute(stmt).first() is not None

    # -- ending --------------------------------------------------------------------------------

    def request_cancel(self, execution_id: str, reason: str | None = None, *, now: datetime) -> Execution:
        """Cancel cooperatively: a ``Pending`` run ends ``Cancelled`` now; a ``Running`` one is
        flagged and ends ``Cancelled`` at its next step or sleep boundary. A terminal run is left
        as it is. The reason becomes the run's error and, only when one is given, its
        ``cancel_reason`` (what a completion trigger's outcome envelope reports).

        :returns: the execution after the request.
        :raises ExecutionNotFoundError: no execution has this id.
        :raises InvalidFieldError: ``reason`` is not storable text.
        """
        check_reason(reason)
        if id_problem(execution_id) is not None:
            raise ExecutionNotFoundError(execution_id)
        error = reason or "cancelled"
        with self._transaction("cancel a workflow execution") as conn:
            for _ in range(_START_ROUNDS):
                done = self._finish(
                    conn,
                    execution_id,
                    ExecutionState.CANCELLED,
                    None,
                    error,
                    now,
                    [_ex.c.state == _PENDING],
                    cancel_reason=reason,
                )
                if done is not None:
                    return done
                row = conn.execute(
                    update(_ex)
                    .where(_ex.c.execution_id == execution_id, _ex.c.state == _RUNNING)
                    .values(cancel_requested=True, cancel_reason=reason)
                    .returning(*_ex.c)
                ).first()
                if row is None:
                    row = conn.execute(select(_ex).where(_ex.c.execution_id == execution_id)).first()
                if row is None:
                    raise ExecutionNotFoundError(execution_id)
                if row.state != _PENDING:
                    return row_to_execution(row)
        raise StoreError(f"could not cancel execution {execution_id}: its state kept changing; try again")

    def terminate(self, execution_id: str, reason: str | None = None, *, now: datetime) -> Execution:
        """End an open execution ``Terminated`` at once; its running code can record nothing more.

        :returns: the execution after the call (unchanged if it had already ended).
        :raises ExecutionNotFoundError: no execution has this id.
        :raises InvalidFieldError: ``reason`` is not storable text.
        """
        check_reason(reason)
        if id_problem(execution_id) is not None:
            raise ExecutionNotFoundError(execution_id)
        ended = self.finish(execution_id, ExecutionState.TERMINATED, error=reason or "terminated", now=now)
        if ended is not None:
            return ended
        current = self.get(execution_id)
        if current is None:
            raise ExecutionNotFoundError(execution_id)
        return current


def _due(now: datetime) -> tuple[Any, Any]:
    # What makes an execution claimable: pending, with no wait or a wait that has passed.
    return (_ex.c.state == _PENDING, or_(_ex.c.next_run_at.is_(None), _ex.c.next_run_at <= now))


def _claim_values(now: datetime, lease_seconds: float) -> dict[str, Any]:
    # One claim's writes, shared by claim and claim_many so the two cannot drift: running, a
    # fresh lease token, one more attempt, the first start kept.
    return {
        "state": _RUNNING,
        "lease_token": uuid.uuid4().hex,
        "lease_expires_at": now + timedelta(seconds=lease_seconds),
        "started_at": _coalesce_time(_ex.c.started_at, now),
        "attempt": _ex.c.attempt + 1,
        "next_run_at": None,
    }


def _open_or_last_run(key: str, policy: IdReusePolicy) -> Select[Any]:
    """The open run of ``key``; under a reuse policy, else its last closed run.

    One statement, so one snapshot: with two reads, a run that a concurrent start committed in
    between looked like a closed earlier run, and the policy refused it while it was open.
    """
    query = select(_ex).where(_ex.c.workflow_id == key)
    if policy is IdReusePolicy.ALLOW_DUPLICATE:
        return query.where(_open())
    # The open run first (true sorts after false on both dialects), then the latest closed one.
    return query.order_by(_open().desc(), _ex.c.created_at.desc(), _ex.c.execution_id.desc()).limit(1)


def _check_reuse(key: str, policy: IdReusePolicy, last_id: str, last_state: str) -> None:
    """Refuse a new run after the closed run ``last_id`` if ``policy`` says so."""
    if policy is IdReusePolicy.REJECT_DUPLICATE or last_state == ExecutionState.COMPLETED.value:
        raise WorkflowIdReusedError(key, policy.value, last_id, last_state)


def _check_key(field: str, value: str) -> None:
    if not isinstance(value, str) or not value or len(value) > NAME_LENGTH:
        raise InvalidFieldError(
            field, f"must be a string of 1 to {NAME_LENGTH} characters, not {value!r:.80}"
        )
    # NUL (PostgreSQL refuses it in text) and lone surrogates (no UTF-8 form) are bad input here,
    # not a driver error later.
    check_text(value, field)


@functools.cache
def _state_counts() -> Select[Any]:
    """count_states' statement, built once: one row of one bounded count per state, each a walk of
    at most ``cap`` entries of the index that leads with ``state`` (one round trip, not one per
    state)."""
    cap = bindparam("cap", type_=Integer)
    counts = []
    for state in ExecutionState:
        bounded = select(literal(1)).where(_ex.c.state == state.value).limit(cap).subquery()
        counts.append(select(func.count()).select_from(bounded).scalar_subquery().label(state.value))
    return select(*counts)
