"""A thread-safe store in process memory, for tests and local development."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

from ..._time import utcnow
from ...errors import (
    DeliveryNotFoundError,
    DuplicateSubscriptionError,
    InvalidStateError,
    SubscriptionNotFoundError,
)
from ..models import (
    AttemptResult,
    Claim,
    DeliveryAttempt,
    DeliveryLog,
    DeliveryState,
    DeliveryStats,
    SubscriptionChanges,
    SubscriptionEffect,
    WebhookSubscription,
    WebhookSubscriptionStatus,
    claimed_subscription,
)
from ..ordering import DEFAULT_ORDERING_POLICY, OrderingPolicy, at_head, next_in_line, position
from ..tenants import ALL_TENANTS, TenantScope, in_scope
from ..topic_index import pattern_key, topic_keys
from .base import (
    ANY_ROTATION,
    AnyRotation,
    BlockedKey,
    DeliverySchedule,
    DlqCursor,
    OutboundWebhookHandler,
    StoreCapabilities,
    capped_groups,
    fold_stats,
    minute_buckets,
)


class InMemoryOutboundWebhookHandler(OutboundWebhookHandler):
    """Subscriptions and delivery logs in plain dictionaries behind one lock.

    It is process-local: everything is lost on restart and nothing is shared between processes or
    replicas. It is also unbounded: every dispatch adds a log per matching subscription and
    nothing removes them but :meth:`purge_deliveries_before`, so memory grows with dispatch volume
    for the life of the process. A retry does not add a row: the log is updated in place, and only
    the latest attempt is kept (:meth:`list_attempts` returns that one). Use it for tests and local
    development; anything long-running or with more than one process needs the SQL store.
    """

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._subscriptions: dict[str, WebhookSubscription] = {}
        self._deliveries: dict[str, DeliveryLog] = {}
        self._latest_attempt: dict[str, DeliveryAttempt] = {}
        self._leases: dict[str, str] = {}
        # The topic index (as the SQL store's table): pattern key -> ids of the subscriptions
        # with a pattern under it, so dispatch looks at the candidates only.
        self._by_key: dict[str, set[str]] = {}
        # The last sequence number of each ordering key (the SQL store's ordering keys table).
        self._ordering_seqs: dict[str, int] = {}

    def __repr__(self) -> str:
        return f"<{type(self).__name__} subscriptions={len(self._subscriptions)}>"

    @property
    def capabilities(self) -> StoreCapabilities:
        return StoreCapabilities(ordering=True)

    # -- subscriptions -------------------------------------------------------------------------

    def add_subscription(self, subscription: WebhookSubscription) -> WebhookSubscription:
        with self._lock:
            if subscription.id in self._subscriptions:
                raise DuplicateSubscriptionError(subscription.id)
            self._subscriptions[subscription.id] = subscription
            self._file(subscription)
            return subscription

    def _file(self, subscription: WebhookSubscription) -> None:
        for pattern in subscription.event_topics:
            self._by_key.setdefault(pattern_key(pattern), set()).add(subscription.id)

    def _unfile(self, subscription: WebhookSubscription) -> None:
        for pattern in subscription.event_topics:
            key = pattern_key(pattern)
            ids = self._by_key.get(key)
            if ids is not None:
                ids.discard(subscription.id)
                if not ids:
                    del self._by_key[key]

    def subscriptions_for_topics(
        self, topics: Sequence[str], *, tenant: TenantScope = ALL_TENANTS
    ) -> dict[str, list[WebhookSubscription]]:
        return {topic: self.subscriptions_for_topic(topic, tenant=tenant) for topic in dict.fromkeys(topics)}

    def subscriptions_for_topic(
        self, topic: str, *, tenant: TenantScope = ALL_TENANTS
    ) -> list[WebhookSubscription]:
        with self._lock:
            ids = {i for key in topic_keys(topic) for i in self._by_key.get(key, ())}
            # A long pattern's key selects a superset: the matcher has the last word.
            found = [self._subscriptions[i] for i in ids]
        chosen = (s for s in found if in_scope(tenant, s.tenant) and s.matches(topic))
        return sorted(chosen, key=lambda s: (s.created_at, s.id))

    def get_subscription(
        self, subscription_id: str, *, tenant: TenantScope = ALL_TENANTS
    ) -> WebhookSubscription | None:
        with self._lock:
            found = self._subscriptions.get(subscription_id)
        return found if found is not None and in_scope(tenant, found.tenant) else None

    def list_subscriptions(self, *, tenant: TenantScope = ALL_TENANTS) -> list[WebhookSubscription]:
        with self._lock:
            chosen = [s for s in self._subscriptions.values() if in_scope(tenant, s.tenant)]
        return sorted(chosen, key=lambda s: (s.created_at, s.id))

    def update_subscription(
        self, subscription_id: str, changes: SubscriptionChanges, *, tenant: TenantScope = ALL_TENANTS
    ) -> WebhookSubscription:
        return self._change(subscription_id, tenant, **changes.values())

    def rotate_secret(
        self,
        subscription_id: str,
        secret: str,
        *,
        previous_expires_at: datetime,
        tenant: TenantScope = ALL_TENANTS,
        after: datetime | AnyRotation | None = ANY_ROTATION,
    ) -> WebhookSubscription:
        with self._lock:
            current = self._get(subscription_id, tenant)
            if after is not ANY_ROTATION and current.previous_secret_expires_at != after:
                raise InvalidStateError("the secret was rotated since; it was not rotated again")
            return self._change(
                subscription_id,
                tenant,
                secret=secret,
                previous_secret=current.secret,
                previous_secret_expires_at=previous_expires_at,
            )

    def _get(self, subscription_id: str, tenant: TenantScope) -> WebhookSubscription:
        subscription = self._subscriptions.get(subscription_id)
        if subscription is None or not in_scope(tenant, subscription.tenant):
            raise SubscriptionNotFoundError(subscription_id)
        return subscription

    def _change(self, subscription_id: str, tenant: TenantScope, **values: Any) -> WebhookSubscription:
        # Read and write under the lock, from the stored value: what a worker wrote stays.
        with self._lock:
            current = self._get(subscription_id, tenant)
            updated = current.replace(**values, updated_at=utcnow())
            self._unfile(current)
            self._subscriptions[subscription_id] = updated
            self._file(updated)
            return updated

    def remove_subscription(self, subscription_id: str, *, tenant: TenantScope = ALL_TENANTS) -> bool:
        with self._lock:
            found = self._subscriptions.get(subscription_id)
            if found is None or not in_scope(tenant, found.tenant):
                return False
            removed = self._subscriptions.pop(subscription_id, None)
            if removed is not None:
                self._unfile(removed)
            return removed is not None

    # -- delivery logs -------------------------------------------------------------------------

    def log_deliveries(self, deliveries: Sequence[DeliveryLog]) -> list[str]:
        inserted = []
        with self._lock:
            # One number per key per call, as the SQL store takes them.
            seqs: dict[str, int] = {}
            for delivery in deliveries:
                key = delivery.ordering_key
                if key is not None and delivery.ordering_seq is None:
                    if key not in seqs:
                        seqs[key] = self._ordering_seqs[key] = self._ordering_seqs.get(key, 0) + 1
                    delivery = delivery.replace(ordering_seq=seqs[key])
                if delivery.id not in self._deliveries:
                    self._deliveries[delivery.id] = delivery
                    inserted.append(delivery.id)
        return inserted

    def get_delivery(self, delivery_id: str, *, tenant: TenantScope = ALL_TENANTS) -> DeliveryLog | None:
        with self._lock:
            found = self._deliveries.get(delivery_id)
        return found if found is not None and in_scope(tenant, found.tenant) else None

    def get_deliveries(
        self, delivery_ids: Sequence[str], *, tenant: TenantScope = ALL_TENANTS
    ) -> list[DeliveryLog]:
        with self._lock:
            found = [self._deliveries[i] for i in delivery_ids if i in self._deliveries]
        return [d for d in found if in_scope(tenant, d.tenant)]

    def list_attempts(self, delivery_id: str, *, tenant: TenantScope = ALL_TENANTS) -> list[DeliveryAttempt]:
        with self._lock:
            if self.get_delivery(delivery_id, tenant=tenant) is None:
                return []
            latest = self._latest_attempt.get(delivery_id)
            return [latest] if latest else []

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
        with self._lock:
            rows = [
                d
                for d in self._deliveries.values()
                if in_scope(tenant, d.tenant)
                and (state is None or d.state is state)
                and (subscription_id is None or d.subscription_id == subscription_id)
                and (topic is None or d.topic == topic)
                and (before is None or (d.timestamp, d.id) < before)
                and (since is None or d.timestamp >= since)
                and (until is None or d.timestamp < until)
            ]
        rows.sort(key=lambda d: (d.timestamp, d.id), reverse=True)
        return rows[:limit]

    def attempts_per_minute(self, *, since: datetime, until: datetime) -> list[tuple[datetime, int, int]]:
        with self._lock:
            started = [
                (a.started_at, a.response_status)
                for a in self._latest_attempt.values()
                if since <= a.started_at < until
            ]
        return minute_buckets(started)

    def delivery_stats(
        self, *, cap: int | None = None, tenant: TenantScope = ALL_TENANTS
    ) -> tuple[DeliveryStats, dict[str, DeliveryStats]]:
        with self._lock:
            deliveries = [d for d in self._deliveries.values() if in_scope(tenant, d.tenant)]
        if cap is not None:
            groups, capped = capped_groups(deliveries, cap)
            return fold_stats(groups, cap=cap, capped=capped)
        return fold_stats((d.subscription_id, d.state.value, 1, d.created_at) for d in deliveries)

    def queue_gauges(self, *, now: datetime, dlq_limit: int) -> tuple[int, datetime | None]:
        with self._lock:
            dlq = sum(1 for d in self._deliveries.values() if d.state is DeliveryState.DLQ)
            pending = (d for d in self._deliveries.values() if d.state is DeliveryState.PENDING)
            due = [d.next_attempt_at for d in pending if d.next_attempt_at and d.next_attempt_at <= now]
        return min(dlq, dlq_limit), min(due, default=None)

    def purge_deliveries_before(self, cutoff: datetime) -> int:
        with self._lock:
            doomed = [
                d.id
                for d in self._deliveries.values()
                if d.state is DeliveryState.DELIVERED and d.timestamp < cutoff
            ]
            for delivery_id in doomed:
                del self._deliveries[delivery_id]
                self._latest_attempt.pop(delivery_id, None)
            return len(doomed)

    # -- the delivery pipeline -----------------------------------------------------------------

    def claim_delivery(
        self,
        delivery_id: str,
        *,
        now: datetime,
        lease_seconds: float,
        max_attempts: int,
    ) -> Claim | None:
        with self._lock:
            delivery = self._deliveries.get(delivery_id)
            if (
                delivery is None
                or delivery.state is not DeliveryState.PENDING
                or (delivery.next_attempt_at is not None and delivery.next_attempt_at > now)
                or not self._at_head(delivery)
            ):
                return None
            token = uuid.uuid4().hex
            claimed = delivery.replace(
                state=DeliveryState.INFLIGHT,
                lease_expires_at=now + timedelta(seconds=lease_seconds),
                max_attempts=max_attempts,
            )
            self._deliveries[delivery_id] = claimed
            self._leases[delivery_id] = token
            return Claim(
                claimed,
                claimed_subscription(claimed, self._subscriptions.get(delivery.subscription_id)),
                token,
            )

    def finish_attempt(
        self, delivery_id: str, lease_token: str, result: AttemptResult
    ) -> WebhookSubscriptionStatus | None:
        with self._lock:
            delivery = self._deliveries.get(delivery_id)
            if (
                delivery is None
                or delivery.state is not DeliveryState.INFLIGHT
                or self._leases.get(delivery_id) != lease_token
            ):
                raise InvalidStateError(f"the lease on delivery {delivery_id!r} was lost")
            del self._leases[delivery_id]
            attempt = result.attempt
            self._deliveries[delivery_id] = delivery.replace(
                state=result.state,
                attempt=result.attempt_number,
                next_attempt_at=result.next_attempt_at,
                last_error=result.last_error,
                timestamp=result.timestamp,
                lease_expires_at=None,
                request_headers=dict(result.request_headers) or delivery.request_headers,
                response_status=attempt.response_status if attempt else delivery.response_status,
                response_body=attempt.response_body if attempt else delivery.response_body,
                elapsed_ms=attempt.elapsed_ms if attempt else delivery.elapsed_ms,
            )
            if attempt is not None:
                self._latest_attempt[delivery_id] = attempt
            return self._apply_effect(delivery.subscription_id, result)

    def _apply_effect(self, subscription_id: str, result: AttemptResult) -> WebhookSubscriptionStatus | None:
        subscription = self._subscriptions.get(subscription_id)
        if subscription is None or result.effect is SubscriptionEffect.NONE:
            return None
        status = subscription.status
        failures = subscription.consecutive_failures
        if result.effect is SubscriptionEffect.RESET_FAILURES:
            failures = 0
        elif result.effect is SubscriptionEffect.COUNT_FAILURE:
            failures += 1
            if status is WebhookSubscriptionStatus.ACTIVE and failures >= result.failure_threshold:
                status = WebhookSubscriptionStatus.FAILED
        elif result.effect is SubscriptionEffect.DISABLE and status is WebhookSubscriptionStatus.ACTIVE:
            status = WebhookSubscriptionStatus.DISABLED
        self._subscriptions[subscription_id] = subscription.replace(
            status=status, consecutive_failures=failures, updated_at=utcnow()
        )
        return status if status is not subscription.status else None

    def dead_letter(self, delivery_ids: Sequence[str], error: str, *, now: datetime) -> list[str]:
        moved = []
        with self._lock:
            for delivery_id in delivery_ids:
                delivery = self._deliveries.get(delivery_id)
                if delivery is not None and delivery.state is DeliveryState.PENDING:
                    self._deliveries[delivery_id] = delivery.replace(
                        state=DeliveryState.DLQ, last_error=error, timestamp=now, next_attempt_at=None
                    )
                    moved.append(delivery_id)
        return moved

    def replay_delivery(
        self, delivery_id: str, *, now: datetime, tenant: TenantScope = ALL_TENANTS
    ) -> DeliveryLog:
        return self._move_dead_letter(
            delivery_id,
            tenant,
            "replayed",
            state=DeliveryState.PENDING,
            attempt=1,
            next_attempt_at=now,
            timestamp=now,
        )

    def _move_dead_letter(
        self, delivery_id: str, tenant: TenantScope, done: str, **changes: Any
    ) -> DeliveryLog:
        """Apply ``changes`` to a dead-lettered delivery in ``tenant``'s scope (another tenant's
        is not found); refuse one in another state, naming what ``done`` to it needs."""
        with self._lock:
            delivery = self._deliveries.get(delivery_id)
            if delivery is None or not in_scope(tenant, delivery.tenant):
                raise DeliveryNotFoundError(delivery_id)
            if delivery.state is not DeliveryState.DLQ:
                raise InvalidStateError(
                    f"delivery {delivery_id!r} is {delivery.state.value}, not dead-lettered; "
                    f"only deliveries in the DLQ can be {done}"
                )
            moved = delivery.replace(**changes)
            self._deliveries[delivery_id] = moved
            return moved

    def release_expired_leases(self, *, now: datetime) -> list[str]:
        released = []
        with self._lock:
            for delivery in list(self._deliveries.values()):
                if (
                    delivery.state is DeliveryState.INFLIGHT
                    and delivery.lease_expires_at is not None
                    and delivery.lease_expires_at < now
                ):
                    self._deliveries[delivery.id] = delivery.replace(
                        state=DeliveryState.PENDING, lease_expires_at=None, next_attempt_at=now
                    )
                    self._leases.pop(delivery.id, None)
                    released.append(delivery.id)
        return released

    def due_deliveries(self, *, now: datetime, limit: int) -> list[str]:
        with self._lock:
            due = [
                d
                for d in self._deliveries.values()
                if d.state is DeliveryState.PENDING
                and d.next_attempt_at is not None
                and d.next_attempt_at <= now
                and self._at_head(d)
            ]
        due.sort(key=lambda d: (d.next_attempt_at or now, d.id))
        return [d.id for d in due[:limit]]

    # -- ordered delivery ----------------------------------------------------------------------

    def _policy(self, subscription_id: str) -> OrderingPolicy:
        subscription = self._subscriptions.get(subscription_id)
        return DEFAULT_ORDERING_POLICY if subscription is None else subscription.ordering_policy

    def _line(self, subscription_id: str, ordering_key: str) -> list[DeliveryLog]:
        # A scan of every delivery: this store is for tests and development.
        return [
            d
            for d in self._deliveries.values()
            if d.ordering_key == ordering_key and d.subscription_id == subscription_id
        ]

    def _at_head(self, delivery: DeliveryLog) -> bool:
        if delivery.ordering_key is None:
            return True
        line = self._line(delivery.subscription_id, delivery.ordering_key)
        return at_head(delivery, line, self._policy(delivery.subscription_id))

    def next_in_line(self, subscription_id: str, ordering_key: str) -> list[DeliverySchedule]:
        with self._lock:
            head = next_in_line(self._line(subscription_id, ordering_key), self._policy(subscription_id))
            if head is None:
                return []
            delivery = self._deliveries[head.id]
        return [DeliverySchedule(delivery.id, delivery.attempt, delivery.next_attempt_at)]

    def waiting_in_line(self, delivery_ids: Sequence[str]) -> set[str]:
        with self._lock:
            found = (self._deliveries.get(i) for i in delivery_ids)
            return {
                d.id
                for d in found
                if d is not None and d.state is DeliveryState.PENDING and not self._at_head(d)
            }

    def skip_delivery(
        self, delivery_id: str, *, reason: str, now: datetime, tenant: TenantScope = ALL_TENANTS
    ) -> DeliveryLog:
        return self._move_dead_letter(
            delivery_id, tenant, "skipped", state=DeliveryState.SKIPPED, last_error=reason, timestamp=now
        )

    def blocked_keys(
        self, subscription_id: str, *, limit: int = 50, tenant: TenantScope = ALL_TENANTS
    ) -> list[BlockedKey]:
        with self._lock:
            if self._policy(subscription_id) is not OrderingPolicy.BLOCK:
                return []
            lines: dict[str, list[DeliveryLog]] = {}
            # A delivery carries its subscription's tenant: the scope filters the deliveries.
            for d in self._deliveries.values():
                if (
                    d.subscription_id == subscription_id
                    and d.ordering_key is not None
                    and in_scope(tenant, d.tenant)
                ):
                    lines.setdefault(d.ordering_key, []).append(d)
        blocked = []
        for key in sorted(lines):
            line = sorted(lines[key], key=position)
            held = [
                d
                for d in line
                if d.state in (DeliveryState.PENDING, DeliveryState.INFLIGHT, DeliveryState.DLQ)
            ]
            if held and held[0].state is DeliveryState.DLQ:
                waiting = sum(1 for d in line if d.state is DeliveryState.PENDING)
                blocked.append(BlockedKey(key, held[0].id, waiting))
        return blocked[:limit]


#: The seed's older name.
InMemoryOutboundWebhookStore = InMemoryOutboundWebhookHandler
