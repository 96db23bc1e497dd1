"""The failed completion callbacks of every execution on one page, with bulk redrive; on SQLite
and PostgreSQL."""

from __future__ import annotations

import re
from typing import Any

import pytest
from flask import Flask
from flask.testing import FlaskClient
from hypothesis import given
from hypothesis import strategies as st

from flask_harvest import OutboundWebhookHandler, get_engine
from flask_harvest.callbacks.outcome import DeliveryState
from flask_harvest.testing import CapturingReceiver

from .dashboard_client import PREFIX, dashboard_app, signed_in, text
from .properties import BUDGET, TEXT
from .test_dashboard_properties import FORM, encoded
from .test_dashboard_workflows import finished, start, wait_until, workflow_dashboard_app
from .workflow_app import TOKEN, database_url_fixture

__all__ = ["database_url_fixture"]

LIST = f"{PREFIX}/workflows/completion-deliveries/failed"
REDRIVE = f"{PREFIX}/workflows/completion-deliveries/redrive-selected"


@pytest.fixture
def app(database_url: str) -> Flask:
    return workflow_dashboard_app(database_url)


@pytest.fixture
def client(app: Flask) -> FlaskClient:
    return app.test_client()


@pytest.fixture
def csrf(client: FlaskClient) -> str:
    return signed_in(client, TOKEN)


def states(app: Flask) -> dict[str, DeliveryState]:
    with app.app_context():
        callbacks = get_engine().callbacks
        assert callbacks is not None
        page, _ = callbacks.failed_page(limit=500)
        failed = {row.delivery_id: row.state for row in page}
    return failed


def failed_runs(app: Flask, receiver: CapturingReceiver, count: int) -> list[str]:
    """``count`` finished runs whose one completion callback failed (one attempt, answered 500)."""
    receiver.respond("/done", 500, "no", times=count)
    ids = [start(app, "echo", n, completion_callbacks=[{"url": receiver.url("/done")}]) for n in range(count)]
    for execution_id in ids:
        finished(app, execution_id)
    wait_until(lambda: len(states(app)) == count)
    return ids


def test_the_list_shows_the_failed_callbacks_of_every_run(
    app: Flask, client: FlaskClient, csrf: str, receiver: CapturingReceiver
) -> None:
    empty = text(client.get(LIST))
    assert "No failed completion callback." in empty and 'id="callback-select"' not in empty
    assert ">Failed callbacks<" in empty  # in the navigation
    runs = failed_runs(app, receiver, 3)
    page = text(client.get(LIST))
    for execution_id in runs:
        assert f"/workflows/{execution_id}" in page
    assert sorted(re.findall(r'name="delivery_id" value="([^"]+)"', page)) == sorted(states(app))
    assert 'id="redrive-selected"' in page and 'id="page-range"' in page


def test_redrive_selected_and_all_shown(
    app: Flask, client: FlaskClient, csrf: str, receiver: CapturingReceiver
) -> None:
    """The ticked ones are sent again with the same ids; then every one shown; one no longer
    failed is listed as not redriven."""
    failed_runs(app, receiver, 3)
    first, *rest = sorted(states(app))
    response = client.post(REDRIVE, data={"csrf_token": csrf, "action": "selected", "delivery_id": [first]})
    assert response.status_code == 200 and first in text(response).split('id="redriven"')[1]
    wait_until(lambda: first not in states(app))
    response = client.post(REDRIVE, data={"csrf_token": csrf, "action": "all", "shown": [first, *rest]})
    page = text(response)
    assert response.status_code == 200
    assert first in page.split('id="not-redriven"')[1]
    assert all(d in page.split('id="redriven"')[1].split('id="not-redriven"')[0] for d in rest)
    wait_until(lambda: not states(app))
    # Each was delivered again with its own id: six requests in all (three failed, three sent).
    assert len(receiver.wait_for(6, path="/done")) == 6


@pytest.mark.parametrize(
    "data",
    [{"action": "selected"}, {"action": "all"}, {"action": "x", "shown": ["a"]}, {"delivery_id": ["a"]},
     {"action": "selected", "delivery_id": ["a\x00"]}, {"action": "selected", "delivery_id": ["x"] * 51}],
)  # fmt: skip
def test_bad_forms_are_refused(client: FlaskClient, csrf: str, data: dict[str, Any]) -> None:
    assert client.post(REDRIVE, data={"csrf_token": csrf, **data}).status_code == 422


def test_redrive_needs_the_csrf_token(
    app: Flask, client: FlaskClient, csrf: str, receiver: CapturingReceiver
) -> None:
    failed_runs(app, receiver, 1)
    before = states(app)
    assert client.post(REDRIVE, data={"action": "all", "shown": list(before)}).status_code == 403
    assert states(app) == before


def test_absent_without_completion_callbacks(store: OutboundWebhookHandler) -> None:
    client = dashboard_app(store).test_client()
    csrf = signed_in(client)
    assert ">Failed callbacks<" not in text(client.get(f"{PREFIX}/"))
    assert client.get(LIST).status_code == 404
    assert client.post(REDRIVE, data={"csrf_token": csrf, "action": "all", "shown": ["a"]}).status_code == 404


@BUDGET
@given(
    fields=st.dictionaries(
        st.sampled_from(["action", "delivery_id", "shown", "cursor", "page", "trail"]),
        st.one_of(TEXT, st.sampled_from(["selected", "all", "", "1"])),
        max_size=3,
    )
)
def test_hostile_input_never_fails(app: Flask, fields: dict[str, str]) -> None:
    """Any form or query: a page or a 4xx, never a 5xx."""
    client = app.test_client()
    csrf = signed_in(client, TOKEN)
    response = client.post(REDRIVE, data=encoded({**fields, "csrf_token": csrf}), content_type=FORM)
    assert response.status_code < 500
    assert client.get(LIST, query_string=encoded(fields)).status_code < 500
