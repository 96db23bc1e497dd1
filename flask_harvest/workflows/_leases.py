"""The workflow store's running executions: claims and leases, step checkpoints, durable sleeps.

Every write here is guarded by the execution being ``Running`` under the caller's lease token, so
once another worker takes the execution over, or it ends, nothing the old holder writes lands.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Text, case, literal, null, or_, select, update

from .._sql import UTCDateTime
from ..errors import StoreError
from ._schema import row_to_execution, steps_table
from ._store_core import StoreCore, _coalesce_time, _ex, check_key
from .models import Execution, ExecutionState, Isolation, JsonValue, encode_json, storable_text

_steps = steps_table
_PENDING = ExecutionState.PENDING.value
_RUNNING = ExecutionState.RUNNING.value
_ALONE = Isolation.ALONE.value
_still_quarantined = case((_ex.c.isolation.is_(None), null()), else_=literal(Isolation.QUARANTINED.value))


@dataclass(frozen=True)
class LeaseView:
    """What a running execution's code must act on, as its lease renewal read it."""

    cancel_requested: bool
    cancel_reason: str | None
    deadline: datetime | None


class Leases:
    """What a worker asks while it runs an execution."""

    def __init__(self, core: StoreCore) -> None:
        self.core = core

    def claim(
        self, execution_id: str, *, now: datetime, lease_seconds: float, alone: bool = False
    ) -> Execution | None:
        stmt = (
            update(_ex)
            .where(_ex.c.execution_id == execution_id, *_due(now))
            .values(**_claim_values(now, lease_seconds, alone))
            .returning(*_ex.c)
        )
        with self.core.transaction("claim a workflow execution") as conn:
            row = conn.execute(stmt).first()
        return row_to_execution(row) if row is not None else None

    def claim_many(
        self, execution_ids: Sequence[str], *, now: datetime, lease_seconds: float, alone: bool = False
    ) -> list[Execution]:
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
            .values(**_claim_values(now, lease_seconds, alone))
            .returning(*_ex.c)
        )
        with self.core.transaction("claim workflow executions") as conn:
            rows = conn.execute(stmt).all()
        return sorted((row_to_execution(row) for row in rows), key=lambda e: e.execution_id)

    def run_alone(self, execution_id: str, token: str, *, now: datetime, lease_seconds: float) -> bool:
        stmt = (
            update(_ex)
            .where(_ex.c.execution_id == execution_id, _ex.c.state == _RUNNING, _ex.c.lease_token == token)
            .values(isolation=_ALONE, lease_expires_at=now + timedelta(seconds=lease_seconds))
            .returning(_ex.c.execution_id)
        )
        with self.core.transaction("run a quarantined workflow execution alone") as conn:
            return conn.execute(stmt).first() is not None

    def renew(
        self, execution_id: str, token: str, *, now: datetime, lease_seconds: float
    ) -> Execution | None:
        stmt = (
            update(_ex)
            .where(_ex.c.execution_id == execution_id, _ex.c.state == _RUNNING, _ex.c.lease_token == token)
            .values(lease_expires_at=now + timedelta(seconds=lease_seconds))
            .returning(*_ex.c)
        )
        with self.core.transaction("renew a workflow lease") as conn:
            row = conn.execute(stmt).first()
        return row_to_execution(row) if row is not None else None

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
        check_key("name", name)
        if error is not None:
            error = storable_text(error)
        output_text = None if error is not None else encode_json(output, field=f"step {name!r} result")
        with self.core.transaction("record a workflow step") as conn:
            return (
                conn.execute(
                    self.guarded_step(execution_id, token, seq, name, output_text, error, now)
                ).first()
                is not None
            )

    def guarded_step(
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
        if self.core.db.postgres:
            # Waits for a concurrent terminal UPDATE, then sees its result: no checkpoint after it.
            guard = guard.with_for_update(read=True)
        columns = ["execution_id", "seq", "name", "output", "error", "created_at"]
        return (
            self.core.db.insert(_steps)
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
        output_text = None if error is not None else encode_json(output, field=f"step {name!r} result")
        flags = (_ex.c.cancel_requested, _ex.c.cancel_reason, _ex.c.deadline)
        with self.core.transaction("record a workflow step") as conn:
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
            step = self.guarded_step(execution_id, token, seq, name, output_text, error, now)
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
        with self.core.transaction("suspend a workflow execution") as conn:
            return conn.execute(stmt).first() is not None


def _due(now: datetime) -> tuple[Any, Any, Any, Any]:
    # What makes an execution claimable by its id: pending, with no wait or a wait that has
    # passed, not waiting for a child (its wake-up clears waiting_on), and in no queue (a queued
    # run is claimed through its queue's limits).
    return (
        _ex.c.state == _PENDING,
        or_(_ex.c.next_run_at.is_(None), _ex.c.next_run_at <= now),
        _ex.c.waiting_on.is_(None),
        _ex.c.queue_name.is_(None),
    )


def _claim_values(now: datetime, lease_seconds: float, alone: bool) -> dict[str, Any]:
    # One claim's writes, shared by claim and claim_many so the two cannot drift: running, a
    # fresh lease token, one more attempt, the first start kept. ``alone``: the claimer runs
    # nothing else meanwhile, so a death now is the run's own; else a quarantined run stays so
    # (and is not alone until run_alone says it is): a claim never inherits an old claim's ALONE.
    return {
        "isolation": literal(_ALONE) if alone else _still_quarantined,
        "state": _RUNNING,
        "lease_token": uuid.uuid4().hex,
        "lease_expires_at": now + timedelta(seconds=lease_seconds),
        "started_at": _coalesce_time(_ex.c.started_at, now),
        "attempt": _ex.c.attempt + 1,
        "next_run_at": None,
    }
