"""What an anonymous client can send the dashboard before it signs in: a body over the limit is a
413 before it is read; the sign-in's ``next`` never leads out of the dashboard."""

from __future__ import annotations

import io
from typing import Any

import pytest
from flask import Flask
from flask.testing import FlaskClient

from flask_harvest import InMemoryOutboundWebhookHandler
from flask_harvest.admin_http import MAX_BODY_BYTES

from .dashboard_client import PREFIX, TOKEN, csrf_of, dashboard_app


class CountingStream(io.BytesIO):
    """A request body that counts the bytes the server read of it."""

    def __init__(self, data: bytes) -> None:
        super().__init__(data)
        self.taken = 0

    def read(self, size: int | None = -1) -> bytes:
        data = super().read(size)
        self.taken += len(data)
        return data

    def readline(self, size: int | None = -1) -> bytes:
        data = super().readline(size)
        self.taken += len(data)
        return data

    def readinto(self, buffer: Any) -> int:
        count = super().readinto(buffer)
        self.taken += count
        return count


@pytest.fixture
def app() -> Flask:
    return dashboard_app(InMemoryOutboundWebhookHandler())


@pytest.fixture
def client(app: Flask) -> FlaskClient:
    return app.test_client()


def urlencoded(size: int) -> bytes:
    return b"token=" + b"x" * (size - len(b"token="))


@pytest.mark.parametrize(
    "path", ["/sign-in", "/sign-out", "/webhooks/replay", "/webhooks/deliveries/d1/replay", "/no-such-page"]
)
def test_an_announced_body_over_the_limit_is_a_413_before_a_byte_is_read(
    client: FlaskClient, path: str
) -> None:
    body = CountingStream(urlencoded(MAX_BODY_BYTES + 1))
    response = client.post(
        PREFIX + path,
        input_stream=body,
        content_length=100 * 1024 * 1024,  # announced; the rest never comes
        content_type="application/x-www-form-urlencoded",
    )
    assert response.status_code == 413, response.get_data(as_text=True)
    assert body.taken == 0
    assert "text/html" in response.content_type  # the dashboard's own error page


def test_a_chunked_body_is_read_only_up_to_the_limit(client: FlaskClient) -> None:
    boundary = "harvestboundary"
    part = (
        f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="big.bin"\r\n'
        "Content-Type: application/octet-stream\r\n\r\n"
    ).encode()
    body = CountingStream(part + b"\0" * (4 * MAX_BODY_BYTES) + f"\r\n--{boundary}--\r\n".encode())
    response = client.post(
        f"{PREFIX}/sign-in",
        input_stream=body,
        content_type=f"multipart/form-data; boundary={boundary}",
        # No Content-Length: the server reads until the client ends the body.
        environ_overrides={"wsgi.input_terminated": True},
    )
    assert response.status_code == 413, response.get_data(as_text=True)
    assert body.taken <= MAX_BODY_BYTES + 1


@pytest.mark.parametrize("kind", ["urlencoded", "multipart"])
def test_a_form_within_the_limit_signs_in(client: FlaskClient, kind: str) -> None:
    page = client.get(f"{PREFIX}/sign-in")
    data = {"token": TOKEN, "csrf_token": csrf_of(page), "next": f"{PREFIX}/subscriptions"}
    if kind == "multipart":
        data["padding"] = (io.BytesIO(b"x" * (MAX_BODY_BYTES // 2)), "padding.txt")  # type: ignore[assignment]
    response = client.post(
        f"{PREFIX}/sign-in",
        data=data,
        content_type="multipart/form-data" if kind == "multipart" else "application/x-www-form-urlencoded",
    )
    assert response.status_code == 303, response.get_data(as_text=True)
    assert response.headers["Location"] == f"{PREFIX}/subscriptions"
