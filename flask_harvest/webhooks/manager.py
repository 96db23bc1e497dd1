"""Dispatch: turn an event into one delivery per matching subscription and queue the attempts."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

from ..config import Settings
from ..errors import EnqueueError
from ..jobs.base import JobBackend, JobBackendError
from .models import DeliveryLog, DeliveryState, WebhookSubscription, new_id, utcnow, validate_topic
from .payload import encode_payload
from .stores.base import OutboundWebhookHandler

log = logging.getLogger("flask_harvest")

#: Takes over a delivery instead of the job backend (the seed's ``WebhookDelegateExt``).
Delegate = Callable[[DeliveryLog, WebhookSubscription], None]
#: Told about the deliveries a dispatch skipped (the plugin sends the signal).
SkipListener = Callable[[Sequence[DeliveryLog]], None]


class OutboundWebhookManager:
    """Writes delivery logs and hands them to the job backend.

    Reach it with :func:`flask_harvest.get_manager` (or ``plugin.manager``) inside an app context.
    """

    def __init__(
        self,
        store: OutboundWebhookHandler,
        backend: JobBackend,
        settings: Settings,
        *,
        delegate: Delegate | None = None,
        on_skipped: SkipListener | None = None,
    ) -> None:
        self.store = store
        self.backend = backend
        self.settings = settings
        self.delegate = delegate
        self._on_skipped = on_skipped

    def dispatch(self, topic: str, payload: Any) -> list[str]:
        """Send ``payload`` to every active subscription of ``topic``; return their delivery ids.

        The payload is serialised to JSON once; those bytes are stored and sent on every attempt.
        One delivery log per matching subscription is written in one round trip: ``PENDING`` for
        an active one, ``SKIPPED`` for a disabled or failed one (their ids are not returned). Then
        one job per pending delivery is queued.

        Logging and queueing are two steps, not one transaction: a crash between them leaves
        pending rows that the sweeper queues later (SQL store). To tie the event to your own
        transaction, use :meth:`dispatch_in_tx`.

        :raises InvalidFieldError: the topic is not a plain topic, or the payload is not JSON.
        :raises EnqueueError: the jobs could not be queued; the deliveries were dead-lettered
            (replayable) and the error names them.
        :raises StoreError: the store failed; nothing was queued.
        """
        validate_topic(topic, pattern=False)
        body = encode_payload(payload)
        now = utcnow()
        max_attempts = self.settings.webhooks_max_attempts
        deliveries: list[DeliveryLog] = []
        subscriptions = self.store.subscriptions_for_topic(topic)
        for subscription in subscriptions:
            active = subscription.is_active
            deliveries.append(
                DeliveryLog(
                    id=new_id("msg"),
                    subscription_id=subscription.id,
                    topic=topic,
                    payload=body,
                    state=DeliveryState.PENDING if active else DeliveryState.SKIPPED,
                    max_attempts=max_attempts,
                    last_error=None if active else f"subscription is {subscription.status.value}",
                    timestamp=now,
                    next_attempt_at=now if active else None,
                    created_at=now,
                )
            )
        self.store.log_deliveries(deliveries)
        pending = [d for d in deliveries if d.state is DeliveryState.PENDING]
        skipped = [d for d in deliveries if d.state is DeliveryState.SKIPPED]
        if skipped and self._on_skipped is not None:
            self._on_skipped(skipped)
        self._hand_over(pending, {s.id: s for s in subscriptions})
        return [d.id for d in pending]

    def _hand_over(self, pending: list[DeliveryLog], subscriptions: dict[str, WebhookSubscription]) -> None:
        if self.delegate is not None:
            for delivery in pending:
                # A delegate error reaches the caller as it is, and the row is not dead-lettered.
                self.delegate(delivery, subscriptions[delivery.subscription_id])
            return
        try:
            self.backend.enqueue(pending)
        except JobBackendError as exc:
            ids = [d.id for d in pending]
            moved = self.store.dead_letter(ids, f"enqueue failed: {exc}", now=utcnow())
            log.error("harvest: enqueue failed (%s); dead-lettered %d deliveries", exc, len(moved))
            raise EnqueueError(ids, str(exc)) from exc
