"""Property tests over every dashboard route (found in the URL map, so a page added later is
covered too): no 5xx and no traceback whatever the input; every page refused without sign-in;
every POST refused without the CSRF token; a refused request changes nothing."""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import quote

import pytest
from flask import Flask
from hypothesis import given
from hypothesis import strategies as st

from flask_harvest import OutboundWebhookHandler, WebhookSubscription, generate_secret

from .dashboard_client import PREFIX, dashboard_app, signed_in
from .properties import BUDGET, TEXT
from .test_actuator import dead_letters

SECRET = generate_secret()
#: Endpoints that answer without sign-in, on purpose.
OPEN = {"harvest_dashboard.sign_in", "harvest_dashboard.static"}
FIELDS = [
    "status", "topic", "cursor", "state", "subscription_id", "since", "until", "grace_seconds",
    "action", "limit", "token", "next",
]  # fmt: skip
#: Values that mean something to some route, mixed with hostile text.
VALUES = st.one_of(
    TEXT,
    st.sampled_from(
        ["sub_1", "active", "disabled", "dlq", "dry-run", "replay", "5", "0", "-1", "nan", "2026-12-01T12:00"]
    ),
)


def dashboard_routes(app: Flask, *, include_open: bool = False) -> list[tuple[str, str, list[str]]]:
    """Every (method, rule, path variables) of the dashboard, from the app's URL map; the sign-in
    form and the stylesheet only with ``include_open``."""
    found = []
    for rule in app.url_map.iter_rules():
        if not rule.endpoint.startswith("harvest_dashboard."):
            continue
        if rule.endpoint in OPEN and not include_open:
            continue
        for method in sorted((rule.methods or set()) - {"HEAD", "OPTIONS"}):
            found.append((method, rule.rule, sorted(rule.arguments)))
    return found


def fill(rule: str, values: dict[str, str]) -> str:
    """The rule with each ``<converter:name>`` replaced by a quoted value."""

    def one(match: re.Match[str]) -> str:
        name = match.group(1).split(":")[-1]
        return quote(values.get(name, "x").encode("utf-8", "surrogatepass"), safe="") or "x"

    return re.sub(r"<([^>]+)>", one, rule)


def encoded(fields: dict[str, str]) -> str:
    """Form or query text of ``fields``, with lone surrogates sent as the bytes a client would send."""
    return "&".join(
        f"{quote(k)}={quote(v.encode('utf-8', 'surrogatepass'), safe='')}" for k, v in fields.items()
    )


FORM = "application/x-www-form-urlencoded"


def snapshot(store: OutboundWebhookHandler) -> Any:
    subscriptions = sorted((s.to_dict()["id"], s.status.value, s.secret) for s in store.list_subscriptions())
    deliveries = sorted((d.id, d.state.value, d.attempt) for d in store.list_deliveries(limit=1000))
    return subscriptions, deliveries


@pytest.fixture
def app(store: OutboundWebhookHandler, redis_url: str, redis_conn: object) -> Flask:
    store.add_subscription(WebhookSubscription("http://127.0.0.1:9/none", ["a.b"], SECRET, id="sub_1"))
    dead_letters(store, 2)
    # The RQ backend with no worker: a replay's job waits in Redis, so no attempt changes a row
    # between an example's two snapshots.
    return dashboard_app(store, HARVEST_JOBS_BACKEND="rq", HARVEST_REDIS_URL=redis_url)


def test_the_routes_are_found(app: Flask) -> None:
    found = {(method, rule) for method, rule, _ in dashboard_routes(app)}
    assert ("POST", f"{PREFIX}/webhooks/deliveries/<delivery_id>/replay") in found
    assert ("GET", f"{PREFIX}/") in found
    assert len(found) >= 10


@BUDGET
@given(data=st.data())
def test_every_route_is_refused_without_sign_in(
    app: Flask, store: OutboundWebhookHandler, data: st.DataObject
) -> None:
    method, rule, args = data.draw(st.sampled_from(dashboard_routes(app)))
    path_values = {name: data.draw(st.one_of(TEXT, st.just("sub_1")), label=name) for name in args}
    form = data.draw(st.dictionaries(st.sampled_from(FIELDS), VALUES, max_size=4), label="form")
    client = app.test_client()
    before = snapshot(store)
    if method != "GET":
        # Even with a valid CSRF token of an anonymous session, nothing opens.
        client.get(f"{PREFIX}/sign-in")
        page = client.get(f"{PREFIX}/sign-in").get_data(as_text=True)
        form["csrf_token"] = re.search(r'name="csrf_token" value="([^"]+)"', page).group(1)  # type: ignore[union-attr]
    if method != "GET":
        response = client.open(fill(rule, path_values), method=method, data=encoded(form), content_type=FORM)
    else:
        response = client.get(fill(rule, path_values), query_string=encoded(form))
    # 308: werkzeug's routing merged a doubled slash (``%2F`` in a path id) before any page ran.
    assert response.status_code in (303, 308, 401, 403), (method, rule, response.status_code)
    if response.status_code == 303:
        assert response.headers["Location"].startswith(f"{PREFIX}/sign-in")
    if response.status_code == 308:
        assert "Sign in" not in response.get_data(as_text=True) and "<table" not in response.get_data(
            as_text=True
        )
    assert snapshot(store) == before


@BUDGET
@given(data=st.data())
def test_no_route_fails_and_refusals_change_nothing(
    app: Flask, store: OutboundWebhookHandler, data: st.DataObject
) -> None:
    client = app.test_client()
    csrf = signed_in(client)
    method, rule, args = data.draw(st.sampled_from(dashboard_routes(app, include_open=True)))
    path_values = {
        name: data.draw(st.one_of(TEXT, st.sampled_from(["sub_1", "msg_sub_1_000"])), label=name)
        for name in args
    }
    fields = data.draw(st.dictionaries(st.sampled_from(FIELDS), VALUES, max_size=5), label="fields")
    with_csrf = data.draw(st.booleans(), label="with_csrf")
    before = snapshot(store)
    if method != "GET":
        form = {**fields, **({"csrf_token": csrf} if with_csrf else {})}
        response = client.open(fill(rule, path_values), method=method, data=encoded(form), content_type=FORM)
    else:
        response = client.get(fill(rule, path_values), query_string=encoded(fields))
    body = response.get_data(as_text=True)
    response.close()  # a stylesheet answer holds its file open
    assert response.status_code < 500, (method, rule, fields, body[:500])
    assert "Traceback" not in body
    if response.status_code != 308:  # werkzeug's slash-merging redirect comes before any page
        assert response.headers["Content-Security-Policy"].startswith("default-src 'none'")
    if method != "GET" and not with_csrf and response.status_code != 308:
        assert response.status_code == 403
    if response.status_code >= 400:
        assert snapshot(store) == before
    assert SECRET not in body
