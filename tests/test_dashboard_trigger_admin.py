"""Triggers from the console: delete after a confirmation; triggers declared in code read-only;
on SQLite and PostgreSQL."""

from __future__ import annotations

import uuid

import pytest
from flask import Flask
from flask.testing import FlaskClient
from hypothesis import given
from hypothesis import strategies as st

from flask_harvest import trigger_service
from flask_harvest.triggers.definitions import CompletionTrigger

from .dashboard_client import PREFIX, signed_in, text
from .properties import BUDGET, TEXT
from .test_dashboard_properties import FORM, encoded
from .test_dashboard_workflows import workflow_dashboard_app
from .workflow_app import TOKEN, database_url_fixture

__all__ = ["database_url_fixture"]

IN_CODE = "5b1f0c8e-1d2a-4e6b-9c3d-7a8b9c0d1e2f"


@pytest.fixture
def app(database_url: str) -> Flask:
    in_code = CompletionTrigger("echo", "three_steps", id=IN_CODE)
    return workflow_dashboard_app(database_url, triggers=[in_code])


@pytest.fixture
def client(app: Flask) -> FlaskClient:
    return app.test_client()


@pytest.fixture
def csrf(client: FlaskClient) -> str:
    return signed_in(client, TOKEN)


def registered(app: Flask) -> str:
    with app.app_context():
        return trigger_service().register(CompletionTrigger("echo", "three_steps", id=str(uuid.uuid4()))).id


def trigger_ids(app: Flask) -> set[str]:
    with app.app_context():
        return {t.id for t in trigger_service().list_triggers()}


def test_delete_after_a_confirmation(app: Flask, client: FlaskClient, csrf: str) -> None:
    trigger_id = registered(app)
    page = text(client.get(f"{PREFIX}/triggers/{trigger_id}"))
    assert 'id="delete-trigger"' in page and 'id="edit-trigger"' in page
    url = f"{PREFIX}/triggers/{trigger_id}/delete"
    assert 'id="confirm-delete"' in text(client.get(url))
    assert client.post(url, data={"csrf_token": csrf}).status_code == 422
    assert client.post(url, data={"confirm": "yes"}).status_code == 403
    assert trigger_id in trigger_ids(app)
    done = client.post(url, data={"confirm": "yes", "csrf_token": csrf})
    assert done.status_code == 303
    assert "Deleted." in text(client.get(done.headers["Location"]))
    assert trigger_id not in trigger_ids(app)
    assert client.get(url).status_code == 404


def test_a_trigger_declared_in_code_is_read_only(app: Flask, client: FlaskClient, csrf: str) -> None:
    """The pages say the next start-up overwrites it, offer no edit or delete, and refuse both."""
    page = text(client.get(f"{PREFIX}/triggers/{IN_CODE}"))
    assert 'id="code-defined"' in page and "next start-up" in page
    assert 'id="edit-trigger"' not in page and 'id="delete-trigger"' not in page
    assert "in code</span>" in text(client.get(f"{PREFIX}/triggers"))
    for path in ("delete", "edit"):
        url = f"{PREFIX}/triggers/{IN_CODE}/{path}"
        assert client.get(url).status_code == 409
        form = {"confirm": "yes", "csrf_token": csrf, "source_workflow_name": "echo"}
        refused = client.post(url, data=form)
        assert refused.status_code == 409 and "next start-up" in text(refused)
    assert IN_CODE in trigger_ids(app)


def test_workflow_names_are_offered_when_registering(client: FlaskClient, csrf: str) -> None:
    page = text(client.get(f"{PREFIX}/triggers/new"))
    assert '<datalist id="workflow-names">' in page
    for name in ("echo", "three_steps", "sleeper"):
        assert f'<option value="{name}">' in page


@BUDGET
@given(
    fields=st.dictionaries(
        st.sampled_from(["confirm", "csrf_token"]), st.one_of(TEXT, st.just("yes")), max_size=2
    ),
    trigger_id=st.one_of(TEXT, st.just(IN_CODE)),
)
def test_hostile_deletes_never_fail(app: Flask, fields: dict[str, str], trigger_id: str) -> None:
    """Any form and id: a page or a 4xx, never a 5xx; the trigger declared in code stays."""
    client = app.test_client()
    csrf = signed_in(client, TOKEN)
    url = f"{PREFIX}/triggers/{encoded({'x': trigger_id})[2:] or 'x'}/delete"
    response = client.post(url, data=encoded({"csrf_token": csrf, **fields}), content_type=FORM)
    assert response.status_code < 500
    assert IN_CODE in trigger_ids(app)
