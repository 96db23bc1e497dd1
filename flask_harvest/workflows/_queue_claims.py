"""The workflow store's queued claims: the best eligible due run of a queue, under its limits.

A queued run is never claimed by its id (:mod:`._leases` leaves it alone): a claim takes the best
due ``Pending`` run of the queue, lower ``priority`` first, then older ``next_run_at``, among those
its limits allow. Each claim is one guarded ``UPDATE ... WHERE execution_id = (SELECT ...)``
whose subquery counts what the limits count, and a queue's claims are serialised, so two workers
never both take its last slot:

* on PostgreSQL by a transaction-scoped advisory lock on the queue's name, taken before the
  ``UPDATE`` (whose snapshot, under READ COMMITTED, then sees every earlier claim committed);
* on SQLite by the database's single writer: the ``UPDATE`` is the transaction's first statement,
  so it reads under the write lock.

Only claims raise a count of running runs, and every claim of a queue holds that lock, so what
the subquery counted is still true when the transaction commits.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, NamedTuple

from sqlalchemy import ColumnElement, Connection, func, literal, literal_column, or_, select, update

from .._sql import UTCDateTime
from ._leases import _claim_values
from ._schema import row_to_execution
from ._store_core import StoreCore, _ex
from .models import Execution, ExecutionState
from .queues import QueueSpec

__all__ = ["PendingRow", "QueueClaim", "QueueClaims", "QueueCounts"]

_PENDING = ExecutionState.PENDING.value
_RUNNING = ExecutionState.RUNNING.value
# The state as literal SQL, not a bound parameter: the planner can then prove the running keyed
# runs' partial index applies (it cannot from a parameter in a prepared statement's generic plan).
_RUNNING_SQL: ColumnElement[str] = literal_column(f"'{_RUNNING}'")
_PENDING_SQL: ColumnElement[str] = literal_column(f"'{_PENDING}'")


@dataclass(frozen=True)
class QueueClaim:
    """What a queued claim took, and, when its rate limit held runs back, when to try again."""

    claimed: list[Execution] = field(default_factory=list)
    retry_at: datetime | None = None


class PendingRow(NamedTuple):
    """A ``Pending`` run's id, due time and queue."""

    execution_id: str
    next_run_at: datetime | None
    queue_name: str | None


@dataclass(frozen=True)
class QueueCounts:
    """A queue's runs now, each count stopping at the cap it was read with."""

    running: int
    waiting: int
    due: int


def advisory_key(queue_name: str) -> int:
    """The advisory lock key of a queue: a stable signed 64-bit hash of its name (the same in
    every process, unlike Python's ``hash``)."""
    digest = hashlib.blake2b(f"harvest-queue:{queue_name}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big", signed=True)


class QueueClaims:
    """Claims, counts and look-ups of queued runs."""

    def __init__(self, core: StoreCore) -> None:
        self.core = core

    def claim(
        self,
        spec: QueueSpec,
        *,
        count: int,
        clock: Callable[[], datetime],
        lease_seconds: float,
        alone: bool = False,
    ) -> QueueClaim:
        """Claim up to ``count`` runs of ``spec``'s queue, best first, within its limits.

        :param clock: read once the queue's lock is held, so claims' ``started_at`` times are in
            the order the claims were made, across processes.
        :param alone: the claimer runs each claimed run alone in its process.
        """
        claimed: list[Execution] = []
        retry_at = None
        with self.core.transaction(f"claim from workflow queue {spec.name!r}") as conn:
            if self.core.db.postgres:
                conn.execute(select(func.pg_advisory_xact_lock(advisory_key(spec.name))))
            now = clock()
            for _ in range(max(0, count)):
                row = conn.execute(self._claim_one(spec, now, lease_seconds, alone)).first()
                if row is None:
                    break
                claimed.append(row_to_execution(row))
            if len(claimed) < count and spec.rate_limit is not None:
                retry_at = self._rate_retry_at(conn, spec, now)
        return QueueClaim(claimed, retry_at)

    def _claim_one(self, spec: QueueSpec, now: datetime, lease_seconds: float, alone: bool) -> Any:
        c = _ex.alias("candidate")
        key = _ex.alias("same_key")
        conditions: list[ColumnElement[bool]] = [
            c.c.queue_name == spec.name,
            c.c.state == _PENDING_SQL,
            or_(c.c.next_run_at.is_(None), c.c.next_run_at <= now),
            # A parent waiting for a child is woken by the child's end, never claimed before.
            c.c.waiting_on.is_(None),
        ]
        # The candidate's own key limit: the runs of its key running now, in its queue.
        running_with_key = (
            select(func.count())
            .select_from(key)
            .where(
                key.c.queue_name == spec.name,
                key.c.concurrency_key == c.c.concurrency_key,
                key.c.state == _RUNNING_SQL,
            )
            .scalar_subquery()
        )
        conditions.append(
            or_(c.c.concurrency_key.is_(None), running_with_key < func.coalesce(c.c.concurrency_limit, 1))
        )
        if spec.concurrency is not None:
            conditions.append(_running(spec.name) < spec.concurrency)
        if spec.rate_limit is not None:
            # Only a first start counts (and is held back): a run waking from a sleep or
            # recovered from a dead worker had its start already.
            limit, _ = spec.rate_limit
            conditions.append(or_(c.c.started_at.is_not(None), _started_since(spec, now) < limit))
        candidate = (
            select(c.c.execution_id)
            .where(*conditions)
            .order_by(c.c.priority, c.c.next_run_at, c.c.execution_id)
            .limit(1)
        )
        if self.core.db.postgres:
            # A row a cancel or terminate holds is skipped, not waited for.
            candidate = candidate.with_for_update(skip_locked=True, of=c)
        return (
            update(_ex)
            .where(_ex.c.execution_id == candidate.scalar_subquery(), _ex.c.state == _PENDING)
            .values(**_claim_values(now, lease_seconds, alone))
            .returning(*_ex.c)
        )

    def _rate_retry_at(self, conn: Connection, spec: QueueSpec, now: datetime) -> datetime | None:
        if spec.rate_limit is None:
            return None
        limit, seconds = spec.rate_limit
        window = _window(spec, now)
        row = conn.execute(
            select(func.count(), func.min(_ex.c.started_at)).where(
                _ex.c.queue_name == spec.name, _ex.c.started_at > window
            )
        ).first()
        if row is None or row[0] < limit or row[1] is None:
            return None
        # The oldest start in the window leaves it then, and frees one start.
        oldest: datetime = row[1]
        return oldest + timedelta(seconds=seconds)

    def counts(self, queue_name: str, *, now: datetime, cap: int) -> QueueCounts:
        """Return how many runs of the queue are running, waiting, and waiting and due, each
        reading at most ``cap`` index entries."""

        def bounded(*where: ColumnElement[bool]) -> Any:
            inner = select(_ex.c.execution_id).where(_ex.c.queue_name == queue_name, *where).limit(cap)
            return select(func.count()).select_from(inner.subquery()).scalar_subquery()

        query = select(
            bounded(_ex.c.state == _RUNNING),
            bounded(_ex.c.state == _PENDING),
            bounded(_ex.c.state == _PENDING, _ex.c.next_run_at <= now),
        )
        with self.core.db.read("count a workflow queue's runs") as conn:
            row = conn.execute(query).one()
        return QueueCounts(int(row[0]), int(row[1]), int(row[2]))

    def pending_rows(self, execution_ids: Sequence[str]) -> list[PendingRow]:
        """Return the ``Pending`` rows among ``execution_ids``: their due time and queue."""
        if not execution_ids:
            return []
        query = select(_ex.c.execution_id, _ex.c.next_run_at, _ex.c.queue_name).where(
            _ex.c.execution_id.in_(sorted(set(execution_ids))), _ex.c.state == _PENDING
        )
        with self.core.db.read("read waiting workflow executions") as conn:
            return [PendingRow(*row) for row in conn.execute(query)]

    def waiting(self, queue_name: str, *, now: datetime, limit: int) -> list[str]:
        """Return the ids of the best due ``Pending`` runs of the queue (its limits aside)."""
        query = (
            select(_ex.c.execution_id)
            .where(_ex.c.queue_name == queue_name, _ex.c.state == _PENDING, _ex.c.next_run_at <= now)
            .order_by(_ex.c.priority, _ex.c.next_run_at, _ex.c.execution_id)
            .limit(limit)
        )
        with self.core.db.read("find a workflow queue's next runs") as conn:
            return list(conn.execute(query).scalars())

    def due_queues(self, *, now: datetime, limit: int) -> list[str]:
        """Return the names of the queues with due ``Pending`` runs."""
        query = (
            select(_ex.c.queue_name)
            .where(_ex.c.queue_name.is_not(None), _ex.c.state == _PENDING, _ex.c.next_run_at <= now)
            .group_by(_ex.c.queue_name)
            .limit(limit)
        )
        with self.core.db.read("find workflow queues with due runs") as conn:
            return [name for name in conn.execute(query).scalars() if name is not None]


def _running(queue_name: str) -> Any:
    running = _ex.alias("running")
    return (
        select(func.count())
        .select_from(running)
        .where(running.c.queue_name == queue_name, running.c.state == _RUNNING_SQL)
        .scalar_subquery()
    )


def _window(spec: QueueSpec, now: datetime) -> Any:
    seconds = spec.rate_limit[1] if spec.rate_limit is not None else 0.0
    return literal(now - timedelta(seconds=seconds), UTCDateTime())


def _started_since(spec: QueueSpec, now: datetime) -> Any:
    started = _ex.alias("started")
    return (
        select(func.count())
        .select_from(started)
        .where(started.c.queue_name == spec.name, started.c.started_at > _window(spec, now))
        .scalar_subquery()
    )
