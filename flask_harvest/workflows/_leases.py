"""The workflow store's running executions: claims and leases, step checkpoints, durable sleeps.

Every write here is guarded by the execution being ``Running`` under the caller's lease token, so
once another worker takes the execution over, or it ends, nothing the old holder writes lands.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any

from sqlalchemy import (
    Boolean,
    ColumnElement,
    Connection,
    String,
    Text,
    case,
    literal,
    null,
    or_,
    select,
    text,
    update,
)

from .._sql import UTCDateTime
from .._threads import GroupCommit, PerProcess
from ..errors import StoreError
from ._schema import row_to_execution, steps_table
from ._store_core import StoreCore, _coalesce_time, _ex, check_key, row_test
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


@dataclass(frozen=True)
class Checkpoint:
    """One step's checkpoint, as :meth:`~flask_harvest.workflows.store.SqlWorkflowStore.checkpoint`
    takes it (its arguments, in one value)."""

    execution_id: str
    token: str
    seq: int
    name: str
    now: datetime
    output: JsonValue = None
    error: str | None = None
    lease_seconds: float | None = None


@dataclass(frozen=True)
class _Row:
    """A checkpoint ready to write: its output encoded, its times naive UTC (as stored)."""

    execution_id: str
    token: str
    seq: int
    name: str
    output: str | None
    error: str | None
    at: datetime
    expires: datetime | None


#: The most checkpoints one transaction carries.
_GROUP_LIMIT = 64


class Leases:
    """What a worker asks while it runs an execution."""

    def __init__(self, core: StoreCore) -> None:
        self.core = core
        # One group per store and process (a forked child must not inherit a write in progress).
        self._group: PerProcess[GroupCommit[_Row, LeaseView | StoreError | None]] = PerProcess(
            lambda: GroupCommit(self._write_grouped, limit=_GROUP_LIMIT)
        )

    def claim(
        self, execution_id: str, *, now: datetime, lease_seconds: float, alone: bool = False
    ) -> Execution | None:
        stmt = (
            update(_ex)
            .where(_ex.c.execution_id == execution_id, _due(now))
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
            .where(_ex.c.execution_id.in_(unique), due)
            .order_by(_ex.c.execution_id)
            .with_for_update()
        )
        stmt = (
            update(_ex)
            .where(_ex.c.execution_id.in_(locked), due)
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
        row = encode_checkpoint(
            Checkpoint(
                execution_id, token, seq, name, now, output=output, error=error, lease_seconds=lease_seconds
            )
        )
        # Runs checkpointing at once on this process's threads share one transaction; a lone one
        # writes at once.
        result = self._group.get().submit(row)
        if isinstance(result, StoreError):
            raise result
        return result

    def checkpoint_many(self, checkpoints: Sequence[Checkpoint]) -> list[LeaseView | None]:
        rows = [encode_checkpoint(c) for c in checkpoints]  # all or nothing: a bad output writes none
        return self._write(rows) if rows else []

    def _write_grouped(self, rows: list[_Row]) -> list[LeaseView | StoreError | None]:
        """The group's write: one transaction for the batch. Should it fail, each item is written
        alone, so that a failure (a deadlock, one bad value) reaches only the runs it concerns."""
        try:
            return list(self._write(rows))
        except StoreError as exc:
            if len(rows) == 1:
                return [exc]
        results: list[LeaseView | StoreError | None] = []
        for row in rows:
            try:
                results.extend(self._write([row]))
            except StoreError as exc:
                results.append(exc)
        return results

    def _write(self, rows: list[_Row]) -> list[LeaseView | None]:
        """Write checkpoints of any runs in one transaction, each with the result it would have
        had alone (in the order given, where one run has several)."""
        results: list[LeaseView | None] = [None] * len(rows)
        with self.core.transaction("record workflow steps") as conn:
            for round_ in _rounds(rows):
                if self.core.db.postgres:
                    views = _write_postgres(conn, [rows[i] for i in round_])
                else:
                    views = [_write_one(conn, rows[i], self.guarded_step) for i in round_]
                for index, view in zip(round_, views, strict=True):
                    results[index] = view
        return results

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


def _due(now: datetime) -> ColumnElement[bool]:
    # What makes an execution claimable by its id: pending, with no wait or a wait that has
    # passed, not waiting for a child (its wake-up clears waiting_on), and in no queue (a queued
    # run is claimed through its queue's limits). A row test: claims name their ids.
    return row_test(
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


def encode_checkpoint(checkpoint: Checkpoint) -> _Row:
    """``checkpoint`` ready to write.

    :raises InvalidFieldError: its output is not a JSON value.
    """
    error = checkpoint.error
    output = None
    if error is None:
        output = encode_json(checkpoint.output, field=f"step {checkpoint.name!r} result")
    at = _naive_utc(checkpoint.now)
    expires = None
    if checkpoint.lease_seconds is not None:
        expires = at + timedelta(seconds=checkpoint.lease_seconds)
    return _Row(
        checkpoint.execution_id, checkpoint.token, checkpoint.seq, checkpoint.name, output, error, at, expires
    )


def _naive_utc(moment: datetime) -> datetime:
    return moment if moment.tzinfo is None else moment.astimezone(timezone.utc).replace(tzinfo=None)


def _rounds(rows: Sequence[_Row]) -> list[list[int]]:
    """Split positions into rounds in which each run appears once, keeping each run's order: the
    statements below join on the run, and a run's second checkpoint sees its first."""
    rounds: list[list[int]] = []
    seen: dict[str, int] = {}
    for index, row in enumerate(rows):
        number = seen.get(row.execution_id, 0)
        seen[row.execution_id] = number + 1
        if number == len(rounds):
            rounds.append([])
        rounds[number].append(index)
    return rounds


_FLAGS = (_ex.c.cancel_requested, _ex.c.cancel_reason, _ex.c.deadline)

# PostgreSQL: a batch's checkpoints as arrays, so the statements are the same text for any batch
# (compiled once, cached by the driver) and cost one round trip each. The guard share-locks each
# run's row (in id order, so two batches cannot deadlock over their rows), waiting for a
# concurrent terminal UPDATE and then seeing its result: no checkpoint lands after one. The flags
# are read from the locked row, as the single checkpoint reads them.
_PG_RENEW = text(
    f"""
UPDATE {_ex.name} AS e SET lease_expires_at = v.expires
FROM unnest(CAST(:ids AS varchar[]), CAST(:tokens AS varchar[]), CAST(:expires AS timestamp[]))
    AS v(execution_id, token, expires)
WHERE e.execution_id = v.execution_id AND e.lease_token = v.token AND e.state = :running
RETURNING e.execution_id
"""  # noqa: S608 (table names, no input)
).columns(execution_id=String)
_PG_CHECKPOINT = text(
    f"""
WITH v AS (
    SELECT * FROM unnest(
        CAST(:ids AS varchar[]), CAST(:tokens AS varchar[]), CAST(:seqs AS integer[]), CAST(:names AS text[]),
        CAST(:outputs AS text[]), CAST(:errors AS text[]), CAST(:ats AS timestamp[])
    ) AS v(execution_id, token, seq, name, output, error, created_at)
), guard AS (
    SELECT v.execution_id, v.seq, v.name, v.output, v.error, v.created_at,
        e.cancel_requested, e.cancel_reason, e.deadline
    FROM v JOIN {_ex.name} AS e
        ON e.execution_id = v.execution_id AND e.lease_token = v.token AND e.state = :running
    ORDER BY e.execution_id
    FOR SHARE OF e
), landed AS (
    INSERT INTO {_steps.name} (execution_id, seq, name, output, error, created_at)
    SELECT execution_id, seq, name, output, error, created_at FROM guard
    ON CONFLICT (execution_id, seq) DO NOTHING
    RETURNING execution_id, seq
)
SELECT guard.execution_id, guard.cancel_requested, guard.cancel_reason, guard.deadline
FROM landed JOIN guard ON guard.execution_id = landed.execution_id AND guard.seq = landed.seq
"""  # noqa: S608 (table names, no input)
).columns(execution_id=String, cancel_requested=Boolean, cancel_reason=Text, deadline=UTCDateTime)


def _write_postgres(conn: Connection, rows: list[_Row]) -> list[LeaseView | None]:
    """Checkpoints of distinct runs in two statements at most (one unless some renew the lease)."""
    ordered = sorted(rows, key=lambda r: r.execution_id)  # lock order
    renewing = [row for row in ordered if row.expires is not None]
    lost: set[str] = set()
    if renewing:
        renewed = conn.execute(
            _PG_RENEW,
            {
                "ids": [r.execution_id for r in renewing],
                "tokens": [r.token for r in renewing],
                "expires": [r.expires for r in renewing],
                "running": _RUNNING,
            },
        ).scalars()
        lost = {r.execution_id for r in renewing} - set(renewed)
    guarded = [row for row in ordered if row.execution_id not in lost]
    views: dict[str, LeaseView] = {}
    if guarded:
        landed = conn.execute(
            _PG_CHECKPOINT,
            {
                "ids": [r.execution_id for r in guarded],
                "tokens": [r.token for r in guarded],
                "seqs": [r.seq for r in guarded],
                "names": [r.name for r in guarded],
                "outputs": [r.output for r in guarded],
                "errors": [r.error for r in guarded],
                "ats": [r.at for r in guarded],
                "running": _RUNNING,
            },
        )
        views = {
            row.execution_id: LeaseView(bool(row.cancel_requested), row.cancel_reason, row.deadline)
            for row in landed
        }
    return [views.get(row.execution_id) for row in rows]


def _write_one(conn: Connection, row: _Row, guarded_step: Callable[..., Any]) -> LeaseView | None:
    """One checkpoint in the caller's transaction, statement by statement (SQLite: its writes are
    serialized anyway, and its write lock holds the row from the first statement on)."""
    guard = (_ex.c.execution_id == row.execution_id, _ex.c.state == _RUNNING, _ex.c.lease_token == row.token)
    flags = None
    if row.expires is not None:
        stmt = update(_ex).where(*guard).values(lease_expires_at=row.expires).returning(*_FLAGS)
        flags = conn.execute(stmt).first()
        if flags is None:
            return None
    step = guarded_step(row.execution_id, row.token, row.seq, row.name, row.output, row.error, row.at)
    if conn.execute(step).first() is None:
        return None
    if flags is None:
        flags = conn.execute(select(*_FLAGS).where(_ex.c.execution_id == row.execution_id)).first()
    if flags is None:  # the guarded step above holds the row: it cannot have gone
        raise StoreError(f"workflow execution {row.execution_id} vanished during its checkpoint")
    return LeaseView(bool(flags.cancel_requested), flags.cancel_reason, flags.deadline)
