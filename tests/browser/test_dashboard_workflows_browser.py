"""The dashboard's workflow and trigger pages in headless chromium, against a live app on PostgreSQL,
Redis, a ``flask harvest worker`` subprocess running the workflows, and a receiver for completion
callbacks. Each page's screenshot is saved (into the docs with ``HARVEST_UPDATE_SCREENSHOTS=1``)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from flask import Flask
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver

from flask_harvest import InvalidFieldError, get_engine, trigger_service, workflow_service
from flask_harvest.callbacks.outcome import DeliveryState
from flask_harvest.triggers.conditions import GreaterThan
from flask_harvest.triggers.definitions import CompletionTrigger, trigger_from_json
from flask_harvest.workflows import Execution, ExecutionState

from ..dashboard_client import PREFIX
from .conftest import Live, wait_until
from .test_dashboard_browser import by_id, shot, sign_in, submit_and_wait

pytestmark = [pytest.mark.postgres, pytest.mark.redis, pytest.mark.slow]

TRIGGER_ID = "5b1f7a52-0c8e-4a0a-bd7e-3f9b1e0c2d44"
SCRIPT_INPUT = {"region": "EU", "note": "<script>document.title='pwned'</script>"}


def full_shot(browser: WebDriver, live: Live, name: str) -> None:
    """A screenshot of the whole page, not only the window (the window's size is put back)."""
    width, height = browser.get_window_size()["width"], browser.get_window_size()["height"]
    page_height = browser.execute_script("return document.documentElement.scrollHeight")
    browser.set_window_size(width, max(height, int(page_height) + 140))
    try:
        shot(browser, live, name)
    finally:
        browser.set_window_size(width, height)


def start(app: Flask, name: str, value: Any = None, **options: Any) -> str:
    with app.app_context():
        handle, _ = workflow_service().start(name, value, **options)
    return handle.execution_id


def execution(app: Flask, execution_id: str) -> Execution:
    with app.app_context():
        return workflow_service().get(execution_id)


def wait_state(app: Flask, execution_id: str, check: Any, what: str, timeout: float = 30.0) -> None:
    """Wait until the worker has moved the run where ``check(execution)`` holds (a deadline, not a
    timing assertion)."""
    wait_until(lambda: check(execution(app, execution_id)), timeout, what)


def callback_state(app: Flask, execution_id: str) -> DeliveryState | None:
    with app.app_context():
        callbacks = get_engine().callbacks
        assert callbacks is not None
        rows = callbacks.deliveries(execution_id)
    return rows[0].state if rows else None


def test_every_workflow_and_trigger_page_is_refused_without_sign_in(
    browser: WebDriver, live_workflows: Live
) -> None:
    live = live_workflows
    with live.app.app_context():
        trigger_service().register(CompletionTrigger("import_orders", "send_report", id=TRIGGER_ID))
    execution_id = start(live.app, "import_orders", {"region": "EU"})
    pages = [
        "/workflows",
        f"/workflows/{execution_id}",
        f"/workflows/{execution_id}/cancel",
        f"/workflows/{execution_id}/terminate",
        "/triggers",
        "/triggers/new",
        f"/triggers/{TRIGGER_ID}",
        f"/triggers/{TRIGGER_ID}/edit",
    ]
    for path in pages:
        browser.get(live.page(PREFIX + path))
        assert "/sign-in" in browser.current_url, path
        assert browser.find_element(By.TAG_NAME, "h1").text == "Sign in"
        assert not browser.find_elements(By.CSS_SELECTOR, "table, nav a, textarea")
        assert execution_id not in browser.page_source.split('name="next"')[0]


def test_cancel_a_running_workflow(browser: WebDriver, live_workflows: Live) -> None:
    live = live_workflows
    for value in ({"region": "EU"}, {"region": "US"}):
        start(live.app, "import_orders", value)
    running = start(live.app, "long_running", SCRIPT_INPUT, workflow_id="nightly-sync")
    wait_state(
        live.app,
        running,
        lambda e: e.state is ExecutionState.RUNNING and len(_steps(live.app, running)) >= 2,
        "the run to be running its steps",
    )
    sign_in(browser, live)
    browser.get(live.page(f"{PREFIX}/"))
    assert by_id(browser, "executions-Running").text.startswith("1")
    full_shot(browser, live, "overview-workflows")
    browser.get(live.page(f"{PREFIX}/workflows"))
    assert running in by_id(browser, "executions").text
    shot(browser, live, "workflows")
    submit_and_wait(browser, browser.find_element(By.LINK_TEXT, running))
    assert by_id(browser, "execution-state").text.startswith("Running")
    # The <script> in the input is text on the page, never a script.
    assert "<script>document.title='pwned'</script>" in by_id(browser, "execution-input").text
    assert browser.find_elements(By.TAG_NAME, "script") == []
    assert "pwned" not in browser.title
    assert "tick_0" in by_id(browser, "steps").text

    submit_and_wait(browser, by_id(browser, "cancel"))
    shot(browser, live, "workflow-cancel")
    by_id(browser, "reason").send_keys("deploy window")
    # Without the box ticked the browser itself refuses to send the form (required); the server
    # refuses it too (the Flask-client tests send one).
    by_id(browser, "confirm").click()
    submit_and_wait(browser, by_id(browser, "confirm-cancel"))
    assert "Cancel requested." in by_id(browser, "notice").text
    wait_state(live.app, running, lambda e: e.state is ExecutionState.CANCELLED, "the run to be cancelled")
    browser.refresh()
    assert by_id(browser, "execution-state").text == "Cancelled"
    assert not browser.find_elements(By.ID, "cancel")


def _steps(app: Flask, execution_id: str) -> list[Any]:
    with app.app_context():
        return workflow_service().steps(execution_id)


def test_redrive_a_failed_completion_callback_and_see_it_delivered(
    browser: WebDriver, live_workflows: Live
) -> None:
    live = live_workflows
    with live.app.app_context():
        trigger_service().register(
            CompletionTrigger(
                "import_orders", "send_report", condition=GreaterThan("imported", 2), id=TRIGGER_ID
            )
        )
    live.receiver.respond("/workflow-done", 500, "down for maintenance", times=1)
    execution_id = start(
        live.app,
        "import_orders",
        {"region": "EU"},
        completion_callbacks=[{"url": live.receiver.url("/workflow-done")}],
    )
    wait_until(
        lambda: callback_state(live.app, execution_id) is DeliveryState.DLQ, 30, "the callback to fail"
    )
    sign_in(browser, live)
    browser.get(live.page(f"{PREFIX}/workflows/{execution_id}"))
    assert by_id(browser, "execution-state").text == "Completed"
    assert "fetch" in by_id(browser, "steps").text and "store" in by_id(browser, "steps").text
    assert "failed" in by_id(browser, "completion-deliveries").text
    assert "fired" in by_id(browser, "trigger-fires").text
    full_shot(browser, live, "workflow-execution")
    submit_and_wait(browser, browser.find_element(By.CSS_SELECTOR, "button.redrive"))
    assert "redriven" in by_id(browser, "notice").text
    wait_until(
        lambda: callback_state(live.app, execution_id) is DeliveryState.DELIVERED,
        30,
        "the redriven callback to be delivered",
    )
    browser.refresh()
    assert "delivered" in by_id(browser, "completion-deliveries").text
    assert not browser.find_elements(By.CSS_SELECTOR, "button.redrive")
    assert len(live.receiver.wait_for(2, path="/workflow-done")) == 2


def test_register_a_trigger_with_an_invalid_condition_and_see_the_error(
    browser: WebDriver, live_workflows: Live
) -> None:
    live = live_workflows
    with live.app.app_context():
        trigger_service().register(
            CompletionTrigger(
                "import_orders", "send_report", condition=GreaterThan("imported", 5), id=TRIGGER_ID
            )
        )
    for _ in range(2):
        start(live.app, "import_orders", {"region": "EU"})
    wait_until(lambda: _fires(live.app) >= 2, 30, "the trigger's skips")
    sign_in(browser, live)
    browser.get(live.page(f"{PREFIX}/triggers"))
    assert TRIGGER_ID in by_id(browser, "triggers").text
    shot(browser, live, "triggers")
    submit_and_wait(browser, browser.find_element(By.LINK_TEXT, TRIGGER_ID))
    assert "skipped: condition_unmet" in by_id(browser, "fires").text
    full_shot(browser, live, "trigger")

    browser.get(live.page(f"{PREFIX}/triggers/new"))
    by_id(browser, "t-source").send_keys("import_orders")
    by_id(browser, "t-target").send_keys("send_report")
    condition = {"type": "GreaterThan", "data": {"path": "imported"}}
    by_id(browser, "t-condition").send_keys(json.dumps(condition))
    submit_and_wait(browser, by_id(browser, "save-trigger"))
    # The admin API's message for the same definition (its 400 says str() of this error).
    with pytest.raises(InvalidFieldError) as refused:
        trigger_from_json(
            {
                "source_workflow_name": "import_orders",
                "target_workflow_name": "send_report",
                "condition": condition,
            }
        )
    assert by_id(browser, "form-error").text == str(refused.value)
    # The form keeps what was typed, and nothing was registered.
    assert '"path": "imported"' in by_id(browser, "t-condition").get_attribute("value")
    with live.app.app_context():
        assert [t.id for t in trigger_service().list_triggers()] == [TRIGGER_ID]
    full_shot(browser, live, "trigger-form-error")


def _fires(app: Flask) -> int:
    with app.app_context():
        return len(trigger_service().fires(limit=100))
