"""The transactional outbox table: messages written in the caller's transaction, claimed for relay.

:func:`~flask_harvest.webhooks.manager.OutboundWebhookManager.dispatch_in_tx` writes a row here on
the application's own connection, so the event exists if and only if that transaction commits.
The relay (after commit, and the sweeper for whatever that missed) claims rows, turns each into
deliveries with ids derived from the message, and marks it relayed.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Connection, Engine, delete, event, exists, func, insert, select, update
from sqlalchemy.orm import Session, SessionTransaction, scoped_session

from .._sql import SqlDatabase
from .._time import utcnow
from ..errors import InvalidFieldError
from .models import new_id
from .stores._schema import outbox_table
from .stores.sql._statements import NEXT_ORDERING_SEQ, ordering_seq_params

_box = outbox_table
_PENDING_KEY = "harvest_outbox_pending"
_HOOKED_KEY = "harvest_outbox_hooked"

#: Where dispatch_in_tx can write: a Core connection, an ORM session, or Flask-SQLAlchemy's
#: ``db.session`` (a scoped session).
TransactionTarget = Connection | Session | scoped_session[Any]
#: Called with the ids of messages whose transaction has just committed.
CommitCallback = Callable[[list[str]], None]


@dataclass(frozen=True)
class OutboxMessage:
    """An outbox row claimed for relay."""

    id: str
    topic: str
    payload: str
    claim_token: str
    #: The W3C trace context stored by the write (:mod:`flask_harvest.tracing`).
    trace_context: str | None = None
    #: The ordering key, and the key's number taken by the write (:mod:`.ordering`).
    ordering_key: str | None = None
    ordering_seq: int | None = None
    #: The tenant whose subscriptions the message is for; ``None``: the untenanted ones.
    tenant: str | None = None


class SqlOutbox:
    """The ``harvest_outbox`` table on the store's engine.

    :param engine: the engine of the SQL store; the caller's transaction must be on the same
        database.
    """

    def __init__(self, engine: Engine) -> None:
        self.db = SqlDatabase(engine, owner="the transactional outbox")
        self.engine = engine
        # SKIP LOCKED lets concurrent relays on PostgreSQL take disjoint rows without waiting;
        # SQLite has one writer at a time, so its UPDATE ... RETURNING claim is already exclusive.
        self._skip_locked = engine.dialect.name == "postgresql"

    def write(
        self,
        target: TransactionTarget,
        topic: str,
        body: str,
        on_commit: CommitCallback,
        trace_context: str | None = None,
        ordering_key: str | None = None,
        *,
        tenant: str | None = None,
    ) -> str:
        """Insert a message on ``target``'s transaction; return its id. Never commits.

        With a session, ``on_commit`` is called with the message id once the session commits (a
        rollback forgets it); with a bare connection, the sweeper relays the message. With an
        ``ordering_key``, the key's next number is taken in the same transaction: its row lock
        numbers the messages of one key in commit order.
        """
        message_id = new_id("evt")
        values: dict[str, Any] = {
            "id": message_id,
            "topic": topic,
            "payload": body,
            "created_at": utcnow(),
            "trace_context": trace_context,
            "tenant": tenant,
        }
        if isinstance(target, scoped_session):
            target = target()
        if isinstance(target, (Session, Connection)):
            if ordering_key is not None:
                values["ordering_key"] = ordering_key
                values["ordering_seq"] = target.execute(
                    NEXT_ORDERING_SEQ, ordering_seq_params(tenant, ordering_key)
                ).scalar_one()
            target.execute(insert(_box).values(values))
            if isinstance(target, Session):
                _remember(target, message_id, on_commit)
        else:
            raise InvalidFieldError(
                "conn", "must be a SQLAlchemy Connection, an ORM Session, or Flask-SQLAlchemy's db.session"
            )
        return message_id

    def claim(
        self, *, now: datetime, lease_seconds: float, limit: int, ids: Sequence[str] | None = None
    ) -> list[OutboxMessage]:
        """Claim up to ``limit`` unrelayed messages (only ``ids``, if given), oldest first."""
        token = uuid.uuid4().hex
        candidates = select(_box.c.id).where(
            _box.c.relayed_at.is_(None),
            (_box.c.claimed_until.is_(None)) | (_box.c.claimed_until < now),
        )
        # A keyed message waits until every earlier message of its key (and tenant: keys are per
        # tenant) is relayed: relayed out of order, a later event's deliveries would be in line
        # before an earlier one's exist.
        earlier = _box.alias("earlier")
        candidates = candidates.where(
            _box.c.ordering_key.is_(None)
            | ~exists().where(
                earlier.c.ordering_key == _box.c.ordering_key,
                earlier.c.relayed_at.is_(None),
                earlier.c.ordering_seq < _box.c.ordering_seq,
                earlier.c.tenant.is_not_distinct_from(_box.c.tenant),
            )
        )
        if ids is not None:
            candidates = candidates.where(_box.c.id.in_(list(ids)))
        candidates = candidates.order_by(_box.c.created_at).limit(limit)
        if self._skip_locked:
            candidates = candidates.with_for_update(skip_locked=True)
        statement = (
            update(_box)
            .where(_box.c.id.in_(candidates.scalar_subquery()))
            .values(claim_token=token, claimed_until=now + timedelta(seconds=lease_seconds))
            .returning(
                _box.c.id,
                _box.c.topic,
                _box.c.payload,
                _box.c.created_at,
                _box.c.trace_context,
                _box.c.ordering_key,
                _box.c.ordering_seq,
                _box.c.tenant,
            )
        )
        with self.db.transaction("claim outbox messages") as conn:
            rows = conn.execute(statement).all()
        return [
            OutboxMessage(
                row.id,
                row.topic,
                row.payload,
                token,
                row.trace_context,
                row.ordering_key,
                row.ordering_seq,
                row.tenant,
            )
            for row in sorted(rows, key=lambda row: row.created_at)
        ]

    def mark_relayed(self, messages: Sequence[OutboxMessage], *, now: datetime) -> int:
        """Mark claimed messages relayed; return how many were still ours to mark."""
        return self._finish(messages, relayed_at=now, claim_token=None, claimed_until=None)

    def release(self, messages: Sequence[OutboxMessage], error: str) -> int:
        """Give claimed messages back after a failed relay, recording why; they are tried again."""
        return self._finish(
            messages,
            claim_token=None,
            claimed_until=None,
            last_error=error[:2000],
            relay_attempts=_box.c.relay_attempts + 1,
        )

    def _finish(self, messages: Sequence[OutboxMessage], **values: Any) -> int:
        if not messages:
            return 0
        token = messages[0].claim_token
        statement = (
            update(_box)
            .where(_box.c.id.in_([m.id for m in messages]), _box.c.claim_token == token)
            .values(**values)
        )
        with self.db.transaction("update outbox messages") as conn:
            return conn.execute(statement).rowcount

    def purge_relayed_before(self, cutoff: datetime) -> int:
        """Delete messages relayed before ``cutoff``; return how many."""
        statement = delete(_box).where(_box.c.relayed_at.is_not(None), _box.c.relayed_at < cutoff)
        with self.db.transaction("purge relayed outbox messages") as conn:
            return conn.execute(statement).rowcount

    def topic_of(self, message_id: str) -> str | None:
        """Return the topic of message ``message_id`` (relayed or not), or ``None`` when there is
        no such message (never written, or purged after its relay)."""
        with self.db.transaction("read an outbox message") as conn:
            topic: str | None = conn.execute(select(_box.c.topic).where(_box.c.id == message_id)).scalar()
        return topic

    def pending_count(self) -> int:
        """Return how many messages wait for their relay."""
        with self.db.transaction("count outbox messages") as conn:
            return int(conn.execute(select(func.count()).where(_box.c.relayed_at.is_(None))).scalar_one())


def _remember(session: Session, message_id: str, on_commit: CommitCallback) -> None:
    """Arrange for ``on_commit`` to hear of ``message_id`` when ``session`` commits."""
    pending: list[tuple[str, CommitCallback]] = session.info.setdefault(_PENDING_KEY, [])
    pending.append((message_id, on_commit))
    if not session.info.get(_HOOKED_KEY):
        event.listen(session, "after_commit", _after_commit)
        event.listen(session, "after_transaction_end", _after_transaction_end)
        session.info[_HOOKED_KEY] = True


def _after_commit(session: Session) -> None:
    pending: list[tuple[str, CommitCallback]] = session.info.pop(_PENDING_KEY, [])
    by_callback: dict[CommitCallback, list[str]] = {}
    for message_id, callback in pending:
        by_callback.setdefault(callback, []).append(message_id)
    for callback, ids in by_callback.items():
        callback(ids)


def _after_transaction_end(session: Session, transaction: SessionTransaction) -> None:
    # The outermost transaction ended without a commit (which would have taken the ids): its rows
    # are gone, nothing to relay. A savepoint's end changes nothing: a message written inside a
    # savepoint that rolled back has no row, and its relay finds nothing to claim.
    if transaction.parent is None:
        session.info.pop(_PENDING_KEY, None)
