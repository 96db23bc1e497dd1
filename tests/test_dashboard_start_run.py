"""*Start a run…* from the console: the registered workflow names offered, the workflow API's
checks; on SQLite and PostgreSQL."""

from __future__ import annotations

import pytest
from flask import Flask
from flask.testing import FlaskClient
from hypothesis import given
from hypothesis import strategies as st

from flask_harvest.workflows import ExecutionState

from .dashboard_client import PREFIX, signed_in, text
from .properties import BUDGET, TEXT
from .test_dashboard_properties import FORM, encoded
from .test_dashboard_workflows import finished, workflow_dashboard_app
from .workflow_app import TOKEN, database_url_fixture, executions

__all__ = ["database_url_fixture"]

START = f"{PREFIX}/workflows/start"


@pytest.fixture
def app(database_url: str) -> Flask:
    return workflow_dashboard_app(database_url, HARVEST_WORKFLOW_MAX_INPUT_BYTES=1000)


@pytest.fixture
def client(app: Flask) -> FlaskClient:
    return app.test_client()


@pytest.fixture
def csrf(client: FlaskClient) -> str:
    return signed_in(client, TOKEN)


def test_the_registered_names_are_the_choices(client: FlaskClient, csrf: str) -> None:
    page = text(client.get(START))
    for name in ("echo", "three_steps", "sleeper", "gated"):
        assert f'<option value="{name}">{name}</option>' in page
    assert 'id="start-run-link"' in text(client.get(f"{PREFIX}/workflows"))


def test_start_opens_the_new_run(app: Flask, client: FlaskClient, csrf: str) -> None:
    form = {"csrf_token": csrf, "name": "echo", "input": '{"n": 7}', "workflow_id": "order-7"}
    response = client.post(START, data=form)
    assert response.status_code == 303
    execution_id = response.headers["Location"].split("/workflows/")[1].split("?")[0]
    assert finished(app, execution_id) is ExecutionState.COMPLETED
    [run] = executions(app)
    assert (run.execution_id, run.workflow_id, run.input) == (execution_id, "order-7", {"n": 7})
    assert "Started." in text(client.get(response.headers["Location"]))


@pytest.mark.parametrize(
    ("fields", "status", "says"),
    [
        ({"name": "nope"}, 404, "nope"),
        ({"name": "echo", "input": "{"}, 422, "input"),
        ({"name": "echo", "input": '"' + "x" * 2000 + '"'}, 413, ""),
        ({"name": "echo", "policy": "Sometimes"}, 422, "id_reuse_policy"),
        ({"name": ""}, 422, "name"),
        ({"name": "echo", "workflow_id": "a\x00b"}, 422, "workflow_id"),
    ],
)
def test_bad_fields_are_refused_and_start_nothing(
    app: Flask, client: FlaskClient, csrf: str, fields: dict[str, str], status: int, says: str
) -> None:
    response = client.post(START, data={"csrf_token": csrf, **fields})
    assert response.status_code == status, text(response)
    assert says in text(response)
    assert executions(app) == []


def test_start_needs_the_csrf_token(app: Flask, client: FlaskClient, csrf: str) -> None:
    assert client.post(START, data={"name": "echo"}).status_code == 403
    assert executions(app) == []


@BUDGET
@given(
    fields=st.dictionaries(
        st.sampled_from(["name", "input", "workflow_id", "policy"]),
        st.one_of(TEXT, st.sampled_from(["{", "null", "[1]", "AllowDuplicate", "nope", "1e999"])),
        max_size=4,
    )
)
def test_hostile_forms_never_fail_and_refusals_start_nothing(app: Flask, fields: dict[str, str]) -> None:
    """Any form: a page or a 4xx, never a 5xx; a refused one starts nothing."""
    client = app.test_client()
    csrf = signed_in(client, TOKEN)
    before = len(executions(app))
    response = client.post(START, data=encoded({**fields, "csrf_token": csrf}), content_type=FORM)
    assert response.status_code < 500
    if response.status_code >= 400:
        assert len(executions(app)) == before
