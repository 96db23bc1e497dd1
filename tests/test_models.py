"""Topic matching and validation, subscription validation, and the JSON shape of deliveries."""

from __future__ import annotations

import dataclasses
import inspect
import json
from datetime import datetime, timedelta, timezone

import pytest

from flask_harvest.errors import InvalidFieldError, InvalidSecretError
from flask_harvest.webhooks.models import (
    MAX_URL_LENGTH,
    DeliveryLog,
    DeliveryState,
    WebhookSubscription,
    WebhookSubscriptionStatus,
    topic_matches,
    validate_topic,
)

SECRET = "whsec_c2VjcmV0LXNpZ25pbmcta2V5LW9mLTMyLWJ5dGVzISE="
URL = "https://api.consumer.com/webhooks/receiver"


def make(**changes):
    fields = {
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
def test_topic_matches(pattern, topic, expected):
    assert topic_matches(pattern, topic) is expected


@pytest.mark.parametrize("topic", ["order.created", "order", "a_b-c:d.E9", "invoice.payment_failed"])
def test_validate_topic_accepts(topic):
    assert validate_topic(topic, pattern=False) == topic
    assert validate_topic(topic, pattern=True) == topic


@pytest.mark.parametrize("topic", ["*", "order.*", "order.*.added", "*.created"])
def test_validate_topic_accepts_wildcards_only_in_patterns(topic):
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
def test_validate_topic_rejects(topic):
    for pattern in (False, True):
        with pytest.raises(InvalidFieldError) as info:
            validate_topic(topic, pattern=pattern, field_name="event_topics")
        assert info.value.field == "event_topics"


# -- subscriptions ----------------------------------------------------------------------------------


def test_valid_subscription():
    sub = make(description="orders")
    assert sub.id == "sub_123"
    assert sub.status is WebhookSubscriptionStatus.ACTIVE
    assert WebhookSubscriptionStatus.Active is WebhookSubscriptionStatus.ACTIVE
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
def test_valid_urls(url):
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
def test_invalid_urls(url):
    with pytest.raises(InvalidFieldError) as info:
        make(target_url=url)
    assert info.value.field == "target_url"
    assert SECRET not in str(info.value)


@pytest.mark.parametrize(
    "topics", [[], (), "order.created", None, 42, ["order..x"], ["order.created", ""], [None]]
)
def test_invalid_topics(topics):
    with pytest.raises(InvalidFieldError) as info:
        make(event_topics=topics)
    assert info.value.field == "event_topics"


def test_topics_are_deduplicated_into_a_tuple_in_order():
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
def test_invalid_secret(secret, error):
    with pytest.raises(error) as info:
        make(secret=secret)
    assert info.value.field == "secret"
    if isinstance(secret, str) and secret != "whsec_" and secret:
        assert secret not in str(info.value)
        assert secret not in repr(info.value)
        assert secret[len("whsec_") :] not in str(info.value)


def test_plain_secret_is_accepted():
    assert make(secret="a plain shared secret").secret == "a plain shared secret"


def test_secret_is_not_in_repr_str_or_to_dict():
    sub = make()
    for text in (repr(sub), str(sub), json.dumps(sub.to_dict())):
        assert SECRET not in text
        assert SECRET[len("whsec_") :] not in text
    assert "secret" not in sub.to_dict()
    assert sub.secret == SECRET


def test_secret_is_not_in_errors_about_other_fields():
    with pytest.raises(InvalidFieldError) as info:
        make(target_url="ftp://example.com", event_topics=[])
    assert SECRET not in str(info.value)
    assert SECRET not in repr(info.value)


def test_id_validation():
    for bad in ("", "x" * 256, None):
        with pytest.raises(InvalidFieldError) as info:
            make(id=bad)
        assert info.value.field == "id"
    assert make(id="x" * 255).id == "x" * 255
    generated = WebhookSubscription(target_url=URL, event_topics=["a"], secret=SECRET)
    assert generated.id.startswith("sub_")
    assert generated.id != WebhookSubscription(target_url=URL, event_topics=["a"], secret=SECRET).id


def test_negative_failure_count_is_rejected():
    with pytest.raises(InvalidFieldError) as info:
        make(consecutive_failures=-1)
    assert info.value.field == "consecutive_failures"


def test_status_from_string():
    sub = make(status="failed")
    assert sub.status is WebhookSubscriptionStatus.FAILED
    assert not sub.is_active


def test_replace_validates_again():
    sub = make()
    with pytest.raises(InvalidFieldError) as info:
        sub.replace(target_url="ftp://example.com")
    assert info.value.field == "target_url"
    assert sub.replace(event_topics=["x", "x"]).event_topics == ("x",)


def test_from_trusted_builds_the_same_subscription_without_validating():
    sub = make(previous_secret=SECRET, previous_secret_expires_at=datetime(2026, 1, 1, tzinfo=timezone.utc))
    fields = {f.name: getattr(sub, f.name) for f in dataclasses.fields(WebhookSubscription)}

    trusted = WebhookSubscription.from_trusted(**fields)

    assert trusted == sub
    assert hash(trusted) == hash(sub)
    assert repr(trusted) == repr(sub)
    # Every field is a parameter, so a field added later cannot be left unset.
    assert set(inspect.signature(WebhookSubscription.from_trusted).parameters) == set(fields)
    # Trusted means unchecked: only a store reading its own validated rows may use it.
    assert WebhookSubscription.from_trusted(**{**fields, "target_url": "not a url"}).target_url == "not a url"
    with pytest.raises(dataclasses.FrozenInstanceError):
        trusted.description = "changed"  # type: ignore[misc]


def test_subscription_to_dict():
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
    }


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


def test_delivery_to_dict_is_the_seed_dlq_shape_plus_state_and_schedule():
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
    assert set(data) == SEED_DLQ_FIELDS | {"state", "next_attempt_at", "created_at"}
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


def test_pending_delivery_to_dict():
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


def test_delivery_to_dict_copies_the_headers():
    headers = {"A": "1"}
    data = DeliveryLog(
        id="l", subscription_id="s", topic="t", payload="{}", request_headers=headers
    ).to_dict()
    data["request_headers"]["B"] = "2"
    assert headers == {"A": "1"}
