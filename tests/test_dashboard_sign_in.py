"""What an anonymous client can send the dashboard before it signs in: a body over the limit is a
413 before it is read; the sign-in's ``next`` never leads out of the dashboard."""

from __future__ import annotations

import io
import re
import urllib.parse
from typing import Any

import pytest
from flask import Flask
from flask.testing import FlaskClient
from hypothesis import given
from hypothesis import strategies as st

from flask_harvest import InMemoryOutboundWebhookHandler
from flask_harvest.http.admin import MAX_BODY_BYTES

from .dashboard_client import PREFIX, TOKEN, csrf_of, dashboard_app
from .properties import BUDGET, TEXT


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


# -- next ------------------------------------------------------------------------------------------

#: Pieces of a hostile ``next``: dot segments (encoded too), separators a browser reads as ``/``,
#: controls a browser drops or a header cannot carry, another host.
PIECES = [
    "..", ".", "%2e%2e", "%2E.", ".%2e", "/", "//", "\\", "%5c", "%2f", "\r\n", "\r", "\n", "\t",
    " ", "%0d%0a", "%09", "?", "#", "@", ":", "evil.example", "https:", "é", "\x00", "\ud800",
    "\x1b", "\x85", "%",
]  # fmt: skip
NEXTS = st.one_of(
    TEXT,
    st.lists(st.sampled_from(PIECES) | TEXT, max_size=8).map("".join),
    st.lists(st.sampled_from(PIECES) | TEXT, max_size=8).map(lambda p: f"{PREFIX}/" + "".join(p)),
    st.sampled_from(
        [
            f"{PREFIX}/../../x",
            f"{PREFIX}/%2e%2e/%2e%2e/x",
            f"{PREFIX}/\r\nSet-Cookie: a=b",
            f"{PREFIX}\\..\\x",
        ]
    ),
)
BASE = "http://dashboard.test/harvest/sign-in"


def encoded(text: str) -> str:
    return urllib.parse.quote(text.encode("utf-8", "surrogatepass"), safe="")


def form_body(fields: dict[str, str]) -> bytes:
    """A urlencoded body for any text, lone surrogates too (as the bytes a client sends)."""
    return "&".join(f"{name}={encoded(value)}" for name, value in fields.items()).encode("ascii")


def lands_on(location: str) -> urllib.parse.SplitResult:
    """Where a browser goes from the sign-in page for a ``Location`` header (as a browser reads
    it: ``\\`` as ``/``, ``%2e`` as a dot in a path segment, tabs and newlines dropped)."""
    cleaned = re.sub(r"[\t\n\r]", "", location).replace("\\", "/")
    parts = urllib.parse.urlsplit(cleaned)
    dotted = parts._replace(path=re.sub("(?i)%2e", ".", parts.path))
    return urllib.parse.urlsplit(urllib.parse.urljoin(BASE, urllib.parse.urlunsplit(dotted)))


@BUDGET
@given(target=NEXTS)
def test_next_never_answers_5xx_nor_leads_out_of_the_dashboard(app: Flask, target: str) -> None:
    client = app.test_client()
    page = client.get(f"{PREFIX}/sign-in?next={encoded(target)}")
    assert page.status_code == 200, page.get_data(as_text=True)
    response = client.post(
        f"{PREFIX}/sign-in",
        data=form_body({"token": TOKEN, "csrf_token": csrf_of(page), "next": target}),
        content_type="application/x-www-form-urlencoded",
    )
    assert response.status_code == 303, response.get_data(as_text=True)
    location = response.headers["Location"]
    assert location.isascii() and location.isprintable() and " " not in location
    landed = lands_on(location)
    assert landed.netloc == "dashboard.test", location
    assert landed.path.startswith(f"{PREFIX}/") and "//" not in landed.path, location


@pytest.mark.parametrize(
    "target",
    [
        f"{PREFIX}/../../x",
        f"{PREFIX}/%2e%2e/x",
        f"{PREFIX}/x\r\nSet-Cookie: a=b",
        f"{PREFIX}/\t/evil.example",
    ],
)
def test_a_next_that_leaves_the_prefix_goes_to_the_index(client: FlaskClient, target: str) -> None:
    page = client.get(f"{PREFIX}/sign-in")
    response = client.post(
        f"{PREFIX}/sign-in", data={"token": TOKEN, "csrf_token": csrf_of(page), "next": target}
    )
    assert (response.status_code, response.headers.get("Location")) == (303, f"{PREFIX}/")


def test_a_page_under_an_encoded_id_comes_back_after_sign_in(client: FlaskClient) -> None:
    sent = client.get(f"{PREFIX}/webhooks/subscriptions/my%20sub?tab=a%20b")
    assert sent.status_code == 303
    page = client.get(sent.headers["Location"])
    response = client.post(sent.headers["Location"], data={"token": TOKEN, "csrf_token": csrf_of(page)})
    assert response.headers["Location"] == f"{PREFIX}/webhooks/subscriptions/my%20sub?tab=a%20b"
