"""The SQL store's delivery pipeline: log deliveries, claim them with a lease, record each
attempt's outcome and its effect on the subscription, dead-letter, replay, release expired leases,
find what is due, purge what was delivered.

Every method that moves a delivery is one short transaction of conditional ``UPDATE ... RETURNING``
statements, so two workers calling it at once never both win, and no lock is held while a worker
talks to a receiver.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import ColumnElement, Connection, Row, TextClause, delete, or_, select, update
from sqlalchemy.sql import Executable

from ...._input import id_problem
from ...._sql import SqlDatabase
from ...._time import utcnow
from ....errors import DeliveryNotFoundError, InvalidStateError
from ... import operational
from ...models import (
    AttemptResult,
    Claim,
    DeliveryLog,
    DeliveryState,
    SubscriptionEffect,
    WebhookSubscription,
    WebhookSubscriptionStatus,
    claimed_subscription,
)
from ...tenants import ALL_TENANTS, TenantScope
from .._schema import (
    INFLIGHT_ROWS,
    PENDING_ROWS,
    delivery_values,
    in_scope_sql,
    row_to_delivery,
    row_to_subscription,
)
from .._schema import attempts_table as _atts
from .._schema import deliveries_table as _dels
from .._schema import subscriptions_table as _subs
from ..base import LINE_ENDS, BlockedKey, DeliverySchedule, LeaseTerms, Outcome, Recorded
from ._statements import (
    APPEND_ATTEMPT,
    AT_HEAD,
    ATTEMPT_COLUMNS,
    CHUNK,
    CLAIM_MANY,
    COUNT_FAILURE,
    FINISH_MANY,
    INSERT_DELIVERY,
    NEXT_IN_LINE,
    NEXT_IN_LINES,
    NEXT_ORDERING_SEQ,
    NOT_AT_HEAD,
    RESET_FAILURES,
    SCHEDULES_BY_IDS,
    SUBSCRIPTIONS_BY_IDS,
    WAITING_AMONG,
    blocked_keys_query,
    chunks,
    finish_many_params,
    finish_statement,
    naive_utc,
    ordering_seq_params,
    scope_params,
)
from .subscriptions import SubscriptionRows

_ACTIVE = WebhookSubscriptionStatus.ACTIVE.value
_PENDING = DeliveryState.PENDING.value
_INFLIGHT = DeliveryState.INFLIGHT.value


class DeliveryPipeline:
    """The deliveries in ``db`` as the workers and the sweeper move them.

    :param subscriptions: the subscription rows, read in the same transaction when a dispatch logs
        one delivery per subscription of a topic.
    """

    def __init__(self, db: SqlDatabase, subscriptions: SubscriptionRows) -> None:
        self.db = db
        self.subscriptions = subscriptions
        # Only PostgreSQL has data-modifying CTEs; on SQLite a statement is an in-process call.
        self._fold_attempt_insert = db.postgres

    def log_deliveries(self, deliveries: Sequence[DeliveryLog]) -> list[str]:
        if not deliveries:
            return []
        with self.db.transaction("log deliveries") as conn:
            return self._insert_deliveries(conn, deliveries)

    def log_deliveries_for_topic(
        self,
        topic: str,
        build: Callable[[WebhookSubscription], DeliveryLog | None],
        tenant: TenantScope = ALL_TENANTS,
    ) -> list[tuple[WebhookSubscription, DeliveryLog]]:
        # One transaction, and a plain INSERT: the ids are new, so neither ON CONFLICT nor
        # RETURNING (which only the outbox relay needs) is worth its cost here. An executemany of
        # one prebuilt statement: psycopg pipelines the rows in one round trip, and building a
        # multi-row VALUES statement per call measured 2 to 3 times slower in Python.
        with self.db.transaction("log deliveries") as conn:
            built = ((s, build(s)) for s in self.subscriptions.matching(conn, topic, tenant))
            pairs = [(s, delivery) for s, delivery in built if delivery is not None]
            if pairs:
                numbered = _numbered(conn, [delivery for _, delivery in pairs])
                pairs = [(s, delivery) for (s, _), delivery in zip(pairs, numbered, strict=True)]
                conn.execute(INSERT_DELIVERY, [delivery_values(delivery) for _, delivery in pairs])
        return pairs

    def _insert_deliveries(self, conn: Connection, deliveries: Sequence[DeliveryLog]) -> list[str]:
        """Insert on ``conn`` (the caller's transaction); return the ids that were new."""
        rows = list({d.id: delivery_values(d) for d in _numbered(conn, deliveries)}.values())
        stmt = self.db.insert(_dels).on_conflict_do_nothing(index_elements=[_dels.c.id]).returning(_dels.c.id)
        # SQLAlchemy's "insertmanyvalues" sends this as multi-row INSERTs of CHUNK rows each.
        result = conn.execution_options(insertmanyvalues_page_size=CHUNK).execute(stmt, rows)
        return list(result.scalars())

    def get_schedules(self, delivery_ids: Sequence[str]) -> list[DeliverySchedule]:
        unique = [i for i in dict.fromkeys(delivery_ids) if id_problem(i) is None]
        found: list[DeliverySchedule] = []
        columns = (_dels.c.id, _dels.c.attempt, _dels.c.next_attempt_at)
        with self.db.transaction("read delivery schedules") as conn:
            for chunk in chunks(unique):
                # PostgreSQL: one array parameter, so psycopg neither rewrites a statement of
                # 500 placeholders each time nor keeps one such statement per chunk size.
                rows = (
                    conn.execute(SCHEDULES_BY_IDS, {"ids": list(chunk)})
                    if self._fold_attempt_insert
                    else conn.execute(select(*columns).where(_dels.c.id.in_(chunk)))
                )
                found.extend(DeliverySchedule(*row) for row in rows)
        return found

    def purge_deliveries_before(self, cutoff: datetime) -> int:
        with self.db.transaction("purge delivered logs") as conn:
            purged = list(
                conn.execute(
                    delete(_dels)
                    .where(_dels.c.state == DeliveryState.DELIVERED.value, _dels.c.timestamp < cutoff)
                    .returning(_dels.c.id)
                ).scalars()
            )
            for chunk in chunks(purged):
                conn.execute(delete(_atts).where(_atts.c.delivery_id.in_(chunk)))
        return len(purged)

    def claim_delivery(
        self,
        delivery_id: str,
        *,
        now: datetime,
        lease_seconds: float,
        max_attempts: int,
    ) -> Claim | None:
        token = uuid.uuid4().hex
        with self.db.transaction("claim a delivery") as conn:
            rows = conn.execute(
                _lease(_dels.c.id == delivery_id, now, lease_seconds, token, max_attempts)
            ).all()
            claims = _with_subscriptions(conn, rows, token)
        return claims[0] if claims else None

    def claim_deliveries(
        self,
        delivery_ids: Sequence[str],
        *,
        now: datetime,
        lease_seconds: float,
        max_attempts: int,
    ) -> list[Claim]:
        # Sorted so that every caller locks rows in the same order (see below), across chunks too.
        unique = sorted(set(delivery_ids))
        if not unique:
            return []
        token = uuid.uuid4().hex
        rows: list[Row[Any]] = []
        with self.db.transaction("claim deliveries") as conn:
            if self._fold_attempt_insert:  # PostgreSQL: one prepared statement per chunk
                until = now + timedelta(seconds=lease_seconds)
                for chunk in chunks(unique):
                    params = {
                        "ids": list(chunk),
                        "now": naive_utc(now),
                        "until": naive_utc(until),
                        "token": token,
                        "max_attempts": max_attempts,
                    }
                    rows.extend(conn.execute(CLAIM_MANY, params).all())
                return _with_subscriptions(conn, rows, token, by_ids=SUBSCRIPTIONS_BY_IDS)
            for chunk in chunks(unique):
                # PostgreSQL locks the rows of a plain UPDATE ... IN in plan order, so two batch
                # claims with overlapping ids could deadlock; the subquery locks them in id order.
                # As in claim_delivery, a row another claim took meanwhile fails the recheck after
                # the lock wait. SQLite has no FOR UPDATE (SQLAlchemy leaves it out) and needs
                # none: it runs one writer at a time.
                locked = (
                    select(_dels.c.id)
                    .where(_dels.c.id.in_(chunk), *_due(now))
                    .order_by(_dels.c.id)
                    .with_for_update()
                )
                rows.extend(
                    conn.execute(
                        _lease(_dels.c.id.in_(locked), now, lease_seconds, token, max_attempts)
                    ).all()
                )
            claims = _with_subscriptions(conn, rows, token)
        return claims

    def finish_attempt(
        self, delivery_id: str, lease_token: str, result: AttemptResult
    ) -> WebhookSubscriptionStatus | None:
        with self.db.transaction("record a delivery attempt") as conn:
            row = self._finish_one(conn, delivery_id, lease_token, result)
            if row is None:
                raise InvalidStateError(
                    f"the lease on delivery {delivery_id!r} was lost (it expired or was never held); "
                    "nothing was recorded"
                )
            changed = self._apply_effect(conn, row.subscription_id, row.failures, result)
            # Logged here and queued by the sweeper: this method returns no deliveries to queue.
            self._notify(conn, delivery_id, row.subscription_id, result, changed)
            return changed

    def finish_attempts(self, outcomes: Sequence[Outcome]) -> list[Recorded]:
        if not outcomes:
            return []
        with self.db.transaction("record delivery attempts") as conn:
            rows: dict[str, Row[Any]] = {}
            if self._fold_attempt_insert:
                for row in conn.execute(FINISH_MANY, finish_many_params(outcomes)):
                    rows[row.id] = row
            else:
                for outcome in outcomes:
                    one = self._finish_one(conn, outcome.delivery_id, outcome.lease_token, outcome.result)
                    if one is not None:
                        rows[outcome.delivery_id] = one
            recorded = []
            lines: dict[int, tuple[str, str]] = {}  # outcome's place -> the line it released
            for outcome in outcomes:
                # pop: an id given twice is recorded once, as a second finish_attempt would find
                # the lease gone.
                found = rows.pop(outcome.delivery_id, None)
                if found is None:
                    recorded.append(Recorded(held=False))
                    continue
                changed = self._apply_effect(conn, found.subscription_id, found.failures, outcome.result)
                made = self._notify(conn, outcome.delivery_id, found.subscription_id, outcome.result, changed)
                if outcome.ordering_key is not None and outcome.result.state in LINE_ENDS:
                    lines[len(recorded)] = (found.subscription_id, outcome.ordering_key)
                recorded.append(Recorded(held=True, changed=changed, notices=made))
            if lines:
                recorded = self._next_of_lines(conn, outcomes, recorded, lines)
        return recorded

    def _next_of_lines(
        self,
        conn: Connection,
        outcomes: Sequence[Outcome],
        recorded: list[Recorded],
        lines: dict[int, tuple[str, str]],
    ) -> list[Recorded]:
        """Find the next delivery of each line the outcomes released, on ``conn`` (their
        transaction: a link of a key's chain costs no transaction of its own), and lease it to
        the caller where the outcome asked to follow: the claim checks that it is due and at the
        head of its line, as every claim does. A dead letter under the ``block`` policy releases
        nothing: the query finds no head behind it."""
        unique = sorted(set(lines.values()))
        found: dict[tuple[str, str], DeliverySchedule] = {}
        if self._fold_attempt_insert:
            params = {"subs": [sub for sub, _ in unique], "keys": [key for _, key in unique]}
            for row in conn.execute(NEXT_IN_LINES, params):
                found[(row.sub, row.key)] = DeliverySchedule(row.id, row.attempt, row.next_attempt_at)
        else:
            for sub, key in unique:
                for row in conn.execute(NEXT_IN_LINE, {"sub": sub, "key": key}):
                    found[(sub, key)] = DeliverySchedule(*row)
        if not found:
            return recorded
        # The lines to follow, by lease terms (one runner's terms in practice: one statement).
        by_terms: dict[LeaseTerms, list[str]] = {}
        for place, line in lines.items():
            terms = outcomes[place].follow
            if terms is not None and line in found:
                by_terms.setdefault(terms, []).append(found[line].id)
        now = utcnow()
        claimed: dict[tuple[str, str], Claim] = {}
        for terms, ids in by_terms.items():
            for claim in self._claim_on(conn, ids, now, terms):
                claimed[(claim.delivery.subscription_id, claim.delivery.ordering_key or "")] = claim
        out = list(recorded)
        # Each line's next delivery goes to the first outcome of the line only (pop): two outcomes
        # of one line in a batch would otherwise hand one lease to two workers, which send it at
        # once.
        for place, line in sorted(lines.items()):
            if line in claimed and outcomes[place].follow is not None:
                out[place] = dataclasses.replace(out[place], following=(claimed.pop(line),))
                found.pop(line, None)
            elif line in found and line not in claimed:
                out[place] = dataclasses.replace(out[place], released=(found.pop(line),))
        return out

    def _claim_on(
        self, conn: Connection, ids: Sequence[str], now: datetime, terms: LeaseTerms
    ) -> list[Claim]:
        """Lease the claimable deliveries among ``ids`` on ``conn``, as :meth:`claim_deliveries`."""
        token = uuid.uuid4().hex
        unique = sorted(set(ids))
        if self._fold_attempt_insert:
            params = {
                "ids": unique,
                "now": naive_utc(now),
                "until": naive_utc(now + timedelta(seconds=terms.lease_seconds)),
                "token": token,
                "max_attempts": terms.max_attempts,
            }
            rows = conn.execute(CLAIM_MANY, params).all()
            return _with_subscriptions(conn, rows, token, by_ids=SUBSCRIPTIONS_BY_IDS)
        # SQLite runs one writer at a time: no row locks to order.
        lease = _lease(_dels.c.id.in_(unique), now, terms.lease_seconds, token, terms.max_attempts)
        return _with_subscriptions(conn, conn.execute(lease).all(), token)

    @staticmethod
    def _notify(
        conn: Connection,
        delivery_id: str,
        subscription_id: str,
        result: AttemptResult,
        changed: WebhookSubscriptionStatus | None,
    ) -> tuple[DeliveryLog, ...]:
        """Log the operational notifications of a recorded outcome's transitions on ``conn``, the
        transaction that recorded it: they commit with the transition or not at all. Nothing (no
        statement) for a result without an operational context."""
        if result.operational is None:
            return ()
        made = tuple(operational.notices(delivery_id, subscription_id, result, changed))
        if made:
            conn.execute(INSERT_DELIVERY, [delivery_values(notice) for notice in made])
        return made

    def _finish_one(
        self, conn: Connection, delivery_id: str, lease_token: str, result: AttemptResult
    ) -> Row[Any] | None:
        """Record one outcome if the lease is held; return (subscription_id, failures) or ``None``."""
        attempt = result.attempt
        params: dict[str, Any] = {
            "p_id": delivery_id,
            "p_token": lease_token,
            "d_state": DeliveryState(result.state).value,
            "d_attempt": result.attempt_number,
            "d_next_attempt_at": result.next_attempt_at,
            "d_last_error": result.last_error,
            "d_timestamp": result.timestamp,
        }
        if result.request_headers:
            params["d_request_headers"] = dict(result.request_headers)
        attempt_params: dict[str, Any] = {}
        if attempt is not None:
            params.update(
                d_response_status=attempt.response_status,
                d_response_body=attempt.response_body,
                d_elapsed_ms=attempt.elapsed_ms,
            )
            attempt_params = {f"a_{name}": getattr(attempt, name) for name in ATTEMPT_COLUMNS}
            attempt_params["a_delivery_id"] = delivery_id
        fold = attempt is not None and self._fold_attempt_insert
        statement = finish_statement(
            headers=bool(result.request_headers), attempt=attempt is not None, fold=fold
        )
        row = conn.execute(statement, {**params, **attempt_params} if fold else params).first()
        if row is not None and attempt_params and not fold:
            conn.execute(APPEND_ATTEMPT, attempt_params)
        return row

    def _apply_effect(
        self,
        conn: Connection,
        subscription_id: str,
        failures: int | None,
        result: AttemptResult,
    ) -> WebhookSubscriptionStatus | None:
        """Apply ``result.effect`` with conditional UPDATEs; return a status this call set.

        ``failures`` is the subscription's failure count as this transaction read it (``None``
        if the subscription is gone).
        """
        effect = SubscriptionEffect(result.effect)
        params = {"p_sub": subscription_id, "p_now": utcnow()}
        if effect is SubscriptionEffect.RESET_FAILURES:
            if failures:
                conn.execute(RESET_FAILURES, params)
            return None
        if effect is SubscriptionEffect.COUNT_FAILURE:
            counted = conn.execute(COUNT_FAILURE, params).scalar()
            if counted is None or counted < result.failure_threshold:
                return None
            return self._deactivate(conn, subscription_id, WebhookSubscriptionStatus.FAILED)
        if effect is SubscriptionEffect.DISABLE:
            return self._deactivate(conn, subscription_id, WebhookSubscriptionStatus.DISABLED)
        return None

    def _deactivate(
        self, conn: Connection, subscription_id: str, status: WebhookSubscriptionStatus
    ) -> WebhookSubscriptionStatus | None:
        # Only an ACTIVE row moves, so among concurrent callers exactly one reports the change.
        changed = conn.execute(
            update(_subs)
            .where(_subs.c.id == subscription_id, _subs.c.status == _ACTIVE)
            .values(status=status.value, updated_at=utcnow())
            .returning(_subs.c.id)
        ).first()
        return status if changed is not None else None

    def dead_letter(self, delivery_ids: Sequence[str], error: str, *, now: datetime) -> list[str]:
        moved: list[str] = []
        with self.db.transaction("dead-letter deliveries") as conn:
            for chunk in chunks(list(dict.fromkeys(delivery_ids))):
                moved.extend(
                    conn.execute(
                        update(_dels)
                        .where(_dels.c.id.in_(chunk), _dels.c.state == _PENDING)
                        .values(
                            state=DeliveryState.DLQ.value,
                            last_error=error,
                            timestamp=now,
                            next_attempt_at=None,
                        )
                        .returning(_dels.c.id)
                    ).scalars()
                )
        return moved

    def replay_delivery(
        self, delivery_id: str, *, now: datetime, tenant: TenantScope = ALL_TENANTS
    ) -> DeliveryLog:
        return self._move_dead_letter(
            delivery_id,
            tenant,
            "replay a delivery",
            "replayed",
            state=_PENDING,
            attempt=1,
            next_attempt_at=now,
            timestamp=now,
            lease_expires_at=None,
            lease_token=None,
        )

    def _move_dead_letter(
        self, delivery_id: str, tenant: TenantScope, action: str, done: str, **values: Any
    ) -> DeliveryLog:
        """Set ``values`` on a dead-lettered delivery in ``tenant``'s scope (another tenant's is
        not found, its state not told), in a transaction named ``action``; refuse one in another
        state, saying only deliveries in the DLQ can be ``done``."""
        scope = [] if (condition := in_scope_sql(_dels.c.tenant, tenant)) is None else [condition]
        with self.db.transaction(action) as conn:
            row = conn.execute(
                update(_dels)
                .where(_dels.c.id == delivery_id, _dels.c.state == DeliveryState.DLQ.value, *scope)
                .values(**values)
                .returning(*_dels.c)
            ).first()
            if row is not None:
                return row_to_delivery(row)
            state = conn.execute(select(_dels.c.state).where(_dels.c.id == delivery_id, *scope)).scalar()
        if state is None:
            raise DeliveryNotFoundError(delivery_id)
        raise InvalidStateError(
            f"delivery {delivery_id!r} is {state}, not dead-lettered; "
            f"only deliveries in the DLQ can be {done}"
        )

    def release_expired_leases(self, *, now: datetime) -> list[str]:
        with self.db.transaction("release expired leases") as conn:
            return list(
                conn.execute(
                    update(_dels)
                    .where(INFLIGHT_ROWS, _dels.c.lease_expires_at < now)
                    .values(state=_PENDING, lease_expires_at=None, lease_token=None, next_attempt_at=now)
                    .returning(_dels.c.id)
                ).scalars()
            )

    def next_in_line(self, subscription_id: str, ordering_key: str) -> list[DeliverySchedule]:
        with self.db.transaction("find the next delivery of a key") as conn:
            rows = conn.execute(NEXT_IN_LINE, {"sub": subscription_id, "key": ordering_key}).all()
        return [DeliverySchedule(*row) for row in rows]

    def waiting_in_line(self, delivery_ids: Sequence[str]) -> set[str]:
        unique = [i for i in dict.fromkeys(delivery_ids) if id_problem(i) is None]
        waiting: set[str] = set()
        if not unique:
            return waiting
        with self.db.transaction("find deliveries waiting behind their key") as conn:
            for chunk in chunks(unique):
                rows = (
                    conn.execute(WAITING_AMONG, {"ids": list(chunk)})
                    if self._fold_attempt_insert
                    else conn.execute(select(_dels.c.id).where(_dels.c.id.in_(chunk), NOT_AT_HEAD))
                )
                waiting.update(rows.scalars())
        return waiting

    def skip_delivery(
        self, delivery_id: str, *, reason: str, now: datetime, tenant: TenantScope = ALL_TENANTS
    ) -> DeliveryLog:
        return self._move_dead_letter(
            delivery_id,
            tenant,
            "skip a dead-lettered delivery",
            "skipped",
            state=DeliveryState.SKIPPED.value,
            last_error=reason,
            timestamp=now,
        )

    def blocked_keys(
        self, subscription_id: str, *, limit: int, tenant: TenantScope = ALL_TENANTS
    ) -> list[BlockedKey]:
        params = {"sub": subscription_id, "limit": limit, **scope_params(tenant)}
        with self.db.transaction("list blocked ordering keys") as conn:
            rows = conn.execute(blocked_keys_query(tenant), params).all()
        return [BlockedKey(key, delivery_id, int(waiting)) for key, delivery_id, waiting in rows]

    def due_deliveries(self, *, now: datetime, limit: int) -> list[str]:
        with self.db.transaction("list due deliveries") as conn:
            return list(
                conn.execute(
                    select(_dels.c.id)
                    .where(PENDING_ROWS, _dels.c.next_attempt_at <= now, AT_HEAD)
                    .order_by(_dels.c.next_attempt_at, _dels.c.id)
                    .limit(limit)
                ).scalars()
            )


def _due(now: datetime) -> tuple[ColumnElement[bool] | TextClause, ...]:
    """The conditions of a claimable delivery: ``PENDING`` and due at ``now``."""
    return (
        PENDING_ROWS,
        or_(_dels.c.next_attempt_at.is_(None), _dels.c.next_attempt_at <= now),
        AT_HEAD,
    )


def _numbered(conn: Connection, deliveries: Sequence[DeliveryLog]) -> Sequence[DeliveryLog]:
    """``deliveries`` with a place in their key's line: each key without one takes its next number
    on ``conn`` (one per key per call, shared by the call's deliveries of that key). The upsert's
    row lock lasts until the caller's transaction ends, so a later dispatch of the key, which waits
    for it, numbers after this one."""
    keys = {
        (d.tenant or "", d.ordering_key)
        for d in deliveries
        if d.ordering_key is not None and d.ordering_seq is None
    }
    if not keys:
        return deliveries
    # Sorted: two dispatches taking the same keys lock them in the same order (no deadlock).
    seqs = {
        line: conn.execute(NEXT_ORDERING_SEQ, ordering_seq_params(*line)).scalar_one()
        for line in sorted(keys)
    }
    return [
        d.replace(ordering_seq=seqs[(d.tenant or "", d.ordering_key)])
        if d.ordering_key is not None and d.ordering_seq is None
        else d
        for d in deliveries
    ]


def _lease(
    which: ColumnElement[bool], now: datetime, lease_seconds: float, token: str, max_attempts: int
) -> Executable:
    """The UPDATE that leases the claimable deliveries among ``which``, returning their rows."""
    return (
        update(_dels)
        .where(which, *_due(now))
        .values(
            state=_INFLIGHT,
            lease_expires_at=now + timedelta(seconds=lease_seconds),
            lease_token=token,
            max_attempts=max_attempts,
        )
        .returning(*_dels.c)
    )


def _with_subscriptions(
    conn: Connection, rows: Sequence[Row[Any]], token: str, *, by_ids: Executable | None = None
) -> list[Claim]:
    """Pair leased rows with their subscriptions as they are now (``None`` if removed, or if the
    id now names another tenant's subscription: :func:`claimed_subscription`).

    :param by_ids: a statement reading the subscriptions of an ``ids`` array in one round trip
        (PostgreSQL); without it, an expanding ``IN`` per chunk.
    """
    subscriptions: dict[str, WebhookSubscription] = {}
    for chunk in chunks(list({row.subscription_id for row in rows})):
        found = (
            conn.execute(by_ids, {"ids": list(chunk)})
            if by_ids is not None
            else conn.execute(select(_subs).where(_subs.c.id.in_(chunk)))
        )
        for sub_row in found:
            subscriptions[sub_row.id] = row_to_subscription(sub_row)
    claims = []
    for row in rows:
        delivery = row_to_delivery(row)
        subscription = claimed_subscription(delivery, subscriptions.get(row.subscription_id))
        claims.append(Claim(delivery, subscription, token))
    return claims
