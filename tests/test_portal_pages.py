"""The portal's pages through the test client, on SQLite and PostgreSQL with the local job backend
and a real receiver on 127.0.0.1: a customer's whole flow from the link to deleting the endpoint,
the SSRF refusals in the customer's words, CSRF, the security headers and cookie, the theme, and
no trace of the operator's console."""

from __future__ import annotations

import re
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from flask import Flask
from flask.testing import FlaskClient
from werkzeug.test import TestResponse

from flask_harvest import DeliveryState, OutboundWebhookHandler
from flask_harvest.outbound.signing import standard_signature, verify_standard
from flask_harvest.outbound.ssrf import SsrfRejection, public_reason
from flask_harvest.testing import CapturingReceiver, drain
from flask_harvest.webhooks.models import WebhookSubscriptionStatus
from flask_harvest.webhooks.stores.sql import SqlOutboundWebhookStore

from .portal_support import (
    EVENT_TYPE,
    PREFIX,
    csrf_of,
    link,
    portal_app,
    portal_routes,
    secret_of,
    signed_in,
    text,
)

TENANT = "acme"


@pytest.fixture
def app(sql_store: SqlOutboundWebhookStore) -> Flask:
    return portal_app(sql_store, HARVEST_WEBHOOKS_MAX_ATTEMPTS=2)


def only_endpoint(store: OutboundWebhookHandler) -> Any:
    [found] = store.list_subscriptions(tenant=TENANT)
    return found


def deliveries_of(store: OutboundWebhookHandler) -> list[Any]:
    return store.list_deliveries(limit=100, tenant=TENANT)


def window() -> dict[str, str]:
    """A ``datetime-local`` window around now, as the replay form posts it."""
    now = datetime.now(timezone.utc)
    return {
        "since": (now - timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M"),
        "until": (now + timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M"),
    }


def post(client: FlaskClient, path: str, csrf: str, **fields: Any) -> TestResponse:
    return client.post(f"{PREFIX}{path}", data={"csrf_token": csrf, **fields})


def test_a_customer_manages_an_endpoint_from_link_to_delete(
    app: Flask, sql_store: SqlOutboundWebhookStore, receiver: CapturingReceiver
) -> None:
    store = sql_store
    client = app.test_client()
    opened = client.get(link(app, TENANT))
    assert opened.status_code == 303 and opened.headers["Location"] == f"{PREFIX}/"
    index = client.get(f"{PREFIX}/")
    assert index.status_code == 200 and "No endpoint yet" in text(index)
    csrf = csrf_of(client.get(f"{PREFIX}/endpoints/new"))

    # Add: the secret is shown once.
    created = post(
        client,
        "/endpoints/new",
        csrf,
        target_url=receiver.url("/hook"),
        description="Orders to the warehouse",
        event_types=[EVENT_TYPE],
    )
    assert created.status_code == 200, text(created)
    secret = secret_of(created)
    endpoint = only_endpoint(store)
    assert (endpoint.tenant, endpoint.secret, list(endpoint.event_topics)) == (TENANT, secret, [EVENT_TYPE])
    page = f"{PREFIX}/endpoints/{endpoint.id}"
    later = [f"{PREFIX}/", page, f"{page}/edit", f"{page}/rotate", f"{PREFIX}/deliveries"]
    for path in later:
        answer = client.get(path)
        assert answer.status_code == 200 and secret not in text(answer), path
    assert "Orders to the warehouse" in text(client.get(f"{PREFIX}/"))

    # Edit.
    edited = post(
        client,
        f"/endpoints/{endpoint.id}/edit",
        csrf,
        target_url=receiver.url("/hook2"),
        description="Orders, second version",
        event_types=["*"],
    )
    assert edited.status_code == 303 and edited.headers["Location"].endswith("done=saved")
    shown = text(client.get(edited.headers["Location"]))
    assert "Saved." in shown and receiver.url("/hook2") in shown and "Orders, second version" in shown
    endpoint = only_endpoint(store)
    assert (endpoint.target_url, list(endpoint.event_topics)) == (receiver.url("/hook2"), ["*"])

    # Disable: a test event is refused, and nothing is logged; enable again.
    disabled = post(client, f"/endpoints/{endpoint.id}/status", csrf, status="disabled")
    assert disabled.status_code == 303 and "Disabled." in text(client.get(disabled.headers["Location"]))
    assert only_endpoint(store).status is WebhookSubscriptionStatus.DISABLED
    refused = post(client, f"/endpoints/{endpoint.id}/test", csrf, event_type=EVENT_TYPE)
    assert refused.status_code == 409 and "enable it first" in text(refused)
    assert deliveries_of(store) == []
    enabled = post(client, f"/endpoints/{endpoint.id}/status", csrf, status="active")
    assert enabled.status_code == 303 and only_endpoint(store).status is WebhookSubscriptionStatus.ACTIVE

    # A test event: delivered, signed with the secret shown, listed with its attempt.
    assert client.get(f"{page}/test").status_code == 200
    tested = post(client, f"/endpoints/{endpoint.id}/test", csrf, event_type=EVENT_TYPE)
    assert tested.status_code == 303 and "A test event was queued" in text(
        client.get(tested.headers["Location"])
    )
    drain(app)
    [received] = receiver.wait_for(1, path="/hook2")
    verify_standard(secret, received.headers, received.body)
    assert b'"ord_example_1"' in received.body  # the catalog's example payload
    [delivery] = deliveries_of(store)
    assert delivery.state is DeliveryState.DELIVERED
    for path in (f"{PREFIX}/deliveries", f"{PREFIX}/deliveries?endpoint_id={endpoint.id}", page):
        assert delivery.id in text(client.get(path)), path
    shown = text(client.get(f"{PREFIX}/deliveries/{delivery.id}"))
    attempts = re.search(r'<table id="attempts">(.*?)</table>', shown, re.S)
    assert attempts and ">200<" in attempts.group(1) and "No attempt yet" not in attempts.group(1)
    assert 'id="replay"' not in shown  # delivered: nothing to replay

    # A dead letter, replayed from its page.
    receiver.respond("/hook2", 500, "down", times=2)
    post(client, f"/endpoints/{endpoint.id}/test", csrf, event_type=EVENT_TYPE)
    drain(app, retries=True)
    [dead] = [d for d in deliveries_of(store) if d.state is DeliveryState.DLQ]
    dead_page = text(client.get(f"{PREFIX}/deliveries/{dead.id}"))
    assert 'id="replay"' in dead_page and "down" in dead_page
    replayed = post(client, f"/deliveries/{dead.id}/replay", csrf)
    assert replayed.status_code == 303 and "done=replayed" in replayed.headers["Location"]
    assert "Replayed: it is due now." in text(client.get(replayed.headers["Location"]))
    drain(app)
    assert store.get_delivery(dead.id).state is DeliveryState.DELIVERED  # type: ignore[union-attr]

    # Dead letters of a window: counted, then replayed.
    receiver.respond("/hook2", 500, "down", times=4)
    for _ in range(2):
        post(client, f"/endpoints/{endpoint.id}/test", csrf, event_type=EVENT_TYPE)
    drain(app, retries=True)
    dead_ids = {d.id for d in deliveries_of(store) if d.state is DeliveryState.DLQ}
    assert len(dead_ids) == 2
    assert client.get(f"{PREFIX}/replay").status_code == 200
    counted = post(client, "/replay", csrf, action="count", endpoint=endpoint.id, **window())
    assert counted.status_code == 200
    assert "2 failed deliveries in this window would be sent again." in text(counted)
    assert {d.id for d in deliveries_of(store) if d.state is DeliveryState.DLQ} == dead_ids
    sent = post(client, "/replay", csrf, action="replay", endpoint=endpoint.id, **window())
    assert "2 deliveries were sent again." in text(sent)
    drain(app)
    assert all(d.state is DeliveryState.DELIVERED for d in store.get_deliveries(sorted(dead_ids)))

    # Rotate: a confirmation first; the new secret once; both secrets sign during the grace.
    kept = post(client, f"/endpoints/{endpoint.id}/rotate", csrf)
    assert kept.status_code == 422 and "the secret was kept" in text(kept)
    assert only_endpoint(store).secret == secret
    rotated = post(client, f"/endpoints/{endpoint.id}/rotate", csrf, confirm="yes")
    assert rotated.status_code == 200 and "The old secret keeps signing too for 24 hours" in text(rotated)
    new_secret = secret_of(rotated)
    assert new_secret != secret
    stored = only_endpoint(store)
    assert (stored.secret, stored.previous_secret) == (new_secret, secret)
    for path in later:
        assert new_secret not in text(client.get(path)) and secret not in text(client.get(path)), path
    # The same form sent again (a reload, a second click) rotates nothing: the grace goes on.
    again = post(client, f"/endpoints/{endpoint.id}/rotate", csrf, confirm="yes")
    assert again.status_code == 409 and "it was not rotated again" in text(again)
    assert new_secret not in text(again) and secret not in text(again)
    assert (only_endpoint(store).secret, only_endpoint(store).previous_secret) == (new_secret, secret)
    before = len(receiver.requests)
    post(client, f"/endpoints/{endpoint.id}/test", csrf, event_type=EVENT_TYPE)
    drain(app)
    signed = receiver.wait_for(before + 1, path="/hook2")[-1]
    entries = signed.headers["webhook-signature"].split(" ")
    msg_id, stamp = signed.headers["webhook-id"], int(signed.headers["webhook-timestamp"])
    assert sorted(entries) == sorted(
        standard_signature(s, msg_id, stamp, signed.body) for s in (secret, new_secret)
    )
    verify_standard(new_secret, signed.headers, signed.body)
    verify_standard(secret, signed.headers, signed.body)

    # Delete: confirmed; the endpoint is gone, its deliveries stay listed.
    assert client.get(f"{page}/delete").status_code == 200
    assert post(client, f"/endpoints/{endpoint.id}/delete", csrf).status_code == 422
    deleted = post(client, f"/endpoints/{endpoint.id}/delete", csrf, confirm="yes")
    assert deleted.status_code == 303 and deleted.headers["Location"].endswith("done=deleted")
    assert "The endpoint was deleted" in text(client.get(deleted.headers["Location"]))
    assert store.list_subscriptions(tenant=TENANT) == []
    assert client.get(page).status_code == 404
    assert delivery.id in text(client.get(f"{PREFIX}/deliveries"))


# -- SSRF -------------------------------------------------------------------------------------------


def ssrf(reason: SsrfRejection) -> str:
    return f"That URL cannot receive events: {public_reason(reason)}."


#: The model's own check of a URL, which runs before the SSRF policy when an endpoint is added
#: (an edit checks the policy first): it names no setting either.
NOT_A_URL = "target_url: must be an absolute http:// or https:// URL with a host"
#: Refused URLs, and what the form says of each: the SSRF policy's reason in the customer's words.
REFUSED_URLS = [
    ("http://169.254.169.254/latest/meta-data", ssrf(SsrfRejection.LINK_LOCAL_ADDRESS)),
    ("http://10.0.0.1/hook", ssrf(SsrfRejection.PRIVATE_ADDRESS)),
    ("http://localhost:8080/hook", ssrf(SsrfRejection.LOCALHOST_NAME)),
    ("http://127.0.0.2/hook", ssrf(SsrfRejection.LOOPBACK_ADDRESS)),
    ("http://[::1]/hook", ssrf(SsrfRejection.LOOPBACK_ADDRESS)),
    ("http://0x7f.2/hook", ssrf(SsrfRejection.LOOPBACK_ADDRESS)),
    ("https://user:pass@example.com/hook", ssrf(SsrfRejection.USERINFO)),
    ("ftp://example.com/hook", ssrf(SsrfRejection.SCHEME)),
    ("example.com/hook", ssrf(SsrfRejection.SCHEME)),
    ("http:///hook", ssrf(SsrfRejection.INVALID_URL)),
]


@pytest.mark.parametrize(("url", "said"), REFUSED_URLS)
def test_a_refused_url_is_explained_in_customer_terms_and_writes_nothing(
    app: Flask, sql_store: SqlOutboundWebhookStore, receiver: CapturingReceiver, url: str, said: str
) -> None:
    client, csrf = signed_in(app, TENANT)
    refused = post(client, "/endpoints/new", csrf, target_url=url, event_types=[EVENT_TYPE])
    assert refused.status_code == 422
    error = re.search(r'id="form-error" role="alert">([^<]*)<', text(refused))
    assert error is not None and (error.group(1) == said or error.group(1).startswith(NOT_A_URL))
    assert "HARVEST_" not in text(refused) and "SSRF" not in text(refused)
    assert sql_store.list_subscriptions() == []
    # The form keeps what was typed, to correct it.
    assert f'value="{url}"' in text(refused)
    # And an edit to it is refused the same way, changing nothing.
    made = post(client, "/endpoints/new", csrf, target_url=receiver.url("/h"), event_types=[EVENT_TYPE])
    assert made.status_code == 200
    endpoint = only_endpoint(sql_store)
    edited = post(client, f"/endpoints/{endpoint.id}/edit", csrf, target_url=url, event_types=[EVENT_TYPE])
    error = re.search(r'id="form-error" role="alert">([^<]*)<', text(edited))
    assert edited.status_code == 422 and error is not None and error.group(1) == said
    assert only_endpoint(sql_store) == endpoint


# -- CSRF -------------------------------------------------------------------------------------------


def seeded(client: FlaskClient, csrf: str, store: OutboundWebhookHandler, target: str) -> tuple[str, str]:
    """An endpoint of the signed-in tenant and a dead letter of it; their ids."""
    assert post(client, "/endpoints/new", csrf, target_url=target, event_types=["*"]).status_code == 200
    endpoint = only_endpoint(store)
    assert post(client, f"/endpoints/{endpoint.id}/test", csrf, event_type=EVENT_TYPE).status_code == 303
    return endpoint.id, deliveries_of(store)[0].id


def snapshot(store: OutboundWebhookHandler) -> Any:
    return (
        sorted(
            (s.id, s.target_url, s.description, s.status.value, s.secret) for s in store.list_subscriptions()
        ),
        sorted((d.id, d.state.value, d.attempt) for d in store.list_deliveries(limit=1000)),
    )


#: A form for each POST route that would change something with a valid token.
FORMS = {
    "target_url": "https://example.com/changed",
    "description": "changed",
    "event_types": EVENT_TYPE,
    "status": "disabled",
    "confirm": "yes",
    "event_type": EVENT_TYPE,
    "action": "replay",
}


@pytest.mark.parametrize("token", [None, "", "wrong-token-" + "x" * 32])
def test_a_post_without_the_sessions_token_is_refused_and_changes_nothing(
    app: Flask, sql_store: SqlOutboundWebhookStore, receiver: CapturingReceiver, token: str | None
) -> None:
    client, csrf = signed_in(app, TENANT)
    receiver.respond("/h", 500, times=10)
    endpoint_id, delivery_id = seeded(client, csrf, sql_store, receiver.url("/h"))
    drain(app, retries=True)
    ids = {"subscription_id": endpoint_id, "delivery_id": delivery_id}
    posts = [rule for method, rule, _ in portal_routes(app) if method == "POST"]
    assert len(posts) >= 8, posts
    before = snapshot(sql_store)
    for rule in posts:
        path = re.sub(r"<(?:[^:>]+:)?([^>]+)>", lambda m: ids[m.group(1)], rule)
        form = {**FORMS, "endpoint": endpoint_id, **window()}
        if token is not None:
            form["csrf_token"] = token
        answer = client.post(path, data=form)
        assert answer.status_code == 403, (rule, answer.status_code)
        assert "nothing was changed" in text(answer)
    # A cookie of another session's token does not pass either: the token is per session.
    _, other_csrf = signed_in(app, TENANT)
    assert other_csrf != csrf
    assert (
        client.post(
            f"{PREFIX}/endpoints/{endpoint_id}/status", data={**FORMS, "csrf_token": other_csrf}
        ).status_code
        == 403
    )
    assert snapshot(sql_store) == before


# -- headers, cookie, theme ---------------------------------------------------------------------------


def every_answer(
    app: Flask, client: FlaskClient, csrf: str, store: OutboundWebhookHandler, target: str
) -> list[TestResponse]:
    """One answer of each kind the portal gives: pages, redirects, errors, routing's own answers,
    stylesheets."""
    endpoint_id, delivery_id = seeded(client, csrf, store, target)
    pages = [
        "/", f"/endpoints/{endpoint_id}", f"/endpoints/{endpoint_id}/edit", f"/endpoints/{endpoint_id}/test",
        f"/endpoints/{endpoint_id}/rotate", f"/endpoints/{endpoint_id}/delete", "/endpoints/new",
        "/deliveries", f"/deliveries/{delivery_id}", "/replay", "/event-types", "/endpoints/nope",
        "/deliveries?state=nope", "/no-such-page", "/endpoints/a/b/c", "//deliveries", "/theme.css",
        "/static/dashboard.css",
    ]  # fmt: skip
    answers = [client.get(PREFIX + path) for path in pages]
    answers.append(client.delete(f"{PREFIX}/"))  # 405, answered by routing
    answers.append(post(client, f"/endpoints/{endpoint_id}/status", csrf, status="active"))
    answers.append(client.post(f"{PREFIX}/replay", data={}))  # CSRF refusal
    answers.append(app.test_client().get(f"{PREFIX}/"))  # no session
    answers.append(app.test_client().get(f"{PREFIX}/open?token=nope"))  # bad link
    answers.append(app.test_client().get(link(app, TENANT)))  # a good one
    for answer in answers:
        answer.close()
    return answers


def test_every_answer_carries_the_security_headers(
    app: Flask, sql_store: SqlOutboundWebhookStore, receiver: CapturingReceiver
) -> None:
    client, csrf = signed_in(app, TENANT)
    answers = every_answer(app, client, csrf, sql_store, receiver.url("/h"))
    assert {a.status_code for a in answers} >= {200, 303, 308, 401, 403, 404, 405, 422}
    for answer in answers:
        where = (answer.request.method, answer.request.path, answer.status_code)
        policy = answer.headers.get("Content-Security-Policy", "")
        assert policy.startswith("default-src 'none';"), where
        assert "frame-ancestors 'none'" in policy and "script-src" not in policy, where
        assert answer.headers.get("X-Frame-Options") == "DENY", where
        assert answer.headers.get("Referrer-Policy") == "no-referrer", where
        assert answer.headers.get("X-Content-Type-Options") == "nosniff", where
        if answer.request.path.startswith(f"{PREFIX}/static/"):
            assert answer.headers.get("Cache-Control") != "no-store", where
        elif not answer.request.path.endswith("/theme.css"):
            assert answer.headers.get("Cache-Control") == "no-store", where


def test_a_framable_portal_names_its_origins_and_no_x_frame_options(
    sql_store: SqlOutboundWebhookStore, receiver: CapturingReceiver
) -> None:
    app = portal_app(sql_store, HARVEST_PORTAL_FRAME_ANCESTORS="https://app.example.com, 'self'")
    client, csrf = signed_in(app, TENANT)
    for answer in every_answer(app, client, csrf, sql_store, receiver.url("/h")):
        where = (answer.request.path, answer.status_code)
        assert (
            "frame-ancestors https://app.example.com 'self';" in answer.headers["Content-Security-Policy"]
        ), where
        assert "X-Frame-Options" not in answer.headers, where
    # In another site's frame only a SameSite=None cookie is sent, and that needs HTTPS.
    secure = app.test_client().get(link(app, TENANT).replace("http://", "https://"))
    cookie = secure.headers["Set-Cookie"]
    assert "SameSite=None" in cookie and "Secure" in cookie and "HttpOnly" in cookie
    plain = app.test_client().get(link(app, TENANT)).headers["Set-Cookie"]
    assert "SameSite=Lax" in plain and "Secure" not in plain


def test_the_session_cookie_is_the_portals_alone(app: Flask) -> None:
    opened = app.test_client().get(link(app, TENANT))
    [cookie] = opened.headers.getlist("Set-Cookie")
    parts = [p.strip() for p in cookie.split(";")]
    assert parts[0].startswith("harvest_portal=")
    assert f"Path={PREFIX}/" in parts and "HttpOnly" in parts and "SameSite=Lax" in parts
    assert "Secure" not in parts and "Max-Age=3600" in parts
    # The link's token never travels on: not in the redirect, and pages send no referrer.
    assert "token" not in opened.headers["Location"]


def test_the_theme_and_the_logo(sql_store: SqlOutboundWebhookStore) -> None:
    app = portal_app(
        sql_store,
        HARVEST_PORTAL_ACCENT_COLOR="#1f6feb",
        HARVEST_PORTAL_LOGO_URL="https://cdn.example.com:8443/brand/logo.svg",
        HARVEST_PORTAL_NAME="Acme <Hooks>",
    )
    client, _ = signed_in(app, TENANT)
    theme = client.get(f"{PREFIX}/theme.css")
    assert theme.status_code == 200 and theme.mimetype == "text/css"
    assert text(theme) == ":root { --accent: #1f6feb; }\n"
    index = client.get(f"{PREFIX}/")
    policy = index.headers["Content-Security-Policy"]
    assert "img-src 'self' data: https://cdn.example.com:8443;" in policy
    body = text(index)
    assert '<img class="logo" src="https://cdn.example.com:8443/brand/logo.svg"' in body
    assert "Acme &lt;Hooks&gt;" in body and "<Hooks>" not in body
    assert f'href="{PREFIX}/theme.css"' in body
    plain = portal_app(sql_store)
    assert text(plain.test_client().get(f"{PREFIX}/theme.css")) == ""
    colours = portal_app(
        sql_store, HARVEST_PORTAL_BACKGROUND_COLOR="#fafafa", HARVEST_PORTAL_TEXT_COLOR="#111111"
    )
    assert (
        text(colours.test_client().get(f"{PREFIX}/theme.css")) == ":root { --bg: #fafafa; --fg: #111111; }\n"
    )


# -- no operator actions ------------------------------------------------------------------------------

#: What only the operator's console shows: its actions and options, and its address.
CONSOLE_ONLY = [
    'name="tenant"', 'name="headers"', 'name="ordering_policy"', 'name="payload_filter"',
    'name="rate_per_second"', 'name="rate_burst"', 'name="grace_seconds"', "/skip", "Skip",
    'href="/harvest', 'action="/harvest', "blocked-keys", "Blocked keys",
]  # fmt: skip


def test_no_portal_page_shows_an_operator_action(
    sql_store: SqlOutboundWebhookStore, receiver: CapturingReceiver
) -> None:
    app = portal_app(
        sql_store, HARVEST_DASHBOARD=True, HARVEST_ACTUATOR_TOKEN="portal-test-actuator-token-0123456789"
    )
    client, csrf = signed_in(app, TENANT)
    receiver.respond("/h", 500, times=10)
    created = post(client, "/endpoints/new", csrf, target_url=receiver.url("/h"), event_types=["*"])
    endpoint = only_endpoint(sql_store)
    post(client, f"/endpoints/{endpoint.id}/test", csrf, event_type=EVENT_TYPE)
    drain(app, retries=True)
    [dead] = deliveries_of(sql_store)
    assert dead.state is DeliveryState.DLQ
    answers = [created, post(client, f"/endpoints/{endpoint.id}/rotate", csrf, confirm="yes")]
    for path in get_pages(endpoint.id, dead.id):
        answers.append(client.get(PREFIX + path))
    answers.append(post(client, "/replay", csrf, action="count", **window()))
    assert all(a.status_code == 200 for a in answers), [(a.request.path, a.status_code) for a in answers]
    for answer in answers:
        body = text(answer)
        found = [word for word in CONSOLE_ONLY if word in body]
        assert not found, (answer.request.path, found)
        assert "<script" not in body.lower()
    # The console is there, at its own prefix: the check above is not vacuous.
    assert app.test_client().get("/harvest/sign-in").status_code == 200


def get_pages(endpoint_id: str, delivery_id: str) -> list[str]:
    """Every GET page of the portal, with one endpoint and one dead letter."""
    endpoint = f"/endpoints/{endpoint_id}"
    return [
        "/", endpoint, f"{endpoint}/edit", f"{endpoint}/test", f"{endpoint}/rotate", f"{endpoint}/delete",
        "/endpoints/new", "/deliveries", f"/deliveries/{delivery_id}", "/replay", "/event-types",
    ]  # fmt: skip


def test_the_window_form_keeps_what_was_counted(
    app: Flask, sql_store: SqlOutboundWebhookStore, receiver: CapturingReceiver
) -> None:
    """After a count, the form shows the same window and endpoint: its Replay button replays what
    was counted, not every endpoint's dead letters."""
    client, csrf = signed_in(app, TENANT)
    for path in ("/one", "/two"):
        assert (
            post(client, "/endpoints/new", csrf, target_url=receiver.url(path), event_types=["*"]).status_code
            == 200
        )
    first, second = sql_store.list_subscriptions(tenant=TENANT)
    chosen = window()
    counted = text(post(client, "/replay", csrf, action="count", endpoint=second.id, **chosen))
    assert f'<option value="{second.id}" selected>' in counted
    assert f'<option value="{first.id}">' in counted
    assert f'value="{chosen["since"]}"' in counted and f'value="{chosen["until"]}"' in counted
