"""The workflow store's forks: a new run of a source run's workflow and input, whose checkpoints
before the fork point are copied from the source in the transaction that inserts it."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import func, literal, select

from .. import tracing
from .._input import id_problem
from ..errors import InvalidStateError
from ._schema import row_to_execution, steps_table
from ._store_core import StoreCore, _ex
from .errors import ExecutionNotFoundError
from .forks import check_from_step, fork_workflow_id, parse_fork_mode
from .models import Execution, ExecutionState, ForkMode

_steps = steps_table


class Forks:
    """Creating forks: what :meth:`SqlWorkflowStore.fork` does."""

    def __init__(self, core: StoreCore) -> None:
        self.core = core

    def fork(
        self,
        source_id: str,
        from_step: int,
        mode: ForkMode,
        *,
        now: datetime,
        deadline: datetime | None = None,
    ) -> Execution:
        chosen = parse_fork_mode(mode)
        check_from_step(from_step)
        if id_problem(source_id) is not None:
            raise ExecutionNotFoundError(source_id)
        execution_id = self.core.new_execution_id()
        with self.core.transaction("fork a workflow execution") as conn:
            source = conn.execute(select(_ex).where(_ex.c.execution_id == source_id)).first()
            if source is None:
                raise ExecutionNotFoundError(source_id)
            recorded = conn.execute(
                select(func.count()).select_from(_steps).where(_steps.c.execution_id == source_id)
            ).scalar_one()
            check_from_step(from_step, recorded)
            row = conn.execute(
                _ex.insert()
                .values(
                    execution_id=execution_id,
                    workflow_name=source.workflow_name,
                    workflow_id=fork_workflow_id(source.workflow_id, execution_id),
                    # The stored text as it is: the source's input was accepted once already.
                    input=source.input,
                    state=ExecutionState.PENDING.value,
                    created_at=now,
                    next_run_at=now,
                    deadline=deadline,
                    attempt=0,
                    recovery_count=0,
                    cancel_requested=False,
                    trigger_depth=source.trigger_depth,
                    completion_callbacks=source.completion_callbacks,
                    forked_from=source.execution_id,
                    fork_from_step=from_step,
                    fork_mode=chosen.value,
                    # Claimed under the same limits as its source.
                    queue_name=source.queue_name,
                    concurrency_key=source.concurrency_key,
                    concurrency_limit=source.concurrency_limit,
                    priority=source.priority,
                    # A fork is a start of its own: the request that forked it traces it.
                    trace_context=tracing.started(source.workflow_name),
                )
                .returning(*_ex.c)
            ).one()
            # Positions are written in order from 0 and never removed while a run is kept, so the
            # first from_step of them are there; a count that differs means retention purged the
            # source meanwhile, and the fork rolls back rather than start with a gap.
            copied = conn.execute(
                _steps.insert()
                .from_select(
                    ["execution_id", "seq", "name", "output", "error", "created_at"],
                    select(
                        literal(execution_id, _steps.c.execution_id.type).label("execution_id"),
                        _steps.c.seq,
                        _steps.c.name,
                        _steps.c.output,
                        _steps.c.error,
                        _steps.c.created_at,
                    ).where(_steps.c.execution_id == source_id, _steps.c.seq < from_step),
                )
                # RETURNING rather than rowcount, which psycopg leaves at -1 for INSERT ... SELECT.
                .returning(_steps.c.seq)
            ).all()
            if len(copied) != from_step:
                raise InvalidStateError(
                    f"the steps of execution {source_id} changed while it was forked; try again"
                )
        return row_to_execution(row)
