"""The store contract: what the delivery pipeline needs from persistence.

Every store implements :class:`OutboundWebhookHandler`. The contract test suite
(``tests/test_store_contract.py``) runs the same tests over every store; a store of your own passes
it to be a drop-in. Methods that move a delivery between states are each atomic: two workers calling
them at once never both win.
"""

from __future__ import annotations

import abc
import enum
import itertools
from collections import Counter
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING

from ...errors import DeliveryNotFoundError, InvalidStateError
from .. import operational
from ..models import (
    WAITING_STATES,
    AttemptResult,
    Claim,
    DeliveryAttempt,
    DeliveryLog,
    DeliveryState,
    DeliveryStats,
    DeliverySummary,
    SubscriptionChanges,
    WebhookSubscription,
    WebhookSubscriptionStatus,
)
from ..tenants import ALL_TENANTS, TenantScope

if TYPE_CHECKING:
    # Only a type: the contract itself needs no SQL.
    from sqlalchemy import Engine

#: The states in which a delivery may let the next one of its key go (whether a dead letter does
#: is the subscription's policy: :func:`~flask_harvest.webhooks.ordering.releases_line`).
LINE_ENDS = frozenset({DeliveryState.DELIVERED, DeliveryState.SKIPPED, DeliveryState.DLQ})


class AnyRotation(enum.Enum):
    """:meth:`~OutboundWebhookHandler.rotate_secret` without a check of the last rotation."""

    ANY = "any"


#: Rotate whatever the last rotation was (the default).
ANY_ROTATION = AnyRotation.ANY

#: A position in the DLQ listing: the ``(timestamp, id)`` of the last row of the previous page.
DlqCursor = tuple[datetime, str]
#: A position in the subscriptions listing: the ``(created_at, id)`` of the last row of a page.
SubscriptionCursor = tuple[datetime, str]


@dataclass(frozen=True)
class LeaseTerms:
    """How a claim is leased: for how long, and the attempts the claimed delivery may use."""

    lease_seconds: float
    max_attempts: int


@dataclass(frozen=True)
class Outcome:
    """An attempt's outcome to record with :meth:`OutboundWebhookHandler.finish_attempts`."""

    delivery_id: str
    lease_token: str
    result: AttemptResult
    #: The delivery's ordering key: when the outcome releases the key's line, the store finds the
    #: next delivery of the key in the same transaction (:attr:`Recorded.released`).
    ordering_key: str | None = None
    #: Lease that next delivery to the caller in the same transaction, on these terms, when it is
    #: due (:attr:`Recorded.following`); ``None``: only find it. Ask only where the caller starts
    #: the claims it gets at once (a worker's pool): an unstarted claim waits out its lease.
    follow: LeaseTerms | None = None


@dataclass(frozen=True)
class DeliverySchedule:
    """Which attempt of a delivery is next, and when: what its job carries
    (:meth:`OutboundWebhookHandler.get_schedules`)."""

    id: str
    attempt: int
    next_attempt_at: datetime | None


@dataclass(frozen=True)
class Recorded:
    """What :meth:`OutboundWebhookHandler.finish_attempts` did with one outcome.

    :param held: the lease was still held and the outcome was written; ``False``: the lease was
        lost and nothing was written for it (as :meth:`~OutboundWebhookHandler.finish_attempt`'s
        :class:`~flask_harvest.errors.InvalidStateError`).
    :param changed: the subscription's new status if this outcome changed it.
    :param notices: the operational notifications the outcome's transitions made
        (:func:`~flask_harvest.webhooks.operational.notices`), logged ``PENDING`` with the outcome;
        the caller queues them.
    :param following: see the attribute.
    :param released: see the attribute.
    """

    held: bool
    changed: WebhookSubscriptionStatus | None = None
    notices: tuple[DeliveryLog, ...] = ()
    #: The next delivery of the outcome's key, leased to the caller (the outcome asked to
    #: :attr:`Outcome.follow` and it was due): the caller starts its attempt.
    following: tuple[Claim, ...] = ()
    #: The next delivery of the outcome's key that the line released, not leased: the caller
    #: queues it. Empty when the outcome did not release its line (a retry, or a dead letter
    #: under the ``block`` policy) or the store has no ordering.
    released: tuple[DeliverySchedule, ...] = ()


@dataclass(frozen=True)
class BlockedKey:
    """An ordering key of a subscription whose line waits for an operator: its head is
    dead-lettered under the ``block`` policy (:meth:`OutboundWebhookHandler.blocked_keys`)."""

    ordering_key: str
    #: The dead-lettered delivery at its head: replay it or skip it to release the key.
    delivery_id: str
    #: How many deliveries of the key wait behind it.
    waiting: int

    def to_dict(self) -> dict[str, object]:
        return {"ordering_key": self.ordering_key, "delivery_id": self.delivery_id, "waiting": self.waiting}


def fold_stats(
    groups: Iterable[tuple[str, str, int, datetime | None]],
    *,
    cap: int | None = None,
    capped: Collection[str] = (),
) -> tuple[DeliveryStats, dict[str, DeliveryStats]]:
    """Fold ``(subscription_id, state, count, oldest created_at)`` groups into stats: overall,
    and per subscription. A store's :meth:`~OutboundWebhookHandler.delivery_stats` uses it.

    :param cap: the cap the groups were counted with, if any.
    :param capped: the states that had more than ``cap`` rows (their groups count ``cap`` rows).
    """
    overall: Counter[str] = Counter()
    oldest_overall: datetime | None = None
    counts: dict[str, Counter[str]] = {}
    oldest: dict[str, datetime] = {}
    for subscription_id, state, count, created in groups:
        overall[state] += count
        counts.setdefault(subscription_id, Counter())[state] += count
        if state == DeliveryState.PENDING.value and created is not None:
            if oldest_overall is None or created < oldest_overall:
                oldest_overall = created
            if subscription_id not in oldest or created < oldest[subscription_id]:
                oldest[subscription_id] = created
    stopped = frozenset(capped)
    per_subscription = {
        sub: DeliveryStats(dict(by_state), oldest.get(sub), stopped, cap) for sub, by_state in counts.items()
    }
    return DeliveryStats(dict(overall), oldest_overall, stopped, cap), per_subscription


def capped_groups(
    deliveries: Iterable[DeliveryLog], cap: int
) -> tuple[list[tuple[str, str, int, datetime | None]], set[str]]:
    """The groups for :func:`fold_stats` of at most ``cap`` deliveries per state, and the states
    that had more: what a capped :meth:`~OutboundWebhookHandler.delivery_stats` reads, for a
    store that holds its deliveries in memory (the SQL store reads the same rows with a query)."""
    by_state: dict[str, list[DeliveryLog]] = {}
    for delivery in deliveries:
        by_state.setdefault(DeliveryState(delivery.state).value, []).append(delivery)
    groups: list[tuple[str, str, int, datetime | None]] = []
    capped: set[str] = set()
    for state, rows in by_state.items():
        rows.sort(key=lambda d: (d.timestamp, d.id), reverse=state not in WAITING_STATES)
        if len(rows) > cap:
            capped.add(state)
        groups.extend((d.subscription_id, state, 1, d.created_at) for d in rows[:cap])
    return groups, capped


def succeeded(status: int | None) -> bool:
    """Whether an attempt that got ``status`` (``None``: no answer) delivered."""
    return status is not None and 200 <= status < 300


def minute_buckets(started: Iterable[tuple[datetime, int | None]]) -> list[tuple[datetime, int, int]]:
    """Fold ``(started_at, response_status)`` pairs into ``(minute, succeeded, failed)``, oldest
    first; a store's :meth:`~OutboundWebhookHandler.attempts_per_minute` uses it."""
    buckets: dict[datetime, list[int]] = {}
    for when, status in started:
        counts = buckets.setdefault(when.replace(second=0, microsecond=0), [0, 0])
        counts[0 if succeeded(status) else 1] += 1
    return [(minute, ok, failed) for minute, (ok, failed) in sorted(buckets.items())]


@dataclass(frozen=True)
class StoreCapabilities:
    """What a store can do beyond the contract; the library asks this, never the store's type.

    :param transactions: deliveries can be written in the application's own SQLAlchemy
        transaction, through a transactional outbox on ``engine``
        (:meth:`~flask_harvest.webhooks.manager.OutboundWebhookManager.dispatch_in_tx`).
    :param engine: the SQLAlchemy engine of the store's database; required with ``transactions``.
    :param schema: the store has tables that :meth:`OutboundWebhookHandler.ensure_schema` creates
        (``flask harvest init-db``).
    :param ordering: the store keeps deliveries with an ordering key in line
        (:mod:`~flask_harvest.webhooks.ordering`): it numbers them when they are logged, claims
        only the head of each line, and implements :meth:`OutboundWebhookHandler.next_in_line`,
        :meth:`~OutboundWebhookHandler.skip_delivery` and
        :meth:`~OutboundWebhookHandler.blocked_keys`. ``dispatch(..., ordering_key=...)`` refuses
        a store without it.
    """

    transactions: bool = False
    engine: Engine | None = None
    schema: bool = False
    ordering: bool = False

    def __post_init__(self) -> None:
        if self.transactions and self.engine is None:
            raise ValueError("a store that supports transactions must give its engine")


class OutboundWebhookHandler(abc.ABC):
    """Persistence of subscriptions and delivery logs.

    Errors of the underlying database are raised as :class:`~flask_harvest.errors.StoreError` with
    the driver's exception as ``__cause__``.

    Every method that reads, lists or changes subscriptions, deliveries or attempts by id takes a
    keyword ``tenant``, a :data:`~flask_harvest.webhooks.tenants.TenantScope`: with a tenant (or
    ``None``, the untenanted rows) it sees that tenant's rows only, and a row of another tenant is
    exactly as absent as one that does not exist (``None``, an empty list, a not-found error, nothing
    changed). The default, :data:`~flask_harvest.webhooks.tenants.ALL_TENANTS`, sees every row.
    """

    @property
    def capabilities(self) -> StoreCapabilities:
        """What this store can do beyond the contract; by default, nothing."""
        return StoreCapabilities()

    @property
    def supports_transactions(self) -> bool:
        """Whether ``dispatch_in_tx`` can write into the caller's transaction (``capabilities``)."""
        return self.capabilities.transactions

    def ensure_schema(self) -> None:  # noqa: B027 (a no-op default, not an abstract method)
        """Create the store's tables where they are missing; nothing for a store without any."""

    # -- subscriptions -------------------------------------------------------------------------

    @abc.abstractmethod
    def add_subscription(self, subscription: WebhookSubscription) -> WebhookSubscription:
        """Store a new subscription and return it.

        :raises DuplicateSubscriptionError: its id is taken.
        """

    @abc.abstractmethod
    def get_subscription(
        self, subscription_id: str, *, tenant: TenantScope = ALL_TENANTS
    ) -> WebhookSubscription | None:
        """Return the subscription, or ``None`` (also when it is not in the ``tenant`` scope)."""

    @abc.abstractmethod
    def list_subscriptions(self, *, tenant: TenantScope = ALL_TENANTS) -> list[WebhookSubscription]:
        """Return every subscription (of the ``tenant`` scope), oldest first."""

    def list_subscriptions_page(
        self,
        *,
        limit: int,
        after: SubscriptionCursor | None = None,
        status: WebhookSubscriptionStatus | None = None,
        topic: str | None = None,
        tenant: TenantScope = ALL_TENANTS,
    ) -> list[WebhookSubscription]:
        """Return at most ``limit`` subscriptions, oldest first by ``(created_at, id)``: the keyset
        listing behind the dashboard, filtered in the query.

        :param after: return only subscriptions after this position (the last row of a page).
        :param status: only subscriptions in this status.
        :param topic: only subscriptions whose topics select this event topic.

        This default filters :meth:`subscriptions_for_topic` or :meth:`list_subscriptions` (the
        in-memory store's topic index makes the first a lookup); the SQL store walks an index.
        """
        candidates = (
            self.subscriptions_for_topic(topic, tenant=tenant)
            if topic is not None
            else self.list_subscriptions(tenant=tenant)
        )
        chosen = (
            s
            for s in candidates
            if (status is None or s.status is status) and (after is None or (s.created_at, s.id) > after)
        )
        return list(itertools.islice(chosen, limit))

    def troubled_subscriptions(
        self, *, limit: int, tenant: TenantScope = ALL_TENANTS
    ) -> list[WebhookSubscription]:
        """Return at most ``limit`` subscriptions that are disabled or failing (not ``active``, or
        with consecutive failures), the most failures first: what the dashboard's overview lists.

        This default filters :meth:`list_subscriptions`; the SQL store reads a partial index of
        those rows only.
        """
        troubled = [
            s
            for s in self.list_subscriptions(tenant=tenant)
            if s.status is not WebhookSubscriptionStatus.ACTIVE or s.consecutive_failures
        ]
        troubled.sort(key=lambda s: (-s.consecutive_failures, s.created_at, s.id))
        return troubled[:limit]

    @abc.abstractmethod
    def update_subscription(
        self, subscription_id: str, changes: SubscriptionChanges, *, tenant: TenantScope = ALL_TENANTS
    ) -> WebhookSubscription:
        """Set the fields ``changes`` names, and ``updated_at``, on the stored subscription, in one
        atomic step; return it as stored.

        Only those fields are written: a failure counted or a status set by a worker meanwhile
        stays (never read, change and write the whole row back).

        :raises SubscriptionNotFoundError: there is none with that id (in the ``tenant`` scope).
        """

    @abc.abstractmethod
    def rotate_secret(
        self,
        subscription_id: str,
        secret: str,
        *,
        previous_expires_at: datetime,
        tenant: TenantScope = ALL_TENANTS,
        after: datetime | AnyRotation | None = ANY_ROTATION,
    ) -> WebhookSubscription:
        """Make ``secret`` the subscription's secret in one atomic step: the current secret becomes
        ``previous_secret``, signing too until ``previous_expires_at``; return it as stored.

        :param after: rotate only if the subscription's ``previous_secret_expires_at`` is still
            this (``None``: never rotated), checked in the same atomic step: a form sent twice at
            once rotates once.
        :raises InvalidFieldError: the secret or the expiry is invalid; nothing was written.
        :raises SubscriptionNotFoundError: there is none with that id.
        :raises InvalidStateError: ``after`` is given and the secret was rotated since.
        """

    @abc.abstractmethod
    def remove_subscription(self, subscription_id: str, *, tenant: TenantScope = ALL_TENANTS) -> bool:
        """Delete the subscription; return whether it existed (in the ``tenant`` scope). Its
        delivery logs stay."""

    def subscriptions_for_topic(
        self, topic: str, *, tenant: TenantScope = ALL_TENANTS
    ) -> list[WebhookSubscription]:
        """Return the subscriptions (of the ``tenant`` scope), whatever their status, whose topics
        select ``topic``. A dispatch asks for its own tenant's, or ``None``'s."""
        return [s for s in self.list_subscriptions(tenant=tenant) if s.matches(topic)]

    def subscriptions_for_topics(
        self, topics: Sequence[str], *, tenant: TenantScope = ALL_TENANTS
    ) -> dict[str, list[WebhookSubscription]]:
        """Return each of ``topics`` with the subscriptions (of the ``tenant`` scope), whatever
        their status, that select it.

        The outbox relay calls it once per tenant of a batch of messages. This default reads every
        subscription once; the SQL and in-memory stores look the topics up in their topic index.
        """
        subscriptions = self.list_subscriptions(tenant=tenant)
        return {topic: [s for s in subscriptions if s.matches(topic)] for topic in dict.fromkeys(topics)}

    def set_subscription_status(
        self, subscription_id: str, status: WebhookSubscriptionStatus, *, tenant: TenantScope = ALL_TENANTS
    ) -> WebhookSubscription:
        """Set a subscription's status; enabling one also clears its failure count.

        :raises SubscriptionNotFoundError: there is none with that id (in the ``tenant`` scope).
        """
        return self.update_subscription(subscription_id, SubscriptionChanges(status=status), tenant=tenant)

    # -- delivery logs -------------------------------------------------------------------------

    @abc.abstractmethod
    def log_deliveries(self, deliveries: Sequence[DeliveryLog]) -> list[str]:
        """Insert many delivery logs in one round trip; return the ids actually inserted.

        A delivery whose id already exists is left as it is (so relaying an outbox message twice
        is harmless) and its id is not returned.
        """

    def log_deliveries_for_topic(
        self,
        topic: str,
        build: Callable[[WebhookSubscription], DeliveryLog | None],
        *,
        tenant: TenantScope = ALL_TENANTS,
    ) -> list[tuple[WebhookSubscription, DeliveryLog]]:
        """Log one delivery, made by ``build``, per subscription whose topics select ``topic``
        (whatever its status) in the ``tenant`` scope (a dispatch passes its tenant, or ``None``)
        and for which ``build`` returns one (``None``: that subscription
        takes no delivery); return the ``(subscription, delivery)`` pairs.

        ``build`` must give every delivery a new id: a store may insert without looking for
        existing ones, unlike :meth:`log_deliveries`. This default calls
        :meth:`subscriptions_for_topic` and :meth:`log_deliveries`; the SQL store does both in
        one transaction.
        """
        matched = self.subscriptions_for_topic(topic, tenant=tenant)
        built = ((subscription, build(subscription)) for subscription in matched)
        pairs = [(subscription, delivery) for subscription, delivery in built if delivery is not None]
        self.log_deliveries([delivery for _, delivery in pairs])
        return pairs

    @abc.abstractmethod
    def get_delivery(self, delivery_id: str, *, tenant: TenantScope = ALL_TENANTS) -> DeliveryLog | None:
        """Return the delivery log, or ``None`` (also when it is not in the ``tenant`` scope)."""

    @abc.abstractmethod
    def get_deliveries(
        self, delivery_ids: Sequence[str], *, tenant: TenantScope = ALL_TENANTS
    ) -> list[DeliveryLog]:
        """Return the delivery logs (of the ``tenant`` scope) that exist among ``delivery_ids``, in
        no particular order."""

    def get_schedules(self, delivery_ids: Sequence[str]) -> list[DeliverySchedule]:
        """Return the next attempt and due time of the deliveries that exist among
        ``delivery_ids``, in no particular order (the sweeper asks the job backend about them).

        This default reads whole logs; a store that can reads only the three columns (the SQL
        store does: with a backlog the sweeper looks at a thousand rows each time, payloads and
        all)."""
        return [
            DeliverySchedule(d.id, d.attempt, d.next_attempt_at)
            for d in self.get_deliveries(list(dict.fromkeys(delivery_ids)))
        ]

    @abc.abstractmethod
    def list_attempts(self, delivery_id: str, *, tenant: TenantScope = ALL_TENANTS) -> list[DeliveryAttempt]:
        """Return the delivery's recorded attempts, oldest first (none when the delivery is not in
        the ``tenant`` scope).

        A store may keep only the latest attempt (the in-memory store does).
        """

    def list_dlq(
        self,
        *,
        limit: int = 100,
        before: DlqCursor | None = None,
        subscription_id: str | None = None,
        topic: str | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
        tenant: TenantScope = ALL_TENANTS,
    ) -> list[DeliveryLog]:
        """Return dead-lettered deliveries, newest first by ``(timestamp, id)``.

        :param before: return only rows older than this cursor (the last row of a previous page).
        :param since: only rows dead-lettered at or after this time.
        :param until: only rows dead-lettered before this time.
        :param tenant: only rows of this scope.
        """
        return self.list_deliveries(
            limit=limit,
            before=before,
            state=DeliveryState.DLQ,
            subscription_id=subscription_id,
            topic=topic,
            since=since,
            until=until,
            tenant=tenant,
        )

    @abc.abstractmethod
    def list_deliveries(
        self,
        *,
        limit: int = 100,
        before: DlqCursor | None = None,
        state: DeliveryState | None = None,
        subscription_id: str | None = None,
        topic: str | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
        tenant: TenantScope = ALL_TENANTS,
    ) -> list[DeliveryLog]:
        """Return deliveries in any state (or in ``state``), newest first by ``(timestamp, id)``:
        the keyset listing behind the dashboard, one bounded index walk per page.

        The parameters are those of :meth:`list_dlq`; ``since`` and ``until`` bound ``timestamp``
        (the time of the latest attempt, or of the logging).
        """

    def list_delivery_summaries(
        self,
        *,
        limit: int = 100,
        before: DlqCursor | None = None,
        state: DeliveryState | None = None,
        subscription_id: str | None = None,
        topic: str | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
        tenant: TenantScope = ALL_TENANTS,
    ) -> list[DeliverySummary]:
        """Return :meth:`list_deliveries`' rows as :class:`DeliverySummary` values, same
        parameters, same order: what a list page shows, without the payload or response body. A
        store may read only those columns; this default summarizes the full rows."""
        listed = self.list_deliveries(
            limit=limit,
            before=before,
            state=state,
            subscription_id=subscription_id,
            topic=topic,
            since=since,
            until=until,
            tenant=tenant,
        )
        return [DeliverySummary.of(delivery) for delivery in listed]

    def count_deliveries(
        self,
        *,
        cap: int,
        state: DeliveryState | None = None,
        subscription_id: str | None = None,
        topic: str | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
        tenant: TenantScope = ALL_TENANTS,
    ) -> int:
        """Return how many deliveries :meth:`list_deliveries` lists with these filters, counting at
        most ``cap`` (a count equal to ``cap`` means "at least"): a list page's total. A store may
        count in one bounded statement; this default lists up to ``cap`` summaries."""
        if cap < 1:
            return 0
        listed = self.list_delivery_summaries(
            limit=cap,
            state=state,
            subscription_id=subscription_id,
            topic=topic,
            since=since,
            until=until,
            tenant=tenant,
        )
        return len(listed)

    @abc.abstractmethod
    def attempts_per_minute(self, *, since: datetime, until: datetime) -> list[tuple[datetime, int, int]]:
        """Return ``(minute, succeeded, failed)`` for each minute in ``[since, until)`` with attempts
        started in it, oldest first: a 2xx answer succeeded, anything else failed.

        A store that keeps only each delivery's latest attempt counts only those.
        """

    def recent_attempts(
        self, subscription_id: str, *, since: datetime, limit: int, tenant: TenantScope = ALL_TENANTS
    ) -> list[tuple[int | None, int | None]]:
        """Return ``(response_status, elapsed_ms)`` of the attempts since ``since`` of the
        ``limit`` deliveries of ``subscription_id`` attempted last: a bounded sample for the
        dashboard's success rate and latency. This default reads those deliveries and their
        attempts; the SQL store joins them in one query on its indexes."""
        recent = self.list_deliveries(
            limit=limit, subscription_id=subscription_id, since=since, tenant=tenant
        )
        return [
            (a.response_status, a.elapsed_ms)
            for d in recent
            for a in self.list_attempts(d.id)
            if a.started_at >= since
        ]

    @abc.abstractmethod
    def delivery_stats(
        self, *, cap: int | None = None, tenant: TenantScope = ALL_TENANTS
    ) -> tuple[DeliveryStats, dict[str, DeliveryStats]]:
        """Return delivery counts by state and the oldest pending delivery: overall, and per
        subscription id; of the ``tenant`` scope's deliveries only.

        :param cap: read at most this many rows of each state, so the cost stays bounded however
            long the history: a state with more is marked capped (see :class:`DeliveryStats` for
            what its counts then mean). ``None`` counts every row.
        """

    def queue_gauges(self, *, now: datetime, dlq_limit: int) -> tuple[int, datetime | None]:
        """Return the number of dead-lettered deliveries (at most ``dlq_limit``) and the due time
        of the longest-waiting due ``PENDING`` delivery (``None`` when none is due).

        What a metrics scrape reads: both must be bounded, indexed queries. This default folds
        :meth:`delivery_stats` capped at ``dlq_limit``; the SQL and in-memory stores answer directly.
        """
        overall, _ = self.delivery_stats(cap=dlq_limit)
        dlq = min(int(overall.counts.get(DeliveryState.DLQ.value, 0)), dlq_limit)
        due = self.due_deliveries(now=now, limit=1)
        delivery = self.get_delivery(due[0]) if due else None
        return dlq, delivery.next_attempt_at if delivery is not None else None

    def count_subscription_states(self, *, cap: int) -> dict[WebhookSubscriptionStatus, int]:
        """Return how many subscriptions have each status, counting at most ``cap`` of each.

        What a metrics scrape reads. This default counts :meth:`list_subscriptions`; the SQL store
        answers with bounded counts.
        """
        counts = Counter(subscription.status for subscription in self.list_subscriptions())
        return {status: min(counts[status], cap) for status in WebhookSubscriptionStatus}

    def count_states(self, *, cap: int) -> dict[DeliveryState, int]:
        """Return how many deliveries are in each state, counting at most ``cap`` of each.

        What a metrics scrape reads: each count must be a bounded, indexed query. This default
        folds :meth:`delivery_stats` capped at ``cap``; the SQL store answers directly.
        """
        overall, _ = self.delivery_stats(cap=cap)
        return {state: min(int(overall.counts.get(state.value, 0)), cap) for state in DeliveryState}

    @abc.abstractmethod
    def purge_deliveries_before(self, cutoff: datetime) -> int:
        """Delete delivered (2xx) logs whose latest attempt is older than ``cutoff``.

        Pending, in-flight, dead-lettered and skipped logs stay. Returns how many were deleted.
        """

    # -- the delivery pipeline -----------------------------------------------------------------

    @abc.abstractmethod
    def claim_delivery(
        self,
        delivery_id: str,
        *,
        now: datetime,
        lease_seconds: float,
        max_attempts: int,
    ) -> Claim | None:
        """Lease a due ``PENDING`` delivery to the caller; ``None`` if it is not claimable.

        Only a delivery that is ``PENDING`` with ``next_attempt_at <= now`` is claimed. It becomes
        ``INFLIGHT`` with ``lease_expires_at = now + lease_seconds``, a fresh lease token and
        ``max_attempts`` recorded. The claim returns the subscription as it is now (``None`` if it
        was removed).
        """

    def claim_deliveries(
        self,
        delivery_ids: Sequence[str],
        *,
        now: datetime,
        lease_seconds: float,
        max_attempts: int,
    ) -> list[Claim]:
        """Lease every due ``PENDING`` delivery among ``delivery_ids``, like :meth:`claim_delivery`;
        return the claims (in no particular order), skipping ids that are not claimable.

        An id given twice is claimed at most once. This default calls :meth:`claim_delivery` per
        id; a store can override it to claim the batch in one round trip.
        """
        claims = []
        for delivery_id in dict.fromkeys(delivery_ids):
            claim = self.claim_delivery(
                delivery_id, now=now, lease_seconds=lease_seconds, max_attempts=max_attempts
            )
            if claim is not None:
                claims.append(claim)
        return claims

    @abc.abstractmethod
    def finish_attempt(
        self, delivery_id: str, lease_token: str, result: AttemptResult
    ) -> WebhookSubscriptionStatus | None:
        """Record an attempt's outcome, atomically, if the caller still holds the lease.

        Updates the delivery from ``result``, appends ``result.attempt`` to the history, applies
        ``result.effect`` to the subscription (atomically, so concurrent failures all count) and
        clears the lease.

        :returns: the subscription's new status if this call changed it, else ``None``.
        :raises InvalidStateError: the lease was lost (it expired and another worker claimed the
            delivery); nothing was written.
        """

    def finish_attempts(self, outcomes: Sequence[Outcome]) -> list[Recorded]:
        """Record several attempts' outcomes, each as :meth:`finish_attempt` would; return what
        was done with each, in order.

        Each outcome is atomic on its own; a store may write them all in one transaction (a
        driver error then writes none and is raised). An outcome whose result has an operational
        context (:attr:`AttemptResult.operational`) and that dead-letters its delivery or turns its
        subscription off logs the notifications :func:`~flask_harvest.webhooks.operational.notices`
        builds, once per transition, and returns them in :attr:`Recorded.notices`; a store that
        can writes them in the outcome's transaction (the SQL store does).

        An outcome with an :attr:`~Outcome.ordering_key` that releases its key's line (delivered,
        skipped, or dead-lettered under the ``skip`` policy) returns the next delivery of the key
        (:meth:`next_in_line`) in :attr:`Recorded.released`, or, if the outcome asks to
        :attr:`~Outcome.follow` and the store can, leased in :attr:`Recorded.following` (the SQL
        store finds and leases it in the outcome's transaction).

        This default calls :meth:`finish_attempt` per outcome, then :meth:`log_deliveries` for
        its notifications and :meth:`next_in_line` for a released key (it leases nothing); a
        store can override it to record the batch in one round trip.
        """
        recorded = []
        for outcome in outcomes:
            try:
                changed = self.finish_attempt(outcome.delivery_id, outcome.lease_token, outcome.result)
            except InvalidStateError:
                recorded.append(Recorded(held=False))
                continue
            made: tuple[DeliveryLog, ...] = ()
            if outcome.result.operational is not None:
                delivery = self.get_delivery(outcome.delivery_id)
                if delivery is not None:
                    made = tuple(
                        operational.notices(delivery.id, delivery.subscription_id, outcome.result, changed)
                    )
                    self.log_deliveries(made)
            released = tuple(self._released_by(outcome))
            recorded.append(Recorded(held=True, changed=changed, notices=made, released=released))
        return recorded

    def _released_by(self, outcome: Outcome) -> list[DeliverySchedule]:
        """The next delivery of ``outcome``'s key if the recorded outcome let its line move."""
        if outcome.ordering_key is None or outcome.result.state not in LINE_ENDS:
            return []
        delivery = self.get_delivery(outcome.delivery_id)
        if delivery is None:
            return []
        return self.next_in_line(delivery.subscription_id, outcome.ordering_key)

    @abc.abstractmethod
    def dead_letter(self, delivery_ids: Sequence[str], error: str, *, now: datetime) -> list[str]:
        """Move ``PENDING`` deliveries to the DLQ with ``error``; return the ids moved."""

    @abc.abstractmethod
    def replay_delivery(
        self, delivery_id: str, *, now: datetime, tenant: TenantScope = ALL_TENANTS
    ) -> DeliveryLog:
        """Move a dead-lettered delivery back to ``PENDING``, due now, with ``attempt`` = 1.

        The id, payload and topic stay, so the receiver sees the same ``webhook-id``.

        :raises DeliveryNotFoundError: no such delivery (in the ``tenant`` scope).
        :raises InvalidStateError: the delivery is not dead-lettered.
        """

    @abc.abstractmethod
    def release_expired_leases(self, *, now: datetime) -> list[str]:
        """Return ``INFLIGHT`` deliveries whose lease ended before ``now`` to ``PENDING``, due now.

        Returns their ids. The attempt number is unchanged: the interrupted attempt is made again.
        """

    @abc.abstractmethod
    def due_deliveries(self, *, now: datetime, limit: int) -> list[str]:
        """Return the ids of up to ``limit`` ``PENDING`` deliveries due at ``now``, oldest due first.

        A store with ordering (:attr:`StoreCapabilities.ordering`) returns only deliveries at the
        head of their key's line: the others are waiting, not lost.
        """

    # -- ordered delivery (optional: StoreCapabilities.ordering) ----------------------------------

    def next_in_line(self, subscription_id: str, ordering_key: str) -> list[DeliverySchedule]:
        """Return the ``PENDING`` delivery of ``subscription_id`` and ``ordering_key`` that may be
        attempted next (at most one), or nothing if the key's line is empty or held.

        Called after a delivery of the key finished, to queue its successor. This default returns
        nothing (a store without ordering).
        """
        return []

    def waiting_in_line(self, delivery_ids: Sequence[str]) -> set[str]:
        """Return those of ``delivery_ids`` that are ``PENDING`` behind an earlier delivery of their
        key (not at the head of their line): a job for one would claim nothing, so dispatch
        queues none; the delivery is queued when the one ahead of it finishes.

        This default returns nothing (a store without ordering): every delivery is queued.
        """
        return set()

    def skip_delivery(
        self, delivery_id: str, *, reason: str, now: datetime, tenant: TenantScope = ALL_TENANTS
    ) -> DeliveryLog:
        """Move a dead-lettered delivery to ``SKIPPED`` with ``reason`` (an operator gives up on it),
        which releases its ordering key.

        :raises DeliveryNotFoundError: no such delivery (in the ``tenant`` scope).
        :raises InvalidStateError: the delivery is not dead-lettered (or the store cannot skip).
        """
        if self.get_delivery(delivery_id, tenant=tenant) is None:
            raise DeliveryNotFoundError(delivery_id)
        raise InvalidStateError(
            f"this store cannot skip delivery {delivery_id!r}: it has no ordered delivery"
        )

    def blocked_keys(
        self, subscription_id: str, *, limit: int = 50, tenant: TenantScope = ALL_TENANTS
    ) -> list[BlockedKey]:
        """Return up to ``limit`` keys of ``subscription_id`` held by a dead-lettered head, by key
        (none when its deliveries are not in the ``tenant`` scope).

        Meaningful for a subscription with the ``block`` policy; this default returns nothing.
        """
        return []


#: The seed's older name for the contract.
OutboundWebhookStore = OutboundWebhookHandler
