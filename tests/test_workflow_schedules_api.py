"""The workflow schedules' HTTP API and CLI, on SQLite and PostgreSQL: list, show, pause, resume;
refusals that change nothing; hostile requests (a property test) that never get a 5xx."""

from __future__ import annotations

import json
import urllib.parse
from datetime import timedelta
from typing import Any

import pytest
from flask import Flask
from hypothesis import given
from hypothesis import strategies as st

from flask_harvest import get_engine

from .dashboard_client import SECRET_KEY, signed_in, text
from .pipeline import close_later
from .properties import BODY_TEXTS, BUDGET, JSON, TEXT, quoted
from .schedule_app import AUTH, EVERY_SECOND, TOKEN, make_app
from .test_cli import fails, ok
from .workflow_app import database_url_fixture  # noqa: F401 (a fixture)

PREFIX = "/api/harvest"
ROOT = f"{PREFIX}/workflow-schedules"


@pytest.fixture
def app(database_url: str) -> Flask:
    return close_later(make_app(database_url))


def table(app: Flask) -> list[tuple[Any, ...]]:
    """Every schedule row as stored: what a refused request must leave as it was."""
    schedules = get_engine(app).schedules
    assert schedules is not None
    return [(r.name, r.cron, r.paused, r.last_tick_at, r.updated_at) for r in schedules.store.all()]


def test_the_list_shows_each_schedule_with_its_last_and_next_tick(app: Flask) -> None:
    response = app.test_client().get(ROOT, headers=AUTH)
    assert response.status_code == 200
    by_name = {s["name"]: s for s in response.get_json()["schedules"]}
    assert set(by_name) == {"heartbeat", "nightly"}
    heartbeat = by_name["heartbeat"]
    assert heartbeat["cron"] == EVERY_SECOND and heartbeat["paused"] is False and heartbeat["declared"]
    assert heartbeat["last_tick_at"] < heartbeat["next_tick_at"]
    one = app.test_client().get(f"{ROOT}/nightly", headers=AUTH).get_json()
    assert one["name"] == "nightly" and one["cron"] == "0 0 3 * * *"


def test_pause_and_resume_over_http(app: Flask) -> None:
    client = app.test_client()
    paused = client.post(f"{ROOT}/heartbeat/pause", json={}, headers=AUTH)
    assert paused.status_code == 200
    assert paused.get_json()["paused"] is True and paused.get_json()["next_tick_at"] is None
    resumed = client.post(f"{ROOT}/heartbeat/resume", json={}, headers=AUTH)
    assert resumed.status_code == 200 and resumed.get_json()["paused"] is False


@pytest.mark.parametrize(
    ("path", "kwargs", "status", "code"),
    [
        ("/nope/pause", {"json": {}}, 404, "not_found"),
        ("/heartbeat/pause", {"json": []}, 400, "bad_json"),
        ("/heartbeat/pause", {"data": "{", "content_type": "application/json"}, 400, "bad_json"),
        ("/heartbeat/resume", {"data": "{}", "content_type": "text/plain"}, 415, "unsupported_media_type"),
        ("/heartbeat/pause", {"json": {"paused": True}}, 422, "validation_error"),
        ("/heartbeat/pause", {}, 415, "unsupported_media_type"),
    ],
)
def test_a_refused_request_is_answered_in_json_and_changes_nothing(
    app: Flask, path: str, kwargs: dict[str, Any], status: int, code: str
) -> None:
    before = table(app)
    response = app.test_client().post(ROOT + path, headers=AUTH, **kwargs)
    assert response.status_code == status, response.get_data(as_text=True)
    assert response.get_json()["error"]["code"] == code
    assert table(app) == before


def test_the_routes_are_behind_the_admin_access_rules(app: Flask) -> None:
    client = app.test_client()
    before = table(app)
    assert client.get(ROOT).status_code == 401  # a token is configured: no credentials, a 401
    assert client.post(f"{ROOT}/heartbeat/pause", json={}).status_code == 401
    wrong = {"Authorization": "Bearer not-the-token-0123456789"}
    assert client.post(f"{ROOT}/heartbeat/pause", json={}, headers=wrong).status_code in (401, 403)
    assert table(app) == before


def test_the_path_does_not_collide_with_executions(app: Flask) -> None:
    # /workflows/<execution_id> stays an execution lookup: a schedule name there is an unknown id.
    response = app.test_client().get(f"{PREFIX}/workflows/heartbeat", headers=AUTH)
    assert response.status_code == 404
    assert app.test_client().delete(ROOT, headers=AUTH).status_code == 405


ROUTES = [("GET", ""), ("GET", "/{}"), ("POST", "/{}/pause"), ("POST", "/{}/resume"), ("PUT", "/{}")]
NAMES = st.one_of(st.sampled_from(["heartbeat", "nightly", "gone", ""]), TEXT)
BODIES = st.one_of(st.none(), JSON, BODY_TEXTS.map(lambda text: text.encode("utf-8", "surrogatepass")))


@BUDGET
@given(route=st.sampled_from(ROUTES), name=NAMES, body=BODIES)
def test_hostile_requests_never_get_a_5xx_nor_change_anything_when_refused(
    app: Flask, route: tuple[str, str], name: str, body: Any
) -> None:
    """Hostile input to the schedule routes: a 4xx JSON answer, and nothing changed."""
    method, template = route
    path = ROOT + template.format(quoted(name, safe=""))
    client = app.test_client()
    before = table(app)
    if body is None:
        response = client.open(path, method=method, headers=AUTH)
    else:
        data = body if isinstance(body, bytes) else json.dumps(body)
        response = client.open(path, method=method, data=data, content_type="application/json", headers=AUTH)
    assert response.status_code < 500, response.get_data(as_text=True)
    if response.status_code >= 400:
        assert response.is_json, response.get_data(as_text=True)
        assert response.get_json()["error"]["message"]
        assert table(app) == before


# -- the CLI -------------------------------------------------------------------------------------


def cli(app: Flask, *args: str) -> Any:
    return app.test_cli_runner().invoke(args=["harvest", "workflows", "schedules", *args])


def test_the_cli_lists_pauses_and_resumes(app: Flask) -> None:
    text = ok(cli(app)).stdout
    assert "heartbeat" in text and EVERY_SECOND in text and "next tick" in text
    listed = json.loads(ok(cli(app, "--json")).stdout)["schedules"]
    assert [s["name"] for s in listed] == ["heartbeat", "nightly"]
    assert "is paused" in ok(cli(app, "pause", "nightly")).stdout
    assert json.loads(ok(cli(app, "--json")).stdout)["schedules"][1]["paused"] is True
    resumed = json.loads(ok(cli(app, "resume", "nightly", "--json")).stdout)
    assert resumed["paused"] is False and resumed["next_tick_at"]


def test_the_cli_refuses_an_unknown_schedule_in_one_line(app: Flask) -> None:
    before = table(app)
    assert "no workflow schedule named 'nope'" in fails(cli(app, "pause", "nope"))
    assert "NUL" in fails(cli(app, "resume", urllib.parse.unquote("%00")))
    assert table(app) == before


# -- the dashboard -------------------------------------------------------------------------------


@pytest.fixture
def dashboard(database_url: str) -> Flask:
    return close_later(make_app(database_url, HARVEST_DASHBOARD=True, SECRET_KEY=SECRET_KEY))


def test_the_dashboard_lists_schedules_and_pauses_and_resumes_them(dashboard: Flask) -> None:
    client = dashboard.test_client()
    csrf = signed_in(client, token=TOKEN)
    page = text(client.get("/harvest/workflow-schedules"))
    assert 'id="schedules"' in page and "heartbeat" in page and EVERY_SECOND in page
    assert 'href="/harvest/workflow-schedules"' in page  # in the navigation
    pause = "/harvest/workflow-schedules/heartbeat/pause"
    assert f'action="{pause}"' in page
    answer = client.post(pause, data={"csrf_token": csrf})
    assert answer.status_code == 303
    page = text(client.get(answer.headers["Location"]))
    assert "Paused" in page and 'action="/harvest/workflow-schedules/heartbeat/resume"' in page
    assert [r[2] for r in table(dashboard) if r[0] == "heartbeat"] == [True]
    client.post("/harvest/workflow-schedules/heartbeat/resume", data={"csrf_token": csrf})
    assert [r[2] for r in table(dashboard) if r[0] == "heartbeat"] == [False]


def test_a_dashboard_action_without_its_csrf_token_changes_nothing(dashboard: Flask) -> None:
    client = dashboard.test_client()
    signed_in(client, token=TOKEN)
    before = table(dashboard)
    assert client.post("/harvest/workflow-schedules/heartbeat/pause", data={}).status_code in (400, 403)
    assert client.post("/harvest/workflow-schedules/nope/pause", data={}).status_code in (400, 403, 404)
    assert table(dashboard) == before
    signed_out = dashboard.test_client()
    assert signed_out.post("/harvest/workflow-schedules/heartbeat/pause").status_code in (302, 303, 401, 403)
    assert table(dashboard) == before


def test_the_dashboard_answers_an_unknown_schedule_with_a_404_page(dashboard: Flask) -> None:
    client = dashboard.test_client()
    csrf = signed_in(client, token=TOKEN)
    before = table(dashboard)
    assert client.post("/harvest/workflow-schedules/nope/pause", data={"csrf_token": csrf}).status_code == 404
    assert table(dashboard) == before


def test_the_sweep_command_says_how_many_scheduled_runs_it_started(app: Flask) -> None:
    schedules = get_engine(app).schedules
    assert schedules is not None
    last = schedules.get("heartbeat").last_tick_at
    schedules.clock = lambda: last + timedelta(seconds=2.5)
    schedules.grace = timedelta(seconds=2)
    result = app.test_cli_runner().invoke(args=["harvest", "sweep"])
    assert "started 2 scheduled workflow run(s)" in ok(result).output
