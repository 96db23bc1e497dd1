"""An adversarial corpus over every edge, on SQLite and PostgreSQL: the actuator (every route and
method, hostile ids, query strings, bodies and headers), the Python API, the CLI and the receiver
kit. The property everywhere: a refusal is a 4xx JSON error (``InvalidFieldError`` or another
package error in Python, a one-line ``Error:`` in the CLI), never a 5xx, a traceback, an outage
signal for bad input or a secret in the output, and a refused request changes nothing."""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from flask import Flask
from flask.testing import FlaskClient

from flask_harvest import (
    HarvestError,
    InvalidFieldError,
    OutboundWebhookHandler,
    WebhookSubscription,
    get_engine,
)
from flask_harvest.errors import StoreError
from flask_harvest.outbound.signing import sign_headers
from flask_harvest.receiver import MemoryReplayCache, verify_completion_callback, verify_webhook
from flask_harvest.webhooks.stores.sql import SqlOutboundWebhookStore

from .pipeline import make_app
from .test_actuator import AUTH, PREFIX, SECRET, TOKEN, dead_letters, snapshot

SURROGATE = "\ud800"
HOSTILE_TEXT = ["\x00", SURROGATE, "\udcff", "x" * 5000, "a\u202eb", "\u00e9\u2603", " ", ""]
HOSTILE_PATH_IDS = [
    "a%00b",
    "%ED%A0%80",
    "%FF",
    "a%0Ab",
    "a%0D%0AX-Injected:%201",
    "x" * 3000,
    "a%2Fb",
    "%2e%2e",
    "a%20b",
    "%C0%AF",
    "%25",
    "sub_1%00",
]
ODD_DATETIMES = [
    "9999-12-31T23:59:59-12:00",
    "0001-01-01T00:00:00+14:00",
    "2020-12-31T23:59:60Z",
    "2020-01-01T00:00:00",
    "0000-01-01T00:00:00Z",
    "10000-01-01T00:00:00Z",
    "2020-01-01T00:00:00+24:00",
    "2020-02-30T00:00:00Z",
    "",
    "now",
]
ODD_NUMBERS: list[Any] = [10**400, -(10**30), -1, 0, 1.5, -0.0, 1e308, True, False, None, "1", [], {}, 2**63]
CUSTOM_METHODS = ["FOO", "PROPFIND", "TRACE", "MKCOL", "CONNECT"]


@pytest.fixture
def app(sql_store: SqlOutboundWebhookStore) -> Flask:
    return make_app(sql_store, HARVEST_ACTUATOR_TOKEN=TOKEN)


@pytest.fixture
def client(app: Flask, sql_store: SqlOutboundWebhookStore) -> FlaskClient:
    sql_store.add_subscription(WebhookSubscription("https://a.example.com/h", ("a.b",), SECRET, id="sub_1"))
    dead_letters(sql_store, 2)
    return app.test_client()


def assert_refused_or_fine(response: Any, context: object) -> None:
    """A success, or a 4xx answered in JSON: never a 5xx, never an HTML page."""
    assert response.status_code < 500, (context, response.get_data(as_text=True)[:300])
    if response.status_code >= 400:
        assert response.mimetype == "application/json", (context, response.get_data(as_text=True)[:300])
        assert response.get_json()["error"]["message"], context
    assert SECRET not in response.get_data(as_text=True), context


def send(client: FlaskClient, method: str, path: str, data: bytes | None = None, **kw: Any) -> Any:
    headers = {**AUTH, **kw.pop("headers", {})}
    return client.open(PREFIX + path, method=method, data=data, headers=headers, **kw)


# -- defects this audit found ----------------------------------------------------------------------


@pytest.mark.parametrize("method", CUSTOM_METHODS)
@pytest.mark.parametrize("path", ["", "/", "/subscriptions/sub_1", "/subscriptions", "/dlq", "/nope/x"])
def test_a_method_no_route_takes_is_a_json_405_or_404_after_the_access_check(
    client: FlaskClient, sql_store: OutboundWebhookHandler, method: str, path: str
) -> None:
    """Werkzeug refuses a custom method while routing, before the blueprint is known: it used to
    get Flask's HTML 405/404 page and skip the access check."""
    before = snapshot(sql_store)
    anonymous = client.open(PREFIX + path, method=method)
    assert anonymous.status_code == 401, anonymous.get_data(as_text=True)
    assert anonymous.mimetype == "application/json"

    response = send(client, method, path)
    assert response.status_code in (404, 405), response.get_data(as_text=True)
    assert response.mimetype == "application/json"
    if response.status_code == 405:
        assert response.get_json()["error"]["code"] == "method_not_allowed"
        allowed = set(response.headers["Allow"].split(", "))
        assert method not in allowed
        # The catch-all route takes every common method: it must not make them "allowed".
        assert "PUT" not in allowed
    assert snapshot(sql_store) == before


def test_unrouted_paths_outside_the_admin_prefix_keep_the_apps_own_pages(client: FlaskClient) -> None:
    response = client.open("/elsewhere", method="PROPFIND")
    assert response.status_code == 404
    assert response.mimetype == "text/html"


@pytest.mark.parametrize(
    "authorization",
    [f"Bearer {SURROGATE}", f"Bearer {TOKEN}{SURROGATE}", f"Bearer \udcff{TOKEN}", f"{SURROGATE} {TOKEN}"],
)
def test_an_authorization_header_that_is_not_text_is_refused_not_a_500(
    client: FlaskClient, authorization: str
) -> None:
    """A WSGI server sends Latin-1 headers, but a test client or an ASGI bridge may pass a lone
    surrogate: it used to raise UnicodeEncodeError in the token comparison (500)."""
    response = client.get(PREFIX + "/subscriptions", headers={"Authorization": authorization})
    assert response.status_code == 401, response.get_data(as_text=True)
    assert response.get_json()["error"]["code"] == "unauthorized"


def receiver_app(scheme: str) -> Flask:
    app = Flask("hostile_receiver")

    @app.post("/hook")
    @verify_webhook(SECRET, scheme=scheme, replay_cache=MemoryReplayCache())  # type: ignore[arg-type]
    def hook(payload: Any, delivery_id: str | None) -> Any:
        return {"id": delivery_id}

    return app


@pytest.mark.parametrize("scheme", ["standard", "stripe"])
@pytest.mark.parametrize("msg_id", ["\udcff", SURROGATE, "a\x00b"])
def test_a_webhook_id_that_is_not_text_is_a_400_not_a_500(scheme: str, msg_id: str) -> None:
    """A lone surrogate in webhook-id used to fail while encoding the signed message: a 500 HTML
    page from verify_webhook, on both schemes (the Stripe one checks a Standard signature too)."""
    body = b'{"a":1}'
    headers = sign_headers([SECRET], "msg_ok", int(time.time()), body)
    headers["webhook-id"] = msg_id
    response = receiver_app(scheme).test_client().post("/hook", data=body, headers=headers)
    assert response.status_code == 400, response.get_data(as_text=True)
    assert response.get_json()["error"]["code"] == "malformed_header"


# -- the corpus: the actuator ----------------------------------------------------------------------


def _path_corpus() -> Iterator[tuple[str, str]]:
    for raw_id in HOSTILE_PATH_IDS:
        for template in ("/subscriptions/{}", "/deliveries/{}", "/subscriptions/{}/rotate-secret", "/{}"):
            for method in ("GET", "PATCH", "DELETE", "POST", "PUT", "HEAD", "OPTIONS", "FOO"):
                yield method, template.format(raw_id)
    for path in ("", "/", "//", "//subscriptions", "/subscriptions/", "/subscriptions%2Fsub_1", "/dlq/"):
        for method in ("GET", "POST", "HEAD", "OPTIONS", "PROPFIND"):
            yield method, path


def _query_corpus() -> Iterator[str]:
    for name in ("limit", "cursor", "subscription_id", "topic", "bogus", "%00"):
        for value in (
            "%00",
            "%ED%A0%80",
            "%FF",
            "1e9",
            "-1",
            "0",
            "9" * 40,
            "NaN",
            "true",
            "1.5",
            "x" * 2000,
        ):
            yield f"{name}={value}"
    for stamp in (*ODD_DATETIMES, "2020-01-01T00:00:00Z"):
        for delivery_id in ("msg_1", "\x00", SURROGATE, ""):
            raw = f"{stamp}|{delivery_id}".encode("utf-8", "surrogatepass")
            yield "cursor=" + base64.urlsafe_b64encode(raw).decode().rstrip("=")
    yield "limit=1&limit=2"


BODY_ROUTES: list[tuple[str, str, dict[str, Any], list[str]]] = [
    (
        "POST",
        "/subscriptions",
        {"target_url": "https://b.example.com/h", "event_topics": ["a.b"]},
        ["id", "target_url", "secret", "description", "event_topics"],
    ),
    ("PATCH", "/subscriptions/sub_1", {}, ["target_url", "description", "status", "event_topics"]),
    ("POST", "/subscriptions/sub_1/rotate-secret", {}, ["secret", "grace_seconds"]),
    (
        "POST",
        "/replay",
        {"subscription_id": "sub_1", "dry_run": True},
        ["log_id", "subscription_id", "since", "until", "limit", "dry_run"],
    ),
]

RAW_BODIES = [
    b"",
    b"null",
    b"1",
    b'"x"',
    b"[]",
    b"true",
    b"{",
    b"\xef\xbb\xbf{}",
    "{}".encode("utf-16"),
    b"\xff\xfe{",
    b'{"description":"a","description":"b"}',
    b"[" * 3000,
    b'{"a":' * 3000,
    b"NaN",
    b'{"limit": NaN}',
    b'{"grace_seconds": Infinity}',
    b'{"limit": 1e999}',
    b'{"limit": ' + b"9" * 5000 + b"}",
    b"\x00",
    b'{"log_id":"\\u0000"}',
    b'{"secret":"\\ud800"}',
    b"x" * (70 * 1024),
]
CONTENT_TYPES = [
    "application/json",
    "text/plain",
    None,
    "application/json; charset=utf-16",
    "application/x-www-form-urlencoded",
    "multipart/form-data; boundary=x",
    "APPLICATION/JSON",
]


def _field_values() -> list[Any]:
    nested = json.loads("[" * 120 + "]" * 120)
    return [
        *HOSTILE_TEXT,
        *ODD_NUMBERS,
        *ODD_DATETIMES,
        ["\x00"],
        [SURROGATE],
        ["a"] * 200,
        nested,
        "https://a.example.com/\x00",
        "http://169.254.169.254/",
        "https://x/" + "a" * 3000,
    ]


def test_hostile_requests_never_get_a_5xx_nor_change_anything_when_refused(
    client: FlaskClient, sql_store: OutboundWebhookHandler
) -> None:
    """About 3,000 requests per store: paths, methods, query strings, raw bodies, content types
    and every body field with every hostile value."""
    before = snapshot(sql_store)
    for method, path in _path_corpus():
        response = send(client, method, path, b"{}", content_type="application/json")
        assert_refused_or_fine(response, (method, path)) if method != "HEAD" else None
        assert response.status_code < 500, (method, path)
    for query in _query_corpus():
        assert_refused_or_fine(send(client, "GET", "/dlq?" + query), query)
    assert snapshot(sql_store) == before

    for method, path, _, _ in BODY_ROUTES:
        for raw in RAW_BODIES:
            for content_type in CONTENT_TYPES:
                response = send(client, method, path, raw, content_type=content_type)
                assert 400 <= response.status_code < 500, (path, raw[:40], content_type)
                assert_refused_or_fine(response, (path, raw[:40], content_type))
    assert snapshot(sql_store) == before

    for method, path, base, names in BODY_ROUTES:
        for name in names:
            for value in _field_values():
                if name == "dry_run" and value is False:
                    continue  # a real bulk replay: its deliveries would change the rows meanwhile
                raw = json.dumps({**base, name: value}, ensure_ascii=False).encode("utf-8", "surrogatepass")
                state = snapshot(sql_store)
                response = send(client, method, path, raw, content_type="application/json")
                assert_refused_or_fine(response, (path, name, repr(value)[:60]))
                if response.status_code >= 400:
                    assert snapshot(sql_store) == state, (path, name, repr(value)[:60])


@pytest.mark.parametrize(
    "authorization",
    [
        "Bearer",
        "Bearer ",
        f"bearer {TOKEN}",
        f"BEARER {TOKEN}",
        f"Bearer  {TOKEN}",
        f" Bearer {TOKEN}",
        f"Bearer {TOKEN} ",
        f"Basic {TOKEN}",
        "Bearer \u00e9",
        f"Token {TOKEN}",
        f"Bearer\t{TOKEN}",
        f"Bearer {TOKEN}\x00",
        f"Bearer {TOKEN[:-1]}",
    ],
)
def test_odd_authorization_headers(client: FlaskClient, authorization: str) -> None:
    """Only ``Bearer <token>`` (scheme in any case) opens the API; everything else is a JSON 401."""
    response = client.get(PREFIX + "/subscriptions", headers={"Authorization": authorization})
    scheme, _, credentials = authorization.partition(" ")
    if scheme.lower() == "bearer" and credentials == TOKEN:
        assert response.status_code == 200
    else:
        assert response.status_code == 401, authorization
        assert response.mimetype == "application/json"
        assert TOKEN not in response.get_data(as_text=True)


# -- the corpus: the Python API --------------------------------------------------------------------


def _python_values() -> list[Any]:
    aware = timezone(timedelta(hours=14))
    return [
        *HOSTILE_TEXT,
        *ODD_NUMBERS,
        float("nan"),
        float("inf"),
        b"x",
        datetime(1, 1, 1),
        datetime(1, 1, 1, tzinfo=aware),
        datetime(9999, 12, 31, 23, tzinfo=timezone(timedelta(hours=-12))),
        object(),
    ]


def test_the_python_api_raises_only_the_packages_errors(app: Flask, client: FlaskClient) -> None:
    engine = get_engine(app)
    ops, store = engine.operations, engine.store
    calls: list[tuple[str, Callable[[Any], Any]]] = [
        ("get_subscription", ops.get_subscription),
        ("remove_subscription", ops.remove_subscription),
        ("update id", lambda v: ops.update_subscription(v, description="x")),
        ("update url", lambda v: ops.update_subscription("sub_1", target_url=v)),
        ("update topics", lambda v: ops.update_subscription("sub_1", event_topics=v)),
        ("update description", lambda v: ops.update_subscription("sub_1", description=v)),
        ("update status", lambda v: ops.update_subscription("sub_1", status=v)),
        ("rotate id", lambda v: ops.rotate_secret(v)),
        ("rotate secret", lambda v: ops.rotate_secret("sub_1", new_secret=v)),
        ("rotate grace", lambda v: ops.rotate_secret("sub_1", grace_seconds=v)),
        ("replay", ops.replay),
        ("replay_many since", lambda v: ops.replay_many(since=v, dry_run=True)),
        ("replay_many until", lambda v: ops.replay_many(until=v, dry_run=True)),
        ("replay_many limit", lambda v: ops.replay_many(subscription_id="sub_1", limit=v, dry_run=True)),
        ("replay_many sub", lambda v: ops.replay_many(subscription_id=v, dry_run=True)),
        ("dlq_page limit", lambda v: ops.dlq_page(limit=v)),
        ("dlq_page cursor", lambda v: ops.dlq_page(cursor=v)),
        ("dlq_page sub", lambda v: ops.dlq_page(subscription_id=v)),
        ("dlq_page topic", lambda v: ops.dlq_page(topic=v)),
        ("delivery_with_attempts", ops.delivery_with_attempts),
        ("purge_delivered", ops.purge_delivered),
        (
            "create id",
            lambda v: ops.create_subscription(
                target_url="https://q.example.com/", event_topics=["a"], subscription_id=v
            ),
        ),
        ("create url", lambda v: ops.create_subscription(target_url=v, event_topics=["a"])),
        (
            "create topics",
            lambda v: ops.create_subscription(target_url="https://q.example.com/", event_topics=v),
        ),
        (
            "create secret",
            lambda v: ops.create_subscription(
                target_url="https://q.example.com/", event_topics=["a"], secret=v
            ),
        ),
        (
            "create description",
            lambda v: ops.create_subscription(
                target_url="https://q.example.com/", event_topics=["a"], description=v
            ),
        ),
        ("dispatch topic", lambda v: engine.manager.dispatch(v, {"a": 1})),
        ("dispatch payload", lambda v: engine.manager.dispatch("a.b", {"v": v})),
        ("store.get_subscription", store.get_subscription),
        ("store.get_delivery", store.get_delivery),
        ("store.list_attempts", store.list_attempts),
        ("store.subscriptions_for_topic", store.subscriptions_for_topic),
        ("store.list_dlq sub", lambda v: store.list_dlq(limit=5, subscription_id=v)),
    ]
    before = snapshot(store)
    with app.app_context():
        for name, call in calls:
            for value in _python_values():
                try:
                    call(value)
                except StoreError as exc:  # an outage signal for bad input
                    pytest.fail(f"{name}({value!r:.40}): StoreError {exc}")
                except HarvestError:
                    pass
                except Exception as exc:
                    pytest.fail(f"{name}({value!r:.40}): {type(exc).__name__}: {exc}")
    assert len(snapshot(store)[1]) >= len(before[1])


def test_models_refuse_every_bad_field_with_invalid_field_error() -> None:
    base: dict[str, Any] = {"target_url": "https://q.example.com/", "event_topics": ["a"], "secret": SECRET}
    names = [
        "target_url",
        "event_topics",
        "secret",
        "id",
        "description",
        "status",
        "consecutive_failures",
        "created_at",
        "updated_at",
        "previous_secret",
        "previous_secret_expires_at",
    ]
    for name in names:
        for value in _python_values():
            try:
                WebhookSubscription(**{**base, name: value})
            except InvalidFieldError as exc:
                assert SECRET not in str(exc)  # noqa: PT017 (a corpus loop, not one expected raise)
            except Exception as exc:
                pytest.fail(f"WebhookSubscription({name}={value!r:.40}): {type(exc).__name__}: {exc}")


# -- the corpus: the CLI ---------------------------------------------------------------------------

CLI_VALUES = [
    "\x00",
    "\udcff",
    "a\nb",
    "\x1b[31m",
    "x" * 10000,
    "9" * 40,
    "-1",
    "1e400",
    "nan",
    "inf",
    "0",
    *ODD_DATETIMES,
    "1_000",
    "\u0663",
]
CLI_COMMANDS: list[list[str | None]] = [
    ["purge", "--before", None, "--yes"],
    ["purge", "--older-than", None, "--yes"],
    ["subscriptions", "add", None, "--topic", "a"],
    ["subscriptions", "add", "https://x.example.com", "--topic", None],
    ["subscriptions", "add", "https://x.example.com", "--topic", "a", "--secret", None],
    ["subscriptions", "add", "https://x.example.com", "--topic", "a", "--id", None],
    ["subscriptions", "add", "https://x.example.com", "--topic", "a", "--description", None],
    ["subscriptions", "show", None],
    ["subscriptions", "enable", None],
    ["subscriptions", "disable", None],
    ["subscriptions", "rotate-secret", None],
    ["subscriptions", "rotate-secret", "sub_1", "--grace", None],
    ["subscriptions", "remove", None, "--yes"],
    ["dlq", "list", "--limit", None],
    ["dlq", "list", "--cursor", None],
    ["dlq", "list", "--subscription", None],
    ["dlq", "list", "--topic", None],
    ["dlq", "replay", None],
    ["dlq", "replay", "--subscription", None],
    ["dlq", "replay", "--subscription", "sub_1", "--since", None, "--dry-run"],
    ["dlq", "replay", "--until", None, "--dry-run"],
    ["dlq", "replay", "--since", "2020-01-01T00:00:00Z", "--limit", None],
    ["deliveries", "show", None],
    ["outbox", "purge", "--older-than", None, "--yes"],
    # Ordered delivery, tenants and the operational endpoint.
    ["subscriptions", "add", "https://x.example.com", "--topic", "a", "--ordering-policy", None],
    ["subscriptions", "add", "https://x.example.com", "--topic", "a", "--tenant", None],
    ["subscriptions", "update", "sub_1", "--ordering-policy", None],
    ["subscriptions", "list", "--tenant", None],
    ["subscriptions", "show", "sub_1", "--tenant", None],
    ["dlq", "skip", None],
    ["dlq", "skip", "dlv_1", "--tenant", None],
    ["dlq", "list", "--tenant", None],
    ["dlq", "replay", "--subscription", "sub_1", "--tenant", None, "--dry-run"],
    ["deliveries", "show", "dlv_1", "--tenant", None],
    ["stats", "--tenant", None],
    ["operational", "status", "--json"],
    ["operational", "test", "--json"],
]


def test_cli_arguments_end_in_a_result_or_a_one_line_error(app: Flask, client: FlaskClient) -> None:
    runner = app.test_cli_runner()
    for command in CLI_COMMANDS:
        for value in CLI_VALUES:
            args = ["harvest", *(value if part is None else part for part in command)]
            result = runner.invoke(args=args, input="n\n")
            context = (command, repr(value)[:40], result.output[-300:])
            assert result.exception is None or isinstance(result.exception, SystemExit), context
            assert result.exit_code in (0, 1, 2), context
            assert "Traceback" not in result.output, context
            if result.exit_code:
                assert "Error" in result.output, context
            if "rotate-secret" not in command and "add" not in command:
                assert SECRET not in result.output, context


@pytest.mark.parametrize("secret", ["\ud800", "", None, 42, b""])
def test_a_callback_secret_that_cannot_be_a_key_is_an_invalid_field(secret: Any) -> None:
    with pytest.raises(InvalidFieldError, match="secret"):
        verify_completion_callback(secret, b"{}", "sha256=00")


def test_outbox_maintenance_refuses_numbers_that_would_loop_or_overflow(app: Flask) -> None:
    operations = get_engine(app).operations
    for limit in (0, -1, True, 1.5, 10**9):
        with pytest.raises(InvalidFieldError, match="limit"):
            operations.relay_outbox(limit=limit)  # type: ignore[arg-type]
    for seconds in (float("nan"), float("inf"), -1, 1e300, "60"):
        with pytest.raises(InvalidFieldError, match="older_than_seconds"):
            operations.purge_outbox(seconds)  # type: ignore[arg-type]
