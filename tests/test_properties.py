"""Property tests over every public surface that takes input: the actuator's routes, the CLI's
commands, the model constructors, ``dispatch`` and ``verify_webhook``.

The property is the same everywhere: hostile input (NUL, lone surrogates, deep nesting, huge
numbers, NaN, odd datetimes, odd content types) gets a clear refusal, a 4xx JSON error,
:class:`~flask_harvest.errors.InvalidFieldError` or a one-line ``Error:``, or a success; never a
5xx, a traceback or another exception, and a refusal changes nothing. On memory, SQLite and
PostgreSQL (a NUL only fails on PostgreSQL).
"""

from __future__ import annotations

import json
import urllib.parse
from typing import Any

import pytest
import redis
from flask import Flask
from flask.testing import FlaskClient
from hypothesis import given
from hypothesis import strategies as st

from flask_harvest import (
    InvalidFieldError,
    OutboundWebhookHandler,
    WebhookSubscription,
    get_engine,
)
from flask_harvest.webhooks.models import SubscriptionChanges

from .pipeline import make_app
from .properties import (
    BODY_TEXTS,
    BUDGET,
    DATETIME_TEXTS,
    DATETIMES,
    JSON,
    NUMBERS,
    PAYLOADS,
    TEXT,
    json_text,
)
from .test_actuator import AUTH, PREFIX, SECRET, TOKEN, dead_letters, snapshot
from .test_receiver import Receiver, signed

ROUTES = [
    ("GET", "/dlq"),
    ("POST", "/replay"),
    ("GET", "/deliveries/{id}"),
    ("GET", "/stats"),
    ("GET", "/subscriptions"),
    ("POST", "/subscriptions"),
    ("GET", "/subscriptions/{id}"),
    ("PATCH", "/subscriptions/{id}"),
    ("DELETE", "/subscriptions/{id}"),
    ("POST", "/subscriptions/{id}/rotate-secret"),
    ("GET", "/event-types"),
    ("GET", "/event-types/{id}"),
    ("GET", "/{id}"),
]
METHODS = ["GET", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "HEAD"]
FIELDS = [
    "id",
    "target_url",
    "event_topics",
    "secret",
    "description",
    "status",
    "log_id",
    "subscription_id",
    "since",
    "until",
    "limit",
    "dry_run",
    "grace_seconds",
    "cursor",
    "topic",
]
VALUES = st.one_of(JSON, DATETIME_TEXTS, st.lists(TEXT, max_size=3))
BODIES = st.one_of(BODY_TEXTS, st.dictionaries(st.sampled_from(FIELDS), VALUES, max_size=4).map(json_text))
CONTENT_TYPES = st.sampled_from(
    [
        "application/json",
        "text/plain",
        "application/x-www-form-urlencoded",
        "application/json; charset=latin-1",
        "",
    ]
)
IDS = st.one_of(st.sampled_from(["sub_1", "msg_sub_1_000", "nope", "order.created"]), TEXT)


def quoted(text: str) -> str:
    return urllib.parse.quote(text.encode("utf-8", "surrogatepass"), safe="")


@pytest.fixture
def app(store: OutboundWebhookHandler, redis_conn: redis.Redis, redis_url: str) -> Flask:
    # RQ with no worker: queued jobs wait in Redis, so no attempt changes a row while an example
    # compares the store before and after a refused request.
    app = make_app(
        store, HARVEST_ACTUATOR_TOKEN=TOKEN, HARVEST_JOBS_BACKEND="rq", HARVEST_REDIS_URL=redis_url
    )
    # A catalog, so that the event-type routes and commands find something, and subscriptions
    # created by an example get topic warnings.
    get_engine(app).manager.catalog.register(
        "order.created", schema={"type": "object"}, example={"id": "ord_1"}, description="An order."
    )
    return app


def seed(store: OutboundWebhookHandler) -> None:
    """A subscription with dead letters, again if an example removed it."""
    if store.get_subscription("sub_1") is None:
        store.add_subscription(WebhookSubscription("https://a.example.com/h", ("a.b",), SECRET, id="sub_1"))
    if not store.list_dlq(limit=1, subscription_id="sub_1"):
        dead_letters(store, 2)


@BUDGET
@given(
    route=st.sampled_from(ROUTES),
    method=st.one_of(st.none(), st.sampled_from(METHODS)),
    path_id=IDS,
    query=st.dictionaries(st.sampled_from(FIELDS) | TEXT, TEXT | DATETIME_TEXTS, max_size=3),
    body=st.one_of(st.none(), BODIES),
    content_type=CONTENT_TYPES,
)
def test_no_request_gets_a_5xx_or_changes_anything_when_refused(
    app: Flask,
    store: OutboundWebhookHandler,
    route: tuple[str, str],
    method: str | None,
    path_id: str,
    query: dict[str, str],
    body: str | None,
    content_type: str,
) -> None:
    seed(store)
    client: FlaskClient = app.test_client()
    route_method, template = route
    path = PREFIX + template.format(id=quoted(path_id))
    query_string = "&".join(f"{quoted(k)}={quoted(v)}" for k, v in query.items())
    before = snapshot(store)
    response = client.open(
        f"{path}?{query_string}" if query_string else path,
        method=method or route_method,
        data=None if body is None else body.encode("utf-8", "surrogatepass"),
        headers={**AUTH, **({"Content-Type": content_type} if content_type else {})},
    )
    assert response.status_code < 500, response.get_data(as_text=True)
    if response.status_code >= 400:
        if response.request.method != "HEAD":
            assert response.get_json()["error"]["message"]
        assert snapshot(store) == before


CLI_COMMANDS = [
    lambda a, b, c: ["subscriptions", "show", a],
    lambda a, b, c: ["subscriptions", "add", a, "--topic", b, "--id", c, "--description", a],
    lambda a, b, c: [
        "subscriptions",
        "add",
        "https://a.example.com/h",
        "--topic",
        "a.b",
        "--secret",
        a,
        "--id",
        b,
    ],
    lambda a, b, c: ["subscriptions", "rotate-secret", a, "--secret", b],
    lambda a, b, c: ["subscriptions", "enable", a],
    lambda a, b, c: ["subscriptions", "disable", a],
    lambda a, b, c: ["subscriptions", "remove", "--yes", a],
    lambda a, b, c: ["dlq", "list", "--subscription", a, "--topic", b, "--cursor", c],
    lambda a, b, c: ["dlq", "replay", a],
    lambda a, b, c: ["dlq", "replay", "--subscription", a, "--since", b, "--until", c, "--dry-run"],
    lambda a, b, c: ["deliveries", "show", a],
    lambda a, b, c: ["event-types", "show", a],
    lambda a, b, c: ["event-types", "list"],
    lambda a, b, c: ["event-types", "rst", "--title", b],
    lambda a, b, c: ["purge", "--yes", "--before", a],
]


@BUDGET
@given(
    command=st.sampled_from(CLI_COMMANDS),
    a=IDS,
    b=st.one_of(TEXT, DATETIME_TEXTS),
    c=st.one_of(TEXT, DATETIME_TEXTS),
    as_json=st.booleans(),
)
def test_no_cli_command_ends_in_a_traceback(
    app: Flask, store: OutboundWebhookHandler, command: Any, a: str, b: str, c: str, as_json: bool
) -> None:
    seed(store)
    args = [arg for arg in command(a, b, c) if arg != ""] + (["--json"] if as_json else [])
    before = snapshot(store)
    result = app.test_cli_runner().invoke(args=["harvest", *args])
    assert result.exit_code in (0, 1, 2), result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    assert "Traceback" not in result.output
    if result.exit_code:
        errors = [line for line in result.output.splitlines() if line.startswith("Error")]
        assert len(errors) == 1, result.output
        assert snapshot(store) == before


ANY = st.one_of(st.none(), TEXT, NUMBERS, DATETIMES, st.lists(TEXT, max_size=3), st.booleans())


@BUDGET
@given(
    target_url=st.one_of(st.just("https://a.example.com/h"), ANY),
    event_topics=st.one_of(st.just(("a.b",)), ANY),
    secret=st.one_of(st.just(SECRET), ANY),
    extra=st.dictionaries(
        st.sampled_from(
            [
                "id",
                "status",
                "consecutive_failures",
                "description",
                "created_at",
                "updated_at",
                "previous_secret",
                "previous_secret_expires_at",
            ]
        ),
        ANY,
        max_size=3,
    ),
)
def test_a_subscription_is_valid_or_refused_with_invalid_field_error(
    target_url: Any, event_topics: Any, secret: Any, extra: dict[str, Any]
) -> None:
    try:
        subscription = WebhookSubscription(target_url, event_topics, secret, **extra)
    except InvalidFieldError:
        return
    # What was accepted can be stored and shown.
    json.dumps(subscription.to_dict()).encode("utf-8")
    assert "/" not in subscription.id and "\x00" not in subscription.id


@BUDGET
@given(
    extra=st.dictionaries(
        st.sampled_from(["target_url", "event_topics", "description", "status"]), ANY, max_size=3
    )
)
def test_subscription_changes_are_valid_or_refused_with_invalid_field_error(extra: dict[str, Any]) -> None:
    try:
        changes = SubscriptionChanges(**extra)
    except InvalidFieldError:
        return
    json.dumps(changes.values(), default=str).encode("utf-8")


@BUDGET
@given(topic=st.one_of(st.just("a.b"), TEXT), payload=PAYLOADS)
def test_dispatch_logs_only_what_it_can_send(
    app: Flask, store: OutboundWebhookHandler, topic: str, payload: Any
) -> None:
    seed(store)
    before = sum(store.delivery_stats()[0].counts.values())  # workers move states meanwhile
    try:
        ids = get_engine(app).manager.dispatch(topic, payload)
    except InvalidFieldError as exc:
        refused: InvalidFieldError | None = exc
    else:
        refused = None
        for delivery in store.get_deliveries(ids):
            json.loads(delivery.payload.encode("utf-8"))
    if refused is not None:
        assert refused.field in ("topic", "payload")
        assert sum(store.delivery_stats()[0].counts.values()) == before


@pytest.mark.parametrize("scheme", ["standard", "stripe"])
@BUDGET
@given(body=st.one_of(BODY_TEXTS.map(lambda t: t.encode("utf-8", "surrogatepass")), st.binary(max_size=64)))
def test_a_signed_hostile_body_is_handled_or_refused(scheme: str, body: bytes) -> None:
    receiver = Receiver(scheme=scheme)
    response = receiver.post(body, signed(body))
    assert response.status_code in (200, 400), response.get_data(as_text=True)
    if response.status_code == 400:
        assert response.get_json()["error"]["code"] == "invalid_json"
