"""The portal's links and session: the pure token module, ``portal_url``'s refusals, the checks of
the ``HARVEST_PORTAL_*`` keys, and revocation by key rotation, through the app."""

from __future__ import annotations

import re
import string
import time
from typing import Any

import pytest
from flask import Flask
from hypothesis import given
from hypothesis import strategies as st
from itsdangerous import TimestampSigner, URLSafeTimedSerializer

from flask_harvest import InMemoryOutboundWebhookHandler, OutboundWebhookPlugin
from flask_harvest.config import KEYS, Settings, load_settings, portal_frame_ancestors
from flask_harvest.errors import ConfigurationError, InvalidFieldError
from flask_harvest.portal import MAX_LINK_SECONDS, content_security_policy, portal, portal_url
from flask_harvest.portal._session import (
    _LINK_SALT,
    _SESSION_SALT,
    COOKIE_NAME,
    MAX_TOKEN_CHARS,
    PortalSession,
    csrf_matches,
    dump_session,
    load_session,
    make_link_token,
    read_link_token,
)

from .pipeline import close_later
from .portal_support import PORTAL_KEY, PREFIX, SECRET_KEY, link, portal_app, signed_in, text
from .properties import BUDGET, TEXT

KEY = "a-portal-key-0123456789abcdefghijklmnop"
NOW = 1_800_000_000.0
DAY = 24 * 3600


def old_token(data: object, salt: str, age: float, key: str = KEY) -> str:
    """A token signed ``age`` seconds ago (itsdangerous stamps the signing time)."""

    class Earlier(TimestampSigner):
        def get_timestamp(self) -> int:
            return int(time.time() - age)

    return URLSafeTimedSerializer(key, salt=salt, signer=Earlier).dumps(data)


# -- links ---------------------------------------------------------------------------------------


def test_a_link_names_its_tenant_until_it_expires() -> None:
    token = make_link_token("acme", KEY, expires_at=NOW + 60)
    assert read_link_token(token, KEY, MAX_LINK_SECONDS, now=NOW) == "acme"
    assert read_link_token(token, KEY, MAX_LINK_SECONDS, now=NOW + 59) == "acme"
    # Expired by its own deadline, however young the signature.
    assert read_link_token(token, KEY, MAX_LINK_SECONDS, now=NOW + 60) is None


def test_a_link_older_than_max_age_is_refused_whatever_it_says() -> None:
    far = time.time() + 30 * DAY
    token = old_token({"t": "acme", "e": int(far)}, _LINK_SALT, age=8 * DAY)
    assert read_link_token(token, KEY, MAX_LINK_SECONDS, now=time.time()) is None
    assert read_link_token(token, KEY, 9 * DAY, now=time.time()) == "acme"


_BASE64 = string.ascii_uppercase + string.ascii_lowercase + string.digits + "-_"


def flipped(char: str) -> str:
    """``char`` with the top bit of its base64 value flipped (the low bits of a last character may
    be padding, which decodes the same); a separator becomes a letter."""
    if char not in _BASE64:
        return "A"
    return _BASE64[_BASE64.index(char) ^ 0b100000]


def test_a_tampered_link_or_one_of_another_key_is_refused() -> None:
    token = make_link_token("acme", KEY, expires_at=NOW + 60)
    for position in range(len(token)):
        changed = token[:position] + flipped(token[position]) + token[position + 1 :]
        assert read_link_token(changed, KEY, MAX_LINK_SECONDS, now=NOW) is None, position
    # The key rotated: every link made before is revoked.
    assert read_link_token(token, KEY + "-rotated", MAX_LINK_SECONDS, now=NOW) is None


def test_a_session_cookie_is_not_a_link_nor_the_reverse() -> None:
    session = PortalSession.new("acme")
    cookie = dump_session(session, KEY)
    assert load_session(cookie, KEY, 3600) == session
    assert read_link_token(cookie, KEY, MAX_LINK_SECONDS, now=NOW) is None
    token = make_link_token("acme", KEY, expires_at=time.time() + 60)
    assert load_session(token, KEY, 3600) is None
    # The same payload under the other salt does not cross over either.
    assert (
        read_link_token(
            URLSafeTimedSerializer(KEY, salt=_SESSION_SALT).dumps({"t": "acme", "e": int(NOW + 60)}),
            KEY,
            MAX_LINK_SECONDS,
            now=NOW,
        )
        is None
    )


def test_a_session_expires_with_its_max_age_and_its_key() -> None:
    cookie = old_token({"t": "acme", "c": "c" * 43}, _SESSION_SALT, age=7200)
    assert load_session(cookie, KEY, 3600) is None
    assert load_session(cookie, KEY, 9000) == PortalSession("acme", "c" * 43)
    assert load_session(cookie, KEY + "-rotated", 9000) is None


@pytest.mark.parametrize(
    "data",
    [
        {"t": "acme", "e": True},
        {"t": "acme", "e": float(NOW + 60)},
        {"t": "acme", "e": str(int(NOW + 60))},
        {"t": "a b", "e": int(NOW + 60)},
        {"t": "", "e": int(NOW + 60)},
        {"t": None, "e": int(NOW + 60)},
        {"t": ["acme"], "e": int(NOW + 60)},
        {"e": int(NOW + 60)},
        ["acme", int(NOW + 60)],
        "acme",
    ],
)
def test_a_link_we_did_not_make_is_refused_even_when_signed(data: Any) -> None:
    # Signed under the right key and salt (a key shared with other code), yet not a link of ours.
    token = URLSafeTimedSerializer(KEY, salt=_LINK_SALT).dumps(data)
    assert read_link_token(token, KEY, MAX_LINK_SECONDS, now=NOW) is None


@pytest.mark.parametrize(
    "data",
    [
        {"t": "acme", "c": "short"},
        {"t": "acme", "c": 12345},
        {"t": "a\nb", "c": "c" * 43},
        {"c": "c" * 43},
        [],
    ],
)
def test_a_cookie_we_did_not_make_is_refused_even_when_signed(data: Any) -> None:
    cookie = URLSafeTimedSerializer(KEY, salt=_SESSION_SALT).dumps(data)
    assert load_session(cookie, KEY, 3600) is None


HOSTILE = st.one_of(
    TEXT,
    st.text(min_size=MAX_TOKEN_CHARS - 2, max_size=MAX_TOKEN_CHARS + 2),
    st.binary(max_size=40),
    st.none(),
    st.integers(),
    st.lists(TEXT, max_size=2),
    st.sampled_from(["a.b.c", "eyJ0IjoiYWNtZSJ9", "e30.AAAA.BBBB", ".", "..", "\x00.\ud800.x"]),
)


@BUDGET
@given(value=HOSTILE, key=st.one_of(st.just(KEY), TEXT.filter(bool)))
def test_hostile_tokens_and_cookies_are_refused_without_raising(value: object, key: str) -> None:
    assert read_link_token(value, key, MAX_LINK_SECONDS, now=NOW) is None
    assert load_session(value, key, 3600) is None
    session = PortalSession.new("acme")
    assert csrf_matches(session, value) is False
    assert csrf_matches(session, session.csrf) is True


def test_a_session_keeps_its_csrf_token_out_of_its_repr() -> None:
    session = PortalSession.new("acme")
    assert session.csrf not in repr(session) and "acme" in repr(session)


# -- portal_url ------------------------------------------------------------------------------------


@pytest.fixture
def app() -> Flask:
    return portal_app(InMemoryOutboundWebhookHandler())


@pytest.mark.parametrize("tenant", ["", "a b", "a\x00b", "\ud800", "x" * 300])
def test_portal_url_refuses_a_bad_tenant(app: Flask, tenant: str) -> None:
    with app.test_request_context(), pytest.raises(InvalidFieldError) as info:
        portal_url(tenant)
    assert info.value.field == "tenant"


def test_portal_url_refuses_no_tenant(app: Flask) -> None:
    with app.test_request_context(), pytest.raises(InvalidFieldError) as info:
        portal_url(None)  # type: ignore[arg-type]
    assert info.value.field == "tenant"


@pytest.mark.parametrize(
    "seconds", [0, -1, MAX_LINK_SECONDS + 1, float("nan"), float("inf"), True, "60", [60]]
)
def test_portal_url_refuses_a_life_out_of_range(app: Flask, seconds: Any) -> None:
    with app.test_request_context(), pytest.raises(InvalidFieldError) as info:
        portal_url("acme", expires_in=seconds)
    assert info.value.field == "expires_in"


def test_portal_url_gives_an_absolute_link_that_opens_the_portal(app: Flask) -> None:
    url = link(app, "acme", expires_in=MAX_LINK_SECONDS)
    assert re.fullmatch(r"http://localhost/portal/open\?token=[A-Za-z0-9._-]+", url), url
    assert app.test_client().get(url).status_code == 303


def test_the_extension_makes_the_same_link(app: Flask) -> None:
    harvest = OutboundWebhookPlugin(InMemoryOutboundWebhookHandler())
    other = Flask("other")
    other.config.update(SECRET_KEY=SECRET_KEY)
    harvest.init_app(other)
    other.register_blueprint(portal, url_prefix="/customers")
    close_later(other)
    with other.test_request_context():
        url = harvest.portal_url("acme", expires_in=60)
    assert url.startswith("http://localhost/customers/open?token=")
    assert other.test_client().get(url).headers["Location"] == "/customers/"


def test_portal_url_needs_the_blueprint_registered() -> None:
    store = InMemoryOutboundWebhookHandler()
    bare = Flask("bare")
    bare.config.update(SECRET_KEY=SECRET_KEY)
    OutboundWebhookPlugin(store, bare)
    close_later(bare)
    with bare.test_request_context(), pytest.raises(ConfigurationError) as info:
        portal_url("acme")
    assert "register_blueprint" in str(info.value)


def test_registering_the_portal_needs_a_key() -> None:
    keyless = Flask("keyless")
    OutboundWebhookPlugin(InMemoryOutboundWebhookHandler(), keyless)
    close_later(keyless)
    with pytest.raises(ConfigurationError) as info:
        keyless.register_blueprint(portal, url_prefix=PREFIX)
    assert KEYS["portal_secret_key"] in str(info.value)


# -- the HARVEST_PORTAL_* keys ---------------------------------------------------------------------

_ORIGIN = re.compile(r"'self'|https?://(\*\.)?[A-Za-z0-9.-]+(:[0-9]{1,5})?")
ANCESTOR_PARTS = st.one_of(
    TEXT,
    st.sampled_from(
        [
            "'self'",
            "https://app.example.com",
            "http://localhost:8080",
            "https://*.example.com",
            "'none'",
            "*",
            "data:",
            "javascript:alert(1)",
            "https://a.example; script-src *",
            "https://a.example\r\nX-Evil: 1",
            "https://a.example/path",
            "https://user@a.example",
            "'unsafe-inline'",
            "https://a.example 'self'",
            "https://é.example",
        ]
    ),
)


def settings_with(**values: Any) -> Settings:
    return load_settings({KEYS[name]: value for name, value in values.items()}, {})


def accepted(name: str, value: object) -> Settings | None:
    """The settings with ``value`` for ``name``, or ``None`` when it is refused (by a
    :class:`ConfigurationError` naming the key, and nothing else)."""
    try:
        return settings_with(**{name: value})
    except ConfigurationError as exc:
        message = str(exc)
    assert KEYS[name] in message
    return None


@BUDGET
@given(st.lists(ANCESTOR_PARTS, max_size=4).map(", ".join))
def test_frame_ancestors_are_origins_or_refused(value: str) -> None:
    settings = accepted("portal_frame_ancestors", value)
    if settings is None:
        return
    origins = portal_frame_ancestors(settings)
    assert all(_ORIGIN.fullmatch(origin) for origin in origins), origins
    policy = content_security_policy(settings)
    # One directive each, on one line: nothing in the value added or ended a directive.
    assert policy.count(";") == 5 and "\n" not in policy and "\r" not in policy
    frame = re.search(r"frame-ancestors ([^;]*)", policy)
    assert frame is not None
    assert frame.group(1) == (" ".join(origins) or "'none'")


COLOURS = st.one_of(
    TEXT,
    st.sampled_from(["#1f6feb", "#ABCDEF", "#fff", "red", "#1f6feb;}", "#1f6feb\n", "#1f6febx", "#12345g"]),
)


@BUDGET
@given(COLOURS)
def test_the_accent_colour_is_six_hex_digits_or_refused(value: str) -> None:
    settings = accepted("portal_accent_color", value)
    if settings is None:
        return
    assert value == "" or re.fullmatch(r"#[0-9A-Fa-f]{6}", value)
    assert settings.portal_accent_color == value


LOGOS = st.one_of(
    TEXT,
    st.sampled_from(
        [
            "https://cdn.example.com/logo.svg",
            "/static/logo.png",
            "//evil.example/logo.png",
            "http://cdn.example.com/logo.svg",
            "javascript:alert(1)",
            "data:image/png;base64,AAAA",
            "https://cdn.example.com/a b.png",
            "https://cdn.example.com/a'b.png",
            'https://cdn.example.com/a"b.png',
            "https://cdn.example.com/a);x.png",
            "https://cdn.example.com; script-src *",
            "https://a@cdn.example.com/x",
            "/" + "a" * 2100,
        ]
    ),
)


@BUDGET
@given(LOGOS)
def test_the_logo_is_an_https_url_or_a_path_or_refused(value: str) -> None:
    settings = accepted("portal_logo_url", value)
    if settings is None:
        return
    if value:
        assert value.startswith("https://") or (value.startswith("/") and not value.startswith("//"))
        assert not set(value) & set(" \t\r\n'\"();,<>\\@") and len(value) <= 2048
    policy = content_security_policy(settings)
    assert policy.count(";") == 5
    images = re.search(r"img-src ([^;]*)", policy)
    assert images is not None
    expected = "'self' data:"
    if value.startswith("https://"):
        expected += " https://" + value.removeprefix("https://").split("/")[0]
    assert images.group(1) == expected


@BUDGET
@given(st.one_of(TEXT, st.text(min_size=99, max_size=102), st.just(" "), st.just("Acme <Webhooks>")))
def test_the_portal_name_is_a_title_or_refused(value: str) -> None:
    settings = accepted("portal_name", value)
    if settings is None:
        return
    assert settings.portal_name == value and 1 <= len(value) <= 100 and value.strip()


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("portal_frame_ancestors", 5),
        ("portal_accent_color", None),
        ("portal_logo_url", ["https://a.example/x"]),
        ("portal_name", ""),
        ("portal_link_seconds", 0),
        ("portal_link_seconds", "nan"),
        ("portal_link_seconds", MAX_LINK_SECONDS + 1),
        ("portal_session_seconds", -1),
    ],
)
def test_other_bad_portal_values_are_refused(name: str, value: Any) -> None:
    with pytest.raises(ConfigurationError) as info:
        settings_with(**{name: value})
    assert KEYS[name] in str(info.value)


def test_the_longest_link_life_is_accepted() -> None:
    assert settings_with(portal_link_seconds=MAX_LINK_SECONDS).portal_link_seconds == MAX_LINK_SECONDS


# -- revocation and the refusal pages, through the app ---------------------------------------------


def with_cookie(target: Flask, cookie: str) -> Any:
    """A client of ``target`` holding a portal cookie another app set."""
    client = target.test_client()
    client.set_cookie(COOKIE_NAME, cookie, path=f"{PREFIX}/")
    return client


def cookie_of(client: Any) -> str:
    found = client.get_cookie(COOKIE_NAME, path=f"{PREFIX}/")
    assert found is not None
    value: str = found.value
    return value


def test_rotating_the_portal_key_ends_open_sessions_and_links() -> None:
    store = InMemoryOutboundWebhookHandler()
    before = portal_app(store)
    client, _ = signed_in(before, "acme")
    url = link(before, "acme")
    cookie = cookie_of(client)
    same = with_cookie(portal_app(store), cookie)
    assert same.get(f"{PREFIX}/").status_code == 200
    rotated = portal_app(store, HARVEST_PORTAL_SECRET_KEY=PORTAL_KEY + "-rotated")
    ended = with_cookie(rotated, cookie).get(f"{PREFIX}/")
    assert ended.status_code == 401 and "Session ended" in text(ended)
    refused = rotated.test_client().get(url)
    assert refused.status_code == 403 and "Link expired" in text(refused)
    assert refused.headers.get("Set-Cookie") is None


def test_rotating_the_apps_key_ends_sessions_when_it_is_the_one_used() -> None:
    store = InMemoryOutboundWebhookHandler()
    before = portal_app(store, HARVEST_PORTAL_SECRET_KEY="")
    client, _ = signed_in(before, "acme")
    rotated = portal_app(store, HARVEST_PORTAL_SECRET_KEY="", SECRET_KEY=SECRET_KEY + "-rotated")
    ended = with_cookie(rotated, cookie_of(client)).get(f"{PREFIX}/deliveries")
    assert ended.status_code == 401


def test_an_expired_link_is_a_403_page_and_opens_nothing(app: Flask) -> None:
    token = make_link_token("acme", PORTAL_KEY, expires_at=time.time() - 1)
    client = app.test_client()
    answer = client.get(f"{PREFIX}/open", query_string={"token": token})
    assert answer.status_code == 403
    assert "This link has expired or is not valid" in text(answer)
    assert answer.headers.get("Set-Cookie") is None
    assert client.get(f"{PREFIX}/").status_code == 401


@pytest.mark.parametrize("cookie", [None, "", "garbage", "a" * 5000])
def test_no_session_is_a_401_page(app: Flask, cookie: str | None) -> None:
    headers = {} if cookie is None else {"Cookie": f"{COOKIE_NAME}={cookie}"}
    answer = app.test_client().get(f"{PREFIX}/", headers=headers)
    assert answer.status_code == 401
    assert "Your session has ended. Open the portal again from your account." in text(answer)
    # Signed out: the page offers no navigation into the portal and no form.
    assert 'aria-label="Portal"' not in text(answer) and "<form" not in text(answer)
