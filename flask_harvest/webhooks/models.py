"""Subscriptions and deliveries as plain values, with their validation and topic matching.

Nothing here touches Flask, SQL or the network; stores persist these values and the delivery
pipeline moves them between states.
"""

from __future__ import annotations

import base64
import dataclasses
import enum
import re
import typing
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, NamedTuple

from .._input import check_id
from .._time import utcnow as utcnow  # re-exported: callers that imported it from here keep working
from ..conditions import Condition, condition_to_json, evaluate, parse_condition, validate_condition
from ..errors import InvalidFieldError
from ..outbound.attempt import DeliveryState as DeliveryState
from ..outbound.rate import RateLimit
from ..outbound.signing import (
    DEFAULT_SIGNATURE_HEADER,
    SECRET_PREFIX,
    WEBHOOK_ID,
    WEBHOOK_SIGNATURE,
    WEBHOOK_TIMESTAMP,
)

# Re-exported: a subscription's secret is checked by the outbound layer's one secret check, which
# the configuration of the operational endpoint's secret uses too.
from ..outbound.signing import validate_secret as validate_secret
from ..outbound.ssrf import MAX_URL_LENGTH as MAX_URL_LENGTH
from ..outbound.ssrf import SsrfRejection, parse_url
from .ordering import DEFAULT_ORDERING_POLICY, OrderingPolicy, validate_ordering_key, validate_ordering_policy
from .tenants import validate_tenant
from .topics import topic_matches, validate_topic

#: The longest subscription (and delivery) id.
MAX_ID_LENGTH = 255
#: The longest subscription description.
MAX_DESCRIPTION_LENGTH = 2048
# Counters are SQL INTEGER columns (32-bit on PostgreSQL).
_MAX_COUNT = 2**31 - 1

#: The most custom headers a subscription may have.
MAX_HEADERS = 20
#: The longest custom header name.
MAX_HEADER_NAME_LENGTH = 64
#: The longest custom header value.
MAX_HEADER_VALUE_LENGTH = 1024
#: The most characters a subscription's custom headers hold together (names and values).
MAX_HEADERS_TOTAL = 4096
#: Header names a subscription cannot set, lower case: the hop-by-hop and framing headers (the
#: transport owns them), and those every delivery sets itself (its body type, its agent, the Standard
#: Webhooks headers and the default Stripe-style signature header). A configured signature header
#: (``HARVEST_WEBHOOKS_SIGNATURE_HEADER``) is refused too, where the settings are known.
RESERVED_HEADERS = frozenset(
    {
        "connection",
        "keep-alive",
        "transfer-encoding",
        "te",
        "trailer",
        "upgrade",
        "host",
        "content-length",
        "content-type",
        "user-agent",
        WEBHOOK_ID,
        WEBHOOK_TIMESTAMP,
        WEBHOOK_SIGNATURE,
        DEFAULT_SIGNATURE_HEADER.lower(),
    }
)
#: A header name: an RFC 7230 token.
_TOKEN = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
#: A header value as it is sent: visible ASCII, with single spaces or tabs inside. Control
#: characters (CR and LF above all) would split the request; other text is encoded differently by
#: HTTP clients and servers, so it is refused rather than garbled.
_HEADER_VALUE = re.compile(r"(?:[!-~]+(?:[ \t]+[!-~]+)*)?")


def new_id(prefix: str) -> str:
    """Return a new random id such as ``sub_6f1c...``."""
    return f"{prefix}_{uuid.uuid4().hex}"


def isoformat(value: datetime | None) -> str | None:
    """Return ``value`` as an ISO 8601 UTC string ending in ``Z``."""
    if value is None:
        return None
    return value.astimezone(timezone.utc).isoformat().replace("+00:00", "Z")


#: Field metadata of a value kept out of JSON output (secrets, lease internals).
PRIVATE: Mapping[str, Any] = {"json": False}


_JSON_NAMES: dict[type, tuple[str, ...]] = {}


def _json_names(cls: type) -> tuple[str, ...]:
    names = _JSON_NAMES.get(cls)
    if names is None:
        fields = [f.name for f in dataclasses.fields(cls) if f.metadata.get("json", True)]
        # The id leads, as a reader looks for it first.
        names = _JSON_NAMES[cls] = tuple(sorted(fields, key=lambda name: name != "id"))
    return names


def _json_value(value: Any) -> Any:
    if isinstance(value, datetime):
        return isoformat(value)
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, (tuple, list)):
        return [_json_value(item) for item in value]
    if isinstance(value, Mapping):
        return {key: _json_value(item) for key, item in value.items()}
    return value


def json_fields(value: object) -> dict[str, Any]:
    """Return a dataclass instance's fields as JSON-ready data, ``id`` first.

    Datetimes become ISO 8601 UTC strings, enums their value, tuples lists, mappings new dicts;
    fields whose metadata is :data:`PRIVATE` (secrets) are left out.
    """
    return {name: _json_value(getattr(value, name)) for name in _json_names(type(value))}


class WebhookSubscriptionStatus(str, enum.Enum):
    """Whether a subscription receives events."""

    #: Operational: matching events are delivered.
    ACTIVE = "active"
    #: Turned off by an operator, or by the receiver answering 410 Gone.
    DISABLED = "disabled"
    #: Turned off automatically after too many consecutive failures.
    FAILED = "failed"


#: States a delivery never leaves except by an operator's replay.
FINAL_STATES = frozenset({DeliveryState.DELIVERED, DeliveryState.DLQ, DeliveryState.SKIPPED})


def validate_url(url: str, field_name: str = "target_url") -> str:
    """Return ``url`` if it is an absolute http(s) URL with a host, else raise.

    This is the syntax check only (:func:`flask_harvest.outbound.ssrf.parse_url`, which the SSRF policy
    applies too); the policy itself is applied separately.
    """
    parsed = parse_url(url)
    if parsed is SsrfRejection.SCHEME:
        raise InvalidFieldError(field_name, "must be an absolute http:// or https:// URL with a host")
    if isinstance(parsed, SsrfRejection):
        raise InvalidFieldError(
            field_name,
            f"must be an absolute http:// or https:// URL with a host and a valid port, at most "
            f"{MAX_URL_LENGTH} printable characters without spaces or backslashes",
        )
    return url


def validate_text(value: object, field_name: str, *, max_length: int, empty: bool = True) -> str:
    """Return ``value`` if it is a string a database can keep, else raise :class:`InvalidFieldError`.

    Refused: non-strings, NUL characters (PostgreSQL cannot store them), lone surrogates (they
    cannot be encoded), and strings longer than ``max_length`` (or empty, unless ``empty``).
    The message never shows the value: it may be a secret.
    """
    if not isinstance(value, str):
        raise InvalidFieldError(field_name, "must be a string")
    if not value and not empty:
        raise InvalidFieldError(field_name, "must not be empty")
    if len(value) > max_length:
        raise InvalidFieldError(field_name, f"must be at most {max_length} characters")
    if "\x00" in value:
        raise InvalidFieldError(field_name, "must not contain NUL characters")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidFieldError(field_name, "must be valid Unicode text (no lone surrogates)") from None
    return value


def validate_datetime(value: object, field_name: str, *, optional: bool = False) -> datetime | None:
    """Return ``value`` if it is a time-zone-aware datetime that exists in UTC, else raise."""
    if value is None and optional:
        return None
    if not isinstance(value, datetime) or value.utcoffset() is None:
        raise InvalidFieldError(field_name, "must be a time-zone-aware datetime")
    try:
        value.astimezone(timezone.utc)
    except OverflowError:
        raise InvalidFieldError(field_name, "is out of range once converted to UTC") from None
    return value


def standard_secret(secret: str) -> str:
    """Return ``secret`` in the Standard Webhooks form ``whsec_<base64>``, signing the same way.

    A secret without the prefix keys the HMAC with its UTF-8 bytes, which receivers using the
    ``standardwebhooks`` library cannot express; ``whsec_`` and the base64 of those bytes is the
    same key in the form they take. A ``whsec_`` secret is returned as it is.

    :raises InvalidFieldError: the secret is not a valid secret.
    """
    validate_secret(secret)
    if secret.startswith(SECRET_PREFIX):
        return secret
    return SECRET_PREFIX + base64.b64encode(secret.encode("utf-8")).decode("ascii")


def _validate_id(value: object) -> str:
    text = check_id(value, "id", max_chars=MAX_ID_LENGTH)
    if "/" in text:
        # The admin API addresses a subscription as /subscriptions/<id>: a '/' would make it
        # impossible to read, change or delete over HTTP.
        raise InvalidFieldError("id", "must not contain '/'")
    return text


def _validate_topics(value: object) -> tuple[str, ...]:
    if isinstance(value, str) or not isinstance(value, Sequence) or not value:
        raise InvalidFieldError("event_topics", "must be a non-empty list of topics")
    for topic in value:
        validate_topic(topic, pattern=True, field_name="event_topics")
    # Accept any sequence, keep an immutable, duplicate-free tuple.
    return tuple(dict.fromkeys(value))


def _validate_status(value: object) -> WebhookSubscriptionStatus:
    try:
        return WebhookSubscriptionStatus(value)
    except (ValueError, TypeError):
        allowed = ", ".join(s.value for s in WebhookSubscriptionStatus)
        raise InvalidFieldError("status", f"must be one of {allowed}") from None


def reserved_header(name: str, signature_header: str = DEFAULT_SIGNATURE_HEADER) -> bool:
    """Whether a subscription may not set the header ``name`` (in any case), with deliveries
    signed under ``signature_header``."""
    lowered = name.lower()
    return lowered in RESERVED_HEADERS or lowered.startswith("proxy-") or lowered == signature_header.lower()


def validate_headers(
    value: object, field_name: str = "headers", *, signature_header: str = DEFAULT_SIGNATURE_HEADER
) -> dict[str, str]:
    """Return ``value`` as a new dict if it is a valid set of custom headers, else raise.

    A mapping of at most :data:`MAX_HEADERS` names (RFC 7230 tokens of at most
    :data:`MAX_HEADER_NAME_LENGTH` characters, none reserved (:func:`reserved_header`), no two the
    same but for case) to values (visible ASCII with inner spaces or tabs, at most
    :data:`MAX_HEADER_VALUE_LENGTH` characters), :data:`MAX_HEADERS_TOTAL` characters in all.

    :raises InvalidFieldError: the message names the header, never shows a value.
    """
    if not isinstance(value, Mapping):
        raise InvalidFieldError(field_name, "must be an object of header names to values")
    if len(value) > MAX_HEADERS:
        raise InvalidFieldError(field_name, f"may hold at most {MAX_HEADERS} headers")
    headers: dict[str, str] = {}
    seen: set[str] = set()
    total = 0
    for name, text in value.items():
        if not isinstance(name, str) or not _TOKEN.fullmatch(name) or len(name) > MAX_HEADER_NAME_LENGTH:
            shown = f"{name!r:.80}" if isinstance(name, str) else type(name).__name__
            raise InvalidFieldError(
                field_name,
                f"{shown} is not a header name: use 1 to {MAX_HEADER_NAME_LENGTH} letters, digits or "
                "!#$%&'*+-.^_`|~",
            )
        if reserved_header(name, signature_header):
            raise InvalidFieldError(
                field_name,
                f"{name!r} cannot be set: hop-by-hop, framing and proxy headers belong to the transport, "
                "and the content type, user agent and signature headers to every delivery",
            )
        if name.lower() in seen:
            raise InvalidFieldError(field_name, f"{name!r} is given twice (header names ignore case)")
        seen.add(name.lower())
        if not isinstance(text, str):
            raise InvalidFieldError(field_name, f"the value of {name!r} must be a string")
        if len(text) > MAX_HEADER_VALUE_LENGTH:
            raise InvalidFieldError(
                field_name, f"the value of {name!r} must be at most {MAX_HEADER_VALUE_LENGTH} characters"
            )
        if not _HEADER_VALUE.fullmatch(text):
            raise InvalidFieldError(
                field_name,
                f"the value of {name!r} must be visible ASCII characters, with spaces or tabs only "
                "between them (no line breaks, NUL or other control characters)",
            )
        total += len(name) + len(text)
        headers[name] = text
    if total > MAX_HEADERS_TOTAL:
        raise InvalidFieldError(
            field_name, f"the headers hold {total} characters, more than {MAX_HEADERS_TOTAL} in all"
        )
    return headers


def validate_filter(value: object, field_name: str = "payload_filter") -> Condition | None:
    """Return a payload filter: ``None`` (none), a condition, or a condition's JSON form, checked
    like a trigger's guard (:func:`~flask_harvest.conditions.parse_condition`, with its caps).

    :raises InvalidFieldError: the message says where the condition is wrong.
    """
    if value is None:
        return None
    if isinstance(value, Mapping):
        return parse_condition(dict(value), field=field_name)
    return validate_condition(typing.cast(Condition, value), field=field_name)


def validate_rate_limit(value: object, field_name: str = "rate_limit") -> RateLimit | None:
    """Return a rate limit: ``None`` (none), a :class:`~flask_harvest.outbound.rate.RateLimit`, or
    its JSON form ``{"per_second": <number>, "burst": <whole number>}``.

    :raises InvalidFieldError: the message says what is wrong.
    """
    if value is None or isinstance(value, RateLimit):
        return value
    if not isinstance(value, Mapping):
        raise InvalidFieldError(
            field_name, 'must be {"per_second": <number>, "burst": <whole number>} or null'
        )
    if set(value) != {"per_second", "burst"}:
        raise InvalidFieldError(field_name, "must have exactly the keys per_second and burst")
    try:
        return RateLimit(per_second=value["per_second"], burst=value["burst"])
    except ValueError as exc:
        raise InvalidFieldError(field_name, str(exc)) from None


def _validate_count(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= _MAX_COUNT:
        raise InvalidFieldError("consecutive_failures", f"must be an integer from 0 to {_MAX_COUNT}")
    return value


#: Each subscription field's validator: it returns the value to keep or raises
#: :class:`InvalidFieldError` naming the field. The constructor and :class:`SubscriptionChanges`
#: both use it, so a field is checked the same way wherever it is set.
_SUBSCRIPTION_VALIDATORS: dict[str, Callable[[Any], Any]] = {
    "id": _validate_id,
    "target_url": validate_url,
    "event_topics": _validate_topics,
    "secret": validate_secret,
    "status": _validate_status,
    "consecutive_failures": _validate_count,
    "description": lambda v: validate_text(v, "description", max_length=MAX_DESCRIPTION_LENGTH),
    "created_at": lambda v: validate_datetime(v, "created_at"),
    "updated_at": lambda v: validate_datetime(v, "updated_at"),
    "previous_secret": lambda v: None if v is None else validate_secret(v, "previous_secret"),
    "previous_secret_expires_at": lambda v: validate_datetime(v, "previous_secret_expires_at", optional=True),
    "payload_filter": validate_filter,
    "headers": validate_headers,
    "rate_limit": validate_rate_limit,
    "ordering_policy": validate_ordering_policy,
    "tenant": validate_tenant,
}


@dataclass(frozen=True)
class WebhookSubscription:
    """A receiver's endpoint, the topics it wants and the secret its deliveries are signed with.

    Building one validates it, so an invalid subscription never exists. The secret is left out of
    ``repr`` so that it cannot leak into logs or tracebacks.
    """

    target_url: str
    #: Any sequence of topic patterns; kept as a tuple.
    event_topics: Sequence[str]
    secret: str = field(repr=False, metadata=PRIVATE)
    id: str = field(default_factory=lambda: new_id("sub"))
    status: WebhookSubscriptionStatus = WebhookSubscriptionStatus.ACTIVE
    consecutive_failures: int = 0
    description: str = ""
    created_at: datetime = field(default_factory=utcnow)
    updated_at: datetime = field(default_factory=utcnow)
    #: The secret before the last rotation; deliveries are signed with it too until it expires.
    previous_secret: str | None = field(default=None, repr=False, metadata=PRIVATE)
    previous_secret_expires_at: datetime | None = None
    #: Deliveries are made only of the payloads this condition holds on; ``None``: every payload.
    #: Given as a condition or its JSON form; kept as a condition.
    #: (Left out of the hash, as the headers are: a comparison value may be a JSON object.)
    payload_filter: Condition | None = field(default=None, hash=False)
    #: Sent with every delivery, as they are (not secrets: they are shown wherever the
    #: subscription is). Names may not be reserved (:func:`reserved_header`).
    headers: Mapping[str, str] = field(default_factory=dict, hash=False)
    #: At most this many deliveries per second, with this burst, across every worker process;
    #: ``None``: no limit. Given as a limit or its JSON form; kept as a limit.
    rate_limit: RateLimit | None = None
    #: What an ordering key of this subscription does when its head is dead-lettered: wait for
    #: an operator (``block``, the default) or move on (``skip``); see :mod:`.ordering`.
    ordering_policy: OrderingPolicy = DEFAULT_ORDERING_POLICY
    #: The tenant the subscription belongs to (:mod:`~flask_harvest.webhooks.tenants`): it gets the
    #: events dispatched for that tenant only. ``None``: no tenant, the events dispatched without one.
    #: Set at creation; an edit cannot move a subscription to another tenant.
    tenant: str | None = None

    def __post_init__(self) -> None:
        for name, check in _SUBSCRIPTION_VALIDATORS.items():
            object.__setattr__(self, name, check(getattr(self, name)))

    @classmethod
    def from_trusted(cls, values: Mapping[str, Any]) -> WebhookSubscription:
        """Build a subscription without validating it, from values that were validated when
        stored (a store reading its own rows): ``values`` holds every field, typed as the model
        types it, and is taken as given."""
        subscription = cls.__new__(cls)
        # The dataclass is frozen, so its fields are set the way __init__ sets them: in __dict__.
        subscription.__dict__.update(values)
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

    def wants(self, payload: Callable[[], Any]) -> bool:
        """Return whether this subscription takes an event with the payload ``payload()`` returns
        (the decoded JSON): called only when there is a filter, so a payload is decoded only for
        subscriptions that filter."""
        return self.payload_filter is None or evaluate(self.payload_filter, payload())

    def replace(self, **changes: Any) -> WebhookSubscription:
        """Return a copy with ``changes`` applied and validated."""
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        """Return the subscription as JSON-ready data, without its secrets; the payload filter in
        its JSON form."""
        data = json_fields(self)
        data["payload_filter"] = filter_json(self.payload_filter)
        data["rate_limit"] = None if self.rate_limit is None else self.rate_limit.to_dict()
        return data


def filter_json(condition: Condition | None) -> dict[str, Any] | None:
    """Return a payload filter's JSON form, ``None`` for none."""
    return condition_to_json(condition) if condition is not None else None


@dataclass(frozen=True)
class SubscriptionChanges:
    """What an edit of a subscription sets; a field left ``None`` keeps its stored value.

    A store applies it to the stored row as it is at that moment, writing only these fields, so
    an edit never undoes what a worker wrote meanwhile (a failure counted, a status set). Each
    field is validated like the subscription's own. Setting ``status`` to ``ACTIVE`` also clears
    the failure count. ``headers`` replaces all of them (``{}`` removes them);
    ``remove_payload_filter`` removes the filter (it cannot be given with one), and
    ``remove_rate_limit`` the rate limit.
    """

    target_url: str | None = None
    event_topics: Sequence[str] | None = None
    description: str | None = None
    status: WebhookSubscriptionStatus | None = None
    payload_filter: Condition | Mapping[str, Any] | None = None
    headers: Mapping[str, str] | None = None
    remove_payload_filter: bool = False
    rate_limit: RateLimit | Mapping[str, Any] | None = None
    remove_rate_limit: bool = False
    ordering_policy: OrderingPolicy | None = None

    def __post_init__(self) -> None:
        for flag in ("remove_payload_filter", "remove_rate_limit"):
            if not isinstance(getattr(self, flag), bool):
                raise InvalidFieldError(flag, "must be true or false")
        if self.remove_payload_filter and self.payload_filter is not None:
            raise InvalidFieldError("payload_filter", "give a new filter or remove the filter, not both")
        if self.remove_rate_limit and self.rate_limit is not None:
            raise InvalidFieldError("rate_limit", "give a new rate limit or remove it, not both")
        for item in dataclasses.fields(self):
            value = getattr(self, item.name)
            if value is not None and item.name in _SUBSCRIPTION_VALIDATORS:
                object.__setattr__(self, item.name, _SUBSCRIPTION_VALIDATORS[item.name](value))

    def values(self) -> dict[str, Any]:
        """Return the subscription fields this edit sets, as the model types them."""
        values = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        del values["remove_payload_filter"], values["remove_rate_limit"]
        values = {name: value for name, value in values.items() if value is not None}
        if self.remove_payload_filter:
            values["payload_filter"] = None
        if self.remove_rate_limit:
            values["rate_limit"] = None
        if self.status is WebhookSubscriptionStatus.ACTIVE:
            values["consecutive_failures"] = 0
        return values


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
    lease_expires_at: datetime | None = field(default=None, metadata=PRIVATE)
    #: The W3C trace context of the dispatch, stored so every attempt joins its trace
    #: (:mod:`flask_harvest.tracing`); ``None`` when nothing was traced.
    trace_context: str | None = field(default=None, repr=False, metadata=PRIVATE)
    #: Deliveries of one subscription with the same key are attempted one at a time, in dispatch
    #: order (:mod:`.ordering`); ``None``: unordered.
    ordering_key: str | None = None
    #: The key's sequence number at dispatch, given by the store: the delivery's place in line.
    ordering_seq: int | None = None
    #: The tenant of its subscription, copied when the delivery is made, so that a tenant's
    #: deliveries are listed without reading the subscriptions; ``None``: no tenant.
    tenant: str | None = None

    def __post_init__(self) -> None:
        if self.ordering_key is not None:
            validate_ordering_key(self.ordering_key)

    @property
    def is_dlq(self) -> bool:
        return self.state is DeliveryState.DLQ

    def replace(self, **changes: Any) -> DeliveryLog:
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        """Return the delivery in the DLQ's JSON shape, plus its state and schedule."""
        return {**json_fields(self), "is_dlq": self.is_dlq}


class DeliverySummary(NamedTuple):
    """What a list of deliveries shows of one (the dashboard's): a :class:`DeliveryLog` without
    its payload, headers, response body and schedule, cheap to read and to build."""

    id: str
    subscription_id: str
    topic: str
    state: DeliveryState
    attempt: int
    max_attempts: int
    response_status: int | None
    last_error: str | None
    timestamp: datetime

    @classmethod
    def of(cls, delivery: DeliveryLog) -> DeliverySummary:
        """Return the summary of ``delivery``."""
        return cls(*(getattr(delivery, name) for name in cls._fields))


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
        return json_fields(self)


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
class OperationalContext:
    """What a store needs to notify the operational endpoint of a transition an attempt causes
    (:mod:`flask_harvest.webhooks.operational`): set by the outcome rules when an endpoint is
    configured and the delivery is not one of its own."""

    #: The subscription the notifications are delivered to.
    subscription_id: str
    #: The notifications' attempt limit.
    max_attempts: int
    #: The topic and creation time of the delivery the attempt was made for.
    topic: str
    created_at: datetime
    #: Its subscription's URL as it may be shown (credentials and query values hidden).
    subscription_url: str
    #: The tenant of that delivery, named in the notifications (which are the application's own,
    #: untenanted deliveries).
    tenant: str | None = None


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
    #: Where a transition this result causes (a dead letter, a subscription turned off) is
    #: notified; ``None``: nowhere (no operational endpoint, or the delivery is one of its own).
    operational: OperationalContext | None = None


def claimed_subscription(
    delivery: DeliveryLog, subscription: WebhookSubscription | None
) -> WebhookSubscription | None:
    """The subscription a claimed delivery is sent to: ``None`` when it was removed, or when its
    id now names a subscription of another tenant (an id chosen again after a removal), which must
    never receive the first one's events. Pure."""
    if subscription is None or subscription.tenant != delivery.tenant:
        return None
    return subscription


@dataclass(frozen=True)
class Claim:
    """A delivery leased to one worker, with its subscription as it was at the claim."""

    delivery: DeliveryLog
    subscription: WebhookSubscription | None
    lease_token: str


#: The states whose longest-waiting rows a capped count reads; in the others (the history) it
#: reads the newest.
WAITING_STATES = frozenset({DeliveryState.PENDING.value, DeliveryState.INFLIGHT.value})


@dataclass(frozen=True)
class DeliveryStats:
    """Counts of deliveries by state, and the creation time of the oldest pending one.

    Counted with a ``cap``, a state with more than ``cap`` rows is in ``capped``: its overall
    count is ``cap`` and means "more than that", and a subscription's count in it is its share of
    the ``cap`` rows read (the longest-waiting ones for ``pending`` and ``inflight``, the newest
    for the others), a lower bound. The oldest pending time is then the oldest among those read.
    """

    counts: Mapping[str, int] = field(default_factory=dict)
    oldest_pending_at: datetime | None = None
    #: The states whose count stopped at ``cap``.
    capped: frozenset[str] = frozenset()
    #: The most rows counted in one state; ``None``: counted exactly.
    cap: int | None = None

    def to_dict(self, now: datetime) -> dict[str, Any]:
        counts = {state.value: int(self.counts.get(state.value, 0)) for state in DeliveryState}
        oldest = self.oldest_pending_at
        return {
            "counts": counts,
            "capped": {state.value: state.value in self.capped for state in DeliveryState},
            "count_cap": self.cap,
            "dlq_depth": counts[DeliveryState.DLQ.value],
            "oldest_pending_age_seconds": round((now - oldest).total_seconds(), 3) if oldest else None,
        }


def count_text(stats: Mapping[str, Any], state: str) -> str:
    """A count of :meth:`DeliveryStats.to_dict`'s as people read it: ``1000+`` when capped."""
    count = int(stats["counts"][state])
    return f"{count}+" if stats.get("capped", {}).get(state) else str(count)
