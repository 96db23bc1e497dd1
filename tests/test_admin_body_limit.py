"""The admin API's body limit (``flask_harvest.admin_http``), on every Flask release setup.cfg allows.

Before Flask 3.1 ``request.max_content_length`` had no setter, and setting it made every actuator
request a 500; the lowest-versions environment (``make lowest``) runs these tests on Flask 2.3.
"""

from __future__ import annotations

import json
import re
import socket
import threading
from collections.abc import Iterator

import pytest
import requests
from flask import Flask
from flask.testing import FlaskClient
from werkzeug.serving import make_server

from flask_harvest.admin_http import MAX_BODY_BYTES
from flask_harvest.webhooks.stores import InMemoryOutboundWebhookHandler

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


class _Server:
    """The app on a real HTTP server on 127.0.0.1, so bodies can be chunked or never finished."""

    def __init__(self, app: Flask) -> None:
        self.server = make_server("127.0.0.1", 0, app, threaded=True)
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def send(self, headers: dict[str, str], body_start: bytes) -> tuple[int, str]:
        """Send a POST with ``headers`` and the start of a body; return the status and error code
        the server answers with, or fail if it waits for the rest of the body."""
        head = f"POST {URL} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        head += "".join(f"{name}: {value}\r\n" for name, value in headers.items()) + "\r\n"
        with socket.create_connection(("127.0.0.1", self.server.server_port), timeout=5) as sock:
            sock.sendall(head.encode("latin-1") + body_start)
            data = b""
            try:
                while b"\r\n\r\n" not in data:
                    chunk = sock.recv(65536)
                    assert chunk, "the server closed the connection without answering"
                    data += chunk
                header_block, _, rest = data.partition(b"\r\n\r\n")
                match = re.search(rb"(?i)content-length: *(\d+)", header_block)
                assert match is not None
                while len(rest) < int(match.group(1)):
                    rest += sock.recv(65536)
            except TimeoutError:
                pytest.fail("the server waited for the body instead of answering")
        return int(header_block.split(b" ", 2)[1]), error_code(rest)


@pytest.fixture
def server(app: Flask) -> Iterator[_Server]:
    running = _Server(app)
    yield running
    running.close()


def test_an_announced_body_over_the_limit_is_a_413_before_it_is_read(server: _Server) -> None:
    # 200 MB announced, 4 KB sent: an answer proves the server never waited for the rest.
    announced = {"Content-Length": str(200 * 1024 * 1024)}
    assert server.send({**AUTH, **announced}, b"[" * 4096) == (413, "request_entity_too_large")


def test_an_unauthorized_request_is_refused_before_its_body_is_read(server: _Server) -> None:
    announced = {"Content-Length": str(200 * 1024 * 1024)}
    assert server.send(announced, b"[" * 4096) == (401, "unauthorized")


def test_a_chunked_body_is_read_only_up_to_the_limit(
    server: _Server, store: InMemoryOutboundWebhookHandler
) -> None:
    body = padded(MAX_BODY_BYTES + 1)
    chunks = b"".join(b"%x\r\n%s\r\n" % (len(part), part) for part in (body[:40000], body[40000:]))
    assert server.send({**AUTH, "Transfer-Encoding": "chunked"}, chunks) == (413, "request_entity_too_large")
    assert store.list_subscriptions() == []


def test_a_chunked_body_under_the_limit_is_read_by_the_view(
    server: _Server, store: InMemoryOutboundWebhookHandler
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
