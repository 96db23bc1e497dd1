"""Issue 16's hostile inputs, one test each, on every store: NUL characters, lone surrogates, deep
nesting, out-of-range datetimes, unencodable payloads, undecodable CLI arguments, weak access
configuration and the documented HTTP behaviour (405, 413, ids with '/')."""

from __future__ import annotations

import base64
import io
import json
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from click.testing import Result
from flask import Flask, Request
from flask.testing import FlaskClient
from werkzeug.test import EnvironBuilder, run_wsgi_app

from flask_harvest import (
    DeliveryLog,
    DeliveryState,
    InvalidFieldError,
    OutboundWebhookHandler,
    WebhookSubscription,
    generate_secret,
    get_engine,
)
from flask_harvest._input import MAX_JSON_DEPTH, json_text_depth, parse_json
from flask_harvest.errors import ConfigurationError, NotFoundError
from flask_harvest.testing import CapturingReceiver
from flask_harvest.webhooks.delivery import delivery_job

from .pipeline import make_app, wait_final
from .test_actuator import AUTH, PREFIX, SECRET, TOKEN, dead_letters, snapshot

SURROGATE = "\ud800"
#: What Python makes of the argument bytes b"\xff" (undecodable: surrogateescape).
UNDECODABLE_ARG = "\udcff"


@pytest.fixture
def app(store: OutboundWebhookHandler) -> Flask:
    return make_app(store, HARVEST_ACTUATOR_TOKEN=TOKEN)


@pytest.fixture
def client(app: Flask, store: OutboundWebhookHandler) -> FlaskClient:
    store.add_subscription(WebhookSubscription("https://a.example.com/h", ("a.b",), SECRET, id="sub_1"))
    dead_letters(store, 2)
    return app.test_client()


def raw_json(client: FlaskClient, method: str, path: str, text: str) -> Any:
    """Send ``text`` as a JSON body as it is (json= would refuse a lone surrogate)."""
    data = text.encode("utf-8", "surrogatepass")
    return client.open(PREFIX + path, method=method, data=data, content_type="application/json", headers=AUTH)


def assert_client_error(response: Any, *statuses: int) -> dict[str, Any]:
    assert response.status_code in statuses, response.get_data(as_text=True)
    error: dict[str, Any] = response.get_json()["error"]
    assert error["message"]
    return error


BODY_ROUTES = [
    ("POST", "/subscriptions"),
    ("PATCH", "/subscriptions/sub_1"),
    ("POST", "/subscriptions/sub_1/rotate-secret"),
    ("POST", "/replay"),
]

# -- 1. NUL characters -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "/subscriptions/a%00b"),
        ("PATCH", "/subscriptions/a%00b"),
        ("DELETE", "/subscriptions/a%00b"),
        ("POST", "/subscriptions/a%00b/rotate-secret"),
        ("GET", "/deliveries/a%00b"),
    ],
)
def test_a_nul_in_a_path_id_is_a_404_not_an_outage(
    client: FlaskClient, store: OutboundWebhookHandler, method: str, path: str
) -> None:
    before = snapshot(store)
    response = client.open(PREFIX + path, method=method, json={"status": "active"}, headers=AUTH)
    assert assert_client_error(response, 404)["code"] == "not_found"
    assert snapshot(store) == before


@pytest.mark.parametrize("query", ["subscription_id=a%00", "topic=a%00b", "limit=5%00"])
def test_a_nul_in_the_dlq_query_is_refused(client: FlaskClient, query: str) -> None:
    assert_client_error(client.get(f"{PREFIX}/dlq?{query}", headers=AUTH), 422)


def cursor_of(text: str) -> str:
    return base64.urlsafe_b64encode(text.encode("utf-8", "surrogatepass")).decode().rstrip("=")


@pytest.mark.parametrize(
    "cursor",
    [
        cursor_of("2026-01-01T00:00:00+00:00|msg\x00x"),
        cursor_of("2026-01-01T00:00:00+00:00|msg" + SURROGATE),
        cursor_of("9999-12-31T23:59:59-12:00|msg_1"),
        cursor_of("0001-01-01T00:00:00+14:00|msg_1"),
    ],
)
def test_a_crafted_cursor_is_refused(client: FlaskClient, cursor: str) -> None:
    error = assert_client_error(
        client.get(f"{PREFIX}/dlq", query_string={"cursor": cursor}, headers=AUTH), 422
    )
    assert "cursor" in error["fields"]


BAD_FIELDS = [
    ("POST", "/subscriptions", {"target_url": "https://b.example.com/h", "event_topics": ["a.b"]}, "id"),
    ("POST", "/subscriptions", {"target_url": "https://b.example.com/h", "event_topics": ["a.b"]}, "secret"),
    (
        "POST",
        "/subscriptions",
        {"target_url": "https://b.example.com/h", "event_topics": ["a.b"]},
        "description",
    ),
    ("PATCH", "/subscriptions/sub_1", {}, "description"),
    ("POST", "/subscriptions/sub_1/rotate-secret", {}, "secret"),
    ("POST", "/replay", {}, "log_id"),
    ("POST", "/replay", {}, "subscription_id"),
]


@pytest.mark.parametrize(("method", "path", "body", "field"), BAD_FIELDS)
@pytest.mark.parametrize("bad", ["x\x00y", f"x{SURROGATE}y"], ids=["nul", "surrogate"])
def test_nul_or_a_lone_surrogate_in_a_body_field_is_a_422_naming_it(
    client: FlaskClient,
    store: OutboundWebhookHandler,
    method: str,
    path: str,
    body: dict[str, Any],
    field: str,
    bad: str,
) -> None:
    before = snapshot(store)
    # ensure_ascii keeps the surrogate as the JSON escape "\ud800": what a hostile client sends.
    response = raw_json(client, method, path, json.dumps({**body, field: bad}))
    assert field in assert_client_error(response, 422)["fields"]
    assert snapshot(store) == before


def test_the_python_api_treats_an_impossible_id_as_not_found(app: Flask) -> None:
    operations = get_engine(app).operations
    for bad in ("a\x00b", SURROGATE):
        with pytest.raises(NotFoundError):
            operations.get_subscription(bad)
        with pytest.raises(NotFoundError):
            operations.delivery_with_attempts(bad)
        with pytest.raises(NotFoundError):
            operations.replay(bad)
        with pytest.raises(NotFoundError):
            operations.remove_subscription(bad)
        with pytest.raises(InvalidFieldError):
            operations.dlq_page(topic=bad)


# -- 3. deep nesting -------------------------------------------------------------------------------


@pytest.mark.parametrize(("method", "path"), BODY_ROUTES)
@pytest.mark.parametrize("depth", [MAX_JSON_DEPTH + 1, 1_000, 20_000])
def test_a_deeply_nested_body_is_a_400_on_every_body_route(
    client: FlaskClient, store: OutboundWebhookHandler, method: str, path: str, depth: int
) -> None:
    before = snapshot(store)
    body = '{"description": ' + "[" * depth + "]" * depth + "}"
    assert assert_client_error(raw_json(client, method, path, body), 400)["code"] == "bad_json"
    assert snapshot(store) == before


def test_the_depth_scan_ignores_brackets_in_strings() -> None:
    assert json_text_depth('{"a": "[[[[{{{{"}') == 1
    assert json_text_depth(r'["\"[[[", [[]]]') == 3
    assert parse_json('{"a": "' + "[" * 1000 + '"}') == {"a": "[" * 1000}
    with pytest.raises(InvalidFieldError):
        parse_json("[NaN]")


# -- 4. datetimes out of range ---------------------------------------------------------------------


@pytest.mark.parametrize("stamp", ["9999-12-31T23:59:59-12:00", "0001-01-01T00:00:00+14:00"])
@pytest.mark.parametrize("field", ["since", "until"])
def test_a_datetime_out_of_range_in_utc_is_a_422(client: FlaskClient, stamp: str, field: str) -> None:
    response = client.post(f"{PREFIX}/replay", json={field: stamp, "dry_run": True}, headers=AUTH)
    assert field in assert_client_error(response, 422)["fields"]


def test_the_python_api_refuses_a_window_out_of_range(app: Flask) -> None:
    far = datetime(9999, 12, 31, 23, 59, tzinfo=timezone(timedelta(hours=-12)))
    with pytest.raises(InvalidFieldError, match="since"):
        get_engine(app).operations.replay_many(since=far, dry_run=True)


# -- 5. payloads that cannot be sent ---------------------------------------------------------------


def nested(depth: int) -> list[Any]:
    outer: list[Any] = []
    inner = outer
    for _ in range(depth):
        inner.append([])
        inner = inner[0]
    return outer


@pytest.mark.parametrize(
    "payload",
    [{"x": SURROGATE}, {SURROGATE: 1}, [{"a": [SURROGATE]}], nested(5_000), {"n": nested(MAX_JSON_DEPTH)}],
    ids=["value", "key", "inner", "deep", "just-too-deep"],
)
def test_dispatch_refuses_a_payload_it_could_not_send(
    app: Flask, store: OutboundWebhookHandler, payload: Any
) -> None:
    store.add_subscription(WebhookSubscription("https://a.example.com/h", ("a.b",), SECRET, id="sub_1"))
    with pytest.raises(InvalidFieldError) as info:
        get_engine(app).manager.dispatch("a.b", payload)
    assert info.value.field == "payload"
    assert store.delivery_stats()[0].counts.get("pending", 0) == 0


def test_a_nul_in_a_payload_is_sent_escaped(app: Flask, store: OutboundWebhookHandler) -> None:
    store.add_subscription(WebhookSubscription("https://a.example.com/h", ("a.b",), SECRET, id="sub_1"))
    [delivery_id] = get_engine(app).manager.dispatch("a.b", {"x": "a\x00b"})
    stored = store.get_delivery(delivery_id)
    assert stored is not None
    assert json.loads(stored.payload) == {"x": "a\x00b"}


@pytest.mark.parametrize("store", ["memory"], indirect=True)
def test_a_row_no_attempt_could_send_is_dead_lettered_not_retried_forever(
    store: OutboundWebhookHandler, receiver: CapturingReceiver
) -> None:
    # Only the memory store can hold such a row (a SQL driver refuses it); dispatch never writes one.
    app = make_app(store)
    store.add_subscription(WebhookSubscription(receiver.url(), ("a.b",), generate_secret(), id="sub_1"))
    row = DeliveryLog(id="msg_bad", subscription_id="sub_1", topic="a.b", payload=f'{{"x":"{SURROGATE}"}}')
    store.log_deliveries([row])
    get_engine(app).backend.enqueue([delivery_job(row)])
    assert wait_final(store, [row.id]) == [DeliveryState.DLQ]
    stored = store.get_delivery(row.id)
    assert stored is not None
    assert stored.last_error is not None and "payload cannot be sent" in stored.last_error
    assert receiver.requests == []


# -- 6. CLI arguments that are not UTF-8 -----------------------------------------------------------

ADD = ["subscriptions", "add", "https://a.example.com/h", "--topic", "a.b"]


@pytest.mark.parametrize(
    "args",
    [
        ["subscriptions", "show", UNDECODABLE_ARG],
        ["subscriptions", "add", "https://a.example.com/h", "--topic", "a.b", "--id", UNDECODABLE_ARG],
        ["subscriptions", "add", "https://a.example.com/h", "--topic", "a.b", "--secret", UNDECODABLE_ARG],
        [
            "subscriptions",
            "add",
            "https://a.example.com/h",
            "--topic",
            "a.b",
            "--description",
            UNDECODABLE_ARG,
        ],
        ["subscriptions", "remove", "--yes", UNDECODABLE_ARG],
        ["subscriptions", "rotate-secret", UNDECODABLE_ARG],
        ["dlq", "list", "--subscription", UNDECODABLE_ARG],
        ["dlq", "list", "--topic", "a\x00"],
        ["dlq", "replay", UNDECODABLE_ARG],
        ["deliveries", "show", UNDECODABLE_ARG],
    ],
)
def test_an_undecodable_cli_argument_is_a_one_line_error(
    app: Flask, store: OutboundWebhookHandler, args: list[str]
) -> None:
    before = snapshot(store)
    result: Result = app.test_cli_runner().invoke(args=["harvest", *args])
    assert result.exit_code == 1, result.output
    assert isinstance(result.exception, SystemExit), result.exception
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), result.output
    assert snapshot(store) == before


@pytest.mark.parametrize("stamp", ["9999-12-31T23:59:59-12:00", "0001-01-01T00:00:00+14:00"])
def test_a_cli_datetime_out_of_range_is_a_usage_error(app: Flask, stamp: str) -> None:
    result = app.test_cli_runner().invoke(args=["harvest", "dlq", "replay", "--since", stamp, "--dry-run"])
    assert result.exit_code == 2, result.output
    assert isinstance(result.exception, SystemExit), result.exception
    assert "out of range" in result.output


# -- 11. weak access configuration -----------------------------------------------------------------


@pytest.mark.parametrize("token", [" ", "  \t ", "x", "a" * 15, " " + "a" * 20, "a" * 20 + "\n"])
def test_a_weak_actuator_token_fails_at_start_up(store: OutboundWebhookHandler, token: str) -> None:
    with pytest.raises(ConfigurationError, match="HARVEST_ACTUATOR_TOKEN"):
        make_app(store, HARVEST_ACTUATOR_TOKEN=token)


def test_a_token_of_the_minimum_length_is_accepted(store: OutboundWebhookHandler) -> None:
    token = "t" * 16
    client = make_app(store, HARVEST_ACTUATOR_TOKEN=token).test_client()
    assert client.get(f"{PREFIX}/stats", headers={"Authorization": f"Bearer {token}"}).status_code == 200


@pytest.mark.parametrize("answer", ["denied", 1, [1], object(), None, False])
def test_only_true_from_an_authorizer_allows(store: OutboundWebhookHandler, answer: Any) -> None:
    app = make_app(store)

    def authorizer(request: Request) -> Any:
        return answer

    get_engine(app).access.authorizer = authorizer
    response = app.test_client().get(f"{PREFIX}/stats")
    assert assert_client_error(response, 403)["code"] == "forbidden"


# -- 13. the documented HTTP behaviour -------------------------------------------------------------


@pytest.mark.parametrize(
    ("method", "path", "allow"),
    [
        ("PUT", "/subscriptions/sub_1", {"GET", "PATCH", "DELETE"}),
        ("POST", "/stats", {"GET"}),
        ("DELETE", "/replay", {"POST"}),
        ("GET", "/subscriptions/sub_1/rotate-secret", {"POST"}),
    ],
)
def test_an_unknown_method_is_a_json_405_with_allow(
    client: FlaskClient, method: str, path: str, allow: set[str]
) -> None:
    response = client.open(PREFIX + path, method=method, headers=AUTH)
    assert assert_client_error(response, 405)["code"] == "method_not_allowed"
    assert allow <= {m.strip() for m in response.headers["Allow"].split(",")}


def test_an_unknown_path_is_still_a_json_404(client: FlaskClient) -> None:
    assert client.put(f"{PREFIX}/nothing/here", headers=AUTH).status_code == 404


@pytest.mark.parametrize(("method", "path"), BODY_ROUTES)
def test_a_chunked_body_over_the_limit_is_a_413(
    app: Flask, client: FlaskClient, store: OutboundWebhookHandler, method: str, path: str
) -> None:
    before = snapshot(store)
    body = json.dumps({"description": "d" * (70 * 1024)}).encode()
    builder = EnvironBuilder(
        path=PREFIX + path,
        method=method,
        input_stream=io.BytesIO(body),
        headers=[*AUTH.items(), ("Transfer-Encoding", "chunked"), ("Content-Type", "application/json")],
    )
    environ = builder.get_environ()
    environ.pop("CONTENT_LENGTH", None)
    environ["wsgi.input_terminated"] = True  # the server has de-chunked it (the test client would not)
    body_iter, status, headers = run_wsgi_app(app, environ, buffered=True)
    response = app.response_class(b"".join(body_iter), status=status, headers=headers)
    assert assert_client_error(response, 413)
    assert snapshot(store) == before


def test_a_subscription_id_with_a_slash_is_refused_everywhere(
    client: FlaskClient, app: Flask, store: OutboundWebhookHandler
) -> None:
    with pytest.raises(InvalidFieldError, match="id"):
        WebhookSubscription("https://a.example.com/h", ("a.b",), SECRET, id="a/b")
    body = {"id": "a/b", "target_url": "https://a.example.com/h", "event_topics": ["a.b"]}
    assert (
        "id"
        in assert_client_error(client.post(f"{PREFIX}/subscriptions", json=body, headers=AUTH), 422)["fields"]
    )
    result = app.test_cli_runner().invoke(
        args=["harvest", "subscriptions", "add", "https://a.example.com/h", "--topic", "a.b", "--id", "a/b"]
    )
    assert result.exit_code == 1 and result.output.startswith("Error: id"), result.output
    assert store.get_subscription("a/b") is None


@pytest.mark.parametrize("path", ["/deliveries/0%2F%0A", "/a%0Ab", "/%0A"])
def test_a_path_with_a_newline_is_a_json_404_after_the_access_check(app: Flask, path: str) -> None:
    client = app.test_client()
    assert client.get(PREFIX + path).status_code == 401
    assert assert_client_error(client.get(PREFIX + path, headers=AUTH), 404)["code"] == "not_found"


# -- the Python API's numbers ----------------------------------------------------------------------


@pytest.mark.parametrize("grace", [1e300, float("nan"), float("inf"), -1, 10**400, "60", True])
def test_a_grace_period_out_of_range_is_an_invalid_field(
    app: Flask, store: OutboundWebhookHandler, grace: Any
) -> None:
    store.add_subscription(WebhookSubscription("https://a.example.com/h", ("a.b",), SECRET, id="sub_1"))
    with pytest.raises(InvalidFieldError, match="grace_seconds"):
        get_engine(app).operations.rotate_secret("sub_1", grace_seconds=grace)
    stored = store.get_subscription("sub_1")
    assert stored is not None and stored.secret == SECRET


@pytest.mark.parametrize("limit", [0, 501, 10**20, True, "5"])
def test_a_dlq_page_size_out_of_range_is_an_invalid_field(app: Flask, limit: Any) -> None:
    with pytest.raises(InvalidFieldError, match="limit"):
        get_engine(app).operations.dlq_page(limit=limit)
