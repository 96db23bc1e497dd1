"""The portal's key property: a tenant signed in sees and changes its own rows only. Over every
portal route (found in the URL map, so a route added later is covered too), signed in as A, with
B's ids, B's cursor and hostile text in every path argument, query parameter and form field: no
answer shows anything of B, B's rows never change, and no answer is a 5xx. And A's answer for B's
id is the answer for an id that does not exist."""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone

import pytest
from flask import Flask
from flask.testing import FlaskClient
from hypothesis import event, given, settings
from hypothesis import strategies as st
from werkzeug.test import TestResponse

from flask_harvest import get_engine
from flask_harvest.testing import CapturingReceiver
from flask_harvest.webhooks.stores.sql import SqlOutboundWebhookStore

from .portal_support import (
    EVENT_TYPE,
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
from .properties import BUDGET, TEXT

#: What names one row: in a path, a query or a form.
ID_ARGS = {"subscription_id", "delivery_id", "endpoint_id", "endpoint"}


def now_local(hours: int) -> str:
    return (datetime.now(timezone.utc) + timedelta(hours=hours)).strftime("%Y-%m-%dT%H:%M")


#: Values a route acts on when they are A's own, so some requests succeed and change A's rows.
MEANINGFUL = [
    "yes", "active", "disabled", "count", "replay", "dlq", "delivered", "pending", EVENT_TYPE, "*",
    now_local(-2), now_local(2), "https://example.com/hook", "2", "saved",
]  # fmt: skip


#: A form each POST route acts on when its ids are A's.
COMPLETE = [
    ("confirm", "yes"), ("status", "disabled"), ("event_type", EVENT_TYPE), ("event_types", "*"),
    ("target_url", "https://example.com/hook"), ("since", now_local(-24)), ("until", now_local(24)),
]  # fmt: skip


@dataclass
class Subject:
    """Two tenants with rows, and a client signed in as A on an app that sends nothing, so a row
    moves only when a request moved it."""

    app: Flask
    store: SqlOutboundWebhookStore
    a: Seeded
    b: Seeded
    client: FlaskClient
    csrf: str


@pytest.fixture
def subject(
    sql_store: SqlOutboundWebhookStore, receiver: CapturingReceiver, redis_url: str, redis_conn: object
) -> Subject:
    seeding = portal_app(sql_store, HARVEST_WEBHOOKS_MAX_ATTEMPTS=2)
    tag = uuid.uuid4().hex[:6]
    a, b = seed_tenant(seeding, receiver, f"acme-{tag}"), seed_tenant(seeding, receiver, f"globex-{tag}")
    get_engine(seeding).close()
    # The RQ backend with no worker: a replay's or a test event's job waits in Redis, so no row
    # moves between an example's two snapshots unless the request moved it.
    app = portal_app(sql_store, HARVEST_JOBS_BACKEND="rq", HARVEST_REDIS_URL=redis_url)
    client, csrf = signed_in(app, a.tenant)
    return Subject(app, sql_store, a, b, client, csrf)


def request_of(
    subject: Subject, route: tuple[str, str, list[str]], data: st.DataObject
) -> tuple[str, str, list[tuple[str, str]]]:
    """Draw a request to ``route`` signed in as A: its path arguments, and query or form fields,
    from B's ids and cursor, A's ids, values a route acts on, and hostile text."""
    a, b = subject.a, subject.b
    values = st.one_of(
        st.sampled_from([*b.endpoint_ids, *b.delivery_ids, b.cursor]),
        st.sampled_from([*a.endpoint_ids, *a.delivery_ids, a.cursor]),
        st.sampled_from(MEANINGFUL),
        TEXT,
    )
    method, rule, args = route
    # In a path, mostly an id of the kind the route takes: B's (the point), or A's (so it acts).
    endpoints = "subscription_id" in args
    theirs = st.sampled_from(b.endpoint_ids if endpoints else b.delivery_ids)
    own = st.sampled_from(a.endpoint_ids if endpoints else a.delivery_ids)
    path = fill(rule, {name: data.draw(st.one_of(theirs, own, values), label=name) for name in args})
    names = data.draw(st.lists(st.sampled_from(FIELDS), max_size=6), label="names")
    fields = [(name, data.draw(values, label=name)) for name in names if name != "csrf_token"]
    if method == "POST" and data.draw(st.booleans(), label="complete"):
        # After the drawn fields (a form's first value counts): what each route needs to act.
        fields += [*COMPLETE, ("action", data.draw(st.sampled_from(["count", "replay"])))]
    # Mostly with the token, so that requests reach the routes (without, each is a 403 at once).
    if method == "POST" and data.draw(st.sampled_from([True, True, True, False]), label="with_csrf"):
        fields.append(("csrf_token", subject.csrf))
    return method, path, fields


def send(client: FlaskClient, method: str, path: str, fields: list[tuple[str, str]]) -> TestResponse:
    if method == "GET":
        answer = client.get(path, query_string=encoded(fields))
    else:
        answer = client.open(path, method=method, data=encoded(fields), content_type=FORM)
    answer.close()  # a stylesheet answer holds its file open
    return answer


def what_a_may_see(subject: Subject, path: str, fields: list[tuple[str, str]]) -> str:
    """Text a page may show although B has it too: what the request said (the page may echo it)
    and what A's own rows hold (A may have named B's id in its own description)."""
    rows = [
        " ".join([s.id, s.target_url, s.description, *s.event_topics])
        for s in subject.store.list_subscriptions(tenant=subject.a.tenant)
    ]
    said = [path, *(value for _, value in fields)]
    return "\n".join([*said, *rows])


def leaked(subject: Subject, answer: TestResponse, allowed: str) -> list[str]:
    shown = text(answer) + "\n" + "\n".join(f"{k}: {v}" for k, v in answer.headers.items())
    return [s for s in subject.b.private if s in shown and s not in allowed]


@settings(BUDGET, max_examples=max(5, BUDGET.max_examples // 4))
@given(data=st.data())
def test_a_tenant_never_sees_nor_changes_another_tenants_rows(subject: Subject, data: st.DataObject) -> None:
    """Each example sends a request to every route, in a drawn order: none is left to the luck of
    a draw."""
    before = tenant_rows(subject.store, subject.b.tenant)
    for route in data.draw(st.permutations(portal_routes(subject.app)), label="routes"):
        method, path, fields = request_of(subject, route, data)
        answer = send(subject.client, method, path, fields)
        event(f"{method} {answer.status_code}")  # --hypothesis-show-statistics: what was reached
        body = text(answer)
        assert answer.status_code < 500, (method, path, fields, body[:500])
        assert "Traceback" not in body
        assert not leaked(subject, answer, what_a_may_see(subject, path, fields)), (method, path, fields)
        assert tenant_rows(subject.store, subject.b.tenant) == before, (method, path, fields)


def test_the_property_covers_every_route_and_reaches_b(subject: Subject) -> None:
    """The property is not vacuous: it draws from every portal route, and B's rows are there to
    be leaked (an unscoped reader sees them)."""
    rules = {rule for _, rule, _ in portal_routes(subject.app)}
    assert len(rules) >= 14, rules
    assert {arg for _, _, args in portal_routes(subject.app) for arg in args} == {
        "subscription_id",
        "delivery_id",
        "filename",
    }
    b = subject.b
    assert len(b.dead_ids) == 2 and all(subject.store.get_delivery(i) for i in b.delivery_ids)
    # A's own pages show A's rows: the check of B's would catch a row of the wrong tenant.
    index = text(subject.client.get("/portal/"))
    assert all(i in index for i in subject.a.endpoint_ids) and not any(i in index for i in b.endpoint_ids)


def anonymised(answer: TestResponse, ids: list[str]) -> tuple[int, str]:
    body = text(answer)
    for value in ids:
        body = body.replace(value, "ID")
    return answer.status_code, body


def unknown_like(row_id: str) -> str:
    """An id of the same shape as ``row_id`` that no row has."""
    prefix, _, rest = row_id.partition("_")
    return f"{prefix}_{uuid.uuid4().hex[: len(rest)]}" if rest else uuid.uuid4().hex


def test_bs_id_answers_exactly_as_an_id_that_does_not_exist(subject: Subject) -> None:
    a, b, client, csrf = subject.a, subject.b, subject.client, subject.csrf
    before = tenant_rows(subject.store, b.tenant)
    compared = 0
    window = [("since", now_local(-24)), ("until", now_local(24))]
    form = [
        ("csrf_token", csrf), ("confirm", "yes"), ("status", "disabled"), ("event_type", EVENT_TYPE),
        ("target_url", "https://example.com/hook"), ("event_types", EVENT_TYPE), ("action", "count"),
    ]  # fmt: skip
    for method, rule, args in portal_routes(subject.app):
        if not set(args) & ID_ARGS:
            continue
        for b_id in b.endpoint_ids if "subscription_id" in args else b.delivery_ids:
            other = unknown_like(b_id)
            answers = [
                send(client, method, fill(rule, dict.fromkeys(args, value)), form if method == "POST" else [])
                for value in (b_id, other)
            ]
            assert anonymised(answers[0], [b_id]) == anonymised(answers[1], [other]), (method, rule)
            assert answers[0].status_code == 404, (method, rule, answers[0].status_code)
            compared += 1
    # And in a query or a form: the deliveries' filter, the window replay's endpoint.
    for b_id in b.endpoint_ids:
        other = unknown_like(b_id)
        for method, path, fields in (
            ("GET", "/portal/deliveries", [("endpoint_id", "ID")]),
            (
                "POST",
                "/portal/replay",
                [("csrf_token", csrf), ("action", "count"), ("endpoint", "ID"), *window],
            ),
            (
                "POST",
                "/portal/replay",
                [("csrf_token", csrf), ("action", "replay"), ("endpoint", "ID"), *window],
            ),
        ):
            answers = [
                send(client, method, path, [(k, value if v == "ID" else v) for k, v in fields])
                for value in (b_id, other)
            ]
            assert anonymised(answers[0], [b_id]) == anonymised(answers[1], [other]), (method, path)
            compared += 1
    assert compared >= 20
    assert tenant_rows(subject.store, b.tenant) == before
    # A's own ids do answer: the 404s above are B's rows kept out, not every id refused.
    assert client.get(f"/portal/endpoints/{a.endpoint_ids[0]}").status_code == 200
    assert client.get(f"/portal/deliveries/{a.dead_ids[0]}").status_code == 200


@settings(BUDGET, max_examples=max(10, BUDGET.max_examples // 3))
@given(data=st.data())
def test_bs_cursor_walks_as_own_rows_only(subject: Subject, data: st.DataObject) -> None:
    """A cursor taken from B's listing, with any filter, lists A's rows only."""
    query = [("cursor", subject.b.cursor)]
    state = data.draw(st.sampled_from(["", "dlq", "delivered"]), label="state")
    if state:
        query.append(("state", state))
    answer = subject.client.get("/portal/deliveries", query_string=encoded(query))
    assert answer.status_code == 200
    listed = set(re.findall(r'href="/portal/deliveries/([^"?]+)"', text(answer)))
    assert listed <= set(subject.a.delivery_ids)
    assert not leaked(subject, answer, what_a_may_see(subject, "/portal/deliveries", query))
