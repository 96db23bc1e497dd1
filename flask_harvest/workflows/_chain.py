"""The workflow store's continue-as-new: the guarded hand-over from a run to the next run of its
``workflow_id``, and the reads that follow a chain of such runs.

A chain is linked both ways: ``continued_to`` on the run that closed ``ContinuedAsNew``,
``continued_from`` on its successor. Both links are written in the one transaction that closes the
old run (through THE terminal transition) and inserts the new one, so a chain never has a gap or a
second successor, whatever worker dies when.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import Integer, literal, or_, select

from .._input import id_problem
from ._schema import row_to_execution
from ._store_core import StoreCore, TerminalTransition, _ex
from .models import Execution, ExecutionState, ForkMode

__all__ = ["MAX_CHAIN", "Chains"]

#: The most runs :meth:`Chains.chain` returns: the most recent ones of a longer chain.
MAX_CHAIN = 1000
_RUNNING = ExecutionState.RUNNING.value
_PENDING = ExecutionState.PENDING.value

#: What a successor takes over from the run that continued as it (besides its workflow name and id).
INHERITED = (
    "deadline",
    "trigger_depth",
    "completion_callbacks",
    "parent_execution_id",
    "parent_close_policy",
    "queue_name",
    "concurrency_key",
    "concurrency_limit",
    "priority",
    "fork_mode",
    # One logical run, one trace: every run of the chain joins the trace of the chain's start.
    "trace_context",
)


class Chains:
    """Continue-as-new and the reads along a chain of runs."""

    def __init__(self, core: StoreCore, terminal: TerminalTransition) -> None:
        self.core = core
        self.terminal = terminal

    def continue_as_new(
        self, execution_id: str, token: str, input_text: str, *, now: datetime
    ) -> tuple[Execution, Execution] | None:
        """Close the run ``ContinuedAsNew`` and insert its successor, in one transaction.

        The closing UPDATE is guarded by the run being ``Running`` under ``token``, with no cancel
        requested and its deadline not passed; the successor is inserted only if it landed. The
        open-run unique index on ``workflow_id`` allows the insert: the old row has left the open
        states by then.

        :param input_text: the successor's input, already encoded by ``encode_json``.
        :returns: ``(closed run, successor)``, or ``None`` when the guard refused (nothing changed).
        """
        successor_id = self.core.new_execution_id()
        guard = [
            _ex.c.state == _RUNNING,
            _ex.c.lease_token == token,
            _ex.c.cancel_requested.is_(False),
            or_(_ex.c.deadline.is_(None), _ex.c.deadline >= now),
        ]
        with self.core.transaction("continue a workflow execution as new") as conn:
            closed = self.terminal.finish_in(
                conn,
                execution_id,
                ExecutionState.CONTINUED_AS_NEW,
                None,
                None,
                now,
                guard,
                values={"continued_to": successor_id},
            )
            if closed is None:
                return None
            values: dict[str, Any] = {name: getattr(closed, name) for name in INHERITED}
            if closed.fork_mode == ForkMode.RECORDED.value and closed.forked_from is not None:
                # A recorded fork replays its source's results: its next run replays the source's
                # next run, from the start (the caller checked that the source continued).
                source_next = conn.execute(
                    select(_ex.c.continued_to).where(_ex.c.execution_id == closed.forked_from)
                ).scalar()
                values.update(forked_from=source_next, fork_from_step=0)
            values.update(
                execution_id=successor_id,
                workflow_name=closed.workflow_name,
                workflow_id=closed.workflow_id,
                input=input_text,
                state=_PENDING,
                created_at=now,
                next_run_at=now,
                attempt=0,
                recovery_count=0,
                cancel_requested=False,
                continued_from=closed.execution_id,
            )
            row = conn.execute(self.core.db.insert(_ex).values(values).returning(*_ex.c)).one()
        return closed, row_to_execution(row)

    def last_run(self, execution_id: str) -> Execution | None:
        """Return the last run of the chain from ``execution_id`` on (itself if it did not continue
        as new), or ``None`` if there is no such execution."""
        if id_problem(execution_id) is not None:
            return None
        step = literal(1, Integer())
        forward = (
            select(_ex.c.execution_id, _ex.c.continued_to, literal(0, Integer()).label("hops"))
            .where(_ex.c.execution_id == execution_id)
            .cte("harvest_chain_forward", recursive=True)
        )
        forward = forward.union_all(
            select(_ex.c.execution_id, _ex.c.continued_to, forward.c.hops + step).where(
                _ex.c.execution_id == forward.c.continued_to
            )
        )
        last = select(forward.c.execution_id).order_by(forward.c.hops.desc()).limit(1).scalar_subquery()
        with self.core.transaction("follow a workflow chain") as conn:
            row = conn.execute(select(_ex).where(_ex.c.execution_id == last)).first()
        return row_to_execution(row) if row is not None else None

    def chain(self, execution_id: str, *, limit: int = MAX_CHAIN) -> list[Execution]:
        """Return the runs of the chain ``execution_id`` belongs to, first to last: the most
        recent ``limit`` of them (empty if there is no such execution)."""
        last = self.last_run(execution_id)
        if last is None:
            return []
        step = literal(1, Integer())
        back = (
            select(_ex.c.execution_id, _ex.c.continued_from, literal(0, Integer()).label("hops"))
            .where(_ex.c.execution_id == last.execution_id)
            .cte("harvest_chain_back", recursive=True)
        )
        back = back.union_all(
            select(_ex.c.execution_id, _ex.c.continued_from, back.c.hops + step).where(
                _ex.c.execution_id == back.c.continued_from, back.c.hops < max(0, limit - 1)
            )
        )
        query = select(_ex).join(back, back.c.execution_id == _ex.c.execution_id).order_by(back.c.hops.desc())
        with self.core.transaction("list a workflow chain") as conn:
            return [row_to_execution(row) for row in conn.execute(query).all()]
