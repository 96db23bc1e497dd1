"""The workflow store's starts and ends from outside a run: start-or-load under the ``workflow_id``
reuse policy, cooperative cancel, and terminate."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import datetime
from functools import partial
from typing import Any

from sqlalchemy import Connection, Select, select, text, update

from .. import tracing
from .._input import check_id, id_problem
from ..errors import InvalidFieldError, StoreError
from ._reads import ExecutionReads
from ._schema import _OPEN, NAME_LENGTH, row_to_execution
from ._store_core import StoreCore, TerminalTransition, _ex, _open, check_key
from .errors import ExecutionNotFoundError, WorkflowIdReusedError
from .models import Execution, ExecutionState, IdReusePolicy, JsonValue, check_reason, encode_json
from .queues import StartQueue, queue_values

_PENDING = ExecutionState.PENDING.value
_RUNNING = ExecutionState.RUNNING.value
_OPEN_STATES = frozenset((_PENDING, _RUNNING))
# A start that keeps losing the race between "the open run closed" and "ours conflicts" gives up.
_START_ROUNDS = 5


class Runs:
    """Starts, cancels and terminations: what the service and the terminal hooks ask."""

    def __init__(self, core: StoreCore, terminal: TerminalTransition, reads: ExecutionReads) -> None:
        self.core = core
        self.terminal = terminal
        self.reads = reads
        # Built once: a start's values go in as parameters, so SQLAlchemy compiles the statement
        # once per set of columns instead of building and hashing a new one per call.
        self._insert = (
            core.db.insert(_ex)
            .on_conflict_do_nothing(index_elements=[_ex.c.workflow_id], index_where=text(_OPEN))
            .returning(*_ex.c)
        )
        # Several new keys at once: one multi-row INSERT, its rows returned in the order given.
        self._insert_many = core.db.insert(_ex).returning(*_ex.c, sort_by_parameter_order=True)

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
        queue: StartQueue | None = None,
        parent: tuple[str, str] | None = None,
    ) -> tuple[Execution, bool]:
        # parent: (parent_execution_id, parent_close_policy) of a child run (see _children).
        input_text = encode_json(input, field="input", max_bytes=max_input_bytes)
        check_key("name", name)
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
        row_values = partial(
            _row_values,
            name=name,
            input_text=input_text,
            now=now,
            deadline=deadline,
            trigger_depth=trigger_depth,
            completion_callbacks=completion_callbacks,
            queue=queue,
            parent=parent,
            trace_context=tracing.started(name),
        )
        if workflow_id is None and conn is None:
            # A key made here has no runs yet: the start is one INSERT, which commits on its own
            # (no look for an open run, no BEGIN or COMMIT: two round trips of three fewer).
            with self.core.db.one_statement("start a workflow execution") as c:
                row = c.execute(self._insert, row_values(self.core.new_execution_id(), key)).first()
            if row is not None:
                return row_to_execution(row), True
        with self.core.transaction("start a workflow execution", conn) as c:
            for _ in range(_START_ROUNDS):
                found = c.execute(_open_or_last_run(key, policy)).first()
                if found is not None and found.state in _OPEN_STATES:
                    return row_to_execution(found), False
                if found is not None:
                    _check_reuse(key, policy, found.execution_id, found.state)
                execution_id = self.core.new_execution_id()
                # DO NOTHING rather than catching IntegrityError: an error would abort the caller's
                # PostgreSQL transaction. PostgreSQL waits here for a concurrent inserter to commit.
                row = c.execute(self._insert, row_values(execution_id, key)).first()
                if row is not None:
                    if conn is not None:
                        self.core.note_started(conn, execution_id)
                    return row_to_execution(row), True
        raise StoreError(f"could not start workflow_id {key!r}: its open run kept changing; try again")

    def start_many(
        self,
        name: str,
        inputs: Sequence[JsonValue],
        workflow_ids: Sequence[str] | None = None,
        *,
        now: datetime,
        deadline: datetime | None = None,
        completion_callbacks: JsonValue = None,
        max_input_bytes: int | None = None,
        queue: StartQueue | None = None,
    ) -> list[Execution]:
        # workflow_ids: keys that have no runs (the sharded store's, made to route to this shard).
        if isinstance(inputs, (str, bytes)) or not isinstance(inputs, Sequence):
            raise InvalidFieldError("inputs", f"must be a list of inputs, not {type(inputs).__name__}")
        texts = [encode_json(value, field="input", max_bytes=max_input_bytes) for value in inputs]
        check_key("name", name)
        if workflow_ids is None:
            keys = [str(uuid.uuid4()) for _ in texts]
        else:
            keys = list(workflow_ids)
            if len(keys) != len(texts):
                raise InvalidFieldError("workflow_ids", "must be as many as the inputs")
            for key in keys:
                check_id(key, "workflow_id", max_chars=NAME_LENGTH)
        if not texts:
            return []
        rows = [
            _row_values(
                self.core.new_execution_id(),
                key,
                name=name,
                input_text=text,
                now=now,
                deadline=deadline,
                trigger_depth=0,
                completion_callbacks=completion_callbacks,
                queue=queue,
                parent=None,
                trace_context=tracing.started(name),
            )
            for key, text in zip(keys, texts, strict=True)
        ]
        # One transaction: every run exists, or (a key with an open run, a lost connection) none.
        with self.core.transaction("start workflow executions") as c:
            found = c.execute(self._insert_many, rows).all()
        return [row_to_execution(row) for row in found]

    def request_cancel(self, execution_id: str, reason: str | None = None, *, now: datetime) -> Execution:
        check_reason(reason)
        if id_problem(execution_id) is not None:
            raise ExecutionNotFoundError(execution_id)
        error = reason or "cancelled"
        with self.core.transaction("cancel a workflow execution") as conn:
            for _ in range(_START_ROUNDS):
                done = self.terminal.finish_in(
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
        check_reason(reason)
        if id_problem(execution_id) is not None:
            raise ExecutionNotFoundError(execution_id)
        ended = self.terminal.finish(
            execution_id, ExecutionState.TERMINATED, error=reason or "terminated", now=now
        )
        if ended is not None:
            return ended
        current = self.reads.get(execution_id)
        if current is None:
            raise ExecutionNotFoundError(execution_id)
        return current


def _row_values(
    execution_id: str,
    key: str,
    *,
    name: str,
    input_text: str,
    now: datetime,
    deadline: datetime | None,
    trigger_depth: int,
    completion_callbacks: JsonValue,
    queue: StartQueue | None,
    parent: tuple[str, str] | None,
    trace_context: str | None,
) -> dict[str, Any]:
    """The new row of a started run, as the INSERT's parameters."""
    values: dict[str, Any] = {
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
        **(queue_values(queue) if queue is not None else {}),
        "trace_context": trace_context,
    }
    if parent is not None:
        values["parent_execution_id"], values["parent_close_policy"] = parent
    return values


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
