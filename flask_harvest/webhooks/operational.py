"""Operational webhooks: the application's own endpoint is told when a subscription is turned off
automatically, when a delivery is dead-lettered, and when a subscription's rate limit has held its
deliveries back for longer than ``HARVEST_OPERATIONAL_RATE_LIMIT_HOLD_SECONDS``. Pure: no Flask,
SQL or network.

A notification is an ordinary delivery on a reserved topic (``harvest.``...), addressed to one
reserved subscription (:data:`OPERATIONAL_SUBSCRIPTION_ID`) that the configuration
(``HARVEST_OPERATIONAL_WEBHOOK_URL`` and ``..._SECRET``) creates: the same pipeline signs, sends,
retries, dead-letters and shows it. It never fans out by topic, so no ordinary subscription
receives one, whatever its patterns (``*`` included), and an ordinary dispatch never reaches the
reserved subscription. The outcome rules attach an :class:`~.models.OperationalContext` to an
attempt's result (:func:`context`); the store, when it records a transition, builds the
notifications with :func:`notices` and writes them in the same transaction. A long rate-limit
hold is no transition of a row: the delivery runner counts holds in episodes
(:mod:`flask_harvest.outbound.holds`) and logs :func:`held_notice` once per episode.

No loop: an attempt of the reserved subscription's own deliveries gets no context, so its
dead-lettered notifications and its own failure make no further notification.

A new kind of notification is one more :class:`Kind` in :data:`KINDS` (its topic, description,
schema and example) and the rule that says when it is made (:func:`notices` for a transition).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
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
    "SUBSCRIPTION_RATE_LIMITED",
    "TEST",
    "Kind",
    "context",
    "enabled",
    "event_types",
    "held_notice",
    "notices",
    "register",
    "subscription_for",
    "test_notice",
]

#: The id of the subscription that receives the operational notifications. Reserved: an ordinary
#: subscription cannot take it, and an ordinary dispatch never reaches it.
OPERATIONAL_SUBSCRIPTION_ID = "harvest_operational"

#: The topic of the notification that a subscription was turned off automatically.
SUBSCRIPTION_DISABLED = RESERVED_PREFIX + "subscription.disabled"
#: The topic of the notification that a delivery was dead-lettered.
DELIVERY_DEAD_LETTERED = RESERVED_PREFIX + "delivery.dead_lettered"
#: The topic of the notification that a subscription's rate limit held its deliveries back long.
SUBSCRIPTION_RATE_LIMITED = RESERVED_PREFIX + "subscription.rate_limited"
#: The topic of a test notification an operator sends (the actuator, the CLI, the console).
TEST = RESERVED_PREFIX + "operational.test"

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

_RATE_LIMITED_DATA = {
    "subscription_id": _TEXT,
    "subscription_url": _TEXT,
    "rate_limit": {
        "type": "object",
        "required": ["per_second", "burst"],
        "properties": {"per_second": {"type": "number"}, "burst": {"type": "integer", "minimum": 1}},
    },
    "threshold_seconds": {"type": "number"},
    "held_since": _TIME,
    "held_until": _TIME,
    "delivery_id": _TEXT,
    "topic": _TEXT,
    "tenant": _NULLABLE_TEXT,
}

_TEST_MESSAGE = "A test notification: operational webhooks reach this endpoint."
_TEST_DATA = {"message": _TEXT}

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
        Kind(
            SUBSCRIPTION_RATE_LIMITED,
            "A subscription's rate limit has held its deliveries back for longer than "
            "HARVEST_OPERATIONAL_RATE_LIMIT_HOLD_SECONDS: events arrive faster than the limit lets "
            "them out, and the backlog grows. Told once per episode of holding.",
            _envelope(SUBSCRIPTION_RATE_LIMITED, _RATE_LIMITED_DATA, list(_RATE_LIMITED_DATA)),
            {
                "type": SUBSCRIPTION_RATE_LIMITED,
                "timestamp": "2025-01-31T12:05:00Z",
                "data": {
                    "subscription_id": "sub_1",
                    "subscription_url": "https://receiver.example/hooks",
                    "rate_limit": {"per_second": 10.0, "burst": 10},
                    "threshold_seconds": 300.0,
                    "held_since": "2025-01-31T12:00:00Z",
                    "held_until": "2025-01-31T12:05:00Z",
                    "delivery_id": "msg_1",
                    "topic": "order.created",
                    "tenant": "acme",
                },
            },
        ),
        Kind(
            TEST,
            "A test notification an operator sent (flask harvest operational test, the admin API "
            "or the console), to check that the endpoint receives and verifies notifications.",
            _envelope(TEST, _TEST_DATA, list(_TEST_DATA)),
            {
                "type": TEST,
                "timestamp": "2025-01-31T12:00:00Z",
                "data": {"message": _TEST_MESSAGE},
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
    return [_notice(topic, data, ctx.max_attempts, result.timestamp) for topic, data in made]


def held_notice(
    claim: Claim,
    settings: Settings,
    *,
    held_since: datetime,
    held_until: datetime,
    now: datetime,
) -> DeliveryLog | None:
    """The notification that ``claim``'s subscription has been held back by its rate limit from
    ``held_since`` to (at least) ``held_until``, or ``None`` when nothing may be notified (no
    endpoint, a delivery of the endpoint's own, no rate limit)."""
    subscription = claim.subscription
    if (
        not enabled(settings)
        or claim.delivery.subscription_id == OPERATIONAL_SUBSCRIPTION_ID
        or subscription is None
        or subscription.rate_limit is None
    ):
        return None
    data = {
        "subscription_id": subscription.id,
        "subscription_url": redact_url(subscription.target_url),
        "rate_limit": subscription.rate_limit.to_dict(),
        "threshold_seconds": settings.operational_rate_limit_hold_seconds,
        "held_since": isoformat(held_since),
        "held_until": isoformat(held_until),
        "delivery_id": claim.delivery.id,
        "topic": claim.delivery.topic,
        "tenant": claim.delivery.tenant,
    }
    return _notice(SUBSCRIPTION_RATE_LIMITED, data, settings.webhooks_max_attempts, now)


def test_notice(settings: Settings, now: datetime) -> DeliveryLog | None:
    """A test notification, or ``None`` when no endpoint is configured."""
    if not enabled(settings):
        return None
    return _notice(TEST, {"message": _TEST_MESSAGE}, settings.webhooks_max_attempts, now)


def _notice(topic: str, data: Mapping[str, Any], max_attempts: int, now: datetime) -> DeliveryLog:
    """A notification: a delivery to the reserved subscription, due now."""
    return DeliveryLog(
        id=new_id("msg"),
        subscription_id=OPERATIONAL_SUBSCRIPTION_ID,
        topic=topic,
        # ASCII: any text in an error (a lone surrogate too) travels escaped, never unsendable.
        payload=json.dumps({"type": topic, "timestamp": isoformat(now), "data": data}, separators=(",", ":")),
        max_attempts=max_attempts,
        timestamp=now,
        next_attempt_at=now,
        created_at=now,
    )
