"""The workflow HTTP API through Flask's test client, on SQLite and PostgreSQL.

Runs execute on the ``local`` backend (threads of the test process); the property test uses the
``rq`` backend on the test Redis with no worker, so that nothing runs behind its back.
"""

from __future__ import annotations

import json
import threading
import urllib.parse
from typing import Any

import pytest
import redis
from flask import Blueprint, Flask
from flask.testing import FlaskClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from werkzeug.test import TestResponse

from flask_harvest import HarvestError, get_engine, workflow_service
from flask_harvest.http.admin import install_admin_api
from flask_harvest.workflows import ExecutionState

from .properties import BUDGET, TEXT, quoted
from .workflow_app import (  # noqa: F401 (app_fixture, database_url_fixture: fixtures)
    AUTH,
    PREFIX,
    app_fixture,
    database_url_fixture,
    executions,
    gate,
    make_workflow_app,
    snapshot,
    state_of,
    wait_asleep,
    wait_in_step,
)

S = ExecutionState


@pytest.fixture
def client(app: Flask) -> FlaskClient:
    return app.test_client()


def call(client: FlaskClient, method: str, path: str, body: Any = None, **kw: Any) -> TestResponse:
    headers = {**AUTH, **kw.pop("headers", {})}
    return client.open(PREFIX + path, method=method, json=body, headers=headers, **kw)


def start(client: FlaskClient, name: str, **body: Any) -> dict[str, Any]:
    response = call(client, "POST", f"/workflows/{name}/start", body)
    assert response.status_code == 201, response.get_json()
    data: dict[str, Any] = response.get_json()
    return data


def result(client: FlaskClient, execution_id: str, wait: float = 10) -> TestResponse:
    return call(client, "GET", f"/workflows/{execution_id}/result?wait={wait}")


def assert_error(response: TestResponse, status: int, code: str | None = None) -> dict[str, Any]:
    assert response.status_code == status, response.get_data(as_text=True)
    error: dict[str, Any] = response.get_json()["error"]
    assert error["message"]
    if code is not None:
        assert error["code"] == code
    return error


ROUTES = [
    ("POST", "/workflows/echo/start"),
    ("GET", "/workflows"),
    ("GET", "/workflows/x"),
    ("GET", "/workflows/x/steps"),
    ("GET", "/workflows/x/result"),
    ("POST", "/workflows/x/cancel"),
    ("POST", "/workflows/x/terminate"),
]


# -- access ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(("method", "path"), ROUTES)
def test_every_route_is_closed_like_the_actuator(database_url: str, method: str, path: str) -> None:
    closed = make_workflow_app(database_url, HARVEST_ACTUATOR_TOKEN="").test_client()
    assert_error(closed.open(PREFIX + path, method=method, json={}, headers=AUTH), 403, "actuator_disabled")
    client = make_workflow_app(database_url).test_client()
    assert_error(client.open(PREFIX + path, method=method, json={}), 401, "unauthorized")
    wrong = client.open(PREFIX + path, method=method, json={}, headers={"Authorization": "Bearer nope"})
    assert_error(wrong, 401)
    assert wrong.headers["WWW-Authenticate"] == 'Bearer realm="harvest-workflows"'
    assert executions(make_workflow_app(database_url)) == []


def test_the_actuator_authorizer_decides_for_the_workflow_api_too(database_url: str) -> None:
    app = make_workflow_app(database_url, HARVEST_ACTUATOR_TOKEN="")
    get_engine(app).access.authorizer = lambda request: request.headers.get("X-Role") == "admin"
    client = app.test_client()
    assert_error(client.get(f"{PREFIX}/workflows", headers={"X-Role": "guest"}), 403, "forbidden")
    assert client.get(f"{PREFIX}/workflows", headers={"X-Role": "admin"}).status_code == 200


def test_the_prefix_is_a_setting(database_url: str) -> None:
    client = make_workflow_app(database_url, HARVEST_WORKFLOW_API_PREFIX="/ops/wf").test_client()
    assert client.get("/ops/wf/workflows", headers=AUTH).status_code == 200
    assert client.get(f"{PREFIX}/workflows", headers=AUTH).status_code == 404


# -- start, show, steps, result -----------------------------------------------------------------


def test_start_runs_the_workflow_and_every_read_route_shows_it(app: Flask, client: FlaskClient) -> None:
    started = start(client, "three_steps", input={"order": "o-1"}, workflow_id="order-o-1")
    assert started["created"] is True
    assert started["workflow_id"] == "order-o-1" and started["workflow_name"] == "three_steps"
    again = call(client, "POST", "/workflows/three_steps/start", {"workflow_id": "order-o-1"})
    assert again.headers["Location"] == f"{PREFIX}/workflows/{started['execution_id']}"
    assert started["state"] in ("Pending", "Running", "Completed")
    eid = started["execution_id"]
    done = result(client, eid)
    assert done.status_code == 200
    assert done.get_json() == {
        "execution_id": eid,
        "workflow_id": "order-o-1",
        "state": "Completed",
        "result": [10, 20, 30],
    }
    shown = call(client, "GET", f"/workflows/{eid}").get_json()
    assert shown["state"] == "Completed" and shown["input"] == {"order": "o-1"}
    assert shown["output"] == [10, 20, 30] and shown["completed_at"] and shown["started_at"]
    steps = call(client, "GET", f"/workflows/{eid}/steps").get_json()
    assert steps["execution_id"] == eid
    assert [(s["seq"], s["name"], s["output"]) for s in steps["steps"]] == [
        (0, "step_1", 10),
        (1, "step_2", 20),
        (2, "step_3", 30),
    ]


def test_a_start_without_a_workflow_id_generates_one_and_an_empty_body_means_null_input(
    client: FlaskClient,
) -> None:
    started = start(client, "echo")
    assert started["workflow_id"]
    assert result(client, started["execution_id"]).get_json()["result"] is None


def test_starting_an_open_workflow_id_again_returns_the_open_run_with_200(
    app: Flask, client: FlaskClient
) -> None:
    first = start(client, "sleeper", workflow_id="refund-r-1")
    again = call(client, "POST", "/workflows/sleeper/start", {"workflow_id": "refund-r-1", "input": 2})
    assert again.status_code == 200
    assert again.get_json()["created"] is False
    assert again.get_json()["execution_id"] == first["execution_id"]
    assert len(executions(app)) == 1


def test_the_id_reuse_policy_refuses_with_409_and_creates_nothing(app: Flask, client: FlaskClient) -> None:
    done = start(client, "echo", input=1, workflow_id="k-done")
    assert result(client, done["execution_id"]).status_code == 200
    failed = start(client, "boom", workflow_id="k-failed")
    assert result(client, failed["execution_id"]).get_json()["state"] == "Failed"
    before = snapshot(app)
    for workflow_id, policy in [
        ("k-done", "RejectDuplicate"),
        ("k-done", "AllowDuplicateFailedOnly"),
        ("k-failed", "RejectDuplicate"),
    ]:
        body = {"workflow_id": workflow_id, "id_reuse_policy": policy}
        refused = call(client, "POST", "/workflows/echo/start", body)
        error = assert_error(refused, 409, "workflow_id_reused")
        assert workflow_id in error["message"] and policy in error["message"]
    assert snapshot(app) == before
    retried = call(
        client,
        "POST",
        "/workflows/boom/start",
        {"workflow_id": "k-failed", "id_reuse_policy": "AllowDuplicateFailedOnly"},
    )
    assert retried.status_code == 201
    again = call(client, "POST", "/workflows/echo/start", {"workflow_id": "k-done"})  # AllowDuplicate
    assert again.status_code == 201
    assert len(executions(app)) == 4


def test_completion_callbacks_are_passed_to_the_service(database_url: str) -> None:
    app = make_workflow_app(
        database_url,
        HARVEST_COMPLETION_CALLBACK_ALLOWLIST="hooks.example.com",
        HARVEST_COMPLETION_CALLBACK_SECRET="callback-secret-0123456789abcdef",
    )
    client = app.test_client()
    callbacks = [{"url": "https://hooks.example.com/done", "filter": {"type": "AnyTerminal"}}]
    started = start(client, "sleeper", completion_callbacks=callbacks)
    with app.app_context():
        stored = workflow_service().get(started["execution_id"])
    assert stored.completion_callbacks
    # They are not shown by the workflow routes.
    assert (
        "completion_callbacks" not in call(client, "GET", f"/workflows/{started['execution_id']}").get_json()
    )
    # A target the callbacks refuse is answered with the status its error declares (422).
    refused = call(
        client,
        "POST",
        "/workflows/sleeper/start",
        {
            "completion_callbacks": [
                {"url": "https://elsewhere.example.org/x", "filter": {"type": "AnyTerminal"}}
            ]
        },
    )
    assert_error(refused, 422)
    assert len(executions(app)) == 1


def test_an_unknown_workflow_is_404_and_creates_nothing(app: Flask, client: FlaskClient) -> None:
    error = assert_error(call(client, "POST", "/workflows/nope/start", {"input": 1}), 404, "not_found")
    assert "'nope'" in error["message"]
    assert executions(app) == []


def test_an_input_over_the_limit_is_413_and_creates_nothing(app: Flask, client: FlaskClient) -> None:
    error = assert_error(call(client, "POST", "/workflows/echo/start", {"input": "x" * 2000}), 413)
    assert error["code"] == "input_too_large"
    assert "HARVEST_WORKFLOW_MAX_INPUT_BYTES" in error["message"]
    # A body far past any input the limit allows is refused before it is read.
    huge = call(client, "POST", "/workflows/echo/start", {"input": "x" * 200_000})
    assert_error(huge, 413)
    assert executions(app) == []


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"input": 1, "extra": 2}, "extra"),
        ({"workflow_id": 5}, "workflow_id"),
        ({"workflow_id": ""}, "workflow_id"),
        ({"workflow_id": "x" * 256}, "workflow_id"),
        ({"workflow_id": "a\x00b"}, "workflow_id"),
        ({"id_reuse_policy": "Sometimes"}, "id_reuse_policy"),
        ({"id_reuse_policy": None}, "id_reuse_policy"),
        ({"input": {"a": {1, 2}}.get("a") and None, "completion_callbacks": float("inf")}, None),
    ],
)
def test_a_start_body_with_a_bad_field_is_422_naming_it_and_one_not_json_is_400(
    app: Flask, client: FlaskClient, body: dict[str, Any], field: str | None
) -> None:
    if field is None:  # a non-finite number: only raw JSON text can carry one; not JSON at all
        raw = '{"completion_callbacks": Infinity}'
        response = call(client, "POST", "/workflows/echo/start", data=raw, content_type="application/json")
        assert_error(response, 400, "bad_json")
    else:
        response = call(client, "POST", "/workflows/echo/start", body)
        error = assert_error(response, 422, "validation_error")
        assert field in error["fields"]
    assert executions(app) == []


@pytest.mark.parametrize(
    "raw", ['{"input": NaN}', '{"input": "\\ud800"}', '{"input": {"k": "\\udfff"}}', '{"input": -Infinity}']
)
def test_an_input_that_is_not_storable_json_is_refused(app: Flask, client: FlaskClient, raw: str) -> None:
    response = call(client, "POST", "/workflows/echo/start", data=raw, content_type="application/json")
    if "\\u" in raw:  # JSON, but a value no database can keep: the field's value is refused
        assert assert_error(response, 422, "validation_error")["fields"].keys() == {"input"}
    else:  # NaN and Infinity are not JSON: the body is malformed, refused as it is read
        assert_error(response, 400, "bad_json")
    assert executions(app) == []


def test_a_body_that_is_not_a_json_object_is_refused(app: Flask, client: FlaskClient) -> None:
    path = PREFIX + "/workflows/echo/start"
    assert_error(client.post(path, data="{nope", content_type="application/json", headers=AUTH), 400)
    assert_error(client.post(path, json=[1, 2], headers=AUTH), 400, "bad_json")
    assert_error(client.post(path, data="input=1", headers=AUTH), 415, "unsupported_media_type")
    assert executions(app) == []


# -- cancel and terminate --------------------------------------------------------------------------


def test_cancel_of_a_pending_run_ends_it_cancelled_at_once(app: Flask, client: FlaskClient) -> None:
    eid = start(client, "sleeper")["execution_id"]
    wait_asleep(app, eid)
    assert result(client, eid, wait=0).status_code == 202  # asleep: Pending until its wake time
    cancelled = call(client, "POST", f"/workflows/{eid}/cancel", {"reason": "customer changed their mind"})
    assert cancelled.status_code == 200
    assert cancelled.get_json()["state"] == "Cancelled"
    assert cancelled.get_json()["error"] == "customer changed their mind"
    assert result(client, eid).get_json() == {
        "execution_id": eid,
        "workflow_id": cancelled.get_json()["workflow_id"],
        "state": "Cancelled",
        "error": "customer changed their mind",
    }


def test_cancel_of_a_running_run_is_202_and_it_ends_cancelled_at_its_next_step(
    app: Flask, client: FlaskClient
) -> None:
    released = gate("cancel-running")
    eid = start(client, "gated", input={"gate": "cancel-running"})["execution_id"]
    try:
        wait_in_step("cancel-running")
        accepted = call(client, "POST", f"/workflows/{eid}/cancel", {})
        assert accepted.status_code == 202
        assert accepted.get_json()["state"] == "Running" and accepted.get_json()["cancel_requested"] is True
    finally:
        released.set()
    ended = result(client, eid).get_json()
    assert ended["state"] == "Cancelled" and ended["error"] == "cancelled"
    steps = call(client, "GET", f"/workflows/{eid}/steps").get_json()["steps"]
    assert [s["name"] for s in steps] == ["wait"]  # the step under way finished; no other began


def test_terminate_of_a_running_run_ends_it_at_once(app: Flask, client: FlaskClient) -> None:
    released = gate("terminate-running")
    eid = start(client, "gated", input={"gate": "terminate-running"})["execution_id"]
    try:
        wait_in_step("terminate-running")
        ended = call(client, "POST", f"/workflows/{eid}/terminate", {"reason": "operator"})
        assert ended.status_code == 200
        assert (ended.get_json()["state"], ended.get_json()["error"]) == ("Terminated", "operator")
    finally:
        released.set()
    assert result(client, eid).get_json()["state"] == "Terminated"
    assert call(client, "GET", f"/workflows/{eid}/steps").get_json()["steps"] == []


def test_cancel_and_terminate_of_an_ended_run_are_409_and_change_nothing(
    app: Flask, client: FlaskClient
) -> None:
    eid = start(client, "echo", input=7)["execution_id"]
    assert result(client, eid).get_json()["state"] == "Completed"
    before = snapshot(app)
    for action in ("cancel", "terminate"):
        error = assert_error(call(client, "POST", f"/workflows/{eid}/{action}", {"reason": "late"}), 409)
        assert error["code"] == "execution_ended" and "Completed" in error["message"]
    assert snapshot(app) == before


def test_cancel_and_terminate_need_a_json_body_so_a_form_cannot_send_them(
    app: Flask, client: FlaskClient
) -> None:
    eid = start(client, "sleeper")["execution_id"]
    wait_asleep(app, eid)
    for action in ("cancel", "terminate"):
        response = client.post(f"{PREFIX}/workflows/{eid}/{action}", data={"reason": "x"}, headers=AUTH)
        assert_error(response, 415)
        assert_error(call(client, "POST", f"/workflows/{eid}/{action}", {"reason": 5}), 422)
        assert_error(call(client, "POST", f"/workflows/{eid}/{action}", {"reason": "x" * 2001}), 422)
    assert state_of(app, eid) is S.PENDING


# -- result ----------------------------------------------------------------------------------------


def test_result_is_202_while_open_and_long_polls_until_the_end(app: Flask, client: FlaskClient) -> None:
    released = gate("long-poll")
    eid = start(client, "gated", input={"gate": "long-poll"})["execution_id"]
    try:
        open_now = result(client, eid, wait=0)
        assert open_now.status_code == 202
        assert open_now.get_json()["state"] in ("Pending", "Running")
        assert "result" not in open_now.get_json() and "error" not in open_now.get_json()
        threading.Timer(0.3, released.set).start()
        done = result(client, eid, wait=10)  # answers when the run ends, well before 10 s
    finally:
        released.set()
    assert (done.status_code, done.get_json()["result"]) == (200, "done")


def test_a_wait_past_the_cap_is_cut_to_it(database_url: str) -> None:
    client = make_workflow_app(database_url, HARVEST_WORKFLOW_RESULT_MAX_WAIT_SECONDS=0.05).test_client()
    eid = start(client, "sleeper")["execution_id"]
    # Without the cap this would hold the request for a day.
    assert result(client, eid, wait=86_400).status_code == 202


def test_a_failed_run_answers_200_with_its_error(client: FlaskClient) -> None:
    eid = start(client, "boom", input="x")["execution_id"]
    body = result(client, eid).get_json()
    assert body["state"] == "Failed" and "boom: x" in body["error"] and "result" not in body


@pytest.mark.parametrize("wait", ["-1", "nan", "inf", "1e999", "soon", ""])
def test_a_bad_wait_is_422(client: FlaskClient, wait: str) -> None:
    eid = start(client, "echo")["execution_id"]
    error = assert_error(call(client, "GET", f"/workflows/{eid}/result?wait={wait}"), 422)
    assert "wait" in error["fields"]


# -- listing ---------------------------------------------------------------------------------------


def test_list_filters_by_name_and_state_and_pages_with_a_cursor(app: Flask, client: FlaskClient) -> None:
    ids = [start(client, "echo", input=n)["execution_id"] for n in range(5)]
    for eid in ids:
        assert result(client, eid).status_code == 200
    failed = start(client, "boom")["execution_id"]
    assert result(client, failed).get_json()["state"] == "Failed"
    seen: list[str] = []
    cursor = None
    while True:
        query = "name=echo&limit=2" + (f"&cursor={cursor}" if cursor else "")
        response = call(client, "GET", f"/workflows?{query}")
        page = response.get_json()
        assert len(page["executions"]) <= 2
        assert all(e["workflow_name"] == "echo" and "input" not in e for e in page["executions"])
        seen += [e["execution_id"] for e in page["executions"]]
        cursor = page["next_cursor"]
        assert response.headers.get("X-Next-Cursor") == cursor
        if cursor is None:
            break
    assert sorted(seen) == sorted(ids) and len(seen) == len(set(seen))
    by_state = call(client, "GET", "/workflows?state=Failed").get_json()["executions"]
    assert [e["execution_id"] for e in by_state] == [failed]
    assert call(client, "GET", "/workflows?name=nothing").get_json() == {
        "executions": [],
        "next_cursor": None,
    }


@pytest.mark.parametrize(
    "query",
    [
        "state=Done",
        "limit=0",
        "limit=501",
        "limit=two",
        "cursor=not-a-cursor",
        "name=",
        "other=1",
        "cursor=%00",
    ],
)
def test_a_bad_list_query_is_422(client: FlaskClient, query: str) -> None:
    assert_error(call(client, "GET", f"/workflows?{query}"), 422, "validation_error")


# -- unknown things --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "execution_id",
    ["nope", "00000000-0000-0000-0000-000000000000", "x" * 300, "a%00b", "%F0%9F%92%A5", "%ED%A0%80"],
)
def test_an_unknown_execution_is_404_on_every_route(
    app: Flask, client: FlaskClient, execution_id: str
) -> None:
    eid = start(client, "sleeper")["execution_id"]
    wait_asleep(app, eid)
    before = snapshot(app)
    for method, suffix in [
        ("GET", ""),
        ("GET", "/steps"),
        ("GET", "/result"),
        ("POST", "/cancel"),
        ("POST", "/terminate"),
    ]:
        response = call(
            client, method, f"/workflows/{execution_id}{suffix}", {} if method == "POST" else None
        )
        assert_error(response, 404, "not_found")
    assert snapshot(app) == before and state_of(app, eid) is S.PENDING


@pytest.mark.parametrize(
    "path",
    [
        "/workflows/x/nothing",
        "/workflows/",
        "/workflows/x/steps/more",
        "/nothing",
        "/workflows/a%0Ab/nothing",
    ],
)
@pytest.mark.parametrize("method", ["GET", "POST", "DELETE", "PROPFIND"])
def test_an_unknown_path_is_a_json_404_after_the_access_check(
    app: Flask, client: FlaskClient, method: str, path: str
) -> None:
    assert_error(client.open(PREFIX + path, method=method), 401)
    before = snapshot(app)
    assert_error(call(client, method, path), 404, "not_found")
    assert snapshot(app) == before


@pytest.mark.parametrize(
    ("method", "path", "allow"),
    [
        ("DELETE", "/workflows", "GET, HEAD, OPTIONS"),
        ("POST", "/workflows", "GET, HEAD, OPTIONS"),
        ("PUT", "/workflows/x", "GET, HEAD, OPTIONS"),
        ("PROPFIND", "/workflows/x/steps", "GET, HEAD, OPTIONS"),
        ("GET", "/workflows/x/cancel", "OPTIONS, POST"),
        ("GET", "/workflows/echo/start", "OPTIONS, POST"),
        ("DELETE", "/workflows/x/completion-deliveries", "GET, HEAD, OPTIONS"),
    ],
)
def test_a_method_a_route_does_not_take_is_a_json_405_with_allow(
    app: Flask, client: FlaskClient, method: str, path: str, allow: str
) -> None:
    assert_error(client.open(PREFIX + path, method=method), 401)
    before = snapshot(app)
    response = call(client, method, path)
    assert_error(response, 405, "method_not_allowed")
    assert response.headers["Allow"] == allow
    assert snapshot(app) == before


def test_options_names_the_methods_of_the_paths_own_routes(client: FlaskClient) -> None:
    # Not the catch-all's, which takes every method to refuse it.
    assert call(client, "OPTIONS", "/workflows/x").headers["Allow"] == "GET, HEAD, OPTIONS"
    assert call(client, "OPTIONS", "/workflows/x/terminate").headers["Allow"] == "OPTIONS, POST"
    assert_error(call(client, "OPTIONS", "/workflows/x/nothing"), 404, "not_found")
    assert_error(client.options(f"{PREFIX}/workflows/x"), 401)


# -- arbitrary input -------------------------------------------------------------------------------

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=12), children, max_size=5)
    ),
    max_leaves=12,
)
FIELDS = ["input", "workflow_id", "id_reuse_policy", "completion_callbacks", "reason"]
FIELD_VALUES = JSON | st.sampled_from(
    ["AllowDuplicate", "RejectDuplicate", "AllowDuplicateFailedOnly", "k-1"]
)
BODIES = st.one_of(
    st.none(),
    JSON,
    st.dictionaries(st.sampled_from(FIELDS), FIELD_VALUES, max_size=4),
    st.binary(max_size=40),  # raw bytes sent as application/json
)
QUERY_KEYS = ["name", "state", "cursor", "limit", "wait", "x"]
QUERY_VALUES = st.text(max_size=30) | st.sampled_from(
    ["Running", "Pending", "5", "-1", "0.01", "1e999", "nan"]
)
QUERIES = st.dictionaries(st.sampled_from(QUERY_KEYS), QUERY_VALUES, max_size=4)
# "@open" and "@ended" stand for the ids of an open and an ended execution of the test.
IDS = st.sampled_from(["@open", "@ended", "echo", "sleeper", "nope"]) | st.text(max_size=40)
ROUTE_TEMPLATES = [
    ("POST", "/workflows/{}/start"),
    ("GET", "/workflows"),
    ("GET", "/workflows/{}"),
    ("GET", "/workflows/{}/steps"),
    ("GET", "/workflows/{}/result"),
    ("POST", "/workflows/{}/cancel"),
    ("POST", "/workflows/{}/terminate"),
]


@pytest.fixture
def rq_app(database_url: str, redis_url: str, redis_conn: redis.Redis) -> Flask:
    """An app whose runs are queued on Redis and never run: only requests change rows."""
    return make_workflow_app(
        database_url,
        HARVEST_JOBS_BACKEND="rq",
        HARVEST_REDIS_URL=redis_url,
        HARVEST_WORKFLOW_MAX_INPUT_BYTES=200,
        HARVEST_WORKFLOW_RESULT_MAX_WAIT_SECONDS=0.01,
    )


def _fixed_ids(app: Flask) -> dict[str, str]:
    """The ids "@open" and "@ended" stand for, starting or ending runs as needed."""
    with app.app_context():
        service = workflow_service()
        rows = executions(app)
        opened = next((e for e in rows if not e.terminal), None)
        if opened is None:
            opened = service.start("sleeper", None)[0].execution()
        ended = next((e for e in rows if e.terminal), None)
        if ended is None:
            ended = service.terminate(service.start("echo", None)[0].execution_id, "setup")
    return {"@open": opened.execution_id, "@ended": ended.execution_id}


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(route=st.sampled_from(ROUTE_TEMPLATES), ident=IDS, body=BODIES, query=QUERIES)
def test_arbitrary_requests_never_get_a_5xx_nor_change_anything_when_refused(
    rq_app: Flask, route: tuple[str, str], ident: str, body: Any, query: dict[str, str]
) -> None:
    client = rq_app.test_client()
    fixed = _fixed_ids(rq_app)
    method, template = route
    segment = urllib.parse.quote(fixed.get(ident, ident), safe="")
    path = PREFIX + template.format(segment) + ("?" + urllib.parse.urlencode(query) if query else "")
    before = snapshot(rq_app)
    if isinstance(body, bytes):
        response = client.open(path, method=method, data=body, content_type="application/json", headers=AUTH)
    elif body is None:
        response = client.open(path, method=method, headers=AUTH)
    else:
        response = client.open(
            path, method=method, data=json.dumps(body), content_type="application/json", headers=AUTH
        )
    assert response.status_code < 500, response.get_data(as_text=True)
    if response.status_code >= 400:
        assert response.is_json, response.get_data(as_text=True)
        assert response.get_json()["error"]["message"]
        assert snapshot(rq_app) == before


METHODS = ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "PROPFIND", "FOO"]
SEGMENTS = st.sampled_from(["workflows", "x", "echo", "start", "steps", "result", "cancel", "terminate"])


@BUDGET
@given(
    method=st.sampled_from(METHODS),
    segments=st.lists(SEGMENTS | TEXT.map(lambda text: quoted(text, safe="")), max_size=4),
)
def test_any_method_on_any_path_is_answered_in_json_never_a_5xx(
    rq_app: Flask, method: str, segments: list[str]
) -> None:
    client = rq_app.test_client()
    path = "/" + "/".join(segments)
    before = snapshot(rq_app)
    response = call(client, method, path)
    assert response.status_code < 500, response.get_data(as_text=True)
    if response.status_code >= 400 and method != "HEAD":
        assert response.is_json, response.get_data(as_text=True)
        assert response.get_json()["error"]["message"]
    if response.status_code == 405:
        allowed = set(response.headers["Allow"].split(", "))
        assert method not in allowed
        # Every method it names is taken: none of them is a 405 in turn.
        for other in allowed - {"HEAD", "OPTIONS"}:
            assert call(client, other, path).status_code != 405, other
    assert snapshot(rq_app) == before


# -- how the admin edge maps errors --------------------------------------------------------------------


class _Declared(HarvestError):
    http_status = 422
    error_code = "callback_rejected"


class _Undeclared(HarvestError):
    pass


def test_an_error_that_declares_its_status_is_answered_with_it(app: Flask) -> None:
    # What a subsystem's error (a refused completion callback) gets without the admin edge knowing it.
    blueprint = Blueprint("declared_errors", __name__)
    install_admin_api(blueprint, realm="test")

    @blueprint.get("/declared")
    def declared() -> str:
        raise _Declared("the callback URL is refused")

    @blueprint.get("/undeclared")
    def undeclared() -> str:
        raise _Undeclared("a bug")

    app.register_blueprint(blueprint, url_prefix="/t")
    app.config["PROPAGATE_EXCEPTIONS"] = False
    client = app.test_client()
    error = assert_error(client.get("/t/declared", headers=AUTH), 422, "callback_rejected")
    assert error["message"] == "the callback URL is refused"
    assert client.get("/t/undeclared", headers=AUTH).status_code == 500
