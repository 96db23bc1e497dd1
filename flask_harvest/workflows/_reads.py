"""The workflow store's reads: an execution by id or by ``workflow_id``, the listing, the counts
by state, and an execution's step checkpoints."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import Integer, Select, bindparam, func, literal, or_, select
from sqlalchemy.sql.elements import ColumnElement

from .._bounded import bounded_count, bounded_counts
from .._input import id_problem
from ._schema import row_to_execution, row_to_step, steps_table
from ._store_core import StoreCore, _ex, check_key
from .models import Execution, ExecutionState, StepRecord

_steps = steps_table

#: A listing position (:data:`flask_harvest.workflows.store.ExecutionCursor`).
ExecutionCursor = tuple[datetime, str]


class ExecutionReads:
    """What the service, the HTTP API, the dashboard and the runner read."""

    def __init__(self, core: StoreCore) -> None:
        self.core = core

    def get(self, execution_id: str) -> Execution | None:
        if id_problem(execution_id) is not None:
            return None
        with self.core.transaction("read a workflow execution") as conn:
            row = conn.execute(select(_ex).where(_ex.c.execution_id == execution_id)).first()
        return row_to_execution(row) if row is not None else None

    def get_by_workflow_id(self, workflow_id: str) -> Execution | None:
        if id_problem(workflow_id) is not None:
            return None
        with self.core.transaction("read a workflow execution") as conn:
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
        query = select(_ex).where(*_listed(name, state))
        if cursor is not None:
            created, last_id = cursor
            query = query.where(
                or_(
                    _ex.c.created_at < created, (_ex.c.created_at == created) & (_ex.c.execution_id < last_id)
                )
            )
        query = query.order_by(_ex.c.created_at.desc(), _ex.c.execution_id.desc()).limit(max(0, limit))
        with self.core.transaction("list workflow executions") as conn:
            return [row_to_execution(row) for row in conn.execute(query).all()]

    def count_executions(
        self, *, name: str | None = None, state: ExecutionState | None = None, cap: int
    ) -> int:
        query = select(literal(1)).select_from(_ex).where(*_listed(name, state))
        with self.core.db.read("count workflow executions") as conn:
            return bounded_count(conn, query, cap=cap)

    def count_states(self, *, cap: int) -> dict[ExecutionState, int]:
        with self.core.db.read("count workflow executions by state") as conn:
            row = conn.execute(_state_counts(), {"cap": max(0, cap)}).one()
        return {state: int(count) for state, count in zip(ExecutionState, row, strict=True)}

    def count_by_workflow(self, names: Sequence[str], *, cap: int) -> dict[tuple[str, ExecutionState], int]:
        pairs = tuple((name, state) for name in names for state in ExecutionState)
        with self.core.db.read("count workflow executions by workflow and state") as conn:
            counts = bounded_counts(
                conn,
                _ex,
                lambda: [
                    (_ex.c.workflow_name == name) & (_ex.c.state == state.value) for name, state in pairs
                ],
                cap=cap,
                key=("workflow executions by workflow and state", pairs),
            )
        return dict(zip(pairs, counts, strict=True))

    def list_steps(self, execution_id: str) -> list[StepRecord]:
        if id_problem(execution_id) is not None:
            return []
        with self.core.transaction("list workflow steps") as conn:
            rows = conn.execute(
                select(_steps).where(_steps.c.execution_id == execution_id).order_by(_steps.c.seq)
            ).all()
        return [row_to_step(row) for row in rows]

    def get_step(self, execution_id: str, seq: int) -> StepRecord | None:
        if id_problem(execution_id) is not None:
            return None
        with self.core.transaction("read a workflow step") as conn:
            row = conn.execute(
                select(_steps).where(_steps.c.execution_id == execution_id, _steps.c.seq == seq)
            ).first()
        return row_to_step(row) if row is not None else None


def _listed(name: str | None, state: ExecutionState | None) -> list[ColumnElement[bool]]:
    """The listing's filters (by workflow name, by state), for its pages and its count."""
    conditions = []
    if name is not None:
        check_key("name", name)
        conditions.append(_ex.c.workflow_name == name)
    if state is not None:
        conditions.append(_ex.c.state == ExecutionState(state).value)
    return conditions


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
