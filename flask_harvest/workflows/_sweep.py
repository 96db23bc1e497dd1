"""The workflow store's sweeper queries: due executions, expired leases, overdue deadlines."""

from __future__ import annotations

from datetime import datetime
from typing import NamedTuple

from sqlalchemy import or_, select, update

from ._store_core import _OPEN_VALUES, StoreCore, TerminalTransition, _ex
from .models import ExecutionState, Isolation, timeout_message

_PENDING = ExecutionState.PENDING.value
_RUNNING = ExecutionState.RUNNING.value
_ALONE = Isolation.ALONE.value
_QUARANTINED = Isolation.QUARANTINED.value


class LeaseSweep(NamedTuple):
    """What :meth:`SqlWorkflowStore.expired_leases` did: requeued ids (to schedule) and failed ids."""

    requeued: list[str]
    failed: list[str]


class _SweepQueries:
    """What the worker's periodic sweep asks the store."""

    def __init__(self, core: StoreCore, terminal: TerminalTransition) -> None:
        # The two things the queries below use, by the names they use them under.
        self._transaction = core.transaction
        self._sweep_finish = terminal.sweep_finish

    def due_executions(self, *, now: datetime, limit: int = 500) -> list[tuple[str, datetime]]:
        """Return the ids and due times of ``Pending`` executions due at ``now``, oldest due first.

        Queued runs are left out: their jobs are claim attempts on their queue, which the queue
        sweep (:meth:`QueueDriver.sweep <flask_harvest.workflows._queue_driver.QueueDriver.sweep>`)
        gives as many as the queue has room for, not one per waiting run.
        """
        query = (
            select(_ex.c.execution_id, _ex.c.next_run_at)
            .where(_ex.c.state == _PENDING, _ex.c.next_run_at <= now, _ex.c.queue_name.is_(None))
            .order_by(_ex.c.next_run_at)
            .limit(limit)
        )
        with self._transaction("find due workflow executions") as conn:
            return [(row.execution_id, row.next_run_at) for row in conn.execute(query)]

    def cancel_expired(self, *, now: datetime, limit: int = 500) -> list[str]:
        """End ``Cancelled`` the ``Running`` executions whose lease expired with a cancel requested.

        Their worker died before their next boundary: no code needs to run again to honour the
        request (and it must not count as a recovery, nor end as a poison pill). Returns their ids.
        """
        abandoned = (_ex.c.state == _RUNNING) & (_ex.c.lease_expires_at < now) & _ex.c.cancel_requested
        with self._transaction("find cancelled workflow executions whose worker died") as conn:
            rows = conn.execute(
                select(_ex.c.execution_id, _ex.c.cancel_reason).where(abandoned).limit(limit)
            ).all()
        cancelled = []
        for execution_id, reason in rows:
            if self._sweep_finish(
                execution_id, ExecutionState.CANCELLED, reason or "cancelled", now, [abandoned]
            ):
                cancelled.append(execution_id)
        return cancelled

    def expired_leases(self, *, now: datetime, max_recovery_attempts: int) -> LeaseSweep:
        """Requeue ``Running`` executions whose lease expired (their worker died), quarantined.

        Each is back to ``Pending`` (due now) with ``recovery_count`` plus one. A run that ran
        alone in its process (``isolation`` ``alone``) is charged the death (``charged_recoveries``
        plus one), unless it was charged ``max_recovery_attempts`` times already: then it ends
        ``Failed`` as a poison pill. A run that died beside others may be innocent (the run that
        killed the process took it down): it is not charged. Both are quarantined: they run alone
        from now on, so the next death is known to be their own.
        """
        expired = (_ex.c.state == _RUNNING) & (_ex.c.lease_expires_at < now)
        alone = _ex.c.isolation == _ALONE
        requeue = {
            "state": _PENDING,
            "next_run_at": now,
            "lease_token": None,
            "lease_expires_at": None,
            "isolation": _QUARANTINED,
            "recovery_count": _ex.c.recovery_count + 1,
        }
        with self._transaction("requeue expired workflow leases") as conn:
            requeued = [
                *conn.execute(
                    update(_ex)
                    .where(expired, or_(_ex.c.isolation.is_(None), ~alone))
                    .values(**requeue)
                    .returning(_ex.c.execution_id)
                ).scalars(),
                *conn.execute(
                    update(_ex)
                    .where(expired, alone, _ex.c.charged_recoveries < max_recovery_attempts)
                    .values(**requeue, charged_recoveries=_ex.c.charged_recoveries + 1)
                    .returning(_ex.c.execution_id)
                ).scalars(),
            ]
            poisoned = conn.execute(select(_ex.c.execution_id, _ex.c.charged_recoveries).where(expired)).all()
        failed = []
        for execution_id, recoveries in poisoned:
            error = (
                f"poison pill: the worker running this execution alone stopped without finishing it "
                f"{recoveries + 1} times (its lease expired), more than the {max_recovery_attempts} "
                "recovery attempts allowed (HARVEST_WORKFLOW_MAX_RECOVERY_ATTEMPTS)"
            )
            if self._sweep_finish(execution_id, ExecutionState.FAILED, error, now, [expired]):
                failed.append(execution_id)
        return LeaseSweep(list(requeued), failed)

    def enforce_timeouts_once(self, *, now: datetime, limit: int = 500) -> list[str]:
        """End open executions whose deadline has passed as ``TimedOut``; return their ids."""
        overdue = (_ex.c.state.in_(_OPEN_VALUES)) & (_ex.c.deadline < now)
        with self._transaction("find overdue workflow executions") as conn:
            rows = conn.execute(
                select(_ex.c.execution_id, _ex.c.deadline)
                .where(overdue)
                .order_by(_ex.c.deadline)
                .limit(limit)
            ).all()
        timed_out = []
        for execution_id, deadline in rows:
            error = timeout_message(deadline)
            if self._sweep_finish(execution_id, ExecutionState.TIMED_OUT, error, now, [overdue]):
                timed_out.append(execution_id)
        return timed_out
