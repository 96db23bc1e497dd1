"""The dashboard's "Retry from step N" (a fork) through Flask's test client, on SQLite and PostgreSQL."""

from __future__ import annotations

import re

import pytest
from flask import Flask
from flask.testing import FlaskClient

from .dashboard_client import PREFIX, signed_in, text
from .test_dashboard_workflows import finished, link, start, workflow_dashboard_app
from .workflow_app import TOKEN, database_url_fixture, executions, state_of, wait_asleep

__all__ = ["database_url_fixture"]


@pytest.fixture
def app(database_url: str) -> Flask:
    return workflow_dashboard_app(database_url)


@pytest.fixture
def client(app: Flask) -> FlaskClient:
    return app.test_client()


@pytest.fixture
def csrf(client: FlaskClient) -> str:
    return signed_in(client, TOKEN)


def test_retry_from_a_step_after_choosing_the_mode(app: Flask, client: FlaskClient, csrf: str) -> None:
    source = start(app, "three_steps", {"order": 1})
    finished(app, source)
    page = text(client.get(f"{PREFIX}/workflows/{source}"))
    url = link(page, "retry-1")
    assert url == f"{PREFIX}/workflows/{source}/fork?from_step=1"
    assert {f"retry-{n}" for n in range(3)} <= set(re.findall(r'id="(retry-\d+)"', page))
    confirm = text(client.get(url))
    assert 'id="mode-recorded" checked' in confirm and 'id="mode-live_quiet"' in confirm
    before = executions(app)
    action = f"{PREFIX}/workflows/{source}/fork"
    assert client.post(action, data={"from_step": "1", "mode": "live"}).status_code == 403  # no CSRF
    assert executions(app) == before
    done = client.post(action, data={"from_step": "1", "mode": "live", "csrf_token": csrf})
    assert done.status_code == 303
    forked = done.headers["Location"].split("/workflows/")[1].split("?")[0]
    assert forked != source
    shown = text(client.get(done.headers["Location"]))
    assert "The fork was created" in shown
    assert f'href="{PREFIX}/workflows/{source}">{source}</a> at step 1 (live)' in shown
    assert finished(app, forked).value == "Completed"


def test_bad_fork_requests_are_refused_and_create_nothing(app: Flask, client: FlaskClient, csrf: str) -> None:
    source = start(app, "three_steps")
    finished(app, source)
    before = executions(app)
    url = f"{PREFIX}/workflows/{source}/fork"
    for query in (
        "",
        "?from_step=",
        "?from_step=x",
        "?from_step=-1",
        "?from_step=4",
        "?from_step=1.5",
        "?from_step=%C2%B2",
    ):
        assert client.get(url + query).status_code == 422, query
    for form in ({"from_step": "9"}, {"from_step": "a"}, {"from_step": "1", "mode": "Replay"}, {}):
        assert client.post(url, data={**form, "csrf_token": csrf}).status_code == 422, form
    assert (
        client.post(f"{PREFIX}/workflows/nope/fork", data={"from_step": "0", "csrf_token": csrf}).status_code
        == 404
    )
    assert executions(app) == before


def test_an_open_run_offers_no_retry(app: Flask, client: FlaskClient) -> None:
    execution_id = start(app, "sleeper")
    wait_asleep(app, execution_id)
    assert 'id="retry-' not in text(client.get(f"{PREFIX}/workflows/{execution_id}"))
    assert state_of(app, execution_id).value == "Pending"
