"""Property tests over every dashboard route (found in the URL map, so a page added later is
covered too): no 5xx and no traceback whatever the input; every page refused without sign-in;
every POST refused without the CSRF token; a refused request changes nothing."""

from __future__ import annotations

import dataclasses
import re
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any
from urllib.parse import quote

import pytest
from flask import Flask, url_for
from flask.testing import FlaskClient
from hypothesis import given
from hypothesis import strategies as st

from flask_harvest import OutboundWebhookHandler, WebhookSubscription, generate_secret, get_engine
from flask_harvest.dashboard._core import link_maker
from flask_harvest.dashboard.webhooks import delivery_rows
from flask_harvest.dashboard.when import when_html
from flask_harvest.testing import CapturingReceiver
from flask_harvest.triggers.conditions import Eq
from flask_harvest.triggers.definitions import CompletionTrigger
from flask_harvest.webhooks.models import DeliveryState, DeliverySummary

from .dashboard_client import PREFIX, dashboard_app, signed_in
from .properties import BUDGET, TEXT
from .test_actuator import dead_letters
from .test_dashboard_workflows import SCRIPT, workflow_dashboard_app
from .workflow_app import TOKEN as WORKFLOW_TOKEN
from .workflow_app import database_url_fixture, executions

__all__ = ["database_url_fixture"]

SECRET = generate_secret()
#: Endpoints that answer without sign-in, on purpose.
OPEN = {"harvest_dashboard.sign_in", "harvest_dashboard.static"}
FIELDS = [
    "status", "topic", "cursor", "state", "subscription_id", "since", "until", "grace_seconds",
    "action", "limit", "token", "next", "q", "page", "trail",
    "delivery_id", "shown", "target_url", "topics", "description", "confirm",
]  # fmt: skip
WORKFLOW_FIELDS = [
    "name", "state", "cursor", "reason", "confirm", "done", "id", "source_workflow_name",
    "target_workflow_name", "terminal_states", "input_mapping", "condition", "from_step", "mode", "q",
    "page", "trail", "delivery_id", "shown", "input", "workflow_id", "policy",
]  # fmt: skip
#: Values that mean something to some route, mixed with hostile text.
VALUES = st.one_of(
    TEXT,
    st.sampled_from(
        ["sub_1", "active", "disabled", "dlq", "dry-run", "replay", "5", "0", "-1", "nan", "2026-12-01T12:00"]
    ),
    st.sampled_from(
        [
            "<script>alert(1)</script>",
            "yes",
            "echo",
            "Completed",
            "Terminated",
            '{"type": "Passthrough"}',
            '{"type": "Eq", "data": {"path": "n", "value": "<script>"}}',
            '{"type": "Eq", "data": {"path": "\\ud800", "value": 1}}',
            '{"type": "Nope"}',
            "{",
        ]
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
    path_values = st.one_of(TEXT, st.just("sub_1"))
    refused_without_sign_in(app, dashboard_routes(app), lambda: snapshot(store), path_values, FIELDS, data)


@BUDGET
@given(data=st.data())
def test_no_route_fails_and_refusals_change_nothing(
    app: Flask, store: OutboundWebhookHandler, data: st.DataObject
) -> None:
    client = app.test_client()
    csrf = signed_in(client)
    routes = dashboard_routes(app, include_open=True)
    path_values = st.one_of(TEXT, st.sampled_from(["sub_1", "msg_sub_1_000"]))
    body = never_fails(client, csrf, routes, lambda: snapshot(store), path_values, FIELDS, data)
    assert SECRET not in body


Snapshot = Callable[[], Any]


def refused_without_sign_in(
    app: Flask,
    routes: list[tuple[str, str, list[str]]],
    state: Snapshot,
    path_values: st.SearchStrategy[str],
    fields: list[str],
    data: st.DataObject,
) -> None:
    """A request to one of ``routes`` without sign-in is refused (or sent to sign in) and changes
    nothing that ``state()`` reads."""
    method, rule, args = data.draw(st.sampled_from(routes))
    path = {name: data.draw(path_values, label=name) for name in args}
    form = data.draw(st.dictionaries(st.sampled_from(fields), VALUES, max_size=4), label="form")
    client = app.test_client()
    before = state()
    if method != "GET":
        # Even with a valid CSRF token of an anonymous session, nothing opens.
        client.get(f"{PREFIX}/sign-in")
        page = client.get(f"{PREFIX}/sign-in").get_data(as_text=True)
        form["csrf_token"] = re.search(r'name="csrf_token" value="([^"]+)"', page).group(1)  # type: ignore[union-attr]
    if method != "GET":
        response = client.open(fill(rule, path), method=method, data=encoded(form), content_type=FORM)
    else:
        response = client.get(fill(rule, path), query_string=encoded(form))
    # 308: werkzeug's routing merged a doubled slash (``%2F`` in a path id) before any page ran;
    # werkzeug 2.3 (the lowest allowed) instead matches the merged path to a route without this
    # method (405) or to none (404 for ``/harvest///``), also before any page ran.
    routed = (308, 404, 405) if "//" in response.request.path else ()
    refusals = (303, 308, 401, 403, *routed)
    assert response.status_code in refusals, (method, rule, response.status_code)
    if response.status_code == 303:
        assert response.headers["Location"].startswith(f"{PREFIX}/sign-in")
    if response.status_code in (308, 404, 405):
        assert "Sign in" not in response.get_data(as_text=True) and "<table" not in response.get_data(
            as_text=True
        )
    assert state() == before


def never_fails(
    client: FlaskClient,
    csrf: str,
    routes: list[tuple[str, str, list[str]]],
    state: Snapshot,
    path_values: st.SearchStrategy[str],
    fields: list[str],
    data: st.DataObject,
) -> str:
    """A signed-in request to one of ``routes`` with drawn fields never fails (no 5xx, no
    traceback, no script on the page); a refusal changes nothing ``state()`` reads. Returns the body."""
    method, rule, args = data.draw(st.sampled_from(routes))
    path = {name: data.draw(path_values, label=name) for name in args}
    drawn = data.draw(st.dictionaries(st.sampled_from(fields), VALUES, max_size=5), label="fields")
    with_csrf = data.draw(st.booleans(), label="with_csrf")
    before = state()
    if method != "GET":
        form = {**drawn, **({"csrf_token": csrf} if with_csrf else {})}
        response = client.open(fill(rule, path), method=method, data=encoded(form), content_type=FORM)
    else:
        response = client.get(fill(rule, path), query_string=encoded(drawn))
    body = response.get_data(as_text=True)
    response.close()  # a stylesheet answer holds its file open
    assert response.status_code < 500, (method, rule, drawn, body[:500])
    assert "Traceback" not in body
    # No page has a script of its own: one in the body would be input rendered as markup.
    assert "<script" not in body.lower()
    # Routing answers a doubled slash before any page: a 308 to the merged path, or on werkzeug 2.3
    # a 405 when the merged path does not take the method (DELETE /harvest//) or a 404 when no
    # route matches it (/harvest///); none of them runs a dashboard view, but each carries the
    # dashboard's security headers.
    routed = response.status_code in (308, 404, 405) and "//" in response.request.path
    assert response.headers["Content-Security-Policy"].startswith("default-src 'none'")
    if method != "GET" and not with_csrf and not routed:
        assert response.status_code == 403
    if response.status_code >= 400:
        assert state() == before
    return body


# -- the workflow and trigger pages ----------------------------------------------------------------


@dataclass
class WorkflowSubject:
    """A workflow app with executions in several states, a failed completion delivery, trigger
    fires and skips, and ``<script>`` in inputs, ids and names; RQ with no worker, so nothing
    moves between an example's two snapshots unless a request moved it."""

    app: Flask
    ids: list[str]

    def snapshot(self) -> Any:
        with self.app.app_context():
            engine = get_engine()
            assert engine.workflows is not None and engine.callbacks is not None and engine.triggers
            runs = executions(self.app)
            return (
                sorted((e.execution_id, e.state.value, e.cancel_requested, e.cancel_reason) for e in runs),
                sorted(
                    (d.delivery_id, d.state.value, d.attempts)
                    for e in runs
                    for d in engine.callbacks.deliveries(e.execution_id)
                ),
                sorted(dataclasses.astuple(t) for t in engine.triggers.list_triggers()),
                sorted(dataclasses.astuple(f) for f in engine.triggers.fires(limit=500)),
            )


@pytest.fixture
def workflow_subject(
    database_url: str, redis_url: str, redis_conn: object, receiver: CapturingReceiver
) -> WorkflowSubject:
    app = workflow_dashboard_app(database_url, HARVEST_JOBS_BACKEND="rq", HARVEST_REDIS_URL=redis_url)
    receiver.respond("/done", 500, "no", times=1)
    with app.app_context():
        engine = get_engine()
        service, callbacks, triggers = engine.workflows, engine.callbacks, engine.triggers
        assert service is not None and callbacks is not None and triggers is not None
        triggers.register(CompletionTrigger("echo", "three_steps", terminal_states=["Terminated"]))
        triggers.register(
            CompletionTrigger("echo", "echo", terminal_states=["Terminated"], condition=Eq("n", 1))
        )
        triggers.register(
            CompletionTrigger(SCRIPT, "echo", id=str(uuid.uuid4())), allow_unknown_workflows=True
        )
        pending, _ = service.start("echo", {"note": SCRIPT}, workflow_id=SCRIPT)
        ended, _ = service.start("echo", {"n": 2}, completion_callbacks=[{"url": receiver.url("/done")}])
        service.terminate(ended.execution_id, SCRIPT)
        [delivery] = callbacks.deliveries(ended.execution_id)
        callbacks.run_many([delivery.delivery_id])  # the receiver answers 500: one attempt, FAILED
        assert callbacks.deliveries(ended.execution_id)[0].wire_state == "FAILED"
        ids = [pending.execution_id, ended.execution_id, delivery.delivery_id]
        ids += [t.id for t in triggers.list_triggers()]
    return WorkflowSubject(app, ids)


def workflow_routes(app: Flask) -> list[tuple[str, str, list[str]]]:
    routes = [r for r in dashboard_routes(app) if "/workflows" in r[1] or "/triggers" in r[1]]
    assert len(routes) >= 10, routes
    return routes


@BUDGET
@given(data=st.data())
def test_workflow_pages_are_refused_without_sign_in(
    workflow_subject: WorkflowSubject, data: st.DataObject
) -> None:
    subject = workflow_subject
    path_values = st.one_of(TEXT, st.sampled_from(subject.ids))
    routes = workflow_routes(subject.app)
    refused_without_sign_in(subject.app, routes, subject.snapshot, path_values, WORKFLOW_FIELDS, data)


@BUDGET
@given(data=st.data())
def test_no_workflow_page_fails_and_refusals_change_nothing(
    workflow_subject: WorkflowSubject, data: st.DataObject
) -> None:
    subject = workflow_subject
    client = subject.app.test_client()
    csrf = signed_in(client, WORKFLOW_TOKEN)
    path_values = st.one_of(TEXT, st.sampled_from(subject.ids))
    routes = workflow_routes(subject.app)
    never_fails(client, csrf, routes, subject.snapshot, path_values, WORKFLOW_FIELDS, data)


@BUDGET
@given(
    value=st.one_of(
        st.text(st.characters(exclude_categories=["Cs"]), min_size=1),
        st.sampled_from(
            ["sub_1", "a/b", "a b", "x?y#z", "100%", "<script>", "é", "&amp;", "HarvestDashboardLinkMark"]
        ),
    ),
    stamp=st.datetimes(min_value=datetime(2000, 1, 1), timezones=st.just(timezone.utc)),
    status=st.one_of(st.none(), st.integers(100, 599)),
    error=st.one_of(st.none(), st.just(""), TEXT),
)
def test_delivery_rows_show_what_url_for_and_the_macros_show(
    app: Flask, value: str, stamp: datetime, status: int | None, error: str | None
) -> None:
    """The deliveries list's rows (links from one url_for for the whole list, texts built in
    Python) are exactly url_for's links and the state macro's and harvest_when filter's texts, for
    any id."""
    summary = DeliverySummary(value, value, "a.b", DeliveryState.DLQ, 2, 5, status, error, stamp)
    with app.test_request_context(f"{PREFIX}/webhooks/deliveries"):
        now = datetime(2026, 12, 3, 10, 0, tzinfo=timezone.utc)
        [row] = delivery_rows(
            [summary],
            link_maker("harvest_dashboard.delivery", "delivery_id"),
            link_maker("harvest_dashboard.subscription", "subscription_id"),
            now,
        )
        expected_time = str(when_html(stamp, now))
        assert row.link == url_for("harvest_dashboard.delivery", delivery_id=value)
        assert row.subscription_link == url_for("harvest_dashboard.subscription", subscription_id=value)
    assert (row.id, row.subscription_id, row.topic, row.state) == (value, value, "a.b", "dlq")
    assert (row.attempt, row.response_status, row.last_error) == ("2/5", str(status or ""), error or "")
    shown = f'<time datetime="{row.iso_time}" title="{row.title}">{row.time}</time>'
    assert shown == expected_time
