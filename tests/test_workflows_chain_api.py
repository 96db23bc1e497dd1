"""Continue-as-new chains through the service, the HTTP API, the CLI and the dashboard, on SQLite
and PostgreSQL: following a chain to its last run, listing it, and cancel or terminate through any
run of it."""

from __future__ import annotations

import json
import time
import urllib.parse
from collections.abc import Callable
from typing import Any

import pytest
import redis
from flask import Flask
from flask.testing import FlaskClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from flask_harvest import get_engine, workflow_service
from flask_harvest.workflows import Execution, ExecutionState, WorkflowContext
from flask_harvest.workflows.errors import ExecutionEndedError, ExecutionNotFoundError
from flask_harvest.workflows.service import WorkflowFailedError, WorkflowService

from .dashboard_client import PREFIX as DASHBOARD
from .dashboard_client import SECRET_KEY, signed_in, text
from .workflow_app import AUTH, PREFIX, TOKEN, database_url_fixture, make_workflow_app, snapshot

__all__ = ["database_url_fixture"]

S = ExecutionState
#: How long a test waits for runs on the app's local threads, at most.
PATIENCE = 30.0


def add_workflows(app: Flask) -> Flask:
    """Register the chain workflows of these tests on the workflow test app."""
    service = get_engine(app).workflows
    assert service is not None
    registry = service.registry

    @registry.workflow("relay")
    def relay(ctx: WorkflowContext, value: Any) -> Any:
        n = ctx.step("tick", lambda: value["n"])
        if n < value["until"]:
            ctx.continue_as_new({"n": n + 1, "until": value["until"]})
        return n

    @registry.workflow("relay_nap")
    def relay_nap(ctx: WorkflowContext, value: Any) -> Any:
        if value < 2:
            ctx.continue_as_new(value + 1)
        ctx.sleep(3600)
        return "woke"

    return app


@pytest.fixture
def app(database_url: str) -> Flask:
    return add_workflows(
        make_workflow_app(
            database_url,
            HARVEST_WORKFLOW_MAX_INPUT_BYTES=1000,
            HARVEST_DASHBOARD=True,
            SECRET_KEY=SECRET_KEY,
        )
    )


@pytest.fixture
def client(app: Flask) -> FlaskClient:
    return app.test_client()


def service_of(app: Flask) -> WorkflowService:
    with app.app_context():
        return workflow_service()


def start(app: Flask, name: str, value: Any, workflow_id: str) -> str:
    with app.app_context():
        handle, _ = workflow_service().start(name, value, workflow_id=workflow_id)
    return handle.execution_id


def settled_chain(
    app: Flask, execution_id: str, runs: int, done: Callable[[Execution], bool]
) -> list[Execution]:
    """Wait until the chain of ``execution_id`` has ``runs`` runs and ``done`` holds for its last."""
    with app.app_context():
        service = workflow_service()
        give_up = time.monotonic() + PATIENCE
        while time.monotonic() < give_up:
            chain = service.chain(execution_id)
            if len(chain) == runs and done(chain[-1]):
                return chain
            time.sleep(0.02)
    raise AssertionError(f"the chain of {execution_id} never settled")


def asleep(execution: Execution) -> bool:
    return (
        execution.state is S.PENDING
        and execution.next_run_at is not None
        and execution.started_at is not None
    )


# -- the service ---------------------------------------------------------------------------------


def test_result_follows_the_chain_to_its_last_run_by_default(app: Flask) -> None:
    """result() and wait() follow continued_to to the last run and return its outcome; with
    follow=False the run itself is returned, and result() says it continued as another run."""
    first = start(app, "relay", {"n": 0, "until": 3}, "r")
    with app.app_context():
        service = workflow_service()
        handle = service.handle(first)
        assert handle.result(timeout=PATIENCE) == 3
        chain = service.chain(first)
        assert [e.state for e in chain] == [S.CONTINUED_AS_NEW] * 3 + [S.COMPLETED]
        assert service.wait(first, PATIENCE).execution_id == chain[-1].execution_id
        itself = service.wait(first, 0, follow=False)
        assert itself.state is S.CONTINUED_AS_NEW and itself.continued_to == chain[1].execution_id
        with pytest.raises(WorkflowFailedError, match="continued as another run") as caught:
            handle.result(timeout=0, follow=False)
        assert chain[1].execution_id in str(caught.value) and caught.value.execution.execution_id == first
        # From any run of the chain: the same chain, first to last.
        for run in chain:
            assert [e.execution_id for e in service.chain(run.execution_id)] == [
                e.execution_id for e in chain
            ]
        with pytest.raises(ExecutionNotFoundError):
            service.chain("no-such-run")


@pytest.mark.parametrize("action", ["cancel", "terminate"])
def test_cancel_and_terminate_through_an_old_run_end_the_chains_open_run(app: Flask, action: str) -> None:
    """Cancel and terminate given any execution id of a chain apply to the chain's open run."""
    first = start(app, "relay_nap", 0, f"n-{action}")
    chain = settled_chain(app, first, 3, asleep)
    with app.app_context():
        service = workflow_service()
        ended = service.cancel(first, "enough") if action == "cancel" else service.terminate(first, "enough")
        assert ended.execution_id == chain[-1].execution_id
        assert ended.state is (S.CANCELLED if action == "cancel" else S.TERMINATED)
        # The closed runs stay as they were.
        assert [service.get(e.execution_id).state for e in chain[:-1]] == [S.CONTINUED_AS_NEW] * 2
        with pytest.raises(ExecutionEndedError):
            service.cancel(chain[1].execution_id)
        with pytest.raises(ExecutionEndedError):
            service.terminate(first)


# -- HTTP ------------------------------------------------------------------------------------------


def call(client: FlaskClient, method: str, path: str, body: Any = None) -> Any:
    return client.open(PREFIX + path, method=method, json=body, headers=AUTH)


def test_http_result_follow_chain_and_the_links(app: Flask, client: FlaskClient) -> None:
    first = start(app, "relay", {"n": 0, "until": 2}, "h")
    followed = call(client, "GET", f"/workflows/{first}/result?wait=20")
    assert followed.status_code == 200
    body = followed.get_json()
    assert body["state"] == "Completed" and body["result"] == 2 and body["execution_id"] != first
    itself = call(client, "GET", f"/workflows/{first}/result?follow=false")
    assert itself.status_code == 200
    assert itself.get_json()["state"] == "ContinuedAsNew" and itself.get_json()["continued_to"]
    chain = call(client, "GET", f"/workflows/{first}/chain")
    assert chain.status_code == 200
    runs = chain.get_json()["runs"]
    assert chain.get_json()["complete"] is True and chain.get_json()["max_runs"] == 1000
    assert [r["state"] for r in runs] == ["ContinuedAsNew", "ContinuedAsNew", "Completed"]
    assert runs[0]["execution_id"] == first and runs[0]["continued_from"] is None
    assert runs[0]["continued_to"] == runs[1]["execution_id"] == itself.get_json()["continued_to"]
    shown = call(client, "GET", f"/workflows/{runs[1]['execution_id']}").get_json()
    assert shown["continued_from"] == first and shown["continued_to"] == runs[2]["execution_id"]
    assert runs[2]["execution_id"] == body["execution_id"]


def test_http_cancel_through_an_old_run_and_bad_input(app: Flask, client: FlaskClient) -> None:
    first = start(app, "relay_nap", 0, "hc")
    chain = settled_chain(app, first, 3, asleep)
    before = snapshot(app)
    bad = call(client, "GET", f"/workflows/{first}/result?follow=maybe")
    assert bad.status_code == 422 and "follow" in json.dumps(bad.get_json()["error"])
    assert call(client, "GET", "/workflows/nope/chain").status_code == 404
    assert snapshot(app) == before
    cancelled = call(client, "POST", f"/workflows/{first}/cancel", {"reason": "r"})
    assert cancelled.status_code == 200
    assert cancelled.get_json()["execution_id"] == chain[-1].execution_id
    assert cancelled.get_json()["state"] == "Cancelled"
    assert call(client, "POST", f"/workflows/{first}/terminate", {}).status_code == 409


def test_the_chain_route_is_closed_like_the_actuator(database_url: str) -> None:
    client = make_workflow_app(database_url).test_client()
    assert client.get(f"{PREFIX}/workflows/x/chain").status_code == 401
    closed = make_workflow_app(database_url, HARVEST_ACTUATOR_TOKEN="").test_client()
    assert closed.get(f"{PREFIX}/workflows/x/chain", headers=AUTH).status_code == 403


@pytest.fixture
def rq_app(database_url: str, redis_url: str, redis_conn: redis.Redis) -> Flask:
    """An app whose runs are queued on Redis and never run by a worker: only the test runs them."""
    return add_workflows(
        make_workflow_app(
            database_url,
            HARVEST_JOBS_BACKEND="rq",
            HARVEST_REDIS_URL=redis_url,
            HARVEST_WORKFLOW_MAX_INPUT_BYTES=200,
            HARVEST_WORKFLOW_RESULT_MAX_WAIT_SECONDS=0.01,
        )
    )


def _chain_ids(app: Flask) -> dict[str, str]:
    """ "@continued" (a run that continued as new) and "@open" (its successor), made once."""
    with app.app_context():
        service = workflow_service()
        found = [e for e in service.list_executions(limit=500)[0] if e.workflow_id == "prop"]
        if not found:
            handle, _ = service.start("relay", {"n": 0, "until": 5}, workflow_id="prop")
            service.runner.run(handle.execution_id)  # the first run only: it continues as new
            found = service.chain(handle.execution_id)
        chain = service.chain(found[0].execution_id)
    return {"@continued": chain[0].execution_id, "@open": chain[-1].execution_id}


IDS = st.sampled_from(["@continued", "@open", "nope"]) | st.text(max_size=40)
QUERIES = st.dictionaries(
    st.sampled_from(["follow", "wait", "x"]),
    st.text(max_size=12) | st.sampled_from(["true", "false", "0", "1", "no", "nan", "-1"]),
    max_size=3,
)
ROUTES = ["/workflows/{}/chain", "/workflows/{}/result"]


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(route=st.sampled_from(ROUTES), ident=IDS, query=QUERIES)
def test_hostile_chain_and_follow_requests_never_get_a_5xx_nor_change_anything(
    rq_app: Flask, route: str, ident: str, query: dict[str, str]
) -> None:
    """Hostile input to the chain route and the follow parameter is never a 5xx and changes nothing."""
    fixed = _chain_ids(rq_app)
    segment = urllib.parse.quote(fixed.get(ident, ident), safe="")
    path = PREFIX + route.format(segment) + ("?" + urllib.parse.urlencode(query) if query else "")
    before = snapshot(rq_app)
    response = rq_app.test_client().get(path, headers=AUTH)
    assert response.status_code < 500, response.get_data(as_text=True)
    if response.status_code >= 400:
        assert response.is_json and response.get_json()["error"]["message"]
    # Reads: nothing changes, answered or refused.
    assert snapshot(rq_app) == before


# -- the CLI and the dashboard -----------------------------------------------------------------------


def test_cli_show_chain_and_result(app: Flask) -> None:
    first = start(app, "relay", {"n": 0, "until": 2}, "cli")
    chain = settled_chain(app, first, 3, lambda e: e.terminal)
    runner = app.test_cli_runner()

    def cli(*args: str) -> Any:
        return runner.invoke(args=["harvest", "workflows", *args])

    shown = cli("show", first)
    assert shown.exit_code == 0 and chain[1].execution_id in shown.output and "continued_to" in shown.output
    listed = cli("chain", chain[1].execution_id, "--json")
    assert listed.exit_code == 0
    assert [e["execution_id"] for e in json.loads(listed.output)["executions"]] == [
        e.execution_id for e in chain
    ]
    assert "ContinuedAsNew" in cli("chain", first).output
    followed = cli("result", first, "--json")
    assert followed.exit_code == 0 and json.loads(followed.output)["result"] == 2
    itself = cli("result", first, "--no-follow")
    assert itself.exit_code == 1 and "continued as another run" in itself.output
    assert chain[1].execution_id in itself.output
    assert cli("chain", "nope").exit_code == 1


def test_dashboard_links_the_chain_and_cancels_through_an_old_run(app: Flask) -> None:
    client = app.test_client()
    csrf = signed_in(client, TOKEN)
    first = start(app, "relay_nap", 0, "dash")
    chain = settled_chain(app, first, 3, asleep)
    page = text(client.get(f"{DASHBOARD}/workflows/{first}"))
    assert 'id="continued-to"' in page and chain[1].execution_id in page and "ContinuedAsNew" in page
    middle = text(client.get(f"{DASHBOARD}/workflows/{chain[1].execution_id}"))
    assert 'id="continued-from"' in middle and first in middle
    listing = text(client.get(f"{DASHBOARD}/workflows?state=ContinuedAsNew"))
    assert first in listing and chain[1].execution_id in listing
    done = client.post(f"{DASHBOARD}/workflows/{first}/cancel", data={"confirm": "yes", "csrf_token": csrf})
    assert done.status_code == 303 and chain[-1].execution_id in done.headers["Location"]
    assert service_of(app).get(chain[-1].execution_id).state is S.CANCELLED
