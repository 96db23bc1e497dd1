"""The dashboard's workflow and trigger pages through Flask's test client: on SQLite and PostgreSQL
with workflows, completion callbacks and triggers; on every store (memory too) without them."""

from __future__ import annotations

import html
import json
import logging
import re
import time
import uuid
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import pytest
from flask import Flask
from flask.testing import FlaskClient
from markupsafe import escape
from werkzeug import Request, Response

from flask_harvest import (
    InvalidFieldError,
    OutboundWebhookHandler,
    get_engine,
    trigger_service,
)
from flask_harvest.callbacks.outcome import DeliveryState
from flask_harvest.dashboard.paging import PAGE_SIZE
from flask_harvest.testing import CapturingReceiver
from flask_harvest.triggers.conditions import GreaterThan
from flask_harvest.triggers.definitions import CompletionTrigger
from flask_harvest.workflows import ExecutionState

from .dashboard_client import PREFIX, SECRET_KEY, dashboard_app, signed_in, text
from .test_triggers_api import ROOT as TRIGGER_API
from .workflow_app import (
    AUTH,
    TOKEN,
    database_url_fixture,
    executions,
    gate,
    make_workflow_app,
    state_of,
    wait_asleep,
    wait_for,
    wait_in_step,
)

__all__ = ["database_url_fixture"]

SCRIPT = "<script>alert('x')</script>"
#: How a page shows it: as text.
ESCAPED = str(escape(SCRIPT))
TRIGGER_ID = "0a6c4a8e-7d0e-4c5e-9d39-2f1d1c9d4b11"
#: What the completion-callback tests need: loopback targets, one attempt (a failure fails at once).
CALLBACK_SETTINGS: dict[str, Any] = {
    "HARVEST_COMPLETION_CALLBACK_ALLOWLIST": "127.0.0.1",
    "HARVEST_COMPLETION_CALLBACK_ALLOW_PRIVATE_TARGETS": True,
    "HARVEST_COMPLETION_CALLBACK_SECRET": "cb-secret-canary-dashboard-0123",
    "HARVEST_COMPLETION_CALLBACK_MAX_ATTEMPTS": 1,
}


def workflow_dashboard_app(database_url: str, **config: Any) -> Flask:
    """The workflow test app with the dashboard, completion callbacks and triggers."""
    app = make_workflow_app(
        database_url, HARVEST_DASHBOARD=True, SECRET_KEY=SECRET_KEY, **CALLBACK_SETTINGS, **config
    )
    return app


@pytest.fixture
def app(database_url: str) -> Flask:
    return workflow_dashboard_app(database_url)


@pytest.fixture
def client(app: Flask) -> FlaskClient:
    return app.test_client()


@pytest.fixture
def csrf(client: FlaskClient) -> str:
    return signed_in(client, TOKEN)


def start(app: Flask, name: str, value: Any = None, **options: Any) -> str:
    with app.app_context():
        handle, _ = get_engine().workflows.start(name, value, **options)  # type: ignore[union-attr]
    return handle.execution_id


def finished(app: Flask, execution_id: str) -> ExecutionState:
    wait_for(app, execution_id, lambda state, _: state.terminal)
    return state_of(app, execution_id)


def link(page: str, element_id: str) -> str:
    found = re.search(rf'id="{element_id}" href="([^"]+)"', page)
    assert found, f"no link #{element_id}"
    return html.unescape(found.group(1))


# -- without workflows: no pages, no nav entries, no panels ------------------------------------------


def test_pages_are_absent_on_an_app_without_workflows(store: OutboundWebhookHandler) -> None:
    client = dashboard_app(store).test_client()
    signed_in(client)
    overview = text(client.get(f"{PREFIX}/"))
    assert ">Workflows<" not in overview and ">Triggers<" not in overview
    assert "workflows-overview" not in overview and "triggers-overview" not in overview
    for path in ("/workflows", "/workflows/x", "/workflows/x/cancel", "/triggers", "/triggers/new"):
        response = client.get(f"{PREFIX}{path}")
        assert response.status_code == 404, path
        assert "does not use" in text(response)


def test_trigger_pages_are_absent_when_only_workflows_are_used(database_url: str) -> None:
    app = make_workflow_app(database_url, with_triggers=False, HARVEST_DASHBOARD=True, SECRET_KEY=SECRET_KEY)
    client = app.test_client()
    signed_in(client, TOKEN)
    overview = text(client.get(f"{PREFIX}/"))
    assert ">Workflows<" in overview and "workflows-overview" in overview
    assert ">Triggers<" not in overview and "triggers-overview" not in overview
    assert client.get(f"{PREFIX}/triggers").status_code == 404
    execution_id = start(app, "echo", 1)
    finished(app, execution_id)
    page = text(client.get(f"{PREFIX}/workflows/{execution_id}"))
    assert "Trigger fires it caused" not in page


# -- overview and list -----------------------------------------------------------------------------


def test_overview_counts_executions_by_state(app: Flask, client: FlaskClient, csrf: str) -> None:
    for value in (1, 2):
        finished(app, start(app, "echo", value))
    finished(app, start(app, "boom", 1))
    asleep = start(app, "sleeper")
    wait_asleep(app, asleep)
    page = text(client.get(f"{PREFIX}/"))
    assert 'id="workflows-overview"' in page and 'id="triggers-overview"' in page
    nav = page.split("</nav>")[0]
    assert nav.index(">Replay DLQ<") < nav.index(">Workflows<") < nav.index(">Triggers<")
    for state, count in (("Completed", 2), ("Failed", 1), ("Pending", 1), ("Running", 0)):
        assert re.search(rf'id="executions-{state}"><div class="value"><a [^>]+>{count}</a>', page), state


def test_state_counts_stop_at_the_cap(app: Flask) -> None:
    for value in range(3):
        finished(app, start(app, "echo", value))
    with app.app_context():
        service = get_engine().workflows
        assert service is not None
        assert service.state_counts(cap=2)[ExecutionState.COMPLETED] == 2
        assert service.state_counts(cap=10)[ExecutionState.COMPLETED] == 3
        assert service.state_counts(cap=10)[ExecutionState.FAILED] == 0
        # One statement for every state: each count is its own, in ExecutionState's order.
        assert service.state_counts(cap=10) == {
            state: 3 if state is ExecutionState.COMPLETED else 0 for state in ExecutionState
        }
        assert set(service.state_counts(cap=0).values()) == {0}


def test_executions_filter_by_name_and_state_and_page_with_cursors(
    app: Flask, client: FlaskClient, csrf: str
) -> None:
    ids = [start(app, "echo", n) for n in range(PAGE_SIZE + 2)]
    failed = start(app, "boom", 0)
    for execution_id in [*ids, failed]:
        finished(app, execution_id)

    def listed(url: str) -> tuple[list[str], str]:
        page = text(client.get(url))
        return re.findall(r'href="/harvest/workflows/([0-9a-f-]{36})"', page), page

    seen, page = listed(f"{PREFIX}/workflows?name=echo")
    assert len(seen) == PAGE_SIZE and failed not in seen
    rest, last = listed(link(page, "next-page"))
    assert sorted(seen + rest) == sorted(ids) and 'id="next-page"' not in last
    assert listed(f"{PREFIX}/workflows?state=Failed")[0] == [failed]
    assert listed(f"{PREFIX}/workflows?name=boom&state=Completed")[0] == []
    for bad in ("?state=Done", "?cursor=%%%", "?name=a%00b"):
        response = client.get(f"{PREFIX}/workflows{bad}")
        assert response.status_code == 422, bad
        assert "Traceback" not in text(response)


def test_execution_page_shows_input_output_steps_and_escapes(
    app: Flask, client: FlaskClient, csrf: str
) -> None:
    done = start(app, "three_steps", {"note": SCRIPT})
    assert finished(app, done) is ExecutionState.COMPLETED
    page = text(client.get(f"{PREFIX}/workflows/{done}"))
    assert SCRIPT not in page and ESCAPED in page
    assert [m for m in re.findall(r"<strong>(step_\d)</strong>", page)] == ["step_1", "step_2", "step_3"]
    assert 'id="execution-output"' in page and "30" in page
    assert 'id="cancel"' not in page  # an ended run offers no cancel
    failed = start(app, "boom", SCRIPT)
    assert finished(app, failed) is ExecutionState.FAILED
    page = text(client.get(f"{PREFIX}/workflows/{failed}"))
    assert 'id="execution-error"' in page and SCRIPT not in page
    assert "ValueError: boom: " + ESCAPED in page
    missing = client.get(f"{PREFIX}/workflows/00000000-0000-0000-0000-000000000000")
    assert missing.status_code == 404


# -- cancel and terminate --------------------------------------------------------------------------


def test_cancel_a_running_workflow_after_confirming(app: Flask, client: FlaskClient, csrf: str) -> None:
    release = gate("dash-cancel")
    execution_id = start(app, "gated", {"gate": "dash-cancel"})
    wait_in_step("dash-cancel")
    url = f"{PREFIX}/workflows/{execution_id}/cancel"
    page = text(client.get(f"{PREFIX}/workflows/{execution_id}"))
    assert link(page, "cancel") == url
    assert 'id="confirm"' in text(client.get(url))
    before = executions(app)
    assert client.post(url, data={"reason": "x"}).status_code == 403  # no CSRF token
    unticked = client.post(url, data={"reason": SCRIPT, "csrf_token": csrf})
    assert unticked.status_code == 422 and "Tick the box" in text(unticked)
    assert SCRIPT not in text(unticked)
    assert executions(app) == before
    done = client.post(url, data={"reason": "operator", "confirm": "yes", "csrf_token": csrf})
    assert done.status_code == 303
    assert "Cancel requested." in text(client.get(done.headers["Location"]))
    release.set()
    assert finished(app, execution_id) is ExecutionState.CANCELLED
    again = client.post(url, data={"confirm": "yes", "csrf_token": csrf})
    assert again.status_code == 409
    assert 'id="already-ended"' in text(client.get(url))


def test_terminate_after_confirming(app: Flask, client: FlaskClient, csrf: str) -> None:
    execution_id = start(app, "sleeper")
    wait_asleep(app, execution_id)
    url = f"{PREFIX}/workflows/{execution_id}/terminate"
    assert client.post(url, data={"csrf_token": csrf}).status_code == 422
    assert state_of(app, execution_id) is ExecutionState.PENDING
    bad = client.post(url, data={"confirm": "yes", "reason": "a\x00b", "csrf_token": csrf})
    assert bad.status_code == 422
    assert state_of(app, execution_id) is ExecutionState.PENDING
    done = client.post(url, data={"confirm": "yes", "reason": "stuck", "csrf_token": csrf})
    assert done.status_code == 303
    assert state_of(app, execution_id) is ExecutionState.TERMINATED
    assert "Terminated." in text(client.get(done.headers["Location"]))
    assert (
        client.post(
            f"{PREFIX}/workflows/nope/terminate", data={"confirm": "yes", "csrf_token": csrf}
        ).status_code
        == 404
    )


# -- completion callbacks --------------------------------------------------------------------------


def test_redrive_a_failed_completion_callback(
    app: Flask, client: FlaskClient, csrf: str, receiver: CapturingReceiver
) -> None:
    receiver.respond("/done", 500, "no", times=1)
    execution_id = start(app, "echo", 7, completion_callbacks=[{"url": receiver.url("/done")}])
    finished(app, execution_id)
    with app.app_context():
        callbacks = get_engine().callbacks
        assert callbacks is not None

        def delivery_state() -> DeliveryState:
            [row] = callbacks.deliveries(execution_id)
            return row.state

        wait_until(lambda: delivery_state() is DeliveryState.DLQ)
        [row] = callbacks.deliveries(execution_id)
    page = text(client.get(f"{PREFIX}/workflows/{execution_id}"))
    assert 'class="redrive"' in page and row.delivery_id in page
    url = f"{PREFIX}/workflows/{execution_id}/completion-deliveries/{row.delivery_id}/redrive"
    assert client.post(url).status_code == 403
    with app.app_context():
        assert delivery_state() is DeliveryState.DLQ
    done = client.post(url, data={"csrf_token": csrf})
    assert done.status_code == 303
    assert "redriven" in text(client.get(done.headers["Location"]))
    with app.app_context():
        wait_until(lambda: delivery_state() is DeliveryState.DELIVERED)
    assert len(receiver.wait_for(2, path="/done")) == 2
    page = text(client.get(f"{PREFIX}/workflows/{execution_id}"))
    assert 'class="redrive"' not in page and "state-delivered" in page
    again = client.post(url, data={"csrf_token": csrf})
    assert "has not failed" in text(client.get(again.headers["Location"]))
    other = f"{PREFIX}/workflows/{execution_id}/completion-deliveries/{execution_id}/redrive"
    assert client.post(other, data={"csrf_token": csrf}).status_code == 404
    surrogate = f"{PREFIX}/workflows/{execution_id}/completion-deliveries/%ED%A0%80/redrive"
    assert client.post(surrogate, data={"csrf_token": csrf}).status_code in (400, 404)
    with app.app_context(), pytest.raises(InvalidFieldError, match="is not an id"):
        callbacks.redrive(execution_id, "a\ud800")


def test_a_callback_url_is_redacted_wherever_it_is_shown_or_logged(
    app: Flask, client: FlaskClient, csrf: str, receiver: CapturingReceiver, caplog: pytest.LogCaptureFixture
) -> None:
    credential = "cb-QUERY-CANARY-4f2a"
    sent: list[str] = []

    def record(request: Request) -> Response:
        sent.append(request.full_path)
        return Response("", status=204)

    receiver.handle("/done", record)
    url = receiver.url(f"/done?token={credential}&tenant=7")
    with caplog.at_level(logging.DEBUG):  # the transport's own and urllib3's debug lines too
        execution_id = start(app, "echo", 1, completion_callbacks=[{"url": url}])
        finished(app, execution_id)
        with app.app_context():
            callbacks = get_engine().callbacks
            assert callbacks is not None
            wait_until(lambda: callbacks.deliveries(execution_id)[0].state is DeliveryState.DELIVERED)
            [row] = callbacks.deliveries(execution_id)
    shown = receiver.url("/done?token=***&tenant=***")
    # What is stored and where the POST goes stay whole.
    assert row.target_url == url and sent == [f"/done?token={credential}&tenant=7"]
    # The admin API.
    listed = client.get(f"/api/harvest/workflows/{execution_id}/completion-deliveries", headers=AUTH)
    assert listed.status_code == 200 and credential not in listed.get_data(as_text=True)
    assert listed.get_json()["deliveries"][0]["target_url"] == shown
    # The dashboard.
    page = text(client.get(f"{PREFIX}/workflows/{execution_id}"))
    assert credential not in page and html.escape(shown) in page
    # The CLI, as a table and as JSON.
    runner = app.test_cli_runner()
    for args in ([], ["--json"]):
        result = runner.invoke(args=["harvest", "callbacks", "list", execution_id, *args])
        assert result.exit_code == 0, result.output
        assert credential not in result.output and "token=***" in result.output
    # Logs at every level, and the repr a signal receiver might log.
    # (werkzeug's access log is the test receiver's, the other end of the wire: it sees the URL.)
    logged = [r.getMessage() for r in caplog.records if r.name != "werkzeug"]
    assert any("token=***" in m for m in logged)  # urllib3's request line, redacted
    assert not [m for m in logged if credential in m]
    assert credential not in repr(row) and "token=***" in repr(row)


def wait_until(check: Callable[[], bool], timeout: float = 20.0) -> None:
    end = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < end, "never happened"
        time.sleep(0.02)


# -- triggers --------------------------------------------------------------------------------------


def test_fires_and_skips_on_the_execution_and_trigger_pages(
    app: Flask, client: FlaskClient, csrf: str
) -> None:
    with app.app_context():
        trigger_service().register(
            CompletionTrigger(
                "echo",
                "three_steps",
                condition=GreaterThan("n", 5),
                id=TRIGGER_ID,
            )
        )
        # A target that only another process would know: its failed starts are in the ledger.
        trigger_service().register(CompletionTrigger("echo", "elsewhere"), allow_unknown_workflows=True)
    fired = start(app, "echo", {"n": 9})
    skipped = start(app, "echo", {"n": 1})
    for execution_id in (fired, skipped):
        finished(app, execution_id)
    page = text(client.get(f"{PREFIX}/workflows/{fired}"))
    assert 'id="trigger-fires"' in page and ">fired<" in page
    [target] = re.findall(r'href="/harvest/workflows/([0-9a-f-]{36})"', page.split('id="trigger-fires"')[1])
    assert target != fired
    assert "not started: validation_failed" in page
    assert "skipped: condition_unmet" in text(client.get(f"{PREFIX}/workflows/{skipped}"))
    detail = text(client.get(f"{PREFIX}/triggers/{TRIGGER_ID}"))
    assert "skipped: condition_unmet" in detail and ">fired<" in detail
    assert fired in detail and skipped in detail and '"GreaterThan"' in html.unescape(detail)
    listing = text(client.get(f"{PREFIX}/triggers"))
    assert TRIGGER_ID in listing and "GreaterThan" in listing
    overview = text(client.get(f"{PREFIX}/"))
    assert 'id="trigger-count"><div class="value"><a' in overview and "condition_unmet" in overview
    assert client.get(f"{PREFIX}/triggers/{'1' * 36}").status_code == 404


def test_the_trigger_list_pages_with_a_cursor(app: Flask, client: FlaskClient, csrf: str) -> None:
    with app.app_context():
        register = trigger_service().register
        ids = [str(uuid.uuid4()) for _ in range(PAGE_SIZE + 1)]
        registered = [register(CompletionTrigger("echo", "three_steps", id=ident)).id for ident in ids]
    first = text(client.get(f"{PREFIX}/triggers"))
    shown = re.findall(r'href="/harvest/triggers/([0-9a-f-]{36})"', first)
    assert len(shown) == PAGE_SIZE
    second = text(client.get(link(first, "next-page")))
    rest = re.findall(r'href="/harvest/triggers/([0-9a-f-]{36})"', second)
    assert sorted(shown + rest) == sorted(registered)
    assert 'id="next-page"' not in second
    assert client.get(f"{PREFIX}/triggers?cursor=bogus").status_code == 422


def stored(app: Flask) -> list[Any]:
    with app.app_context():
        return [
            (t.id, t.source_workflow_name, t.condition, t.updated_at)
            for t in trigger_service().list_triggers()
        ]


def form(**changes: Any) -> dict[str, Any]:
    data: dict[str, Any] = {
        "source_workflow_name": "echo",
        "target_workflow_name": "three_steps",
        "terminal_states": ["Completed", "Failed"],
        "input_mapping": '{"type": "Passthrough"}',
        "condition": '{"type": "Eq", "data": {"path": "n", "value": 1}}',
    }
    data.update(changes)
    return data


INVALID_CONDITIONS = [
    '{"type": "Eq", "data": {"path": "n"}}',
    '{"type": "Bogus", "data": {}}',
    '{"type": "GreaterThan", "data": {"path": "a..b", "value": 1}}',
    '{"type": "In", "data": {"path": "n", "values": 3}}',
    "[]",
]


@pytest.mark.parametrize("condition", INVALID_CONDITIONS)
def test_an_invalid_condition_shows_the_admin_apis_error_and_changes_nothing(
    app: Flask, client: FlaskClient, csrf: str, condition: str
) -> None:
    api = client.post(
        TRIGGER_API,
        json={
            **{k: v for k, v in form().items() if k not in ("input_mapping", "condition")},
            "condition": json.loads(condition),
        },
        headers=AUTH,
    )
    assert api.status_code == 400
    message = api.get_json()["error"]["message"]
    before = stored(app)
    response = client.post(f"{PREFIX}/triggers/new", data={**form(condition=condition), "csrf_token": csrf})
    assert response.status_code == 400
    page = text(response)
    shown = re.search(r'id="form-error">([^<]*)<', page)
    assert shown and html.unescape(shown.group(1)) == message
    assert str(escape(condition)) in page  # the form keeps what was typed
    assert stored(app) == before


def test_register_then_edit_a_trigger(app: Flask, client: FlaskClient, csrf: str) -> None:
    assert 'id="save-trigger"' in text(client.get(f"{PREFIX}/triggers/new"))
    created = client.post(f"{PREFIX}/triggers/new", data={**form(id=TRIGGER_ID), "csrf_token": csrf})
    assert created.status_code == 303, text(created)
    assert created.headers["Location"] == f"{PREFIX}/triggers/{TRIGGER_ID}?done=saved"
    with app.app_context():
        trigger = trigger_service().get(TRIGGER_ID).parse()
    assert trigger.terminal_states == ("Completed", "Failed")
    assert trigger.condition is not None
    edit_url = f"{PREFIX}/triggers/{TRIGGER_ID}/edit"
    edit_page = html.unescape(text(client.get(edit_url)))
    assert '"Eq"' in edit_page and 'value="Failed" checked' in edit_page
    before = stored(app)
    bad_json = client.post(edit_url, data={**form(condition="{not json"), "csrf_token": csrf})
    assert bad_json.status_code == 400 and "condition: is not valid JSON" in text(bad_json)
    no_state = client.post(edit_url, data={**form(terminal_states=[]), "csrf_token": csrf})
    assert no_state.status_code == 400 and "terminal_states: must name at least one" in text(no_state)
    no_source = client.post(edit_url, data={**form(source_workflow_name=""), "csrf_token": csrf})
    assert no_source.status_code == 400 and "source_workflow_name: is required" in text(no_source)
    assert client.post(edit_url, data=form(condition="")).status_code == 403  # no CSRF token
    unknown = client.post(edit_url, data={**form(source_workflow_name=SCRIPT), "csrf_token": csrf})
    assert unknown.status_code == 400
    assert "source_workflow_name: no workflow named" in html.unescape(text(unknown))
    assert SCRIPT not in text(unknown)
    assert stored(app) == before
    cleared = client.post(edit_url, data={**form(condition=""), "csrf_token": csrf})
    assert cleared.status_code == 303
    with app.app_context():
        trigger = trigger_service().get(TRIGGER_ID).parse()
        assert trigger.condition is None
        # A name that only other processes register (allowed explicitly) is shown as text.
        trigger_service().register(
            replace(trigger, source_workflow_name=SCRIPT), allow_unknown_workflows=True
        )
    for path in ("", "/edit"):
        page = text(client.get(f"{PREFIX}/triggers/{TRIGGER_ID}{path}"))
        assert SCRIPT not in page and ESCAPED in page
    assert SCRIPT not in text(client.get(f"{PREFIX}/triggers"))
    assert client.get(f"{PREFIX}/triggers/nope/edit").status_code == 404
