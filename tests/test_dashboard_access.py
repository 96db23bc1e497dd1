"""The dashboard's skeleton: enabled by one setting, deny by default, sign-in, CSRF, headers."""

from __future__ import annotations

import dataclasses

import pytest
from flask import Flask

from flask_harvest import ConfigurationError, InMemoryOutboundWebhookHandler, OutboundWebhookPlugin
from flask_harvest.dashboard import CONTENT_SECURITY_POLICY
from flask_harvest.dashboard._session import (
    COOKIE_NAME,
    DashboardSession,
    dump_session,
    load_session,
    token_digest,
)

from .dashboard_client import PREFIX, SECRET_KEY, TOKEN, csrf_of, dashboard_app, signed_in, text
from .pipeline import close_later, make_app


def memory_app(**config: object) -> Flask:
    return dashboard_app(InMemoryOutboundWebhookHandler(), **config)


def test_off_unless_enabled() -> None:
    app = make_app(InMemoryOutboundWebhookHandler(), HARVEST_ACTUATOR_TOKEN=TOKEN, SECRET_KEY=SECRET_KEY)
    assert app.test_client().get(f"{PREFIX}/").status_code == 404


def test_one_setting_enables_it_at_the_configured_prefix() -> None:
    app = memory_app(HARVEST_DASHBOARD_URL_PREFIX="/ops/harvest")
    client = app.test_client()
    assert client.get("/ops/harvest/sign-in").status_code == 200
    assert client.get(f"{PREFIX}/sign-in").status_code == 404


def test_registration_without_a_secret_key_says_what_to_do() -> None:
    app = Flask("no_secret")
    app.config["HARVEST_DASHBOARD"] = True
    with pytest.raises(ConfigurationError, match="secret_key"):
        OutboundWebhookPlugin(InMemoryOutboundWebhookHandler(), app)
    assert "harvest" not in app.extensions


@pytest.mark.parametrize("prefix", ["harvest", "/", "/harvest/", "//evil"])
def test_a_bad_prefix_is_refused(prefix: str) -> None:
    app = Flask("bad_prefix")
    app.config.update(HARVEST_DASHBOARD=True, HARVEST_DASHBOARD_URL_PREFIX=prefix, SECRET_KEY=SECRET_KEY)
    with pytest.raises(ConfigurationError, match="HARVEST_DASHBOARD_URL_PREFIX"):
        OutboundWebhookPlugin(InMemoryOutboundWebhookHandler(), app)


def test_pages_redirect_to_sign_in_and_come_back() -> None:
    client = memory_app().test_client()
    response = client.get(f"{PREFIX}/")
    assert response.status_code == 303
    assert response.headers["Location"] == f"{PREFIX}/sign-in?next={PREFIX}/"
    page = client.get(response.headers["Location"])
    assert "Actuator token" in text(page)
    done = client.post(
        f"{PREFIX}/sign-in", data={"token": TOKEN, "csrf_token": csrf_of(page), "next": f"{PREFIX}/"}
    )
    assert done.status_code == 303 and done.headers["Location"] == f"{PREFIX}/"
    assert client.get(f"{PREFIX}/").status_code == 200


def test_the_cookie_is_httponly_lax_scoped_and_holds_no_token() -> None:
    client = memory_app().test_client()
    page = client.get(f"{PREFIX}/sign-in")
    response = client.post(f"{PREFIX}/sign-in", data={"token": TOKEN, "csrf_token": csrf_of(page)})
    cookie = response.headers["Set-Cookie"]
    assert cookie.startswith(f"{COOKIE_NAME}=")
    for flag in ("HttpOnly", "SameSite=Lax", f"Path={PREFIX}"):
        assert flag in cookie
    assert "Secure" not in cookie  # plain HTTP here
    assert TOKEN not in cookie
    secure = memory_app().test_client()
    page = secure.get(f"{PREFIX}/sign-in", base_url="https://localhost")
    assert "Secure" in page.headers["Set-Cookie"]


def test_a_wrong_token_is_refused() -> None:
    client = memory_app().test_client()
    page = client.get(f"{PREFIX}/sign-in")
    response = client.post(f"{PREFIX}/sign-in", data={"token": "x" * 30, "csrf_token": csrf_of(page)})
    assert response.status_code == 401
    assert "not the token" in text(response)
    assert client.get(f"{PREFIX}/").status_code == 303


def test_sign_in_without_csrf_is_refused() -> None:
    client = memory_app().test_client()
    client.get(f"{PREFIX}/sign-in")
    response = client.post(f"{PREFIX}/sign-in", data={"token": TOKEN})
    assert response.status_code == 403
    assert client.get(f"{PREFIX}/").status_code == 303


def test_a_cross_site_next_is_not_followed() -> None:
    client = memory_app().test_client()
    page = client.get(f"{PREFIX}/sign-in")
    for target in ("https://evil.example/", "//evil.example/", f"{PREFIX}//evil.example", "/elsewhere"):
        client.post(f"{PREFIX}/sign-in", data={"token": TOKEN, "csrf_token": csrf_of(page), "next": target})
        page = client.get(f"{PREFIX}/sign-in")
        done = client.post(
            f"{PREFIX}/sign-in", data={"token": TOKEN, "csrf_token": csrf_of(page), "next": target}
        )
        assert done.headers["Location"] == f"{PREFIX}/"


def test_sign_out_needs_csrf_and_ends_the_session() -> None:
    client = memory_app().test_client()
    csrf = signed_in(client)
    assert client.post(f"{PREFIX}/sign-out").status_code == 403
    assert client.get(f"{PREFIX}/").status_code == 200
    assert client.post(f"{PREFIX}/sign-out", data={"csrf_token": csrf}).status_code == 303
    assert client.get(f"{PREFIX}/").status_code == 303


def test_a_new_token_signs_every_session_out() -> None:
    app = memory_app()
    client = app.test_client()
    signed_in(client)
    old = app.extensions["harvest"].settings
    new_token = "another-token-0123456789"
    app.extensions["harvest"].settings = dataclasses.replace(old, actuator_token=new_token)
    assert client.get(f"{PREFIX}/").status_code == 303


def test_security_headers_on_every_answer() -> None:
    client = memory_app().test_client()
    for path in ("/", "/sign-in", "/static/dashboard.css", "/no-such-page"):
        with client.get(PREFIX + path) as response:  # closes the static file
            assert response.headers["Content-Security-Policy"] == CONTENT_SECURITY_POLICY
            assert response.headers["X-Content-Type-Options"] == "nosniff"
            assert response.headers["Referrer-Policy"] == "same-origin"
    assert "default-src 'none'" in CONTENT_SECURITY_POLICY and "script-src" not in CONTENT_SECURITY_POLICY


def test_unknown_pages_are_404_only_after_sign_in() -> None:
    client = memory_app().test_client()
    assert client.get(f"{PREFIX}/no-such-page").status_code == 303
    signed_in(client)
    assert client.get(f"{PREFIX}/no-such-page").status_code == 404


def test_closed_without_token_or_authorizer() -> None:
    app = make_app(InMemoryOutboundWebhookHandler(), HARVEST_DASHBOARD=True, SECRET_KEY=SECRET_KEY)
    response = app.test_client().get(f"{PREFIX}/")
    assert response.status_code == 403
    assert "HARVEST_ACTUATOR_TOKEN" in text(response)


def test_the_actuator_authorizer_opens_it() -> None:
    app = Flask("authorized")
    app.config.update(HARVEST_DASHBOARD=True, SECRET_KEY=SECRET_KEY)
    plugin = OutboundWebhookPlugin(InMemoryOutboundWebhookHandler())

    @plugin.actuator_authorizer
    def only_admin(request: object) -> bool:
        return getattr(request, "headers", {}).get("X-Admin") == "yes"

    plugin.init_app(app)
    close_later(app)
    client = app.test_client()
    assert client.get(f"{PREFIX}/").status_code == 403
    page = client.get(f"{PREFIX}/", headers={"X-Admin": "yes"})
    assert page.status_code == 200
    # The authorizer does not lift the CSRF check.
    assert client.post(f"{PREFIX}/sign-out", headers={"X-Admin": "yes"}).status_code == 403


def test_session_cookie_round_trip_and_forgery() -> None:
    session = DashboardSession(csrf="c" * 43, auth=token_digest(SECRET_KEY, TOKEN))
    value = dump_session(session, SECRET_KEY)
    assert load_session(value, SECRET_KEY, 60) == session
    assert load_session(value, "another-key", 60) is None
    assert load_session(value[:-2] + "xx", SECRET_KEY, 60) is None
    assert load_session("x" * 5000, SECRET_KEY, 60) is None
    assert TOKEN not in repr(session) and session.auth not in repr(session)
