"""Accessibility and small screens, in headless chromium: axe-core finds no serious or critical
violation on any dashboard page, and no page scrolls sideways at 1280x800 or on a 390-pixel-wide
phone screen.

axe-core is npm's package, installed into ``tests/browser/node_modules_axe`` (``npm install
--prefix tests/browser/node_modules_axe axe-core@4``; ``.ci/run`` does it when missing). Without
it these tests are skipped, and under ``CI=true`` they fail. It is run through WebDriver, which
the pages' Content-Security-Policy does not govern: the pages themselves still run no script.
"""

from __future__ import annotations

import json

import pytest
from selenium.webdriver.remote.webdriver import WebDriver

from flask_harvest import WebhookSubscription, generate_secret, get_engine, trigger_service
from flask_harvest.triggers.definitions import CompletionTrigger

from ..dashboard_client import PREFIX
from .conftest import Live, violations
from .test_dashboard_browser import sign_in
from .test_dashboard_workflows_browser import full_shot, start, wait_state

pytestmark = [pytest.mark.postgres, pytest.mark.redis, pytest.mark.slow]

#: (width, height) of the screens every page must fit without scrolling sideways.
SCREENS = {"desktop": (1280, 800), "phone": (390, 844)}
NOWHERE = "http://127.0.0.1:9/none"
TRIGGER_ID = "7c2b9a1e-3f4d-4b8a-9e6f-0a1b2c3d4e5f"
#: The pages whose screenshots the docs show, by the start of their path: the file's name.
SHOTS = {
    "/search?": "console-search-not-found",
    "/webhooks/subscriptions/new": "console-subscription-new",
    "/webhooks/subscriptions/sub_a11y": "console-subscription-health",
    "/webhooks/deliveries": "console-deliveries",
    "/workflows/start": "console-start-run",
    "/workflows/completion-deliveries/failed": "console-failed-callbacks",
}
#: The pages shot on the phone screen.
PHONE_SHOTS = {"/": "console-phone-overview", "/webhooks/deliveries": "console-phone-deliveries"}


@pytest.fixture
def pages(live_workflows: Live, browser: WebDriver) -> list[str]:
    """Every page of the dashboard (of each kind) with data on it, signed in."""
    app = live_workflows.app
    with app.app_context():
        engine = get_engine()
        engine.operations.store.add_subscription(
            WebhookSubscription(NOWHERE, ["order.created"], generate_secret(), id="sub_a11y")
        )
        [delivery_id] = engine.manager.dispatch("order.created", {"n": 1})
        # So that the event catalog page shows a type.
        engine.manager.catalog.register(
            "order.shipped",
            description="An order left the warehouse.",
            schema={
                "type": "object",
                "required": ["order_id"],
                "properties": {"order_id": {"type": "string"}},
            },
            example={"order_id": "ord_1"},
        )
        trigger_service().register(CompletionTrigger("import_orders", "send_report", id=TRIGGER_ID))
    execution_id = start(app, "import_orders", {"orders": 2})
    wait_state(app, execution_id, lambda e: e.state.terminal, "the run to end")
    sign_in(browser, live_workflows)
    return [
        "/",
        "/webhooks/subscriptions",
        "/webhooks/subscriptions/new",
        "/webhooks/subscriptions/sub_a11y",
        "/webhooks/subscriptions/sub_a11y/delete",
        "/webhooks/deliveries",
        f"/webhooks/deliveries/{delivery_id}",
        "/webhooks/replay",
        "/webhooks/event-types",
        "/search?q=nothing-has-this-id",
        "/workflows",
        "/workflows/start",
        f"/workflows/{execution_id}",
        f"/workflows/{execution_id}/fork?from_step=0",
        "/workflows/completion-deliveries/failed",
        "/workflow-queues",
        "/workflow-schedules",
        "/triggers",
        "/triggers/new",
        f"/triggers/{TRIGGER_ID}",
        f"/triggers/{TRIGGER_ID}/delete",
    ]


def test_no_page_has_a_serious_accessibility_violation(
    live_workflows: Live, browser: WebDriver, pages: list[str], axe_source: str
) -> None:
    """axe-core on every page, signed in and on the sign-in form: no serious or critical violation."""
    found = {}
    browser.set_window_size(*SCREENS["desktop"])
    for path in pages:
        browser.get(live_workflows.page(f"{PREFIX}{path}"))
        bad = violations(browser, axe_source)
        if bad:
            found[path] = bad
        if path in SHOTS or path.startswith("/search?"):
            full_shot(browser, live_workflows, SHOTS.get(path) or SHOTS["/search?"])
        elif path.startswith("/workflows/") and path.count("/") == 2 and path not in ("/workflows/start",):
            full_shot(browser, live_workflows, "console-run-timeline")
    browser.delete_all_cookies()
    browser.get(live_workflows.page(f"{PREFIX}/sign-in"))
    if bad := violations(browser, axe_source):
        found["/sign-in"] = bad
    assert not found, json.dumps(found, indent=2)


@pytest.mark.parametrize("screen", sorted(SCREENS))
def test_no_page_scrolls_sideways(
    live_workflows: Live, browser: WebDriver, pages: list[str], screen: str
) -> None:
    """At 1280x800 and on a 390-pixel-wide phone, no page is wider than the window (a wide table
    scrolls inside itself)."""
    browser.set_window_size(*SCREENS[screen])
    try:
        wide = {}
        for path in pages:
            browser.get(live_workflows.page(f"{PREFIX}{path}"))
            sizes = browser.execute_script(
                "return [document.documentElement.scrollWidth, document.documentElement.clientWidth];"
            )
            if sizes[0] > sizes[1]:
                wide[path] = sizes
            if screen == "phone" and path in PHONE_SHOTS:
                full_shot(browser, live_workflows, PHONE_SHOTS[path])
        assert not wide, f"pages wider than the {screen} window (scroll width, window width): {wide}"
    finally:
        browser.set_window_size(1280, 900)
