"""Subscriptions and deliveries as plain values, with their validation and topic matching.

Nothing here touches Flask, SQL or the network; stores persist these values and the delivery
pipeline moves them between states.
"""

from __future__ import annotations

import dataclasses
import enum
import re
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any
from urllib.parse import urlsplit

from ..errors import InvalidFieldError
from ..signing import secret_key

MAX_URL_LENGTH = 2048
_TOPIC_SEGMENT = re.compile(r"[A-Za-z0-9_\-:]+")


def utcnow() -> datetime:
    """Return the current time as an aware UTC datetime."""
    return datetime.now(timezone.utc)


def new_id(prefix: str) -> str:
    """Return a new random id such as ``sub_6f1c...``."""
    return f"{prefix}_{uuid.uuid4().hex}"


def isoformat(value: datetime | None) -> str | None:
    """Return ``value`` as an ISO 8601 UTC string ending in ``Z``."""
    if value is None:
        return None
    return value.astimezone(timezone.utc).isoformat().replace("+00:00", "Z")


class WebhookSubscriptionStatus(str, enum.Enum):
    """Whether a subscription receives events."""

    #: Operational: matching events are delivered.
    ACTIVE = "active"
    #: Turned off by an operator, or by the receiver answering 410 Gone.
    DISABLED = "disabled"
    #: Turned off automatically after too many consecutive failures.
    FAILED = "failed"

    # The seed's spellings.
    Active = ACTIVE
    Disabled = DISABLED
    Failed = FAILED


class DeliveryState(str, enum.Enum):
    """Where a delivery is in its life; see the delivery semantics page."""

    #: Logged and waiting for an attempt (first, retry or replay) at ``next_attempt_at``.
    PENDING = "pending"
    #: Claimed by a worker, whose lease runs until ``lease_expires_at``.
    INFLIGHT = "inflight"
    #: The receiver answered 2xx.
    DELIVERED = "delivered"
    #: Dead-lettered: attempts exhausted, a permanent failure, or the enqueue failed.
    DLQ = "dlq"
    #: Not sent: the subscription was disabled, failed or removed.
    SKIPPED = "skipped"


#: States a delivery never leaves except by an operator's replay.
FINAL_STATES = frozenset({DeliveryState.DELIVERED, DeliveryState.DLQ, DeliveryState.SKIPPED})


def validate_topic(topic: str, *, pattern: bool, field_name: str = "topic") -> str:
    """Return ``topic`` if it is a dot-separated topic, else raise :class:`InvalidFieldError`.

    With ``pattern`` true, ``*`` may stand for a segment (see :func:`topic_matches`).
    """
    if not isinstance(topic, str) or not topic:
        raise InvalidFieldError(field_name, "a topic must be a non-empty string such as 'order.created'")
    for segment in topic.split("."):
        if segment == "*" and pattern:
            continue
        if not _TOPIC_SEGMENT.fullmatch(segment):
            allowed = "letters, digits, '_', '-', ':'" + (" or a lone '*'" if pattern else "")
            raise InvalidFieldError(
                field_name, f"{topic!r} is not a topic: each dot-separated part must be {allowed}"
            )
    return topic


def topic_matches(pattern: str, topic: str) -> bool:
    """Return whether a subscription's topic ``pattern`` selects the event ``topic``.

    Topics are dot-separated. A ``*`` segment matches any one segment, and a trailing ``*`` matches
    one or more: ``order.*`` selects ``order.created`` and ``order.item.added`` but not ``order``;
    ``*`` alone selects every topic.
    """
    wanted = pattern.split(".")
    given = topic.split(".")
    for index, segment in enumerate(wanted):
        last = index == len(wanted) - 1
        if index >= len(given):
            return False
        if segment == "*":
            if last:
                return True
            continue
        if segment != given[index]:
            return False
    return len(wanted) == len(given)


def validate_url(url: str, field_name: str = "target_url") -> str:
    """Return ``url`` if it is an absolute http(s) URL with a host, else raise.

    This is the syntax check only; the SSRF policy is applied separately.
    """
    if not isinstance(url, str) or not url:
        raise InvalidFieldError(field_name, "must be an absolute http:// or https:// URL")
    if len(url) > MAX_URL_LENGTH or any(c.isspace() for c in url):
        raise InvalidFieldError(field_name, f"must be at most {MAX_URL_LENGTH} characters, no spaces")
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise InvalidFieldError(field_name, f"is not a valid URL ({exc})") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise InvalidFieldError(field_name, "must be an absolute http:// or https:// URL with a host")
    if port == 0:
        raise InvalidFieldError(field_name, "port 0 is not a valid port")
    return url


@dataclass(frozen=True)
class WebhookSubscription:
    """A receiver's endpoint, the topics it wants and the secret its deliveries are signed with.

    Building one validates it, so an invalid subscription never exists. The secret is left out of
    ``repr`` so that it cannot leak into logs or tracebacks.
    """

    target_url: str
    event_topics: tuple[str, ...]
    secret: str = field(repr=False)
    id: str = field(default_factory=lambda: new_id("sub"))
    status: WebhookSubscriptionStatus = WebhookSubscriptionStatus.ACTIVE
    consecutive_failures: int = 0
    description: str = ""
    created_at: datetime = field(default_factory=utcnow)
    updated_at: datetime = field(default_factory=utcnow)
    #: The secret before the last rotation; deliveries are signed with it too until it expires.
    previous_secret: str | None = field(default=None, repr=False)
    previous_secret_expires_at: datetime | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.id, str) or not self.id or len(self.id) > 255:
            raise InvalidFieldError("id", "must be a non-empty string of at most 255 characters")
        validate_url(self.target_url)
        topics = self.event_topics
        if isinstance(topics, str) or not isinstance(topics, Sequence) or not topics:
            raise InvalidFieldError("event_topics", "must be a non-empty list of topics")
        for topic in topics:
            validate_topic(topic, pattern=True, field_name="event_topics")
        # Accept any sequence, keep an immutable, duplicate-free tuple.
        object.__setattr__(self, "event_topics", tuple(dict.fromkeys(topics)))
        if not isinstance(self.secret, str):
            raise InvalidFieldError("secret", "must be a string")
        secret_key(self.secret)  # raises InvalidSecretError naming the field
        if self.previous_secret is not None:
            secret_key(self.previous_secret)
        object.__setattr__(self, "status", WebhookSubscriptionStatus(self.status))
        if self.consecutive_failures < 0:
            raise InvalidFieldError("consecutive_failures", "must not be negative")

    @classmethod
    def from_trusted(
        cls,
        *,
        id: str,
        target_url: str,
        event_topics: tuple[str, ...],
        secret: str,
        status: WebhookSubscriptionStatus,
        consecutive_failures: int,
        description: str,
        created_at: datetime,
        updated_at: datetime,
        previous_secret: str | None,
        previous_secret_expires_at: datetime | None,
    ) -> WebhookSubscription:
        """Build a subscription without validating it, from values that were validated when
        stored (a store reading its own rows); every field is required and taken as given."""
        subscription = cls.__new__(cls)
        # The dataclass is frozen, so its fields are set the way __init__ sets them: in __dict__.
        subscription.__dict__.update(
            id=id,
            target_url=target_url,
            event_topics=event_topics,
            secret=secret,
            status=status,
            consecutive_failures=consecutive_failures,
            description=description,
            created_at=created_at,
            updated_at=updated_at,
            previous_secret=previous_secret,
            previous_secret_expires_at=previous_secret_expires_at,
        )
        return subscription

    @property
    def is_active(self) -> bool:
        return self.status is WebhookSubscriptionStatus.ACTIVE

    def signing_secrets(self, now: datetime) -> list[str]:
        """Return the secrets a delivery made at ``now`` is signed with: the current one, and the
        previous one while its rotation grace period lasts."""
        secrets = [self.secret]
        expires = self.previous_secret_expires_at
        if self.previous_secret and expires is not None and expires > now:
            secrets.append(self.previous_secret)
        return secrets

    def matches(self, topic: str) -> bool:
        """Return whether this subscription wants events of ``topic``."""
        return any(topic_matches(pattern, topic) for pattern in self.event_topics)

    def replace(self, **changes: Any) -> WebhookSubscription:
        """Return a copy with ``changes`` applied and validated."""
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        """Return the subscription as JSON-ready data, without its secret."""
        return {
            "id": self.id,
            "target_url": self.target_url,
            "event_topics": list(self.event_topics),
            "status": self.status.value,
            "consecutive_failures": self.consecutive_failures,
            "description": self.description,
            "created_at": isoformat(self.created_at),
            "updated_at": isoformat(self.updated_at),
            "previous_secret_expires_at": isoformat(self.previous_secret_expires_at),
        }


@dataclass(frozen=True)
class DeliveryLog:
    """One event's delivery to one subscription, showing its latest attempt.

    ``attempt`` is the 1-based number of the latest attempt made, or of the next one while
    ``PENDING``. ``payload`` holds the exact JSON text that is sent on every attempt.
    """

    id: str
    subscription_id: str
    topic: str
    payload: str
    state: DeliveryState = DeliveryState.PENDING
    attempt: int = 1
    max_attempts: int = 5
    request_headers: Mapping[str, str] = field(default_factory=dict)
    response_status: int | None = None
    response_body: str | None = None
    elapsed_ms: int | None = None
    last_error: str | None = None
    timestamp: datetime = field(default_factory=utcnow)
    next_attempt_at: datetime | None = field(default_factory=utcnow)
    created_at: datetime = field(default_factory=utcnow)
    lease_expires_at: datetime | None = None

    @property
    def is_dlq(self) -> bool:
        return self.state is DeliveryState.DLQ

    def replace(self, **changes: Any) -> DeliveryLog:
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        """Return the delivery in the seed's DLQ JSON shape, plus its state and schedule."""
        return {
            "id": self.id,
            "subscription_id": self.subscription_id,
            "topic": self.topic,
            "payload": self.payload,
            "request_headers": dict(self.request_headers),
            "response_status": self.response_status,
            "response_body": self.response_body,
            "elapsed_ms": self.elapsed_ms,
            "attempt": self.attempt,
            "max_attempts": self.max_attempts,
            "is_dlq": self.is_dlq,
            "last_error": self.last_error,
            "timestamp": isoformat(self.timestamp),
            "state": self.state.value,
            "next_attempt_at": isoformat(self.next_attempt_at),
            "created_at": isoformat(self.created_at),
        }


@dataclass(frozen=True)
class DeliveryAttempt:
    """The record of one HTTP attempt of a delivery."""

    delivery_id: str
    attempt: int
    started_at: datetime
    response_status: int | None = None
    response_body: str | None = None
    elapsed_ms: int | None = None
    error: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "delivery_id": self.delivery_id,
            "attempt": self.attempt,
            "started_at": isoformat(self.started_at),
            "response_status": self.response_status,
            "response_body": self.response_body,
            "elapsed_ms": self.elapsed_ms,
            "error": self.error,
        }


class SubscriptionEffect(str, enum.Enum):
    """What an attempt's outcome does to its subscription."""

    NONE = "none"
    #: 2xx: the consecutive failure count goes back to zero.
    RESET_FAILURES = "reset_failures"
    #: A counted failure; at the threshold an active subscription becomes ``FAILED``.
    COUNT_FAILURE = "count_failure"
    #: 410 Gone: the receiver asked us to stop; the subscription becomes ``DISABLED``.
    DISABLE = "disable"


@dataclass(frozen=True)
class AttemptResult:
    """What to write when an attempt ends: the delivery's new state and the subscription effect.

    ``attempt`` is ``None`` when no request was made (the attempt limit was lowered, or the
    subscription is gone or inactive).
    """

    state: DeliveryState
    attempt_number: int
    next_attempt_at: datetime | None
    last_error: str | None
    timestamp: datetime
    request_headers: Mapping[str, str] = field(default_factory=dict)
    attempt: DeliveryAttempt | None = None
    effect: SubscriptionEffect = SubscriptionEffect.NONE
    failure_threshold: int = 50


@dataclass(frozen=True)
class Claim:
    """A delivery leased to one worker, with its subscription as it was at the claim."""

    delivery: DeliveryLog
    subscription: WebhookSubscription | None
    lease_token: str


@dataclass(frozen=True)
class DeliveryStats:
    """Counts of deliveries by state, and the creation time of the oldest pending one."""

    counts: Mapping[str, int] = field(default_factory=dict)
    oldest_pending_at: datetime | None = None

    def to_dict(self, now: datetime) -> dict[str, Any]:
        counts = {state.value: int(self.counts.get(state.value, 0)) for state in DeliveryState}
        oldest = self.oldest_pending_at
        return {
            "counts": counts,
            "dlq_depth": counts[DeliveryState.DLQ.value],
            "oldest_pending_age_seconds": round((now - oldest).total_seconds(), 3) if oldest else None,
        }
