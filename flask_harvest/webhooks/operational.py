"""Operational webhooks: the application's own endpoint is told when a subscription is turned off
automatically and when a delivery is dead-lettered. Pure: no Flask, SQL or network.

A notification is an ordinary delivery on a reserved topic (``harvest.``...), addressed to one
reserved subscription (:data:`OPERATIONAL_SUBSCRIPTION_ID`) that the configuration
(``HARVEST_OPERATIONAL_WEBHOOK_URL`` and ``..._SECRET``) creates: the same pipeline signs, sends,
retries, dead-letters and shows it. It never fans out by topic, so no ordinary subscription
receives one, whatever its patterns (``*`` included), and an ordinary dispatch never reaches the
reserved subscription. The outcome rules attach an :class:`~.models.OperationalContext` to an
attempt's result (:func:`context`); the store, when it records a transition, builds the
notifications with :func:`notices` and writes them in the same transaction.

No loop: an attempt of the reserved subscription's own deliveries gets no context, so its
dead-lettered notifications and its own failure make no further notification.

A new kind of notification is one more :class:`Kind` in :data:`KINDS` (its topic, description,
schema and example) and the rule in :func:`notices` that says when it is made.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..config import Settings
from ..outbound.ssrf import redact_url
from .catalog import EventCatalog, EventType, make_event_type
from .models import (
    AttemptResult,
    Claim,
    DeliveryLog,
    DeliveryState,
    OperationalContext,
    WebhookSubscription,
    WebhookSubscriptionStatus,
    isoformat,
    new_id,
    standard_secret,
)
from .topics import RESERVED_PREFIX

__all__ = [
    "DELIVERY_DEAD_LETTERED",
    "KINDS",
    "OPERATIONAL_SUBSCRIPTION_ID",
    "SUBSCRIPTION_DISABLED",
    "Kind",
    "context",
    "enabled",
    "event_types",
    "notices",
    "register",
    "subscription_for",
]

#: The id of the subscription that receives the operational notifications. Reserved: an ordinary
#: subscription cannot take it, and an ordinary dispatch never reaches it.
OPERATIONAL_SUBSCRIPTION_ID = "harvest_operational"

#: The topic of the notification that a subscription was turned off automatically.
SUBSCRIPTION_DISABLED = RESERVED_PREFIX + "subscription.disabled"
#: The topic of the notification that a delivery was dead-lettered.
DELIVERY_DEAD_LETTERED = RESERVED_PREFIX + "delivery.dead_lettered"

_TIME = {"type": "string", "format": "date-time"}
_TEXT = {"type": "string"}
_NULLABLE_TEXT = {"type": ["string", "null"]}


def _envelope(topic: str, data: Mapping[str, Any], required: list[str]) -> dict[str, Any]:
    """The JSON Schema of a notification: ``type``, ``timestamp`` and the kind's ``data``."""
    return {
        "type": "object",
        "required": ["type", "timestamp", "data"],
        "properties": {
            "type": {"const": topic},
            "timestamp": _TIME,
            "data": {"type": "object", "required": required, "properties": dict(data)},
        },
    }


@dataclass(frozen=True)
class Kind:
    """One kind of operational notification: its topic and what it carries."""

    topic: str
    description: str
    schema: dict[str, Any]
    example: dict[str, Any]

    def event_type(self) -> EventType:
        """The kind as an event type of the catalog (checked: its example matches its schema)."""
        return make_event_type(
            self.topic, description=self.description, schema=self.schema, example=self.example
        )


_DISABLED_DATA = {
    "subscription_id": _TEXT,
    "subscription_url": _TEXT,
    "status": {"enum": [WebhookSubscriptionStatus.FAILED.value, WebhookSubscriptionStatus.DISABLED.value]},
    "reason": _NULLABLE_TEXT,
    "delivery_id": _TEXT,
    "topic": _TEXT,
    "disabled_at": _TIME,
    "tenant": _NULLABLE_TEXT,
}
_DEAD_LETTERED_DATA = {
    "delivery_id": _TEXT,
    "subscription_id": _TEXT,
    "subscription_url": _TEXT,
    "topic": _TEXT,
    "attempts": {"type": "integer", "minimum": 1},
    "response_status": {"type": ["integer", "null"]},
    "last_error": _NULLABLE_TEXT,
    "created_at": _TIME,
    "dead_lettered_at": _TIME,
    "tenant": _NULLABLE_TEXT,
}

#: Every kind of operational notification, by topic: add a new kind here (and its rule in
#: :func:`notices`).
KINDS: dict[str, Kind] = {
    kind.topic: kind
    for kind in (
        Kind(
            SUBSCRIPTION_DISABLED,
            "A subscription was turned off automatically: it failed too many times in a row "
            "(status failed) or its endpoint answered 410 Gone (status disabled). Its deliveries "
            "are dead-lettered until an operator enables it again.",
            _envelope(SUBSCRIPTION_DISABLED, _DISABLED_DATA, list(_DISABLED_DATA)),
            {
                "type": SUBSCRIPTION_DISABLED,
                "timestamp": "2025-01-31T12:00:00Z",
                "data": {
                    "subscription_id": "sub_1",
                    "subscription_url": "https://receiver.example/hooks?token=***",
                    "status": "failed",
                    "reason": "HTTP 503",
                    "delivery_id": "msg_1",
                    "topic": "order.created",
                    "disabled_at": "2025-01-31T12:00:00Z",
                    "tenant": "acme",
                },
            },
        ),
        Kind(
            DELIVERY_DEAD_LETTERED,
            "A delivery was dead-lettered: its attempts ran out, its endpoint refused it for good, "
            "or its subscription is off. It can be replayed with the same id.",
            _envelope(DELIVERY_DEAD_LETTERED, _DEAD_LETTERED_DATA, list(_DEAD_LETTERED_DATA)),
            {
                "type": DELIVERY_DEAD_LETTERED,
                "timestamp": "2025-01-31T12:00:00Z",
                "data": {
                    "delivery_id": "msg_1",
                    "subscription_id": "sub_1",
                    "subscription_url": "https://receiver.example/hooks",
                    "topic": "order.created",
                    "attempts": 5,
                    "response_status": 500,
                    "last_error": "HTTP 500",
                    "created_at": "2025-01-31T11:00:00Z",
                    "dead_lettered_at": "2025-01-31T12:00:00Z",
                    "tenant": None,
                },
            },
        ),
    )
}


def event_types() -> list[EventType]:
    """The operational notifications as event types (what the catalog lists when they are on)."""
    return [kind.event_type() for kind in KINDS.values()]


def register(catalog: EventCatalog) -> None:
    """Add the operational notifications' event types to ``catalog`` (again: a no-op)."""
    for kind in KINDS.values():
        catalog.register(kind.topic, description=kind.description, schema=kind.schema, example=kind.example)


def enabled(settings: Settings) -> bool:
    """Whether these settings name an operational endpoint."""
    return bool(settings.operational_webhook_url)


def subscription_for(settings: Settings) -> WebhookSubscription | None:
    """The reserved subscription these settings describe, or ``None`` when they name no endpoint."""
    if not enabled(settings):
        return None
    return WebhookSubscription(
        target_url=settings.operational_webhook_url,
        event_topics=list(KINDS),
        secret=standard_secret(settings.operational_webhook_secret),
        id=OPERATIONAL_SUBSCRIPTION_ID,
        description="Operational notifications (HARVEST_OPERATIONAL_WEBHOOK_URL)",
    )


def context(claim: Claim, settings: Settings) -> OperationalContext | None:
    """What a store needs to notify the operational endpoint of a transition of ``claim``, or
    ``None`` when nothing may be notified: no endpoint is configured, or the delivery is one of
    the endpoint's own (a notification about a notification would loop)."""
    if not settings.operational_webhook_url:
        return None
    delivery = claim.delivery
    if delivery.subscription_id == OPERATIONAL_SUBSCRIPTION_ID:
        return None
    subscription = claim.subscription
    return OperationalContext(
        subscription_id=OPERATIONAL_SUBSCRIPTION_ID,
        max_attempts=settings.webhooks_max_attempts,
        topic=delivery.topic,
        created_at=delivery.created_at,
        subscription_url=redact_url(subscription.target_url) if subscription is not None else "",
        tenant=delivery.tenant,
    )


def notices(
    delivery_id: str,
    subscription_id: str,
    result: AttemptResult,
    changed: WebhookSubscriptionStatus | None,
) -> list[DeliveryLog]:
    """The notifications a recorded attempt makes: one per transition it caused, none without a
    context. The store calls it once the transition landed (its guarded UPDATE matched), in the
    transaction that wrote it.

    :param changed: the status the attempt moved the subscription to, if it did.
    """
    ctx = result.operational
    if ctx is None:
        return []
    made: list[tuple[str, dict[str, Any]]] = []
    if changed in (WebhookSubscriptionStatus.FAILED, WebhookSubscriptionStatus.DISABLED):
        made.append(
            (
                SUBSCRIPTION_DISABLED,
                {
                    "subscription_id": subscription_id,
                    "subscription_url": ctx.subscription_url,
                    "status": changed.value,
                    "reason": result.last_error,
                    "delivery_id": delivery_id,
                    "topic": ctx.topic,
                    "disabled_at": isoformat(result.timestamp),
                    "tenant": ctx.tenant,
                },
            )
        )
    if result.state is DeliveryState.DLQ:
        made.append(
            (
                DELIVERY_DEAD_LETTERED,
                {
                    "delivery_id": delivery_id,
                    "subscription_id": subscription_id,
                    "subscription_url": ctx.subscription_url,
                    "topic": ctx.topic,
                    "attempts": result.attempt_number,
                    "response_status": result.attempt.response_status if result.attempt else None,
                    "last_error": result.last_error,
                    "created_at": isoformat(ctx.created_at),
                    "dead_lettered_at": isoformat(result.timestamp),
                    "tenant": ctx.tenant,
                },
            )
        )
    now = result.timestamp
    return [
        DeliveryLog(
            id=new_id("msg"),
            subscription_id=ctx.subscription_id,
            topic=topic,
            # ASCII: any text in an error (a lone surrogate too) travels escaped, never unsendable.
            payload=json.dumps(
                {"type": topic, "timestamp": isoformat(now), "data": data}, separators=(",", ":")
            ),
            max_attempts=ctx.max_attempts,
            timestamp=now,
            next_attempt_at=now,
            created_at=now,
        )
        for topic, data in made
    ]
