"""The dashboard's "Retry from step N" in headless chromium, against a live app on PostgreSQL, Redis
and a ``flask harvest worker`` subprocess running the workflows."""

from __future__ import annotations

import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver

from flask_harvest.workflows import ExecutionState

from ..dashboard_client import PREFIX
from .conftest import Live
from .test_dashboard_browser import by_id, shot, sign_in, submit_and_wait
from .test_dashboard_workflows_browser import execution, start, wait_state

pytestmark = [pytest.mark.postgres, pytest.mark.redis, pytest.mark.slow]


def test_retry_a_run_from_a_step_in_a_chosen_mode(browser: WebDriver, live_workflows: Live) -> None:
    live = live_workflows
    source = start(live.app, "import_orders", {"region": "EU"}, workflow_id="orders-eu")
    wait_state(live.app, source, lambda e: e.state is ExecutionState.COMPLETED, "the run to complete")
    sign_in(browser, live)
    browser.get(live.page(f"{PREFIX}/workflows/{source}"))
    submit_and_wait(browser, by_id(browser, "retry-1"))
    assert "from step 1" in browser.find_element(By.TAG_NAME, "h1").text
    assert by_id(browser, "mode-recorded").is_selected()
    shot(browser, live, "workflow-fork")
    by_id(browser, "mode-live").click()
    submit_and_wait(browser, by_id(browser, "confirm-fork"))
    assert "The fork was created" in by_id(browser, "notice").text
    forked_from = by_id(browser, "forked-from")
    assert source in forked_from.text and "at step 1 (live)" in forked_from.text
    fork_id = browser.current_url.split("/workflows/")[1].split("?")[0]
    wait_state(live.app, fork_id, lambda e: e.state is ExecutionState.COMPLETED, "the fork to complete")
    assert execution(live.app, fork_id).output == execution(live.app, source).output
    # The link goes back to the source, which is unchanged.
    submit_and_wait(browser, forked_from.find_element(By.TAG_NAME, "a"))
    assert by_id(browser, "execution-state").text == "Completed"
    assert source in browser.find_element(By.TAG_NAME, "h1").text
