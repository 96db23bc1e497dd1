"""Topic matching and validation, subscription validation, and the JSON shape of deliveries."""

from __future__ import annotations

import dataclasses
import json
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flask_harvest.errors import InvalidFieldError, InvalidSecretError
from flask_harvest.outbound.rate import RateLimit
from flask_harvest.outbound.signing import secret_key
from flask_harvest.webhooks.models import (
    MAX_DESCRIPTION_LENGTH,
    MAX_URL_LENGTH,
    DeliveryAttempt,
    DeliveryLog,
    DeliveryState,
    SubscriptionChanges,
    WebhookSubscription,
    WebhookSubscriptionStatus,
    standard_secret,
)
from flask_harvest.webhooks.topics import topic_matches, validate_topic

SECRET = "whsec_c2VjcmV0LXNpZ25pbmcta2V5LW9mLTMyLWJ5dGVzISE="
URL = "https://api.consumer.com/webhooks/receiver"


def make(**changes: Any) -> WebhookSubscription:
    fields: dict[str, Any] = {
        "id": "sub_123",
        "target_url": URL,
        "event_topics": ["order.created", "order.fulfilled"],
        "secret": SECRET,
    }
    fields.update(changes)
    return WebhookSubscription(**fields)


# -- topics -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("pattern", "topic", "expected"),
    [
        ("order.created", "order.created", True),
        ("order.created", "order.updated", False),
        ("order.created", "order", False),
        ("order.created", "order.created.v2", False),
        ("order", "order.created", False),
        ("order.*", "order.created", True),
        ("order.*", "order.item.added", True),
        ("order.*", "order", False),
        ("order.*", "orders.created", False),
        ("order.*", "xorder.created", False),
        ("*", "order", True),
        ("*", "order.created", True),
        ("*", "a.b.c.d", True),
        ("order.*.added", "order.item.added", True),
        ("order.*.added", "order.line.added", True),
        ("order.*.added", "order.added", False),
        ("order.*.added", "order.item.sub.added", False),
        ("order.*.added", "order.item.removed", False),
        ("*.created", "order.created", True),
        ("*.created", "order.item.created", False),
        ("*.created", "created", False),
    ],
)
def test_topic_matches(pattern: str, topic: str, expected: bool) -> None:
    assert topic_matches(pattern, topic) is expected


@pytest.mark.parametrize("topic", ["order.created", "order", "a_b-c:d.E9", "invoice.payment_failed"])
def test_validate_topic_accepts(topic: str) -> None:
    assert validate_topic(topic, pattern=False) == topic
    assert validate_topic(topic, pattern=True) == topic


@pytest.mark.parametrize("topic", ["*", "order.*", "order.*.added", "*.created"])
def test_validate_topic_accepts_wildcards_only_in_patterns(topic: str) -> None:
    assert validate_topic(topic, pattern=True) == topic
    with pytest.raises(InvalidFieldError):
        validate_topic(topic, pattern=False)


@pytest.mark.parametrize(
    "topic",
    [
        "",
        " ",
        "order created",
        "order. created",
        "order..x",
        ".order",
        "order.",
        "order.created\n",
        "order/created",
        "order.**",
        "order.cr*",
        None,
        ["order.created"],
    ],
)
def test_validate_topic_rejects(topic: object) -> None:
    for pattern in (False, True):
        with pytest.raises(InvalidFieldError) as info:
            validate_topic(topic, pattern=pattern, field_name="event_topics")  # type: ignore[arg-type]
        assert info.value.field == "event_topics"


# -- subscriptions ----------------------------------------------------------------------------------


def test_valid_subscription() -> None:
    sub = make(description="orders")
    assert sub.id == "sub_123"
    assert sub.status is WebhookSubscriptionStatus.ACTIVE
    assert sub.is_active
    assert sub.consecutive_failures == 0
    assert sub.matches("order.created")
    assert not sub.matches("order.cancelled")


@pytest.mark.parametrize(
    "url",
    [
        "https://example.com",
        "http://localhost:8080/hook",
        "https://example.com:443/a?b=c#d",
        "http://[::1]:8000/x",
        "https://example.com/" + "a" * (MAX_URL_LENGTH - len("https://example.com/")),
    ],
)
def test_valid_urls(url: str) -> None:
    assert make(target_url=url).target_url == url


@pytest.mark.parametrize(
    "url",
    [
        "",
        "api.consumer.com/webhooks",  # no scheme
        "//api.consumer.com/webhooks",
        "ftp://example.com/hook",
        "mailto:ops@example.com",
        "javascript:alert(1)",
        "http://",  # no host
        "https:///path",
        "http://:8080/path",
        "https://exa mple.com/",
        "https://example.com/a b",
        "https://example.com/\n",
        "https://example.com/" + "a" * (MAX_URL_LENGTH - len("https://example.com/") + 1),
        "https://example.com:99999/",
        "https://example.com:0/",
        "https://example.com:-1/",
        "https://example.com:abc/",
        "http://[::1/x",
        None,
        b"https://example.com",
    ],
)
def test_invalid_urls(url: object) -> None:
    with pytest.raises(InvalidFieldError) as info:
        make(target_url=url)
    assert info.value.field == "target_url"
    assert SECRET not in str(info.value)


@pytest.mark.parametrize(
    "topics", [[], (), "order.created", None, 42, ["order..x"], ["order.created", ""], [None]]
)
def test_invalid_topics(topics: object) -> None:
    with pytest.raises(InvalidFieldError) as info:
        make(event_topics=topics)
    assert info.value.field == "event_topics"


def test_topics_are_deduplicated_into_a_tuple_in_order() -> None:
    sub = make(event_topics=["order.fulfilled", "order.created", "order.fulfilled", "order.*"])
    assert sub.event_topics == ("order.fulfilled", "order.created", "order.*")
    assert make(event_topics=("a", "a")).event_topics == ("a",)


@pytest.mark.parametrize(
    ("secret", "error"),
    [
        ("", InvalidSecretError),
        ("whsec_", InvalidSecretError),
        ("whsec_not!base64", InvalidSecretError),
        ("whsec_stripe_style_signing_secret_key_32_bytes!!", InvalidSecretError),
        (None, InvalidFieldError),
        (b"whsec_c2VjcmV0", InvalidFieldError),
    ],
)
def test_invalid_secret(secret: object, error: type[InvalidFieldError]) -> None:
    with pytest.raises(error) as info:
        make(secret=secret)
    assert info.value.field == "secret"
    if isinstance(secret, str) and secret != "whsec_" and secret:
        assert secret not in str(info.value)
        assert secret not in repr(info.value)
        assert secret[len("whsec_") :] not in str(info.value)


def test_plain_secret_is_accepted() -> None:
    assert make(secret="a plain shared secret").secret == "a plain shared secret"


def test_secret_is_not_in_repr_str_or_to_dict() -> None:
    sub = make()
    for text in (repr(sub), str(sub), json.dumps(sub.to_dict())):
        assert SECRET not in text
        assert SECRET[len("whsec_") :] not in text
    assert "secret" not in sub.to_dict()
    assert sub.secret == SECRET


def test_secret_is_not_in_errors_about_other_fields() -> None:
    with pytest.raises(InvalidFieldError) as info:
        make(target_url="ftp://example.com", event_topics=[])
    assert SECRET not in str(info.value)
    assert SECRET not in repr(info.value)


def test_id_validation() -> None:
    for bad in ("", "x" * 256, None):
        with pytest.raises(InvalidFieldError) as info:
            make(id=bad)
        assert info.value.field == "id"
    assert make(id="x" * 255).id == "x" * 255
    generated = WebhookSubscription(target_url=URL, event_topics=["a"], secret=SECRET)
    assert generated.id.startswith("sub_")
    assert generated.id != WebhookSubscription(target_url=URL, event_topics=["a"], secret=SECRET).id


NAIVE = datetime(2026, 1, 1)
AWARE = datetime(2026, 1, 1, tzinfo=timezone.utc)


@pytest.mark.parametrize(
    ("field", "bad"),
    [
        ("id", "sub\x00x"),
        ("id", "sub_\ud800"),
        ("id", 42),
        ("target_url", "https://example.com/\x00"),
        ("target_url", "https://example.com\\@evil.example/"),
        ("event_topics", [1]),
        ("event_topics", [["a"]]),
        ("secret", "plain\x00secret"),
        ("secret", "plain\ud800secret"),
        ("secret", 42),
        ("status", "paused"),
        ("status", None),
        ("status", ["active"]),
        ("status", {}),
        ("consecutive_failures", -1),
        ("consecutive_failures", "3"),
        ("consecutive_failures", 1.0),
        ("consecutive_failures", True),
        ("consecutive_failures", None),
        ("consecutive_failures", 2**31),
        ("description", None),
        ("description", 42),
        ("description", "x" * (MAX_DESCRIPTION_LENGTH + 1)),
        ("description", "nul \x00 inside"),
        ("description", "\udfff"),
        ("created_at", None),
        ("created_at", "2026-01-01T00:00:00Z"),
        ("created_at", NAIVE),
        ("created_at", datetime.max.replace(tzinfo=timezone(timedelta(hours=-12)))),
        ("updated_at", 0),
        ("updated_at", NAIVE),
        ("previous_secret", 42),
        ("previous_secret", ""),
        ("previous_secret", "whsec_not!base64"),
        ("previous_secret", ["whsec_"]),
        ("previous_secret_expires_at", "tomorrow"),
        ("previous_secret_expires_at", NAIVE),
        ("previous_secret_expires_at", datetime.min.replace(tzinfo=timezone(timedelta(hours=14)))),
    ],
)
def test_every_field_is_validated_with_an_error_naming_it(field: str, bad: object) -> None:
    # Issue 16, item 7: any type was accepted for some fields, others raised a plain
    # ValueError, TypeError or AttributeError.
    with pytest.raises(InvalidFieldError) as info:
        make(**{field: bad})
    assert info.value.field == field
    assert SECRET not in str(info.value)


def test_the_fields_accept_their_edge_values() -> None:
    sub = make(
        consecutive_failures=2**31 - 1,
        description="x" * MAX_DESCRIPTION_LENGTH,
        created_at=AWARE,
        updated_at=datetime(2026, 1, 1, 5, tzinfo=timezone(timedelta(hours=5))),
        previous_secret="a plain old secret",
        previous_secret_expires_at=AWARE,
        status=WebhookSubscriptionStatus.DISABLED,
    )
    assert sub.consecutive_failures == 2**31 - 1
    assert sub.previous_secret == "a plain old secret"
    assert sub.status is WebhookSubscriptionStatus.DISABLED


def assert_names_one_of(error: InvalidFieldError, given: dict[str, object]) -> None:
    """The error names a field that was given an arbitrary value, never another one."""
    assert error.field in given, (error.field, sorted(given))


_ANY_VALUE = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(allow_nan=True),
    st.text(),
    st.binary(max_size=8),
    st.datetimes(timezones=st.none() | st.timezones()),
    st.lists(st.text(max_size=12), max_size=3),
    st.dictionaries(st.text(max_size=4), st.integers(), max_size=2),
    st.sampled_from(["active", "failed", "disabled", SECRET, "https://example.com/h", "order.*", ""]),
)
_FIELDS = [f.name for f in dataclasses.fields(WebhookSubscription)]


@settings(max_examples=400, deadline=None)
@given(st.dictionaries(st.sampled_from(_FIELDS), _ANY_VALUE, min_size=1))
def test_the_constructor_raises_invalid_field_error_or_succeeds(changes: dict[str, object]) -> None:
    values = {"target_url": URL, "event_topics": ["order.*"], "secret": SECRET, **changes}
    try:
        sub = WebhookSubscription(**values)  # type: ignore[arg-type]
    except InvalidFieldError as exc:
        assert_names_one_of(exc, changes)
        return
    # What was accepted can be shown and signed with.
    sub.to_dict()
    json.dumps(sub.to_dict())
    for secret in sub.signing_secrets(AWARE):
        secret_key(secret)


@settings(max_examples=200, deadline=None)
@given(
    st.fixed_dictionaries(
        {},
        optional={name: _ANY_VALUE for name in ("target_url", "event_topics", "description", "status")},
    )
)
def test_changes_raise_invalid_field_error_or_succeed(values: dict[str, object]) -> None:
    try:
        changes = SubscriptionChanges(**values)  # type: ignore[arg-type]
    except InvalidFieldError as exc:
        assert_names_one_of(exc, values)
        return
    make().replace(**changes.values())


def test_changes_name_only_what_they_set() -> None:
    assert SubscriptionChanges().values() == {}
    assert SubscriptionChanges(description="").values() == {"description": ""}
    assert SubscriptionChanges(event_topics=["a", "a"]).values() == {"event_topics": ("a",)}
    assert SubscriptionChanges(status="disabled").values() == {  # type: ignore[arg-type]
        "status": WebhookSubscriptionStatus.DISABLED
    }
    assert SubscriptionChanges(status=WebhookSubscriptionStatus.ACTIVE).values() == {
        "status": WebhookSubscriptionStatus.ACTIVE,
        "consecutive_failures": 0,
    }
    with pytest.raises(InvalidFieldError) as info:
        SubscriptionChanges(target_url="ftp://example.com")
    assert info.value.field == "target_url"


def test_standard_secret_keeps_the_signing_key() -> None:
    plain = "a plain shared secret ünïcode"
    normalised = standard_secret(plain)
    assert normalised.startswith("whsec_")
    assert secret_key(normalised) == secret_key(plain) == plain.encode("utf-8")
    assert standard_secret(SECRET) == SECRET
    assert standard_secret(normalised) == normalised
    with pytest.raises(InvalidSecretError):
        standard_secret("whsec_not!base64")


def test_status_from_string() -> None:
    sub = make(status="failed")
    assert sub.status is WebhookSubscriptionStatus.FAILED
    assert not sub.is_active


def test_replace_validates_again() -> None:
    sub = make()
    with pytest.raises(InvalidFieldError) as info:
        sub.replace(target_url="ftp://example.com")
    assert info.value.field == "target_url"
    assert sub.replace(event_topics=["x", "x"]).event_topics == ("x",)


def test_from_trusted_builds_the_same_subscription_without_validating() -> None:
    sub = make(previous_secret=SECRET, previous_secret_expires_at=datetime(2026, 1, 1, tzinfo=timezone.utc))
    fields = {f.name: getattr(sub, f.name) for f in dataclasses.fields(WebhookSubscription)}

    trusted = WebhookSubscription.from_trusted(fields)

    assert trusted == sub
    assert hash(trusted) == hash(sub)
    assert repr(trusted) == repr(sub)
    # Trusted means unchecked: only a store reading its own validated rows may use it.
    assert WebhookSubscription.from_trusted({**fields, "target_url": "not a url"}).target_url == "not a url"
    with pytest.raises(dataclasses.FrozenInstanceError):
        trusted.description = "changed"  # type: ignore[misc]


def test_subscription_to_dict() -> None:
    created = datetime(2026, 5, 26, 7, 0, tzinfo=timezone(timedelta(hours=2)))
    sub = make(created_at=created, updated_at=created, description="d")
    assert sub.to_dict() == {
        "id": "sub_123",
        "target_url": URL,
        "event_topics": ["order.created", "order.fulfilled"],
        "status": "active",
        "consecutive_failures": 0,
        "description": "d",
        "created_at": "2026-05-26T05:00:00Z",
        "updated_at": "2026-05-26T05:00:00Z",
        "previous_secret_expires_at": None,
        "payload_filter": None,
        "headers": {},
        "rate_limit": None,
        "ordering_policy": "block",
        "tenant": None,
    }
    assert next(iter(sub.to_dict())) == "id"
    filtered = sub.replace(
        payload_filter={"type": "Eq", "data": {"path": "a", "value": 1}}, headers={"X-A": "b"}
    )
    assert filtered.to_dict()["payload_filter"] == {"type": "Eq", "data": {"path": "a", "value": 1}}
    assert filtered.to_dict()["headers"] == {"X-A": "b"}
    limited = sub.replace(rate_limit={"per_second": 10, "burst": 5})
    assert limited.rate_limit == RateLimit(per_second=10.0, burst=5)
    assert limited.to_dict()["rate_limit"] == {"per_second": 10.0, "burst": 5}


@pytest.mark.parametrize(
    "value",
    [
        {"per_second": 0, "burst": 1},
        {"per_second": -5, "burst": 1},
        {"per_second": float("nan"), "burst": 1},
        {"per_second": 10, "burst": 0},
        {"per_second": 10, "burst": 2.5},
        {"per_second": 10},
        {"per_second": 10, "burst": 1, "extra": 1},
        "10/s",
        [10, 1],
    ],
)
def test_a_bad_rate_limit_is_refused_naming_the_field(value: object) -> None:
    with pytest.raises(InvalidFieldError) as info:
        make(rate_limit=value)
    assert info.value.field == "rate_limit"
    with pytest.raises(InvalidFieldError):
        SubscriptionChanges(rate_limit=value)  # type: ignore[arg-type]


def test_an_edit_sets_or_removes_the_rate_limit_not_both() -> None:
    assert SubscriptionChanges(rate_limit={"per_second": 2, "burst": 3}).values() == {
        "rate_limit": RateLimit(per_second=2.0, burst=3)
    }
    assert SubscriptionChanges(remove_rate_limit=True).values() == {"rate_limit": None}
    with pytest.raises(InvalidFieldError):
        SubscriptionChanges(rate_limit={"per_second": 2, "burst": 3}, remove_rate_limit=True)


# -- deliveries -------------------------------------------------------------------------------------

SEED_DLQ_FIELDS = {
    "id",
    "subscription_id",
    "topic",
    "payload",
    "request_headers",
    "response_status",
    "response_body",
    "elapsed_ms",
    "attempt",
    "max_attempts",
    "is_dlq",
    "last_error",
    "timestamp",
}


def test_delivery_to_dict_is_the_seed_dlq_shape_plus_state_and_schedule() -> None:
    at = datetime(2026, 5, 26, 5, 0, tzinfo=timezone.utc)
    log = DeliveryLog(
        id="log_456",
        subscription_id="sub_123",
        topic="order.created",
        payload='{"order_id":"ord_999"}',
        state=DeliveryState.DLQ,
        attempt=5,
        max_attempts=5,
        request_headers={"Content-Type": "application/json", "Autumn-Signature": "t=1778930400,v1=..."},
        response_status=500,
        response_body='{"error":"Internal Server Error"}',
        elapsed_ms=142,
        last_error="server returned status: 500",
        timestamp=at,
        next_attempt_at=None,
        created_at=datetime(2026, 5, 26, 6, 59, 30, tzinfo=timezone(timedelta(hours=2))),
    )
    data = log.to_dict()
    assert set(data) == SEED_DLQ_FIELDS | {
        "state",
        "next_attempt_at",
        "created_at",
        "ordering_key",
        "ordering_seq",
        "tenant",
    }
    assert next(iter(data)) == "id"
    # The seed's example, field for field.
    assert {key: data[key] for key in SEED_DLQ_FIELDS} == {
        "id": "log_456",
        "subscription_id": "sub_123",
        "topic": "order.created",
        "payload": '{"order_id":"ord_999"}',
        "request_headers": {"Content-Type": "application/json", "Autumn-Signature": "t=1778930400,v1=..."},
        "response_status": 500,
        "response_body": '{"error":"Internal Server Error"}',
        "elapsed_ms": 142,
        "attempt": 5,
        "max_attempts": 5,
        "is_dlq": True,
        "last_error": "server returned status: 500",
        "timestamp": "2026-05-26T05:00:00Z",
    }
    assert data["state"] == "dlq"
    assert data["next_attempt_at"] is None
    assert data["created_at"] == "2026-05-26T04:59:30Z"
    assert json.loads(json.dumps(data)) == data


def test_pending_delivery_to_dict() -> None:
    at = datetime(2026, 5, 26, 5, 0, 0, 123000, tzinfo=timezone.utc)
    log = DeliveryLog(
        id="log_1",
        subscription_id="sub_1",
        topic="t",
        payload="{}",
        timestamp=at,
        next_attempt_at=at + timedelta(seconds=2),
        created_at=at,
    )
    data = log.to_dict()
    assert data["state"] == "pending"
    assert data["is_dlq"] is False
    assert data["attempt"] == 1
    assert data["max_attempts"] == 5
    assert data["request_headers"] == {}
    assert data["response_status"] is None
    assert data["timestamp"] == "2026-05-26T05:00:00.123000Z"
    assert data["next_attempt_at"] == "2026-05-26T05:00:02.123000Z"
    for key in ("timestamp", "next_attempt_at", "created_at"):
        assert data[key].endswith("Z")
        assert "+00:00" not in data[key]


def test_delivery_to_dict_copies_the_headers() -> None:
    headers = {"A": "1"}
    data = DeliveryLog(
        id="l", subscription_id="s", topic="t", payload="{}", request_headers=headers
    ).to_dict()
    data["request_headers"]["B"] = "2"
    assert headers == {"A": "1"}


def test_attempt_to_dict() -> None:
    at = datetime(2026, 5, 26, 7, 0, tzinfo=timezone(timedelta(hours=2)))
    attempt = DeliveryAttempt("dlv_1", 2, at, 503, "busy", 12, "HTTP 503")
    assert attempt.to_dict() == {
        "delivery_id": "dlv_1",
        "attempt": 2,
        "started_at": "2026-05-26T05:00:00Z",
        "response_status": 503,
        "response_body": "busy",
        "elapsed_ms": 12,
        "error": "HTTP 503",
    }
