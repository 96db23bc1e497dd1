"""Hostile input over every portal route (from the URL map): NUL, lone surrogates, very long and
odd unicode text in every path argument, query parameter, form field and the cookie; never a 5xx,
never a traceback, no markup of the input, and a refused request changes nothing."""

from __future__ import annotations

import uuid
from dataclasses import dataclass

import pytest
from flask import Flask
from flask.testing import FlaskClient
from hypothesis import event, given, settings
from hypothesis import strategies as st

from flask_harvest import OutboundWebhookHandler, get_engine
from flask_harvest.portal._session import COOKIE_NAME
from flask_harvest.testing import CapturingReceiver
from flask_harvest.webhooks.stores.sql import SqlOutboundWebhookStore

from .portal_support import (
    FIELDS,
    FORM,
    Seeded,
    encoded,
    fill,
    portal_app,
    portal_routes,
    seed_tenant,
    signed_in,
    tenant_rows,
    text,
)
from .properties import BUDGET, DATETIME_TEXTS, TEXT

HOSTILE = st.one_of(
    TEXT,
    DATETIME_TEXTS,
    st.text(min_size=1, max_size=40),
    # Past every field's limit (built by repetition: cheap to draw).
    st.builds(lambda char, times: char * times, st.characters(), st.sampled_from([2049, 5000])),
    st.sampled_from(
        [
            "<script>alert(1)</script>",
            "\"'><img src=x onerror=alert(1)>",
            "javascript:alert(1)",
            "http://169.254.169.254/",
            "https://example.com/\x00",
            "9" * 400,
            "-1",
            "nan",
            "../../etc/passwd",
            "%00",
            "%ud800",
            "\u202e",
            "*",
            "yes",
        ]
    ),
)


@dataclass
class Subject:
    app: Flask
    store: OutboundWebhookHandler
    rows: Seeded
    client: FlaskClient
    csrf: str


@pytest.fixture
def subject(
    sql_store: SqlOutboundWebhookStore, receiver: CapturingReceiver, redis_url: str, redis_conn: object
) -> Subject:
    seeding = portal_app(sql_store, HARVEST_WEBHOOKS_MAX_ATTEMPTS=2)
    rows = seed_tenant(seeding, receiver, f"acme-{uuid.uuid4().hex[:6]}")
    get_engine(seeding).close()
    # The RQ backend with no worker: a replay's or a test event's job waits in Redis, so no row
    # moves between an example's two snapshots unless the request moved it.
    app = portal_app(sql_store, HARVEST_JOBS_BACKEND="rq", HARVEST_REDIS_URL=redis_url)
    client, csrf = signed_in(app, rows.tenant)
    return Subject(app, sql_store, rows, client, csrf)


def request_of(
    subject: Subject, route: tuple[str, str, list[str]], data: st.DataObject
) -> tuple[str, str, list[tuple[str, str]], dict[str, str]]:
    """Draw a request to ``route``: hostile path arguments (or the tenant's ids), fields and, now
    and then, cookie."""
    rows = subject.rows
    method, rule, args = route
    ids = st.sampled_from([*rows.endpoint_ids, *rows.delivery_ids])
    path = fill(rule, {name: data.draw(st.one_of(ids, HOSTILE), label=name) for name in args})
    names = data.draw(st.lists(st.sampled_from(FIELDS), max_size=6), label="names")
    fields = [(name, data.draw(HOSTILE, label=name)) for name in names]
    if method == "POST" and data.draw(st.booleans(), label="with_csrf"):
        fields.append(("csrf_token", subject.csrf))
    headers: dict[str, str] = {}
    if data.draw(st.integers(0, 3), label="hostile_cookie") == 0:  # else the session's own
        cookie = data.draw(
            st.one_of(TEXT, st.builds(lambda char: char * 3000, st.characters())), label="cookie"
        )
        raw = cookie.encode("utf-8", "surrogatepass").decode("latin-1")  # the bytes a client sends
        headers["Cookie"] = f"{COOKIE_NAME}={raw.replace(chr(13), '').replace(chr(10), '')}"
    return method, path, fields, headers


# Each example is a request to each of the ~20 routes: 10 examples are 200 hostile requests.
@settings(BUDGET, max_examples=max(5, BUDGET.max_examples // 6))
@given(data=st.data())
def test_hostile_input_never_fails_and_a_refusal_changes_nothing(
    subject: Subject, data: st.DataObject
) -> None:
    """Each example sends a request to every route, in a drawn order."""
    before = tenant_rows(subject.store, subject.rows.tenant)
    for route in data.draw(st.permutations(portal_routes(subject.app)), label="routes"):
        method, path, fields, headers = request_of(subject, route, data)
        client = subject.client
        if method == "GET":
            answer = client.get(path, query_string=encoded(fields), headers=headers)
        else:
            answer = client.open(
                path, method=method, data=encoded(fields), content_type=FORM, headers=headers
            )
        body = text(answer)
        answer.close()
        event(f"{method} {answer.status_code}")
        assert answer.status_code < 500, (method, path, fields, body[:500])
        assert "Traceback" not in body
        assert "<script" not in body.lower() and "<img src=x" not in body
        after = tenant_rows(subject.store, subject.rows.tenant)
        if answer.status_code >= 400:
            assert after == before, (method, path, fields)
        before = after
        # Routing answers a path no route matches (an argument with "/") before any view or guard.
        routed = answer.status_code in (308, 404, 405) and 'id="error-message"' not in body
        if method == "POST" and not any(name == "csrf_token" for name, _ in fields):
            # 413: a body past the form limit, refused before the token is read.
            assert answer.status_code in (401, 403, 413) or routed, (path, answer.status_code)
        # Every answer, routing's own included, carries the portal's policy.
        assert answer.headers["Content-Security-Policy"].startswith("default-src 'none';")


#: Times at the ends of the calendar, with the widest offsets, and times that are not.
ODD_TIMES = [
    "9999-12-31T23:59:59-12:00",
    "0001-01-01T00:00:00+14:00",
    "0001-01-01T00:00",
    "9999-12-31T23:59",
    "2026-02-30T00:00",
    "2026-01-01T00:00:00+24:00",
    "1e400",
    "",
]


@pytest.mark.parametrize("when", ODD_TIMES)
def test_odd_times_in_a_filter_or_a_window_are_refused_or_listed(subject: Subject, when: str) -> None:
    for name in ("since", "until"):
        listed = subject.client.get("/portal/deliveries", query_string={name: when})
        assert listed.status_code in (200, 422), (name, when, text(listed)[:300])
        for action in ("count", "replay"):
            window = {"since": "2026-01-01T00:00", "until": "2026-01-02T00:00", name: when}
            before = tenant_rows(subject.store, subject.rows.tenant)
            replayed = subject.client.post(
                "/portal/replay", data={"csrf_token": subject.csrf, "action": action, **window}
            )
            assert replayed.status_code in (200, 422), (name, when, action, text(replayed)[:300])
            if replayed.status_code == 422 or action == "count":
                assert tenant_rows(subject.store, subject.rows.tenant) == before
