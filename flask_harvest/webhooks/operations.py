"""What an operator can do with webhooks, in one place (:class:`WebhookOperations`): the actuator
blueprint and the CLI are thin over it."""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, TypeVar

from .._input import check_number, id_problem, text_problem, to_utc
from .._time import utcnow
from ..conditions import Condition
from ..config import Settings
from ..errors import (
    ConfigurationError,
    DeliveryNotFoundError,
    DuplicateSubscriptionError,
    EventTypeNotFoundError,
    InvalidFieldError,
    InvalidStateError,
    SubscriptionNotFoundError,
)
from ..http.cursor import decode_position, encode_position
from ..jobs.base import JobBackend, JobBackendError
from ..outbound.rate import RateLimit
from ..outbound.signing import generate_secret
from ..outbound.ssrf import validate_target
from . import operational
from .catalog import EventType
from .delivery import delivery_job
from .manager import OutboundWebhookManager
from .models import (
    DeliveryLog,
    DeliveryState,
    DeliverySummary,
    SubscriptionChanges,
    WebhookSubscription,
    WebhookSubscriptionStatus,
    new_id,
    standard_secret,
    validate_filter,
    validate_headers,
    validate_rate_limit,
)
from .operational import OPERATIONAL_SUBSCRIPTION_ID
from .ordering import DEFAULT_ORDERING_POLICY, OrderingPolicy, validate_ordering_policy
from .outbox import SqlOutbox
from .payload import encode_payload
from .stores.base import (
    ANY_ROTATION,
    AnyRotation,
    BlockedKey,
    DeliverySchedule,
    DlqCursor,
    OutboundWebhookHandler,
)
from .tenants import ALL_TENANTS, TenantScope, in_scope, validate_scope, validate_tenant
from .topics import validate_topic

#: The most deliveries one bulk replay may touch.
MAX_BULK_REPLAY = 1000
#: The most rows one DLQ page holds.
MAX_DLQ_PAGE = 500
#: The longest grace period of a secret rotation (30 days).
MAX_GRACE_SECONDS = 30 * 24 * 3600.0
#: The most outbox messages one relay round claims.
MAX_RELAY_BATCH = 10_000
#: The oldest age a purge can be asked for (a century: past it the cut-off overflows).
MAX_RETENTION_SECONDS = 100 * 365 * 24 * 3600.0
#: The stats count at most this many deliveries in each state (past it a count reads ``1000+``), so
#: a page view or a poll costs the same whatever history the table keeps.
STATS_COUNT_CAP = 1000
#: The operational endpoint's latest notifications its status shows.
OPERATIONAL_RECENT = 10


@dataclass(frozen=True)
class NewSecret:
    """A subscription and its new secret: shown once, at creation or rotation, never again."""

    subscription: WebhookSubscription
    secret: str = field(repr=False)


class ReplayOutcome(str, enum.Enum):
    """What a replay did with one delivery; the values are the JSON answers' ``outcome``."""

    #: Moved back to pending, due now, at attempt 1.
    REPLAYED = "replayed"
    #: A dry run's: in the DLQ, so a replay would move it.
    WOULD_REPLAY = "would_replay"
    #: Gone between the listing and its replay (deleted).
    NOT_FOUND = "not_found"
    #: No longer in the DLQ when its turn came (replayed by another call meanwhile).
    NOT_REPLAYABLE = "not_replayable"


@dataclass(frozen=True)
class ReplayRow:
    """One delivery's outcome in a replay, with the reason when it was not replayed."""

    delivery_id: str
    outcome: ReplayOutcome
    reason: str | None = None

    def to_dict(self) -> dict[str, str]:
        shown = {"delivery_id": self.delivery_id, "outcome": self.outcome.value}
        return shown if self.reason is None else {**shown, "reason": self.reason}


@dataclass(frozen=True)
class ReplayResult:
    """What a replay did with each delivery it selected, and whether the jobs were queued."""

    rows: list[ReplayRow]
    dry_run: bool = False
    #: Why the jobs could not be queued (the sweeper sends them later), or ``None``.
    enqueue_error: str | None = None

    @property
    def delivery_ids(self) -> list[str]:
        """The deliveries replayed (in a dry run: that would be), in the order selected."""
        moved = (ReplayOutcome.REPLAYED, ReplayOutcome.WOULD_REPLAY)
        return [row.delivery_id for row in self.rows if row.outcome in moved]

    @property
    def not_replayed(self) -> list[ReplayRow]:
        """The deliveries selected that were not replayed, each with its reason."""
        moved = (ReplayOutcome.REPLAYED, ReplayOutcome.WOULD_REPLAY)
        return [row for row in self.rows if row.outcome not in moved]

    def to_dict(self) -> dict[str, Any]:
        """The JSON answer of the actuator and of ``flask harvest dlq replay --json``."""
        shown: dict[str, Any] = {
            "dry_run": self.dry_run,
            "count": len(self.delivery_ids),
            "delivery_ids": self.delivery_ids,
            "results": [row.to_dict() for row in self.rows],
        }
        if self.enqueue_error:
            shown["warning"] = f"replayed, but not queued ({self.enqueue_error}); the sweeper will send them"
        return shown


#: A row of a delivery listing: the full delivery, or its summary.
_Listed = TypeVar("_Listed", DeliveryLog, DeliverySummary)


def encode_cursor(delivery: DeliveryLog | DeliverySummary) -> str:
    """Return an opaque cursor that continues a delivery listing after ``delivery``."""
    return encode_position(delivery.timestamp, delivery.id)


def decode_cursor(cursor: str) -> DlqCursor:
    """Return the position an :func:`encode_cursor` cursor stands for.

    :raises InvalidFieldError: the cursor was not made by :func:`encode_cursor`.
    """
    return decode_position(cursor)


def _lookup(value: str, not_found: type[SubscriptionNotFoundError | DeliveryNotFoundError]) -> str:
    """Return an id to look up, or raise ``not_found`` for one no object can have: such an id must
    not reach a store (a custom one included) as if it could be there."""
    if id_problem(value) is not None:
        raise not_found(value if isinstance(value, str) else repr(value))
    return value


def _filter(value: str | None, field: str) -> str | None:
    if value is None:
        return None
    problem = text_problem(value) if isinstance(value, str) else "must be a string"
    if problem is not None:
        raise InvalidFieldError(field, problem)
    return value


#: The ``last_error`` of a dead-lettered delivery an operator skipped.
SKIPPED_BY_OPERATOR = "skipped by an operator; not sent"


def _check_limit(limit: int) -> None:
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_DLQ_PAGE:
        raise InvalidFieldError("limit", f"must be between 1 and {MAX_DLQ_PAGE}")


def _window(value: datetime | None, field: str) -> datetime | None:
    if value is None:
        return None
    if not isinstance(value, datetime):
        raise InvalidFieldError(field, "must be a datetime")
    return to_utc(value, field)


class WebhookOperations:
    """What an operator can do with webhooks; the actuator and the CLI are thin over it.

    Every method validates its input fully before it changes anything, and raises the package's
    own errors. Every method that reads or changes subscriptions or deliveries takes a keyword
    ``tenant`` (:data:`~flask_harvest.webhooks.tenants.TenantScope`, every tenant by default): a row
    of another tenant is then exactly as absent as one that does not exist.
    """

    def __init__(
        self,
        store: OutboundWebhookHandler,
        backend: JobBackend,
        manager: OutboundWebhookManager,
        settings: Settings,
    ) -> None:
        self.store = store
        self.backend = backend
        self.manager = manager
        self.settings = settings

    def __repr__(self) -> str:
        return f"<WebhookOperations store={self.store!r}>"

    def _check_target(self, url: str, tenant: str | None) -> None:
        validate_target(url, self.settings.ssrf_policy_for(tenant))

    def _check_headers(self, headers: Mapping[str, str] | None) -> None:
        # The model refuses the default signature header; this one is configured.
        if headers is not None:
            validate_headers(headers, signature_header=self.settings.webhooks_signature_header)

    def create_subscription(
        self,
        *,
        target_url: str,
        event_topics: Sequence[str],
        secret: str | None = None,
        subscription_id: str | None = None,
        description: str = "",
        payload_filter: Condition | Mapping[str, Any] | None = None,
        headers: Mapping[str, str] | None = None,
        rate_limit: RateLimit | Mapping[str, Any] | None = None,
        ordering_policy: OrderingPolicy | str = DEFAULT_ORDERING_POLICY,
        tenant: str | None = None,
    ) -> NewSecret:
        """Validate and store a subscription; a missing secret is generated.

        A secret without the ``whsec_`` prefix is stored in that form (:func:`standard_secret`: the
        same signing key), so that every receiver library can verify with the secret returned.

        :param payload_filter: a condition (or its JSON form): deliveries are made only of the
            payloads it holds on. ``None``: every payload.
        :param headers: custom headers sent with every delivery (not secrets: they are shown).
        :param rate_limit: at most this many deliveries per second, with this burst (or its JSON
            form, ``{"per_second": ..., "burst": ...}``), across every worker. ``None``: no limit.
        :param ordering_policy: what an ordering key does when its head is dead-lettered:
            ``block`` (wait for an operator, the default) or ``skip`` (move on).
        :param tenant: the tenant the subscription belongs to (it receives that tenant's events
            only); ``None``: no tenant.
        :raises InvalidFieldError: a field is invalid, or the URL is refused by the SSRF policy.
        :raises DuplicateSubscriptionError: the id is taken.
        """
        if subscription_id == OPERATIONAL_SUBSCRIPTION_ID:
            raise InvalidFieldError(
                "id",
                f"{OPERATIONAL_SUBSCRIPTION_ID!r} is reserved for the operational endpoint, which "
                "HARVEST_OPERATIONAL_WEBHOOK_URL sets up; choose another id",
            )
        extra: dict[str, Any] = {"id": subscription_id} if subscription_id is not None else {}
        subscription = WebhookSubscription(
            target_url=target_url,
            # Anything not a list of topics (an int, None) is the model's to refuse, by field name.
            event_topics=tuple(event_topics) if isinstance(event_topics, list | tuple) else event_topics,
            secret=secret if secret is not None else generate_secret(),
            description=description,
            payload_filter=validate_filter(payload_filter),
            headers={} if headers is None else headers,
            rate_limit=validate_rate_limit(rate_limit),
            ordering_policy=validate_ordering_policy(ordering_policy),
            tenant=validate_tenant(tenant),
            **extra,
        )
        self._check_headers(subscription.headers)
        self._check_target(target_url, subscription.tenant)
        chosen = standard_secret(subscription.secret)
        subscription = subscription.replace(secret=chosen)
        return NewSecret(self.store.add_subscription(subscription), chosen)

    def install_operational_endpoint(self) -> WebhookSubscription | None:
        """Make the reserved operational subscription match ``HARVEST_OPERATIONAL_WEBHOOK_URL``
        and its secret, and list the notifications in the event catalog; return it (``None``, and
        nothing read or written, when no endpoint is configured).

        Created when missing; its URL and topics set when they differ; a new secret rotated in
        (the old one signs too for ``HARVEST_WEBHOOKS_SECRET_GRACE_SECONDS``). Its status is left
        as it is: once turned off, an operator enables it again, as any subscription. Safe to run
        from several processes at once.
        """
        wanted = operational.subscription_for(self.settings)
        if wanted is None:
            return None
        operational.register(self.manager.catalog)
        current = self.store.get_subscription(wanted.id)
        if current is None:
            try:
                return self.store.add_subscription(wanted)
            except DuplicateSubscriptionError:  # another process created it a moment ago
                current = self.store.get_subscription(wanted.id)
                if current is None:
                    raise
        if current.target_url != wanted.target_url or set(current.event_topics) != set(wanted.event_topics):
            changes = SubscriptionChanges(target_url=wanted.target_url, event_topics=wanted.event_topics)
            current = self.store.update_subscription(wanted.id, changes)
        if current.secret != wanted.secret:
            grace = timedelta(seconds=self.settings.webhooks_secret_grace_seconds)
            current = self.store.rotate_secret(wanted.id, wanted.secret, previous_expires_at=utcnow() + grace)
        return current

    def operational_status(self, *, tenant: TenantScope = ALL_TENANTS) -> dict[str, Any]:
        """The operational endpoint as an operator checks it: whether one is configured, its
        reserved subscription (status, failures, URL; never the secret), the kinds it is sent,
        the rate-limit threshold, and its latest notifications (newest first).

        :raises SubscriptionNotFoundError: ``tenant`` is a tenant: the endpoint is the
            application's own, untenanted, so it is absent from a tenant's scope.
        """
        self._operational_in_scope(tenant)
        configured = operational.enabled(self.settings)
        found = self.store.get_subscription(OPERATIONAL_SUBSCRIPTION_ID) if configured else None
        recent, _ = (
            self.deliveries_page(subscription_id=OPERATIONAL_SUBSCRIPTION_ID, limit=OPERATIONAL_RECENT)
            if found is not None
            else ([], None)
        )
        return {
            "configured": configured,
            "subscription": None if found is None else found.to_dict(),
            "kinds": list(operational.KINDS),
            "rate_limit_hold_seconds": self.settings.operational_rate_limit_hold_seconds,
            "recent": [d.to_dict() for d in recent],
        }

    def send_operational_test(self, *, tenant: TenantScope = ALL_TENANTS) -> tuple[DeliveryLog, str | None]:
        """Log a test notification to the operational endpoint and queue it; return its delivery,
        and why its job could not be queued (the sweeper queues it later) or ``None``.

        :raises InvalidStateError: no endpoint is configured, or its subscription is turned off
            (enable it first: a test would only be dead-lettered).
        :raises SubscriptionNotFoundError: ``tenant`` is a tenant (see :meth:`operational_status`).
        """
        self._operational_in_scope(tenant)
        notice = operational.test_notice(self.settings, utcnow())
        found = self.store.get_subscription(OPERATIONAL_SUBSCRIPTION_ID) if notice is not None else None
        if notice is None or found is None:
            raise InvalidStateError(
                "no operational endpoint is configured: set HARVEST_OPERATIONAL_WEBHOOK_URL and "
                "HARVEST_OPERATIONAL_WEBHOOK_SECRET"
            )
        if found.status is not WebhookSubscriptionStatus.ACTIVE:
            raise InvalidStateError(
                f"the operational endpoint is {found.status.value}: enable {OPERATIONAL_SUBSCRIPTION_ID} "
                "first (a test sent now would be dead-lettered)"
            )
        self.store.log_deliveries([notice])
        return notice, self._enqueue([notice])

    def send_test_event(
        self, subscription_id: str, event_type: str, *, tenant: TenantScope = ALL_TENANTS
    ) -> tuple[DeliveryLog, str | None]:
        """Send the catalog's example payload of ``event_type`` to one subscription only, as a
        delivery like any other (signed, retried, listed); return it, and why its job could not be
        queued (the sweeper queues it later) or ``None``.

        The subscription's topics and payload filter are not consulted: the receiver asked for
        this event to see what it looks like.

        :raises SubscriptionNotFoundError: no such subscription (in the ``tenant`` scope).
        :raises EventTypeNotFoundError: the catalog has no such type.
        :raises InvalidStateError: the subscription is not active (a test would be dead-lettered).
        """
        scope = validate_scope(tenant)
        subscription = self.get_subscription(subscription_id, tenant=scope)
        chosen = self.event_type(event_type)
        if not subscription.is_active:
            raise InvalidStateError(
                f"the endpoint is {subscription.status.value}: enable it first (a test event sent "
                "now would not be delivered)"
            )
        now = utcnow()
        delivery = DeliveryLog(
            id=new_id("msg"),
            subscription_id=subscription.id,
            topic=chosen.name,
            payload=encode_payload(chosen.example),
            max_attempts=self.settings.webhooks_max_attempts,
            timestamp=now,
            next_attempt_at=now,
            created_at=now,
            tenant=subscription.tenant,
        )
        self.store.log_deliveries([delivery])
        return delivery, self._enqueue([delivery])

    @staticmethod
    def _operational_in_scope(tenant: TenantScope) -> None:
        # The reserved subscription is untenanted: in a tenant's scope it is as absent as any row
        # of another tenant (and its notifications, which name tenants, are not listed).
        if not in_scope(validate_scope(tenant), None):
            raise SubscriptionNotFoundError(OPERATIONAL_SUBSCRIPTION_ID)

    def topic_warnings(self, event_topics: Sequence[str] | None) -> list[str]:
        """Return a warning for each of a subscription's topic patterns that selects no event type
        in the catalog (none without a catalog, or for ``None``: topics left unchanged).

        A warning, not an error: the type may be registered later, or by another process.
        """
        if event_topics is None:
            return []
        return self.manager.catalog.unmatched_patterns(event_topics)

    def event_types(self) -> list[EventType]:
        """Return every event type in the catalog, by name."""
        return self.manager.catalog.types()

    def event_type(self, name: str) -> EventType:
        """Return the event type ``name``, or raise :class:`EventTypeNotFoundError`."""
        found = self.manager.catalog.get(name)
        if found is None:
            raise EventTypeNotFoundError(name if isinstance(name, str) else repr(name))
        return found

    def list_subscriptions(self, *, tenant: TenantScope = ALL_TENANTS) -> list[WebhookSubscription]:
        """Return every subscription (of the ``tenant`` scope), oldest first."""
        return self.store.list_subscriptions(tenant=validate_scope(tenant))

    def troubled_subscriptions(
        self, *, limit: int = 50, tenant: TenantScope = ALL_TENANTS
    ) -> list[WebhookSubscription]:
        """Return at most ``limit`` disabled or failing subscriptions, the most failures first.

        :raises InvalidFieldError: a limit outside 1 to 500.
        """
        _check_limit(limit)
        return self.store.troubled_subscriptions(limit=limit, tenant=validate_scope(tenant))

    def subscriptions_page(
        self,
        *,
        limit: int = 50,
        cursor: str | None = None,
        status: WebhookSubscriptionStatus | None = None,
        topic: str | None = None,
        tenant: TenantScope = ALL_TENANTS,
    ) -> tuple[list[WebhookSubscription], str | None]:
        """Return one page of subscriptions, oldest first, in ``status`` and/or selecting the event
        ``topic``, and the cursor of the next page (or ``None``): a keyset walk, never a count.

        :raises InvalidFieldError: a limit outside 1 to 500, a bad cursor or filter.
        """
        _check_limit(limit)
        if status is not None and not isinstance(status, WebhookSubscriptionStatus):
            raise InvalidFieldError("status", "must be a WebhookSubscriptionStatus")
        rows = self.store.list_subscriptions_page(
            limit=limit + 1,
            after=decode_position(cursor) if cursor else None,
            status=status,
            topic=validate_topic(topic, pattern=False) if topic is not None else None,
            tenant=validate_scope(tenant),
        )
        page = rows[:limit]
        return page, encode_position(page[-1].created_at, page[-1].id) if len(rows) > limit else None

    def remove_subscription(self, subscription_id: str, *, tenant: TenantScope = ALL_TENANTS) -> None:
        """Delete a subscription; its delivery logs stay.

        :raises SubscriptionNotFoundError: no such subscription (in the ``tenant`` scope).
        """
        scope = validate_scope(tenant)
        looked_up = _lookup(subscription_id, SubscriptionNotFoundError)
        if not self.store.remove_subscription(looked_up, tenant=scope):
            raise SubscriptionNotFoundError(subscription_id)

    def get_subscription(
        self, subscription_id: str, *, tenant: TenantScope = ALL_TENANTS
    ) -> WebhookSubscription:
        """Return the subscription or raise :class:`SubscriptionNotFoundError` (also for one that
        is not in the ``tenant`` scope)."""
        scope = validate_scope(tenant)
        looked_up = _lookup(subscription_id, SubscriptionNotFoundError)
        subscription = self.store.get_subscription(looked_up, tenant=scope)
        if subscription is None:
            raise SubscriptionNotFoundError(subscription_id)
        return subscription

    def update_subscription(
        self,
        subscription_id: str,
        *,
        target_url: str | None = None,
        event_topics: Sequence[str] | None = None,
        description: str | None = None,
        status: WebhookSubscriptionStatus | None = None,
        payload_filter: Condition | Mapping[str, Any] | None = None,
        remove_payload_filter: bool = False,
        headers: Mapping[str, str] | None = None,
        rate_limit: RateLimit | Mapping[str, Any] | None = None,
        remove_rate_limit: bool = False,
        ordering_policy: OrderingPolicy | str | None = None,
        tenant: TenantScope = ALL_TENANTS,
    ) -> WebhookSubscription:
        """Change a subscription's URL, topics, description, status (enable/disable), payload
        filter, custom headers, rate limit or ordering policy; what is ``None`` is kept.

        Setting the ordering policy to ``skip`` releases the keys held by a dead-lettered head:
        the sweeper queues their next deliveries.

        Enabling clears the failure count. A ``failed`` status cannot be set by hand.
        ``remove_payload_filter`` removes the filter; ``headers`` replaces every custom header
        (``{}`` removes them); ``remove_rate_limit`` removes the rate limit. Everything is
        validated before anything is written. A subscription keeps its tenant.
        """
        scope = validate_scope(tenant)
        if target_url is not None:
            # The subscription's own tenant decides the policy (the scope may be every tenant).
            self._check_target(target_url, self.get_subscription(subscription_id, tenant=scope).tenant)
        if status is WebhookSubscriptionStatus.FAILED:
            raise InvalidFieldError(
                "status", "set 'active' or 'disabled'; 'failed' is set by the failure threshold"
            )
        # Validated before anything is written; the store writes only the fields given.
        changes = SubscriptionChanges(
            target_url=target_url,
            event_topics=event_topics,
            description=description,
            status=status,
            payload_filter=payload_filter,
            remove_payload_filter=remove_payload_filter,
            headers=headers,
            rate_limit=rate_limit,
            remove_rate_limit=remove_rate_limit,
            ordering_policy=None if ordering_policy is None else validate_ordering_policy(ordering_policy),
        )
        self._check_headers(changes.headers)
        if not changes.values():
            return self.get_subscription(subscription_id, tenant=scope)
        looked_up = _lookup(subscription_id, SubscriptionNotFoundError)
        return self.store.update_subscription(looked_up, changes, tenant=scope)

    def rotate_secret(
        self,
        subscription_id: str,
        *,
        new_secret: str | None = None,
        grace_seconds: float | None = None,
        tenant: TenantScope = ALL_TENANTS,
        after: datetime | AnyRotation | None = ANY_ROTATION,
    ) -> NewSecret:
        """Give a subscription a new secret; the old one keeps signing for ``grace_seconds``.

        During the grace period every delivery carries signatures from both secrets, so the receiver
        can switch without downtime. The default grace is ``HARVEST_WEBHOOKS_SECRET_GRACE_SECONDS``.

        :param after: rotate only if the last rotation is still the one the caller saw (its
            ``previous_secret_expires_at``; ``None``: never rotated): a form sent twice rotates
            once, and the first rotation keeps its grace period.
        :raises InvalidStateError: ``after`` is given and the secret was rotated since.
        """
        scope = validate_scope(tenant)
        _lookup(subscription_id, SubscriptionNotFoundError)
        grace = self.settings.webhooks_secret_grace_seconds if grace_seconds is None else grace_seconds
        # A huge number would overflow the expiry time.
        check_number(grace, "grace_seconds", low=0, high=MAX_GRACE_SECONDS)
        chosen = standard_secret(new_secret) if new_secret is not None else generate_secret()
        expires = utcnow() + timedelta(seconds=grace)
        return NewSecret(
            self.store.rotate_secret(
                subscription_id, chosen, previous_expires_at=expires, tenant=scope, after=after
            ),
            chosen,
        )

    def replay(self, delivery_id: str, *, tenant: TenantScope = ALL_TENANTS) -> ReplayResult:
        """Replay one dead-lettered delivery: attempt 1 again, same id, a fresh job.

        :raises DeliveryNotFoundError: no such delivery (in the ``tenant`` scope).
        :raises InvalidStateError: the delivery is not dead-lettered.
        """
        scope = validate_scope(tenant)
        looked_up = _lookup(delivery_id, DeliveryNotFoundError)
        replayed = self.store.replay_delivery(looked_up, now=utcnow(), tenant=scope)
        row = ReplayRow(replayed.id, ReplayOutcome.REPLAYED)
        return ReplayResult([row], enqueue_error=self._enqueue([replayed]))

    def replay_many(
        self,
        *,
        subscription_id: str | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
        limit: int = 100,
        dry_run: bool = False,
        tenant: TenantScope = ALL_TENANTS,
    ) -> ReplayResult:
        """Replay the DLQ of one subscription and/or a time window, newest first, at most ``limit``.

        Each selected delivery is replayed on its own, and the result says what became of each: a
        delivery that left the DLQ (or was deleted) after the selection was read is reported with
        the reason, and the others are replayed all the same. With ``dry_run``, report what would
        be replayed and change nothing.

        :raises InvalidFieldError: no selector, a bad window or limit (nothing is replayed).
        :raises SubscriptionNotFoundError: no such subscription (nothing is replayed).
        """
        scope = validate_scope(tenant)
        since, until = _window(since, "since"), _window(until, "until")
        if subscription_id is None and since is None and until is None:
            raise InvalidFieldError(
                "subscription_id", "give a subscription_id, a since/until window, or both"
            )
        if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_BULK_REPLAY:
            raise InvalidFieldError("limit", f"must be between 1 and {MAX_BULK_REPLAY}")
        if since is not None and until is not None and since >= until:
            raise InvalidFieldError("since", "must be earlier than until")
        if subscription_id is not None:
            self.get_subscription(subscription_id, tenant=scope)
        candidates = self.store.list_dlq(
            limit=limit, subscription_id=subscription_id, since=since, until=until, tenant=scope
        )
        if dry_run:
            return ReplayResult(
                [ReplayRow(d.id, ReplayOutcome.WOULD_REPLAY) for d in candidates], dry_run=True
            )
        return self._replay_each([d.id for d in candidates], scope)

    def replay_selected(
        self, delivery_ids: Sequence[str], *, tenant: TenantScope = ALL_TENANTS
    ) -> ReplayResult:
        """Replay the chosen deliveries (the dashboard's "replay selected"), each on its own: one
        that is not in the DLQ, or not there at all, is reported with the reason and the others
        are replayed all the same.

        :raises InvalidFieldError: (field ``delivery_id``) no id, or more than
            :data:`MAX_BULK_REPLAY` (nothing is replayed).
        """
        scope = validate_scope(tenant)
        if not delivery_ids or len(delivery_ids) > MAX_BULK_REPLAY:
            raise InvalidFieldError("delivery_id", f"choose between 1 and {MAX_BULK_REPLAY} deliveries")
        return self._replay_each(list(dict.fromkeys(delivery_ids)), scope)

    def _replay_each(self, delivery_ids: Sequence[str], tenant: TenantScope) -> ReplayResult:
        now = utcnow()
        rows: list[ReplayRow] = []
        replayed: list[DeliveryLog] = []
        for delivery_id in delivery_ids:
            # Another operator's replay (or a purge) may get to a row first: the rows before it are
            # already pending, so an error now would leave the call half done and unreported.
            try:
                looked_up = _lookup(delivery_id, DeliveryNotFoundError)
                replayed.append(self.store.replay_delivery(looked_up, now=now, tenant=tenant))
            except DeliveryNotFoundError as exc:
                rows.append(ReplayRow(delivery_id, ReplayOutcome.NOT_FOUND, str(exc)))
            except InvalidStateError as exc:
                rows.append(ReplayRow(delivery_id, ReplayOutcome.NOT_REPLAYABLE, str(exc)))
            else:
                rows.append(ReplayRow(delivery_id, ReplayOutcome.REPLAYED))
        return ReplayResult(rows, enqueue_error=self._enqueue(replayed) if replayed else None)

    def skip(self, delivery_id: str, *, tenant: TenantScope = ALL_TENANTS) -> DeliveryLog:
        """Give up on a dead-lettered delivery: it becomes ``SKIPPED`` and is never sent, and the
        next delivery of its ordering key (if any) is queued at once. Replay is the other way to
        release a key held under the ``block`` policy.

        :raises DeliveryNotFoundError: no such delivery (in the ``tenant`` scope).
        :raises InvalidStateError: the delivery is not dead-lettered.
        """
        scope = validate_scope(tenant)
        skipped = self.store.skip_delivery(
            _lookup(delivery_id, DeliveryNotFoundError),
            reason=SKIPPED_BY_OPERATOR,
            now=utcnow(),
            tenant=scope,
        )
        if skipped.ordering_key is not None:
            # Unscoped: the line is one subscription's, so its next delivery is of the same tenant.
            following = self.store.next_in_line(skipped.subscription_id, skipped.ordering_key)
            # Not queued (the backend is down): the next delivery is due at its line's head, and
            # the sweeper queues it.
            self._enqueue_schedules(following)
        return skipped

    def blocked_keys(
        self, subscription_id: str, *, limit: int = 50, tenant: TenantScope = ALL_TENANTS
    ) -> list[BlockedKey]:
        """The ordering keys of a subscription that wait for an operator (their head is
        dead-lettered under the ``block`` policy), by key, at most ``limit``.

        :raises SubscriptionNotFoundError: no such subscription (in the ``tenant`` scope).
        """
        scope = validate_scope(tenant)
        _check_limit(limit)
        self.get_subscription(subscription_id, tenant=scope)
        return self.store.blocked_keys(subscription_id, limit=limit, tenant=scope)

    def _enqueue_schedules(self, schedules: Sequence[DeliverySchedule]) -> str | None:
        try:
            self.backend.enqueue([delivery_job(s) for s in schedules])
        except JobBackendError as exc:
            return str(exc)
        return None

    def _enqueue(self, deliveries: list[DeliveryLog]) -> str | None:
        try:
            self.manager.hand_over_logged(deliveries)
        except JobBackendError as exc:
            # The rows are PENDING and due: the sweeper queues them once the backend is back.
            return str(exc)
        return None

    def dlq_page(
        self,
        *,
        limit: int = 50,
        cursor: str | None = None,
        subscription_id: str | None = None,
        topic: str | None = None,
        tenant: TenantScope = ALL_TENANTS,
    ) -> tuple[list[DeliveryLog], str | None]:
        """Return one page of the DLQ, newest first, and the cursor of the next page (or ``None``)."""
        return self.deliveries_page(
            state=DeliveryState.DLQ,
            limit=limit,
            cursor=cursor,
            subscription_id=subscription_id,
            topic=topic,
            tenant=tenant,
        )

    def deliveries_page(
        self,
        *,
        state: DeliveryState | None = None,
        limit: int = 50,
        cursor: str | None = None,
        subscription_id: str | None = None,
        topic: str | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
        tenant: TenantScope = ALL_TENANTS,
    ) -> tuple[list[DeliveryLog], str | None]:
        """Return one page of deliveries (in ``state``, or any), newest first by their latest
        attempt, and the cursor of the next page (or ``None``): a keyset walk, never a count."""
        return self._page(
            self.store.list_deliveries, state, limit, cursor, subscription_id, topic, since, until, tenant
        )

    def delivery_summaries_page(
        self,
        *,
        state: DeliveryState | None = None,
        limit: int = 50,
        cursor: str | None = None,
        subscription_id: str | None = None,
        topic: str | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
        tenant: TenantScope = ALL_TENANTS,
    ) -> tuple[list[DeliverySummary], str | None]:
        """:meth:`deliveries_page` as :class:`DeliverySummary` values (what a list page shows),
        with the same checks and cursors."""
        return self._page(
            self.store.list_delivery_summaries,
            state,
            limit,
            cursor,
            subscription_id,
            topic,
            since,
            until,
            tenant,
        )

    def count_deliveries(
        self,
        *,
        state: DeliveryState | None = None,
        subscription_id: str | None = None,
        topic: str | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
        cap: int = 1000,
        tenant: TenantScope = ALL_TENANTS,
    ) -> int:
        """How many deliveries :meth:`delivery_summaries_page` lists with these filters, counting at
        most ``cap`` (a count equal to ``cap`` means "at least"): a list page's total, in one
        bounded read (the SQL store's is one statement), with the listing's checks."""
        scope = validate_scope(tenant)
        since, until = _window(since, "since"), _window(until, "until")
        if since is not None and until is not None and since >= until:
            raise InvalidFieldError("since", "must be earlier than until")
        return self.store.count_deliveries(
            tenant=scope,
            cap=cap,
            state=state,
            subscription_id=_filter(subscription_id, "subscription_id"),
            topic=_filter(topic, "topic"),
            since=since,
            until=until,
        )

    def _page(
        self,
        listing: Callable[..., list[_Listed]],
        state: DeliveryState | None,
        limit: int,
        cursor: str | None,
        subscription_id: str | None,
        topic: str | None,
        since: datetime | None,
        until: datetime | None,
        tenant: TenantScope,
    ) -> tuple[list[_Listed], str | None]:
        scope = validate_scope(tenant)
        _check_limit(limit)
        since, until = _window(since, "since"), _window(until, "until")
        if since is not None and until is not None and since >= until:
            raise InvalidFieldError("since", "must be earlier than until")
        before = decode_cursor(cursor) if cursor else None
        rows = listing(
            limit=limit + 1,
            before=before,
            state=state,
            subscription_id=_filter(subscription_id, "subscription_id"),
            topic=_filter(topic, "topic"),
            since=since,
            until=until,
            tenant=scope,
        )
        page = rows[:limit]
        return page, encode_cursor(page[-1]) if len(rows) > limit else None

    def attempts_per_minute(self, *, minutes: int = 60) -> list[tuple[datetime, int, int]]:
        """Return ``(minute, succeeded, failed)`` for each of the last ``minutes`` minutes, oldest
        first, with zeros for quiet minutes (the current, partial minute is the last)."""
        check_number(minutes, "minutes", low=1, high=24 * 60, integer=True)
        end = utcnow().replace(second=0, microsecond=0) + timedelta(minutes=1)
        start = end - timedelta(minutes=minutes)
        rows = self.store.attempts_per_minute(since=start, until=end)
        counted = {when: (ok, failed) for when, ok, failed in rows}
        return [
            (start + timedelta(minutes=n), *counted.get(start + timedelta(minutes=n), (0, 0)))
            for n in range(minutes)
        ]

    def overall_stats(self, *, tenant: TenantScope = ALL_TENANTS) -> dict[str, Any]:
        """Return :meth:`stats`' ``overall`` part alone (the dashboard's overview): the same
        capped counts, without a dictionary per subscription."""
        overall, _ = self.store.delivery_stats(cap=STATS_COUNT_CAP, tenant=validate_scope(tenant))
        return overall.to_dict(utcnow())

    def stats(self, *, tenant: TenantScope = ALL_TENANTS) -> dict[str, Any]:
        """Return delivery counts by state, DLQ depth and oldest pending age: overall and per
        subscription, each state counted up to :data:`STATS_COUNT_CAP` (``capped`` says which
        stopped there); of the ``tenant`` scope's deliveries."""
        now = utcnow()
        overall, per_subscription = self.store.delivery_stats(
            cap=STATS_COUNT_CAP, tenant=validate_scope(tenant)
        )
        return {
            "overall": overall.to_dict(now),
            "subscriptions": {sub: s.to_dict(now) for sub, s in sorted(per_subscription.items())},
        }

    def delivery_with_attempts(
        self, delivery_id: str, *, tenant: TenantScope = ALL_TENANTS
    ) -> dict[str, Any]:
        """Return a delivery's JSON form with its attempt history under ``attempts``.

        :raises DeliveryNotFoundError: no such delivery (in the ``tenant`` scope).
        """
        scope = validate_scope(tenant)
        delivery = self.store.get_delivery(_lookup(delivery_id, DeliveryNotFoundError), tenant=scope)
        if delivery is None:
            raise DeliveryNotFoundError(delivery_id)
        return {
            **delivery.to_dict(),
            "attempts": [a.to_dict() for a in self.store.list_attempts(delivery_id, tenant=scope)],
        }

    def purge_delivered(self, cutoff: datetime) -> int:
        """Delete delivered logs whose last attempt is before ``cutoff``; return how many."""
        checked = _window(cutoff, "cutoff")
        if checked is None:
            raise InvalidFieldError("cutoff", "must be a datetime")
        return self.store.purge_deliveries_before(checked)

    def relay_outbox(self, *, limit: int = 500) -> tuple[int, int]:
        """Relay committed outbox messages until none are left or one fails; return (relayed, failed).

        :raises ConfigurationError: the store has no outbox.
        """
        self._outbox()
        # A limit under 1 would relay nothing and ask again forever.
        check_number(limit, "limit", low=1, high=MAX_RELAY_BATCH, integer=True)
        relayed = failed = 0
        while True:
            report = self.manager.relay_outbox(limit=limit)
            relayed += report.relayed
            failed += report.failed
            if report.relayed + report.failed < limit or report.failed:
                return relayed, failed

    def purge_outbox(self, older_than_seconds: float | None = None) -> tuple[int, float]:
        """Delete relayed outbox messages older than ``older_than_seconds`` (default: the retention
        setting); return how many and the age used.

        :raises ConfigurationError: the store has no outbox.
        """
        seconds = self.settings.outbox_retention_seconds if older_than_seconds is None else older_than_seconds
        check_number(seconds, "older_than_seconds", low=0, high=MAX_RETENTION_SECONDS)
        removed = self._outbox().purge_relayed_before(utcnow() - timedelta(seconds=seconds))
        return removed, seconds

    def _outbox(self) -> SqlOutbox:
        if self.manager.outbox is None:
            raise ConfigurationError("the outbox needs the SQL store; this app uses another store")
        return self.manager.outbox
