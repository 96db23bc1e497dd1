"""The admin API's body limit (``flask_harvest.http.admin``), on every Flask release setup.cfg allows.

Before Flask 3.1 ``request.max_content_length`` had no setter, and setting it made every actuator
request a 500; the lowest-versions environment (``make lowest``) runs these tests on Flask 2.3.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
import requests
from flask import Flask
from flask.testing import FlaskClient

from flask_harvest.http.admin import MAX_BODY_BYTES
from flask_harvest.webhooks.stores import InMemoryOutboundWebhookHandler

from .live_server import LiveServer, live_server
from .pipeline import make_app

TOKEN = "test-actuator-token-0123456789"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
JSON = {"Content-Type": "application/json"}
URL = "/actuator/webhooks/subscriptions"


@pytest.fixture
def store() -> InMemoryOutboundWebhookHandler:
    return InMemoryOutboundWebhookHandler()


@pytest.fixture
def app(store: InMemoryOutboundWebhookHandler) -> Flask:
    return make_app(store, HARVEST_ACTUATOR_TOKEN=TOKEN)


@pytest.fixture
def client(app: Flask) -> FlaskClient:
    return app.test_client()


def padded(size: int) -> bytes:
    """A subscription body of exactly ``size`` bytes whose description is too long: a 422 if read."""
    start = b'{"target_url":"https://hooks.example.com/a","event_topics":["a.b"],"description":"'
    body = start + b"x" * (size - len(start) - 2) + b'"}'
    assert len(body) == size
    return body


def error_code(body: bytes) -> str:
    code: str = json.loads(body)["error"]["code"]
    return code


def test_requests_under_the_limit_are_answered(
    client: FlaskClient, store: InMemoryOutboundWebhookHandler
) -> None:
    assert client.get(URL, headers=AUTH).status_code == 200
    created = client.post(
        URL, json={"target_url": "https://hooks.example.com/a", "event_topics": ["a.b"]}, headers=AUTH
    )
    assert created.status_code == 201, created.get_json()
    assert [s.id for s in store.list_subscriptions()] == [created.get_json()["id"]]


def test_a_body_at_the_limit_is_read_and_one_byte_more_is_a_413(
    client: FlaskClient, store: InMemoryOutboundWebhookHandler
) -> None:
    at_limit = client.post(URL, data=padded(MAX_BODY_BYTES), headers={**AUTH, **JSON})
    assert at_limit.status_code == 422  # read and parsed: the description is too long
    assert "description" in at_limit.get_json()["error"]["fields"]
    over = client.post(URL, data=padded(MAX_BODY_BYTES + 1), headers={**AUTH, **JSON})
    assert (over.status_code, error_code(over.data)) == (413, "request_entity_too_large")
    assert store.list_subscriptions() == []


@pytest.fixture
def server(app: Flask) -> Iterator[LiveServer]:
    with live_server(app) as running:
        yield running


def send(server: LiveServer, headers: dict[str, str], body_start: bytes) -> tuple[int, str]:
    """POST the start of a JSON body to the route that takes one; see ``send_unfinished``."""
    return server.send_unfinished(URL, {**JSON, **headers}, body_start)


def test_an_announced_body_over_the_limit_is_a_413_before_it_is_read(server: LiveServer) -> None:
    # 200 MB announced, 4 KB sent: an answer proves the server never waited for the rest.
    announced = {"Content-Length": str(200 * 1024 * 1024)}
    assert send(server, {**AUTH, **announced}, b"[" * 4096) == (413, "request_entity_too_large")


def test_an_unauthorized_request_is_refused_before_its_body_is_read(server: LiveServer) -> None:
    announced = {"Content-Length": str(200 * 1024 * 1024)}
    assert send(server, announced, b"[" * 4096) == (401, "unauthorized")


def test_a_chunked_body_is_read_only_up_to_the_limit(
    server: LiveServer, store: InMemoryOutboundWebhookHandler
) -> None:
    body = padded(MAX_BODY_BYTES + 1)
    chunks = b"".join(b"%x\r\n%s\r\n" % (len(part), part) for part in (body[:40000], body[40000:]))
    assert send(server, {**AUTH, "Transfer-Encoding": "chunked"}, chunks) == (413, "request_entity_too_large")
    assert store.list_subscriptions() == []


def test_a_chunked_body_under_the_limit_is_read_by_the_view(
    server: LiveServer, store: InMemoryOutboundWebhookHandler
) -> None:
    body = json.dumps({"target_url": "https://hooks.example.com/a", "event_topics": ["a.b"]}).encode()
    # A generator body makes requests send it chunked, without a Content-Length.
    response = requests.post(
        server.url + URL,
        data=(body[i : i + 10] for i in range(0, len(body), 10)),
        headers={**AUTH, **JSON},
        timeout=10,
    )
    assert response.request.headers.get("Transfer-Encoding") == "chunked"
    assert response.status_code == 201, response.text
    assert [s.target_url for s in store.list_subscriptions()] == ["https://hooks.example.com/a"]
