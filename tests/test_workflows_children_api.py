"""Child runs through the app: ``GET /workflows/<id>/children``, the execution JSON, the CLI, the
dashboard, and completion callbacks and triggers of runs the parent-close cascade ended."""

from __future__ import annotations

import json
import urllib.parse
import uuid
from typing import Any

import pytest
import redis
import sqlalchemy as sa
from flask import Flask
from flask.testing import FlaskClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from werkzeug.test import TestResponse

from flask_harvest import get_engine, workflow_service
from flask_harvest.testing import CapturingReceiver
from flask_harvest.triggers.definitions import CompletionTrigger
from flask_harvest.workflows import ExecutionState, ParentClosePolicy
from flask_harvest.workflows._children import ChildStart

from .children_app import make_children_app
from .dashboard_client import PREFIX as DASHBOARD
from .dashboard_client import SECRET_KEY, signed_in, text
from .workflow_app import AUTH, PREFIX, TOKEN, database_url_fixture, wait_for

__all__ = ["database_url_fixture"]

S = ExecutionState


@pytest.fixture
def app(database_url: str) -> Flask:
    return make_children_app(database_url, HARVEST_DASHBOARD=True, SECRET_KEY=SECRET_KEY)


def call(client: FlaskClient, path: str, **kw: Any) -> TestResponse:
    return client.get(PREFIX + path, headers=AUTH, **kw)


def finished_family(app: Flask, count: int = 3) -> str:
    client = app.test_client()
    response = client.post(f"{PREFIX}/workflows/family/start", json={"input": {"count": count}}, headers=AUTH)
    assert response.status_code == 201
    execution_id: str = response.get_json()["execution_id"]
    done = call(client, f"/workflows/{execution_id}/result?wait=20")
    assert done.status_code == 200, done.get_json()
    assert done.get_json()["result"] == list(range(count))
    return execution_id


def test_children_are_listed_paged_and_show_their_parent(app: Flask) -> None:
    """GET /workflows/<id>/children pages like the list; a child's JSON names its parent."""
    client = app.test_client()
    parent_id = finished_family(app)
    first = call(client, f"/workflows/{parent_id}/children?limit=2")
    assert first.status_code == 200
    body = first.get_json()
    assert body["execution_id"] == parent_id and len(body["children"]) == 2
    assert first.headers["X-Next-Cursor"] == body["next_cursor"]
    rest = call(client, f"/workflows/{parent_id}/children?limit=2&cursor={body['next_cursor']}").get_json()
    assert len(rest["children"]) == 1 and rest["next_cursor"] is None
    kids = body["children"] + rest["children"]
    assert sorted(k["workflow_id"] for k in kids) == [f"{parent_id}:{n}" for n in range(3)]
    assert {(k["parent_execution_id"], k["parent_close_policy"]) for k in kids} == {(parent_id, "Terminate")}
    shown = call(client, f"/workflows/{kids[0]['execution_id']}").get_json()
    assert shown["parent_execution_id"] == parent_id and shown["parent_close_policy"] == "Terminate"
    top = call(client, f"/workflows/{parent_id}").get_json()
    assert top["parent_execution_id"] is None and top["parent_close_policy"] is None
    assert call(client, f"/workflows/{kids[0]['execution_id']}/children").get_json()["children"] == []


@pytest.mark.parametrize(
    ("query", "status"), [("limit=0", 422), ("limit=x", 422), ("limit=501", 422), ("cursor=nope", 422)]
)
def test_a_bad_children_query_is_422_and_an_unknown_execution_404(
    app: Flask, query: str, status: int
) -> None:
    client = app.test_client()
    parent_id = finished_family(app, count=1)
    response = call(client, f"/workflows/{parent_id}/children?{query}")
    assert response.status_code == status and response.get_json()["error"]["message"]
    missing = call(client, "/workflows/00000000-0000-0000-0000-000000000000/children")
    assert missing.status_code == 404 and missing.get_json()["error"]["message"]


def test_the_children_route_is_closed_like_the_actuator(app: Flask) -> None:
    """The new route is behind the admin API's access rules."""
    client = app.test_client()
    response = client.get(f"{PREFIX}/workflows/x/children")
    assert response.status_code == 401 and response.get_json()["error"]["code"] == "unauthorized"
    wrong = client.get(f"{PREFIX}/workflows/x/children", headers={"Authorization": "Bearer nope"})
    assert wrong.status_code == 401


def test_the_cli_lists_a_runs_children(app: Flask) -> None:
    parent_id = finished_family(app)
    runner = app.test_cli_runner()
    shown = runner.invoke(args=["harvest", "workflows", "children", parent_id])
    assert shown.exit_code == 0, shown.output
    assert shown.output.count("child_echo") == 3 and f"{parent_id}:2" in shown.output
    as_json = runner.invoke(args=["harvest", "workflows", "children", parent_id, "--json", "--limit", "2"])
    data = json.loads(as_json.output)
    assert len(data["children"]) == 2 and data["next_cursor"]
    more = runner.invoke(
        args=["harvest", "workflows", "children", parent_id, "--cursor", data["next_cursor"]]
    )
    assert more.output.count("child_echo") == 1
    missing = runner.invoke(args=["harvest", "workflows", "children", "nope"])
    assert missing.exit_code == 1 and "Error:" in missing.output
    show = runner.invoke(args=["harvest", "workflows", "show", data["children"][0]["execution_id"]])
    assert "parent_execution_id" in show.output and parent_id in show.output


def test_the_dashboard_links_a_parent_and_its_children(app: Flask) -> None:
    parent_id = finished_family(app)
    client = app.test_client()
    signed_in(client, TOKEN)
    page = text(client.get(f"{DASHBOARD}/workflows/{parent_id}"))
    with app.app_context():
        kids, _ = workflow_service().children(parent_id)
    for kid in kids:
        assert f'href="{DASHBOARD}/workflows/{kid.execution_id}"' in page
    assert 'id="parent-link"' not in page
    child_page = text(client.get(f"{DASHBOARD}/workflows/{kids[0].execution_id}"))
    assert f'href="{DASHBOARD}/workflows/{parent_id}"' in child_page and 'id="parent-link"' in child_page
    assert "This run started no child run." in child_page


def test_re_evaluating_callbacks_and_triggers_of_cascaded_runs_is_a_no_op(
    database_url: str, harvest_receiver: CapturingReceiver
) -> None:
    """Re-entry, e.g. the parent-close cascade re-evaluating triggers, is a no-op: one delivery row
    per target and one fires row per trigger, however often a run's terminal hooks run."""
    app = make_children_app(
        database_url,
        triggers=[CompletionTrigger("child_slow", "child_echo", terminal_states=["Terminated"])],
        HARVEST_COMPLETION_CALLBACK_DEFAULTS=json.dumps(
            [{"url": harvest_receiver.url("/done"), "filter": {"type": "AnyTerminal"}}]
        ),
        HARVEST_COMPLETION_CALLBACK_ALLOWLIST="127.0.0.1",
        HARVEST_COMPLETION_CALLBACK_ALLOW_PRIVATE_TARGETS=True,
        HARVEST_COMPLETION_CALLBACK_ALLOW_HTTP=True,
        HARVEST_COMPLETION_CALLBACK_SECRET="cb-secret-children-0123456789",
    )
    client = app.test_client()
    started = client.post(
        f"{PREFIX}/workflows/family/start",
        json={"input": {"count": 2, "child": "child_slow", "wait": False}},
        headers=AUTH,
    ).get_json()
    parent_id = started["execution_id"]
    with app.app_context():
        service = workflow_service()
        wait_for(app, parent_id, lambda state, steps: state is S.PENDING and steps == 3)
        kids, _ = service.children(parent_id)
        for kid in kids:
            wait_for(app, kid.execution_id, lambda state, steps: state is S.PENDING and steps == 1)
    engine = get_engine(app)
    assert engine.callbacks is not None and engine.triggers is not None
    # A child gets no completion callbacks of its own (it inherits nothing): give these the
    # app's defaults by hand, so that the cascade's ends enqueue deliveries too.
    with app.app_context():
        stored = engine.callbacks.prepare(None)
        with service.store.engine.begin() as conn:
            conn.execute(
                sa.text(
                    "UPDATE harvest_workflow_executions SET completion_callbacks = :c"
                    " WHERE parent_execution_id = :p"
                ),
                {"c": json.dumps(stored), "p": parent_id},
            )
    terminated = client.post(f"{PREFIX}/workflows/{parent_id}/terminate", json={}, headers=AUTH)
    assert terminated.get_json()["state"] == "Terminated"

    def ledger() -> Any:
        with app.app_context():
            ids = [parent_id, *(k.execution_id for k in kids)]
            return (
                {i: len(engine.callbacks.deliveries(i)) for i in ids},  # type: ignore[union-attr]
                {i: len(engine.triggers.fires(source_exec_id=i)) for i in ids},  # type: ignore[union-attr]
                len(workflow_service().list_executions(name="child_echo", limit=500)[0]),
            )

    before = ledger()
    assert before[0] == {i: 1 for i in before[0]} and before[2] == 2
    assert {before[1][k.execution_id] for k in kids} == {1}
    with app.app_context():
        store = service.store
        for execution_id in [parent_id, *(k.execution_id for k in kids)]:
            ended = store.get(execution_id)
            assert ended is not None and ended.state is S.TERMINATED
            with store.engine.begin() as conn:
                store.hooks.run(conn, ended)
    assert ledger() == before


# -- hostile input ---------------------------------------------------------------------------------

QUERY_KEYS = ["cursor", "limit", "x"]
QUERY_VALUES = st.text(max_size=30) | st.sampled_from(["5", "-1", "0", "501", "1e999", "nan", ""])
QUERIES = st.dictionaries(st.sampled_from(QUERY_KEYS), QUERY_VALUES, max_size=3)
IDS = st.sampled_from(["@parent", "@child", "nope"]) | st.text(max_size=40)
METHODS = st.sampled_from(["GET", "POST", "PUT", "DELETE", "PATCH", "HEAD"])


@pytest.fixture
def rq_app(database_url: str, redis_url: str, redis_conn: redis.Redis) -> Flask:
    """An app whose runs are queued on Redis and never run: only requests change rows."""
    return make_children_app(database_url, HARVEST_JOBS_BACKEND="rq", HARVEST_REDIS_URL=redis_url)


def _snapshot(app: Flask) -> Any:
    with app.app_context():
        engine = workflow_service().store.engine
    with engine.connect() as conn:
        return conn.execute(sa.text("SELECT * FROM harvest_workflow_executions ORDER BY execution_id")).all()


def _family(app: Flask) -> dict[str, str]:
    """A parent with a child, made by hand (no worker runs on this app)."""
    with app.app_context():
        store = workflow_service().store
        found = store.get_by_workflow_id("hostile-parent")
        if found is None:
            found, _ = workflow_service().runner.start("family", {"count": 1}, workflow_id="hostile-parent")
            claimed = store.claim(found.execution_id, now=workflow_service().runner.clock(), lease_seconds=30)
            assert claimed is not None and claimed.lease_token is not None
            start = ChildStart(
                0, str(uuid.uuid4()), "child_echo", "0", "hostile-child", ParentClosePolicy.TERMINATE, None
            )
            store.record_children(
                found.execution_id, claimed.lease_token, [start], now=workflow_service().runner.clock()
            )
        child = store.get_by_workflow_id("hostile-child")
        assert child is not None
    return {"@parent": found.execution_id, "@child": child.execution_id}


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(method=METHODS, ident=IDS, query=QUERIES, body=st.none() | st.binary(max_size=30))
def test_hostile_requests_to_the_children_route_never_get_a_5xx_nor_change_anything(
    rq_app: Flask, method: str, ident: str, query: dict[str, str], body: bytes | None
) -> None:
    """Any method, id, query and body on /workflows/<id>/children: never a 5xx, JSON errors, and
    nothing changed."""
    client = rq_app.test_client()
    fixed = _family(rq_app)
    segment = urllib.parse.quote(fixed.get(ident, ident), safe="")
    path = f"{PREFIX}/workflows/{segment}/children" + ("?" + urllib.parse.urlencode(query) if query else "")
    before = _snapshot(rq_app)
    kwargs: dict[str, Any] = {"headers": AUTH}
    if body is not None:
        kwargs.update(data=body, content_type="application/json")
    response = client.open(path, method=method, **kwargs)
    assert response.status_code < 500, response.get_data(as_text=True)
    if response.status_code >= 400 and method != "HEAD":
        assert response.is_json and response.get_json()["error"]["message"]
    if response.status_code == 200 and method == "GET":
        assert all(
            c["parent_execution_id"] == fixed.get(ident, ident) for c in response.get_json()["children"]
        )
    assert _snapshot(rq_app) == before
