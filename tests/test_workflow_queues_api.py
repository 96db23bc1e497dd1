"""Workflow queues through the app: the settings, Harvest.queue, the HTTP start fields, the
``/workflow-queues`` route and the ``flask harvest workflows queues`` command, on SQLite and
PostgreSQL. Runs are queued on Redis and never run, so only requests change rows."""

from __future__ import annotations

import json
from typing import Any

import pytest
import redis
from flask import Flask
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from flask_harvest.errors import ConfigurationError

from .properties import TEXT, quoted
from .workflow_app import (  # noqa: F401 (database_url_fixture: a fixture)
    AUTH,
    PREFIX,
    database_url_fixture,
    executions,
    make_workflow_app,
    snapshot,
)

QUEUES = {"emails": {"concurrency": 2, "rate_limit": [10, 1.5]}, "plain": {}}


@pytest.fixture
def app(database_url: str, redis_url: str, redis_conn: redis.Redis) -> Flask:
    return make_workflow_app(
        database_url,
        HARVEST_JOBS_BACKEND="rq",
        HARVEST_REDIS_URL=redis_url,
        HARVEST_WORKFLOW_QUEUES=QUEUES,
    )


def start(app: Flask, body: Any) -> Any:
    return app.test_client().post(PREFIX + "/workflows/echo/start", json=body, headers=AUTH)


def test_a_start_names_its_queue_key_and_priority(app: Flask) -> None:
    """The HTTP start body's queue fields are stored, and the execution JSON shows them."""
    response = start(app, {"queue": "emails", "concurrency_key": "customer-42", "priority": 3})
    assert response.status_code == 201, response.get_json()
    data = response.get_json()
    assert (data["queue_name"], data["concurrency_key"], data["priority"]) == ("emails", "customer-42", 3)
    shown = app.test_client().get(response.headers["Location"], headers=AUTH).get_json()
    assert shown["queue_name"] == "emails"
    (stored,) = executions(app)
    assert stored.concurrency_limit == 1


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"queue": "nope"}, "queue"),
        ({"queue": ""}, "queue"),
        ({"queue": "emails", "priority": 10**9}, "priority"),
        ({"queue": "emails", "priority": 1.5}, "priority"),
        ({"queue": "emails", "concurrency_limit": 0, "concurrency_key": "k"}, "concurrency_limit"),
        ({"queue": "emails", "concurrency_limit": 2}, "concurrency_limit"),
        ({"concurrency_key": "k"}, "concurrency_key"),
        ({"queue": "emails", "concurrency_key": "x" * 256}, "concurrency_key"),
    ],
)
def test_a_bad_queue_field_is_a_422_and_changes_nothing(app: Flask, body: Any, field: str) -> None:
    """An unknown queue name, or a queue field out of range, is a clear error."""
    before = snapshot(app)
    response = start(app, body)
    assert response.status_code in (400, 422), response.get_json()
    error = response.get_json()["error"]
    assert field in json.dumps(error["fields"])
    assert snapshot(app) == before


def test_the_queues_route_lists_limits_and_bounded_counts(app: Flask) -> None:
    for _ in range(3):
        assert start(app, {"queue": "emails"}).status_code == 201
    response = app.test_client().get(PREFIX + "/workflow-queues", headers=AUTH)
    assert response.status_code == 200
    queues = {q["name"]: q for q in response.get_json()["queues"]}
    assert queues["emails"]["concurrency"] == 2
    assert queues["emails"]["rate_limit"] == [10, 1.5]
    assert (queues["emails"]["running"], queues["emails"]["waiting"]) == (0, 3)
    assert queues["plain"]["concurrency"] is None
    # The same access rules as the rest of the admin API.
    assert app.test_client().get(PREFIX + "/workflow-queues").status_code in (401, 403)


def test_the_cli_lists_the_queues(app: Flask) -> None:
    start(app, {"queue": "emails"})
    result = app.test_cli_runner().invoke(args=["harvest", "workflows", "queues"])
    assert result.exit_code == 0, result.output
    assert "emails" in result.output and "10/1.5s" in result.output
    result = app.test_cli_runner().invoke(args=["harvest", "workflows", "queues", "--json"])
    data = json.loads(result.output)
    assert {q["name"] for q in data["queues"]} == {"emails", "plain"}


@pytest.mark.parametrize(
    "queues",
    ["{", '{"q": {"concurrency": 0}}', '{"q": {"speed": 1}}', {"q": {"rate_limit": [1, -1]}}, "[]"],
)
def test_bad_queue_settings_are_refused_at_start_up(database_url: str, queues: Any) -> None:
    with pytest.raises(ConfigurationError, match="HARVEST_WORKFLOW_QUEUES"):
        make_workflow_app(database_url, HARVEST_WORKFLOW_QUEUES=queues)


QUEUE_FIELDS = st.fixed_dictionaries(
    {},
    optional={
        "queue": st.sampled_from(["emails", "plain", "nope"]) | TEXT | st.integers(),
        "concurrency_key": TEXT | st.integers() | st.none(),
        "concurrency_limit": st.integers(-3, 10**6) | st.floats() | TEXT | st.booleans(),
        "priority": st.integers(-(10**7), 10**7) | st.floats() | TEXT | st.booleans(),
        "input": st.none() | st.integers(),
    },
)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=QUEUE_FIELDS)
def test_hostile_queue_fields_never_get_a_5xx_nor_change_anything_when_refused(app: Flask, body: Any) -> None:
    before = snapshot(app)
    response = start(app, body)
    assert response.status_code < 500, response.get_data(as_text=True)
    if response.status_code >= 400:
        assert response.get_json()["error"]["message"]
        assert snapshot(app) == before
    queues = app.test_client().get(PREFIX + "/workflow-queues", headers=AUTH)
    assert queues.status_code == 200


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(method=st.sampled_from(["GET", "POST", "PUT", "DELETE", "PATCH"]), query=TEXT)
def test_any_request_to_the_queues_route_is_never_a_5xx(app: Flask, method: str, query: str) -> None:
    before = snapshot(app)
    path = PREFIX + "/workflow-queues?q=" + quoted(query, safe="")
    response = app.test_client().open(path, method=method, headers=AUTH)
    assert response.status_code < 500, response.get_data(as_text=True)
    if response.status_code >= 400:
        assert response.is_json
    assert snapshot(app) == before
