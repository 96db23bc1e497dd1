"""The workflow store's child runs: the start, the durable wait, the wake-up and the parent-close
cascade.

Lock order, the same in every transaction here, so none of them deadlocks another: a parent's row
before its child's. A parent's start or wait locks its own row (the lease guard) and then reads
the child; the parent-close cascade runs in the parent's terminal transaction (its row already
moved) and then moves each child. The one transaction that meets the rows the other way round, a
child's terminal transaction waking its parent, never waits for the parent's row: it skips a
locked one (``SKIP LOCKED``), which only a transaction that either ends the parent or re-reads the
child holds, and the sweeper's :meth:`ChildRuns.wake_stranded` covers the rest.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, exists, insert, or_, select, text, update
from sqlalchemy.orm import aliased

from .. import tracing
from .._time import utcnow
from ._leases import Leases, LeaseView
from ._runs import Runs
from ._schema import _OPEN, row_to_execution, steps_table
from ._store_core import _OPEN_VALUES, StoreCore, TerminalTransition, _ex
from .children import CHILD_STEP, WAIT_CHILD_STEP, child_outcome
from .hooks import known_childless
from .models import Execution, ExecutionState, JsonValue, ParentClosePolicy, decode_json, encode_json

logger = logging.getLogger(__name__)

__all__ = ["ChildRuns", "ChildStart", "ChildWait"]

_steps = steps_table

_PENDING = ExecutionState.PENDING.value
_RUNNING = ExecutionState.RUNNING.value
# A continue-as-new chain longer than this is not followed further (the wait sees it as open).
_MAX_CHAIN = 10_000


@dataclass(frozen=True)
class ChildWait:
    """What :meth:`ChildRuns.wait_child` did; nothing set means the parent's lease is lost.

    :param outcome: the child's recorded outcome, when it had ended (and the checkpoint landed).
    :param suspended: the parent went to sleep until the child ends.
    :param boundary: the parent has a cancel request or passed its deadline: act on it now.
    :param lease: the parent's row as read under its lock.
    """

    outcome: JsonValue = None
    suspended: bool = False
    boundary: bool = False
    #: The parent's row as this transaction read it (the next boundary's lease check).
    lease: LeaseView | None = None


class ChildRuns:
    """What a parent run asks of the store, and the terminal hook of parents and children."""

    def __init__(self, core: StoreCore, terminal: TerminalTransition, runs: Runs, leases: Leases) -> None:
        self.core = core
        self.terminal = terminal
        self.runs = runs
        self.leases = leases

    # -- the parent's calls ----------------------------------------------------------------------

    def record(
        self,
        parent_id: str,
        token: str,
        starts: Sequence[ChildStart],
        outcomes: Sequence[tuple[int, JsonValue]] = (),
        *,
        now: datetime,
    ) -> tuple[list[Execution], LeaseView] | None:
        """Start (or load) children and checkpoint each at its position of the parent, and
        checkpoint the outcomes of ended children the parent waited for (``(position, outcome)``),
        in one transaction guarded by the parent's lease: all land, or none.

        The parent's row is locked first (the module's lock order); then one multi-row insert of
        the children (a ``workflow_id`` that has an open run already collapses into that run) and
        one of the checkpoints.

        :returns: the children in the order of ``starts`` and the parent's row as read, or ``None``
            when the parent's lease is lost (nothing was written).
        """
        with self.core.transaction("record child workflow executions") as conn:
            lease = self._lock_parent(conn, parent_id, token)
            if lease is None:
                return None
            children = self._insert_children(conn, parent_id, starts, now) if starts else []
            checkpoints = [
                _checkpoint(parent_id, start.seq, CHILD_STEP, _ids(child), now)
                for start, child in zip(starts, children, strict=True)
            ]
            checkpoints += [
                _checkpoint(parent_id, seq, WAIT_CHILD_STEP, outcome, now) for seq, outcome in outcomes
            ]
            if checkpoints:
                conn.execute(insert(_steps), checkpoints)
        return children, lease

    def _insert_children(
        self, conn: Connection, parent_id: str, starts: Sequence[ChildStart], now: datetime
    ) -> list[Execution]:
        """The children's rows in one statement; a ``workflow_id`` with an open run loads it."""
        rows = conn.execute(
            self.core.db.insert(_ex)
            .on_conflict_do_nothing(index_elements=[_ex.c.workflow_id], index_where=text(_OPEN))
            .returning(*_ex.c, sort_by_parameter_order=True),
            [_child_values(parent_id, start, now) for start in starts],
        ).all()
        created = {row.workflow_id: row_to_execution(row) for row in rows}
        children = []
        for start in starts:
            child = created.get(start.workflow_id)
            if child is None:
                # An open run has this workflow_id: start-or-load returns it as it is.
                child, _ = self.runs.start(
                    start.name,
                    decode_json(start.input_text),
                    start.workflow_id,
                    now=now,
                    deadline=start.deadline,
                    conn=conn,
                    parent=(parent_id, start.policy.value),
                )
            else:
                self.core.note_started(conn, child.execution_id)
            children.append(child)
        return children

    def outcome_of(self, execution_id: str) -> JsonValue:
        """The outcome ``ctx.wait_child`` records for the child ``execution_id`` (the end of its
        continue-as-new chain), or ``None`` while it is open. A read of its own, without locks: an
        ended run never changes again."""
        with self.core.db.read("read a child workflow execution") as conn:
            child = self._follow(conn, execution_id, lock=False)
        if child is None:
            return _vanished(execution_id)
        if child.state.outcome:
            return child_outcome(child.state, child.output, child.error)
        return None

    def _lock_parent(self, conn: Connection, parent_id: str, token: str) -> LeaseView | None:
        """Lock the parent's row if it still runs under ``token``; return it as read."""
        guard = (_ex.c.execution_id == parent_id, _ex.c.state == _RUNNING, _ex.c.lease_token == token)
        flags = (_ex.c.cancel_requested, _ex.c.cancel_reason, _ex.c.deadline)
        if self.core.db.postgres:
            # Without writing the row: a write updates every index of the executions table.
            found = conn.execute(select(*flags).where(*guard).with_for_update()).first()
        else:
            # A write takes SQLite's write lock: what this transaction reads next cannot go stale.
            found = conn.execute(update(_ex).where(*guard).values(waiting_on=None).returning(*flags)).first()
        if found is None:
            return None
        return LeaseView(bool(found.cancel_requested), found.cancel_reason, found.deadline)

    def wait_child(
        self,
        parent_id: str,
        token: str,
        seq: int,
        child_execution_id: str,
        child_workflow_id: str,
        *,
        now: datetime,
    ) -> ChildWait:
        """Record the child's outcome at ``seq`` if it has ended, else suspend the parent until it
        does (``Pending``, no due time, ``waiting_on`` the child's ``workflow_id``, lease released).

        The parent's row is locked first (its lease guard), then the child's is read under a share
        lock: a child whose terminal transaction runs meanwhile either is seen ended here, or
        commits after this and wakes the suspended parent.
        """
        with self.core.transaction("wait for a child workflow execution") as conn:
            # The parent's row first (the module's lock order); on SQLite this takes the write
            # lock, so the read of the child below cannot go stale before the commit.
            lease = self._lock_parent(conn, parent_id, token)
            if lease is None:
                return ChildWait()
            child = self._follow(conn, child_execution_id)
            if child is None or child.state.outcome:
                if child is None:
                    outcome = _vanished(child_execution_id)
                else:
                    outcome = child_outcome(child.state, child.output, child.error)
                text = encode_json(outcome, field="child outcome")
                step = self.leases.guarded_step(parent_id, token, seq, WAIT_CHILD_STEP, text, None, now)
                if conn.execute(step).first() is None:
                    return ChildWait()
                return ChildWait(outcome=outcome, lease=lease)
            if lease.cancel_requested or (lease.deadline is not None and lease.deadline < now):
                return ChildWait(boundary=True, lease=lease)
            conn.execute(
                update(_ex)
                .where(_ex.c.execution_id == parent_id, _ex.c.state == _RUNNING, _ex.c.lease_token == token)
                .values(
                    state=_PENDING,
                    next_run_at=None,
                    waiting_on=child_workflow_id,
                    lease_token=None,
                    lease_expires_at=None,
                )
            )
        return ChildWait(suspended=True)

    def _follow(self, conn: Connection, execution_id: str, *, lock: bool = True) -> Execution | None:
        """The child's row, or the last run of its continue-as-new chain, share-locked."""
        current = execution_id
        found: Execution | None = None
        for _ in range(_MAX_CHAIN):
            query = select(_ex).where(_ex.c.execution_id == current)
            if lock and self.core.db.postgres:
                # Waits for a terminal transaction of the child in flight, then reads its result.
                query = query.with_for_update(read=True)
            row = conn.execute(query).first()
            if row is None:
                return found
            found = row_to_execution(row)
            if found.state is not ExecutionState.CONTINUED_AS_NEW or found.continued_to is None:
                return found
            current = found.continued_to
        return found

    # -- reads -----------------------------------------------------------------------------------

    def list_children(
        self, parent_id: str, *, cursor: tuple[datetime, str] | None = None, limit: int = 100
    ) -> list[Execution]:
        """The runs ``parent_id`` started as children, oldest first, after ``cursor``."""
        query = select(_ex).where(_ex.c.parent_execution_id == parent_id)
        if cursor is not None:
            created, last_id = cursor
            query = query.where(
                or_(
                    _ex.c.created_at > created, (_ex.c.created_at == created) & (_ex.c.execution_id > last_id)
                )
            )
        query = query.order_by(_ex.c.created_at, _ex.c.execution_id).limit(max(0, limit))
        with self.core.transaction("list child workflow executions") as conn:
            return [row_to_execution(row) for row in conn.execute(query).all()]

    # -- the terminal hook -------------------------------------------------------------------------

    def terminal_hook(self, conn: Connection, execution: Execution) -> None:
        """Wake the parent waiting for this run, and apply the parent-close policy of this run's
        open children (or hand them to its successor when it continued as new)."""
        now = execution.completed_at or utcnow()
        if execution.parent_execution_id is not None and execution.state.outcome:
            self._wake(conn, execution, now)
        if known_childless(conn, execution.execution_id):
            return  # most runs: no statement spent looking for children
        if execution.state is ExecutionState.CONTINUED_AS_NEW:
            if execution.continued_to is not None:
                conn.execute(
                    update(_ex)
                    .where(
                        _ex.c.parent_execution_id == execution.execution_id,
                        _ex.c.state.in_(_OPEN_VALUES),
                    )
                    .values(parent_execution_id=execution.continued_to)
                )
            return
        if execution.state.outcome:
            self._cascade(conn, execution, now)

    def _wake(self, conn: Connection, child: Execution, now: datetime) -> None:
        guard = (
            _ex.c.execution_id == child.parent_execution_id,
            _ex.c.state == _PENDING,
            _ex.c.waiting_on == child.workflow_id,
        )
        locked = select(_ex.c.execution_id).where(*guard)
        if self.core.db.postgres:
            # Never wait for the parent's row here (see the module's lock order).
            locked = locked.with_for_update(skip_locked=True)
        woken = conn.execute(
            update(_ex)
            .where(_ex.c.execution_id.in_(locked), *guard)
            .values(next_run_at=now, waiting_on=None)
            .returning(_ex.c.execution_id)
        ).first()
        if woken is not None:
            # Queued once this transaction commits (or by the sweeper's due scan).
            self.core.note_started(conn, woken.execution_id)

    def _cascade(self, conn: Connection, parent: Execution, now: datetime) -> None:
        children = conn.execute(
            select(_ex.c.execution_id, _ex.c.parent_close_policy)
            .where(_ex.c.parent_execution_id == parent.execution_id, _ex.c.state.in_(_OPEN_VALUES))
            .order_by(_ex.c.execution_id)
        ).all()
        reason = f"parent {parent.execution_id} ended {parent.state.value}"
        for child_id, raw_policy in children:
            policy = _policy(raw_policy)
            if policy is ParentClosePolicy.ABANDON:
                continue
            if policy is ParentClosePolicy.TERMINATE:
                self.terminal.finish_in(conn, child_id, ExecutionState.TERMINATED, None, reason, now)
                continue
            ended = self.terminal.finish_in(
                conn,
                child_id,
                ExecutionState.CANCELLED,
                None,
                reason,
                now,
                [_ex.c.state == _PENDING],
                cancel_reason=reason,
            )
            if ended is None:
                conn.execute(
                    update(_ex)
                    .where(_ex.c.execution_id == child_id, _ex.c.state == _RUNNING)
                    .values(cancel_requested=True, cancel_reason=reason)
                )

    # -- the sweeper -----------------------------------------------------------------------------

    def wake_stranded(self, *, now: datetime, limit: int = 500) -> list[str]:
        """Wake the parents still waiting for a ``workflow_id`` that has no open run any more (a
        wake-up skipped because the parent's row was locked by a transaction that then rolled
        back); return their ids, to queue."""
        child = aliased(_ex)
        waiting = (
            select(_ex.c.execution_id)
            .where(
                _ex.c.state == _PENDING,
                _ex.c.next_run_at.is_(None),
                _ex.c.waiting_on.is_not(None),
                ~exists().where(child.c.workflow_id == _ex.c.waiting_on, child.c.state.in_(_OPEN_VALUES)),
            )
            .limit(limit)
        )
        with self.core.transaction("wake parents whose child ended") as conn:
            ids = [row.execution_id for row in conn.execute(waiting).all()]
            if not ids:
                return []
            woken = conn.execute(
                update(_ex)
                .where(_ex.c.execution_id.in_(ids), _ex.c.state == _PENDING, _ex.c.waiting_on.is_not(None))
                .values(next_run_at=now, waiting_on=None)
                .returning(_ex.c.execution_id)
            )
            return [row.execution_id for row in woken]


def _vanished(execution_id: str) -> JsonValue:
    # Purged by retention while the parent waited: the parent cannot learn how it ended.
    return child_outcome(ExecutionState.FAILED, None, f"child run {execution_id} no longer exists")


def _ids(child: Execution) -> dict[str, str]:
    return {"execution_id": child.execution_id, "workflow_id": child.workflow_id}


def _checkpoint(parent_id: str, seq: int, name: str, value: JsonValue, now: datetime) -> dict[str, Any]:
    return {
        "execution_id": parent_id,
        "seq": seq,
        "name": name,
        "output": encode_json(value, field=name),
        "error": None,
        "created_at": now,
    }


@dataclass(frozen=True)
class ChildStart:
    """One child to start at position ``seq`` of its parent (checked and encoded already)."""

    seq: int
    execution_id: str
    name: str
    input_text: str
    workflow_id: str
    policy: ParentClosePolicy
    deadline: datetime | None


def _child_values(parent_id: str, start: ChildStart, now: datetime) -> dict[str, Any]:
    return {
        "execution_id": start.execution_id,
        "workflow_name": start.name,
        "workflow_id": start.workflow_id,
        "input": start.input_text,
        "state": _PENDING,
        "created_at": now,
        "next_run_at": now,
        "deadline": start.deadline,
        "attempt": 0,
        "recovery_count": 0,
        "cancel_requested": False,
        "trigger_depth": 0,
        "parent_execution_id": parent_id,
        "parent_close_policy": start.policy.value,
        # A child joins its parent's trace: its start span is a child of the parent's run span.
        "trace_context": tracing.started(start.name),
    }


def _policy(raw: Any) -> ParentClosePolicy:
    try:
        return ParentClosePolicy(raw)
    except ValueError:
        # Only the engine writes this column; an unknown value (a newer build's) is the default.
        return ParentClosePolicy.TERMINATE
