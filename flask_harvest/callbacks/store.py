"""Completion deliveries in SQL: enqueue in the terminal transaction, claim, record, redrive.

Every move is a short transaction around a guarded ``UPDATE ... RETURNING``; no transaction is open
while a callback is sent. Claiming takes due rows (``PENDING`` and due, or ``INFLIGHT`` with an
expired lease, whose worker died) with ``FOR UPDATE SKIP LOCKED`` on PostgreSQL.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Connection, Engine, Update, and_, delete, literal, or_, select, update
from sqlalchemy.engine import Row

from .. import tracing
from .._bounded import bounded_count, bounded_counts
from .._sql import SqlDatabase
from ..outbound.attempt import DeliveryState, Verdict
from ..outbound.backoff import RetryPolicy
from ..outbound.ssrf import redact_url
from ..shards import new_id_beside
from ._schema import CALLBACK_TABLES, dead_letters_table, deliveries_table
from .outcome import callback_retry_policy, dead_letter_reason

__all__ = ["WIRE_STATES", "CompletionDelivery", "SqlCallbackStore"]

_d = deliveries_table
_dl = dead_letters_table

#: How the completion-callback tables, management API and CLI spell each state: one lifecycle
#: with the webhooks' (:class:`~flask_harvest.outbound.attempt.DeliveryState`), its own wire values.
#: A callback is never skipped.
WIRE_STATES: dict[DeliveryState, str] = {
    DeliveryState.PENDING: "PENDING",
    DeliveryState.INFLIGHT: "INFLIGHT",
    DeliveryState.DELIVERED: "DELIVERED",
    DeliveryState.DLQ: "FAILED",
}
_STATE_OF = {wire: state for state, wire in WIRE_STATES.items()}
_PENDING = WIRE_STATES[DeliveryState.PENDING]
_INFLIGHT = WIRE_STATES[DeliveryState.INFLIGHT]
_FAILED = WIRE_STATES[DeliveryState.DLQ]


@dataclass(frozen=True)
class CompletionDelivery:
    """One completion-callback delivery row (its body is the exact bytes sent)."""

    delivery_id: str
    execution_id: str
    callback_index: int
    target_url: str
    filter: Any
    state: DeliveryState
    attempts: int
    retry_policy: RetryPolicy
    body: str
    next_attempt_at: datetime | None
    lease_token: str | None
    lease_expires_at: datetime | None
    last_status: int | None
    last_error: str | None
    created_at: datetime
    updated_at: datetime
    delivered_at: datetime | None
    #: The W3C trace context stored at the enqueue (:mod:`flask_harvest.tracing`).
    trace_context: str | None = None

    def __repr__(self) -> str:
        # Short, and without the body or the URL's credentials: a signal receiver may log it.
        return (
            f"<CompletionDelivery {self.delivery_id} of {self.execution_id} #{self.callback_index} "
            f"{self.wire_state} attempts={self.attempts} target={self.display_url}>"
        )

    @property
    def wire_state(self) -> str:
        """The state as the table, the management API and the CLI spell it (``FAILED``...)."""
        return WIRE_STATES[self.state]

    @property
    def display_url(self) -> str:
        """The target URL as it may be shown or logged (:func:`~flask_harvest.outbound.ssrf.redact_url`)."""
        return redact_url(self.target_url)

    def to_json(self) -> dict[str, Any]:
        """The management API's form (no body, no lease token; the target URL redacted)."""

        def iso(when: datetime | None) -> str | None:
            return when.isoformat() if when is not None else None

        return {
            "delivery_id": self.delivery_id,
            "execution_id": self.execution_id,
            "callback_index": self.callback_index,
            "target_url": self.display_url,
            "filter": self.filter,
            "state": self.wire_state,
            "attempts": self.attempts,
            "max_attempts": self.retry_policy.max_attempts,
            "next_attempt_at": iso(self.next_attempt_at),
            "last_status": self.last_status,
            "last_error": self.last_error,
            "created_at": iso(self.created_at),
            "updated_at": iso(self.updated_at),
            "delivered_at": iso(self.delivered_at),
        }


def _row(row: Row[Any]) -> CompletionDelivery:
    return CompletionDelivery(
        delivery_id=row.delivery_id,
        execution_id=row.execution_id,
        callback_index=row.callback_index,
        target_url=row.target_url,
        filter=json.loads(row.filter),
        state=_STATE_OF[row.state],
        attempts=row.attempts,
        retry_policy=callback_retry_policy(row.max_attempts, row.initial_backoff_ms, row.max_backoff_ms),
        body=row.body,
        next_attempt_at=row.next_attempt_at,
        lease_token=row.lease_token,
        lease_expires_at=row.lease_expires_at,
        last_status=row.last_status,
        last_error=row.last_error,
        created_at=row.created_at,
        updated_at=row.updated_at,
        delivered_at=row.delivered_at,
        trace_context=row.trace_context,
    )


@dataclass(frozen=True)
class NewDelivery:
    """A row to enqueue."""

    execution_id: str
    callback_index: int
    target_url: str
    filter: Any
    body: bytes
    delivery_id: str


def _update_held(delivery: CompletionDelivery) -> Update:
    # An update of ``delivery``'s row that matches only while the caller's lease holds (still in
    # flight under the same token): record and give_back write nothing once the lease is lost.
    return update(_d).where(
        _d.c.delivery_id == delivery.delivery_id,
        _d.c.state == _INFLIGHT,
        _d.c.lease_token == delivery.lease_token,
    )


def new_delivery_id(execution_id: str) -> str:
    """A fresh delivery id on the shard of its execution (a plain UUID when there are no shards)."""
    return new_id_beside(execution_id)


class SqlCallbackStore:
    """The completion-delivery rows of one database (PostgreSQL or SQLite)."""

    def __init__(self, engine: Engine) -> None:
        self.db = SqlDatabase(engine, owner="completion callbacks")
        self.engine = engine

    def __repr__(self) -> str:
        return f"<SqlCallbackStore {self.engine.url.render_as_string(hide_password=True)}>"

    def ensure_schema(self) -> None:
        """Create the completion-callback tables where they do not exist yet."""
        self.db.create_tables(CALLBACK_TABLES, what="the completion-callback tables")

    # -- enqueue (in the caller's terminal transaction) ---------------------------------------

    def insert(
        self, conn: Connection, rows: Sequence[NewDelivery], policy: RetryPolicy, now: datetime
    ) -> list[str]:
        """Insert ``rows`` with ``ON CONFLICT (execution_id, callback_index) DO NOTHING``.

        :returns: the ids of the rows that were new.
        """
        inserted = []
        for new in rows:
            stmt = (
                self.db.insert(_d)
                .values(
                    delivery_id=new.delivery_id,
                    execution_id=new.execution_id,
                    callback_index=new.callback_index,
                    target_url=new.target_url,
                    filter=json.dumps(new.filter, sort_keys=True),
                    state=_PENDING,
                    attempts=0,
                    max_attempts=policy.max_attempts,
                    initial_backoff_ms=policy.initial_backoff_ms,
                    max_backoff_ms=policy.max_backoff_ms,
                    body=new.body.decode("utf-8"),
                    next_attempt_at=now,
                    created_at=now,
                    updated_at=now,
                    # In the terminal transition's span, in the trace of the run's start.
                    trace_context=tracing.capture(),
                )
                .on_conflict_do_nothing(index_elements=[_d.c.execution_id, _d.c.callback_index])
                .returning(_d.c.delivery_id)
            )
            if conn.execute(stmt).first() is not None:
                inserted.append(new.delivery_id)
        return inserted

    # -- delivery ------------------------------------------------------------------------------

    @staticmethod
    def _due(now: datetime) -> Any:
        return or_(
            and_(_d.c.state == _PENDING, _d.c.next_attempt_at <= now),
            and_(_d.c.state == _INFLIGHT, _d.c.lease_expires_at <= now),
        )

    def claim(
        self, ids: Sequence[str] | None, *, now: datetime, lease_seconds: float, limit: int = 100
    ) -> list[CompletionDelivery]:
        """Lease the due rows (among ``ids``, or any) to the caller: ``INFLIGHT``, attempts + 1."""
        pick = select(_d.c.delivery_id).where(self._due(now))
        if ids is not None:
            if not ids:
                return []
            pick = pick.where(_d.c.delivery_id.in_(list(ids)))
        pick = pick.order_by(_d.c.next_attempt_at).limit(limit)
        if self.db.postgres:
            pick = pick.with_for_update(skip_locked=True)
        token = uuid.uuid4().hex
        stmt = (
            update(_d)
            .where(_d.c.delivery_id.in_(pick.scalar_subquery()), self._due(now))
            .values(
                state=_INFLIGHT,
                attempts=_d.c.attempts + 1,
                lease_token=token,
                lease_expires_at=now + timedelta(seconds=lease_seconds),
                updated_at=now,
            )
            .returning(*_d.c)
        )
        with self.db.transaction("claim completion deliveries") as conn:
            return [_row(r) for r in conn.execute(stmt).all()]

    def record(
        self, delivery: CompletionDelivery, outcome: Verdict, *, now: datetime
    ) -> CompletionDelivery | None:
        """Write an attempt's outcome if the caller still holds the lease; ``None`` if it lost it.

        A dead-lettered outcome (``FAILED``) adds the dead-letter entry in the same transaction.
        """
        stmt = (
            _update_held(delivery)
            .values(
                state=WIRE_STATES[outcome.state],
                last_status=outcome.status,
                last_error=outcome.error,
                next_attempt_at=outcome.next_attempt_at,
                lease_token=None,
                lease_expires_at=None,
                updated_at=now,
                delivered_at=now if outcome.state is DeliveryState.DELIVERED else None,
            )
            .returning(*_d.c)
        )
        with self.db.transaction("record a completion delivery attempt") as conn:
            row = conn.execute(stmt).first()
            if row is None:
                return None
            if outcome.state is DeliveryState.DLQ:
                reason = dead_letter_reason(row.delivery_id, row.attempts, row.last_status, row.target_url)
                conn.execute(delete(_dl).where(_dl.c.delivery_id == row.delivery_id))
                conn.execute(
                    _dl.insert().values(
                        delivery_id=row.delivery_id,
                        execution_id=row.execution_id,
                        reason_type=reason["type"],
                        reason=json.dumps(reason),
                        created_at=now,
                    )
                )
        return _row(row)

    def give_back(self, delivery: CompletionDelivery, *, due: datetime, now: datetime) -> bool:
        """Return a claimed row unsent, without using an attempt, due at ``due`` (endpoint at its cap)."""
        stmt = (
            _update_held(delivery)
            .values(
                state=_PENDING,
                attempts=_d.c.attempts - 1,
                next_attempt_at=due,
                lease_token=None,
                lease_expires_at=None,
                updated_at=now,
            )
            .returning(_d.c.delivery_id)
        )
        with self.db.transaction("give back a completion delivery") as conn:
            return conn.execute(stmt).first() is not None

    def due(self, now: datetime, limit: int = 1000) -> list[CompletionDelivery]:
        """Return rows due now (pending and due, or in flight under an expired lease)."""
        with self.db.transaction("list due completion deliveries") as conn:
            rows = conn.execute(select(_d).where(self._due(now)).order_by(_d.c.next_attempt_at).limit(limit))
            return [_row(r) for r in rows.all()]

    # -- reads and redrive ---------------------------------------------------------------------

    def get(self, delivery_id: str) -> CompletionDelivery | None:
        with self.db.transaction("read a completion delivery") as conn:
            row = conn.execute(select(_d).where(_d.c.delivery_id == delivery_id)).first()
        return _row(row) if row is not None else None

    def list_for_execution(self, execution_id: str) -> list[CompletionDelivery]:
        """Every delivery of an execution, by ``callback_index``."""
        with self.db.transaction("list completion deliveries") as conn:
            rows = conn.execute(
                select(_d).where(_d.c.execution_id == execution_id).order_by(_d.c.callback_index)
            ).all()
        return [_row(r) for r in rows]

    def count_states(self, *, cap: int) -> dict[DeliveryState, int]:
        """How many deliveries are in each state, counting at most ``cap`` of each (bounded walks of
        the index that leads with ``state``: a metrics scrape's read)."""
        states = list(WIRE_STATES)
        with self.db.read("count completion deliveries by state") as conn:
            counts = bounded_counts(
                conn,
                _d,
                lambda: [_d.c.state == WIRE_STATES[state] for state in states],
                cap=cap,
                key=("completion deliveries by state",),
            )
        return dict(zip(states, counts, strict=True))

    def count_failed(self, *, cap: int) -> int:
        """How many deliveries :meth:`failed_page` lists, counting at most ``cap`` (a bounded walk
        of the index its pages walk)."""
        query = select(literal(1)).select_from(_d).where(_d.c.state == _FAILED)
        with self.db.read("count failed completion deliveries") as conn:
            return bounded_count(conn, query, cap=cap)

    def failed_page(
        self, *, limit: int, before: tuple[datetime, str] | None = None
    ) -> list[CompletionDelivery]:
        """``FAILED`` deliveries of every execution, the latest to fail first, after the keyset
        position ``before`` (``(updated_at, delivery_id)`` of the last row of the page before)."""
        query = select(_d).where(_d.c.state == _FAILED)
        if before is not None:
            when, last = before
            query = query.where(
                or_(_d.c.updated_at < when, and_(_d.c.updated_at == when, _d.c.delivery_id < last))
            )
        query = query.order_by(_d.c.updated_at.desc(), _d.c.delivery_id.desc()).limit(limit)
        with self.db.transaction("list failed completion deliveries") as conn:
            return [_row(r) for r in conn.execute(query).all()]

    def redrive_selected(self, delivery_ids: Sequence[str], *, now: datetime) -> list[CompletionDelivery]:
        """Redrive those of ``delivery_ids`` that are ``FAILED`` (each as :meth:`redrive`, due now);
        return the rows redriven."""
        if not delivery_ids:
            return []
        chosen = _d.c.delivery_id.in_(list(delivery_ids))
        return self._redrive([chosen], now=now, window=0.0, limit=len(delivery_ids))

    def dead_letter(self, delivery_id: str) -> dict[str, Any] | None:
        """The dead-letter reason of a ``FAILED`` delivery, or ``None``."""
        with self.db.transaction("read a completion dead letter") as conn:
            row = conn.execute(select(_dl.c.reason).where(_dl.c.delivery_id == delivery_id)).first()
        return json.loads(row.reason) if row is not None else None

    def redrive(
        self, execution_id: str, delivery_id: str, *, now: datetime
    ) -> CompletionDelivery | str | None:
        """Put a ``FAILED`` delivery back to ``PENDING`` (attempt 0, same id and body), due now.

        :returns: the row if it was redriven, ``"not_failed"`` if it exists but is not failed,
            ``None`` if the execution has no such delivery.
        """
        rows = self._redrive(
            [_d.c.execution_id == execution_id, _d.c.delivery_id == delivery_id], now=now, window=0.0, limit=1
        )
        if rows:
            return rows[0]
        current = self.get(delivery_id)
        if current is None or current.execution_id != execution_id:
            return None
        return "not_failed"

    def redrive_failed(
        self, *, now: datetime, window_seconds: float, limit: int = 10_000
    ) -> list[CompletionDelivery]:
        """Redrive every ``FAILED`` delivery, their next attempts spread evenly over the window."""
        return self._redrive([], now=now, window=window_seconds, limit=limit)

    def _redrive(
        self, where: list[Any], *, now: datetime, window: float, limit: int
    ) -> list[CompletionDelivery]:
        failed = _d.c.state == _FAILED
        with self.db.transaction("redrive completion deliveries") as conn:
            pick = (
                select(_d.c.delivery_id)
                .where(failed, *where)
                .order_by(_d.c.updated_at, _d.c.delivery_id)
                .limit(limit)
            )
            if self.db.postgres:
                pick = pick.with_for_update(skip_locked=True)
            ids = list(conn.execute(pick).scalars())
            redriven = []
            for position, delivery_id in enumerate(ids):
                due = now + timedelta(seconds=window * position / len(ids)) if window > 0 else now
                row = conn.execute(
                    update(_d)
                    .where(_d.c.delivery_id == delivery_id, failed)
                    .values(
                        state=_PENDING,
                        attempts=0,
                        next_attempt_at=due,
                        last_error=None,
                        updated_at=now,
                    )
                    .returning(*_d.c)
                ).first()
                if row is not None:
                    conn.execute(delete(_dl).where(_dl.c.delivery_id == delivery_id))
                    redriven.append(_row(row))
        return redriven
