"""Forks through the HTTP API and the CLI, on SQLite and PostgreSQL, with completion callbacks to a
real receiver on 127.0.0.1 and completion triggers; and hostile requests to the fork route."""

from __future__ import annotations

import json
import urllib.parse
from typing import Any

import pytest
import redis
from flask import Flask
from flask.testing import FlaskClient
from hypothesis import given
from hypothesis import strategies as st

from flask_harvest import CompletionTrigger, get_engine, workflow_service
from flask_harvest.jobs.rq import RqBackend
from flask_harvest.testing import CapturingReceiver
from flask_harvest.worker import HarvestWorker
from flask_harvest.workflows import ExecutionState, ForkMode

from .properties import BUDGET
from .test_cli import fails, ok
from .test_workflows_http import assert_error, call, result, start
from .workflow_app import (  # noqa: F401 (app_fixture, database_url_fixture: fixtures)
    AUTH,
    PREFIX,
    app_fixture,
    database_url_fixture,
    make_workflow_app,
    snapshot,
)

S = ExecutionState
SECRET = "fork-test-secret-0123456789"


@pytest.fixture
def client(app: Flask) -> FlaskClient:
    return app.test_client()


def finished(client: FlaskClient, name: str, **body: Any) -> str:
    """Start ``name``, wait for its end, return its execution id."""
    execution_id: str = start(client, name, **body)["execution_id"]
    assert result(client, execution_id).status_code == 200
    return execution_id


def fork(client: FlaskClient, execution_id: str, from_step: int, mode: str | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {"from_step": from_step}
    if mode is not None:
        body["mode"] = mode
    response = call(client, "POST", f"/workflows/{execution_id}/fork", body)
    assert response.status_code == 201, response.get_json()
    data: dict[str, Any] = response.get_json()
    assert response.headers["Location"] == f"{PREFIX}/workflows/{data['execution_id']}"
    return data


# -- the route ------------------------------------------------------------------------------------


def test_fork_answers_201_with_the_new_run_and_it_runs(client: FlaskClient) -> None:
    source = finished(client, "three_steps", input={"order": 1}, workflow_id="order-1")
    data = fork(client, source, 1)
    assert data["forked_from"] == source and data["fork_from_step"] == 1 and data["fork_mode"] == "recorded"
    assert data["workflow_id"] == f"order-1:fork:{data['execution_id']}"
    assert data["input"] == {"order": 1}
    done = result(client, data["execution_id"]).get_json()
    assert done["state"] == "Completed" and done["result"] == [10, 20, 30]
    shown = call(client, "GET", f"/workflows/{data['execution_id']}").get_json()
    assert shown["forked_from"] == source and shown["fork_mode"] == "recorded"
    assert "forked_from" not in call(client, "GET", f"/workflows/{source}").get_json()


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({}, "from_step"),
        ({"from_step": -1}, "from_step"),
        ({"from_step": 4}, "from_step"),
        ({"from_step": "1"}, "from_step"),
        ({"from_step": 1.5}, "from_step"),
        ({"from_step": True}, "from_step"),
        ({"from_step": None}, "from_step"),
        ({"from_step": 1, "mode": "Recorded"}, "mode"),
        ({"from_step": 1, "mode": None}, "mode"),
        ({"from_step": 1, "mode": "replay"}, "mode"),
        ({"from_step": 1, "extra": 1}, "extra"),
    ],
)
def test_a_bad_fork_body_is_422_naming_the_field_and_creates_nothing(
    app: Flask, client: FlaskClient, body: dict[str, Any], field: str
) -> None:
    source = finished(client, "three_steps")
    before = snapshot(app)
    error = assert_error(call(client, "POST", f"/workflows/{source}/fork", body), 422)
    assert field in (error.get("fields") or {}) or field in error["message"]
    assert snapshot(app) == before


def test_an_unknown_source_is_404_and_a_body_that_is_not_an_object_is_400(
    app: Flask, client: FlaskClient
) -> None:
    source = finished(client, "three_steps")
    before = snapshot(app)
    unknown = "00000000-0000-0000-0000-000000000000"
    assert_error(call(client, "POST", f"/workflows/{unknown}/fork", {"from_step": 0}), 404, "not_found")
    assert_error(call(client, "POST", "/workflows/nope/fork", {"from_step": 0}), 404, "not_found")
    assert_error(call(client, "POST", f"/workflows/{source}/fork", [0]), 400, "bad_json")
    path = f"{PREFIX}/workflows/{source}/fork"
    assert_error(client.post(path, data="from_step=0", headers=AUTH), 415)
    assert snapshot(app) == before


def test_the_fork_route_is_closed_like_the_actuator(database_url: str) -> None:
    closed = make_workflow_app(database_url, HARVEST_ACTUATOR_TOKEN="").test_client()
    body = {"from_step": 0}
    assert_error(closed.post(f"{PREFIX}/workflows/x/fork", json=body, headers=AUTH), 403, "actuator_disabled")
    client = make_workflow_app(database_url).test_client()
    assert_error(client.post(f"{PREFIX}/workflows/x/fork", json=body), 401, "unauthorized")


# -- the modes, with a real receiver and a completion trigger ----------------------------------------


@pytest.mark.parametrize(("mode", "notifies"), [("recorded", False), ("live", True), ("live_quiet", False)])
def test_only_a_live_fork_delivers_callbacks_and_fires_triggers(
    database_url: str, receiver: CapturingReceiver, mode: str, notifies: bool
) -> None:
    """A fork with the default recorded effects enqueues no delivery, so it never notifies an
    outside system, and fires no trigger, so it starts no target execution; a live fork delivers
    and fires triggers as usual; a live_quiet fork fires none (and, by this package's choice,
    delivers none either)."""
    app = make_workflow_app(
        database_url,
        triggers=[CompletionTrigger("three_steps", "echo")],
        HARVEST_COMPLETION_CALLBACK_ALLOWLIST="127.0.0.1",
        HARVEST_COMPLETION_CALLBACK_ALLOW_PRIVATE_TARGETS=True,
        HARVEST_COMPLETION_CALLBACK_SECRET=SECRET,
    )
    client = app.test_client()
    hook = [{"url": receiver.url("/hook"), "filter": {"type": "AnyTerminal"}}]
    source = finished(client, "three_steps", completion_callbacks=hook)
    [first] = receiver.wait_for(1, timeout=20)
    assert json.loads(first.body)["execution_id"] == source
    forked = fork(client, source, 1, mode)["execution_id"]
    assert result(client, forked).get_json()["state"] == "Completed"
    engine = get_engine(app)
    assert engine.callbacks is not None and engine.triggers is not None
    with app.app_context():
        deliveries = engine.callbacks.deliveries(forked)
        fires = engine.triggers.fires(source_exec_id=forked)
        targets, _ = workflow_service().list_executions(name="echo")
    if notifies:
        assert len(deliveries) == 1 and len(fires) == 1 and fires[0].target_execution_id is not None
        assert len(targets) == 2
        got = receiver.wait_for(2, timeout=20)
        assert sorted(json.loads(r.body)["execution_id"] for r in got) == sorted([source, forked])
    else:
        # The delivery rows and the fires are written in the terminal transaction, which has
        # committed: none now means none ever.
        assert deliveries == [] and fires == []
        assert len(targets) == 1
        assert [json.loads(r.body)["execution_id"] for r in receiver.requests] == [source]


# -- the CLI --------------------------------------------------------------------------------------


def test_the_cli_forks_a_run(app: Flask, client: FlaskClient) -> None:
    source = finished(client, "three_steps")
    runner = app.test_cli_runner()
    out = ok(runner.invoke(args=["harvest", "workflows", "fork", source, "--from-step", "2", "--json"]))
    data = json.loads(out.stdout)
    assert data["forked_from"] == source and data["fork_from_step"] == 2 and data["fork_mode"] == "recorded"
    text = ok(
        runner.invoke(args=["harvest", "workflows", "fork", source, "--from-step", "0", "--mode", "live"])
    ).stdout
    assert text.startswith(f"forked execution {source} from step 0 as ") and "mode live" in text
    shown = ok(runner.invoke(args=["harvest", "workflows", "show", data["execution_id"]])).stdout
    assert "forked_from" in shown and source in shown


def test_the_cli_refuses_bad_input_with_one_error_line(app: Flask, client: FlaskClient) -> None:
    source = finished(client, "three_steps")
    runner = app.test_cli_runner()
    before = snapshot(app)
    line = fails(runner.invoke(args=["harvest", "workflows", "fork", source, "--from-step", "9"]))
    assert "from_step" in line and "at most 3" in line
    fails(runner.invoke(args=["harvest", "workflows", "fork", "nope", "--from-step", "0"]))
    fails(runner.invoke(args=["harvest", "workflows", "fork", source, "--from-step", "-1"]), code=2)
    fails(
        runner.invoke(args=["harvest", "workflows", "fork", source, "--from-step", "0", "--mode", "x"]),
        code=2,
    )
    fails(runner.invoke(args=["harvest", "workflows", "fork", source]), code=2)
    assert snapshot(app) == before


# -- hostile requests -----------------------------------------------------------------------------

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=12),
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=8), children, max_size=3)
    ),
    max_leaves=8,
)
FORK_BODIES = st.one_of(
    st.none(),
    JSON,
    st.fixed_dictionaries(
        {},
        optional={
            "from_step": JSON | st.integers(min_value=-5, max_value=5) | st.sampled_from([2**63, -(2**63)]),
            "mode": JSON | st.sampled_from([m.value for m in ForkMode]),
            "extra": JSON,
        },
    ),
    st.binary(max_size=30),
)
# "@ended" and "@open" stand for an ended and an open run of the test.
FORK_IDS = st.sampled_from(["@ended", "@open", "nope", ""]) | st.text(max_size=40)


@pytest.fixture
def rq_app(database_url: str, redis_url: str, redis_conn: redis.Redis) -> Flask:
    """An app whose runs are queued on Redis and never run: only requests change rows."""
    return make_workflow_app(database_url, HARVEST_JOBS_BACKEND="rq", HARVEST_REDIS_URL=redis_url)


def _fixed_ids(app: Flask) -> dict[str, str]:
    with app.app_context():
        service = workflow_service()
        rows, _ = service.list_executions(limit=500)
        opened = next((e for e in rows if not e.terminal), None)
        if opened is None:
            opened = service.start("sleeper", None)[0].execution()
        ended = next((e for e in rows if e.terminal), None)
        if ended is None:
            ended = service.terminate(service.start("echo", None)[0].execution_id, "setup")
    return {"@open": opened.execution_id, "@ended": ended.execution_id}


@BUDGET
@given(ident=FORK_IDS, body=FORK_BODIES)
def test_hostile_fork_requests_never_get_a_5xx_and_change_nothing_when_refused(
    rq_app: Flask, ident: str, body: Any
) -> None:
    client = rq_app.test_client()
    fixed = _fixed_ids(rq_app)
    path = f"{PREFIX}/workflows/{urllib.parse.quote(fixed.get(ident, ident), safe='')}/fork"
    before = snapshot(rq_app)
    if isinstance(body, bytes):
        response = client.post(path, data=body, content_type="application/json", headers=AUTH)
    elif body is None:
        response = client.post(path, headers=AUTH)
    else:
        response = client.post(path, data=json.dumps(body), content_type="application/json", headers=AUTH)
    assert response.status_code < 500, response.get_data(as_text=True)
    if response.status_code == 201:
        created = response.get_json()
        assert created["forked_from"] == fixed.get(ident) and created["state"] == "Pending"
        return
    if response.status_code >= 400:
        assert response.is_json and response.get_json()["error"]["message"]
    # Refused (or, for an empty id, redirected to the path with one slash): nothing changed.
    assert snapshot(rq_app) == before


@pytest.mark.redis
def test_an_rq_worker_runs_a_live_fork(database_url: str, redis_url: str, redis_conn: redis.Redis) -> None:
    app = make_workflow_app(database_url, HARVEST_JOBS_BACKEND="rq", HARVEST_REDIS_URL=redis_url)
    backend = get_engine(app).backend
    assert isinstance(backend, RqBackend)

    def work() -> None:
        HarvestWorker([backend.queue], connection=backend.connection, app=app).work(burst=True)

    with app.app_context():
        service = workflow_service()
        source, _ = service.start("three_steps", None)
        work()
        assert source.result(timeout=30) == [10, 20, 30]
        fork = service.fork(source.execution_id, 1, ForkMode.LIVE)
        work()
        assert fork.result(timeout=30) == [10, 20, 30]
        assert [s.name for s in service.steps(fork.execution_id)] == ["step_1", "step_2", "step_3"]
