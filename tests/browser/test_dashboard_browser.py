"""The dashboard in headless chromium, against a live app, PostgreSQL, Redis, a worker subprocess
and a receiver: what an operator does, click by click. Each page's screenshot is saved (into the
docs with ``HARVEST_UPDATE_SCREENSHOTS=1``)."""

from __future__ import annotations

from typing import Any

import pytest
from selenium.common.exceptions import StaleElementReferenceException, WebDriverException
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support.ui import WebDriverWait

from flask_harvest import DeliveryState, WebhookSubscription, WebhookSubscriptionStatus, generate_secret

from ..dashboard_client import PREFIX, TOKEN
from .conftest import Live, dispatch, wait_until

pytestmark = [pytest.mark.postgres, pytest.mark.redis, pytest.mark.slow]

SECRET = generate_secret()
SCRIPT_PAYLOAD = {"note": "<script>document.title='pwned'</script>", "n": 1}


def sign_in(browser: WebDriver, live: Live, token: str = TOKEN) -> None:
    browser.get(live.page(f"{PREFIX}/sign-in"))
    browser.find_element(By.ID, "token").send_keys(token)
    submit_and_wait(browser, browser.find_element(By.CSS_SELECTOR, "form.stack button[type=submit]"))


def submit_and_wait(browser: WebDriver, button: Any) -> None:
    """Click a form's button (or a link) and wait for the answer to replace the page: a ``get`` or
    a lookup right after a bare click can overtake the form's request, or find the old page."""
    button.click()

    def replaced(_: WebDriver) -> bool:
        try:
            button.is_enabled()
        except StaleElementReferenceException:
            return True
        except WebDriverException as exc:
            # Older Selenium (the lowest versions' run) passes chromium's word for a detached
            # node through as a plain WebDriverException instead of a stale element.
            if "does not belong to the document" in str(exc):
                return True
            raise
        return False

    WebDriverWait(browser, 30).until(replaced)


def shot(browser: WebDriver, live: Live, name: str) -> None:
    browser.save_screenshot(str(live.screenshots / f"{name}.png"))


def by_id(browser: WebDriver, element_id: str) -> Any:
    return browser.find_element(By.ID, element_id)


def subscribe(live: Live, sub_id: str = "sub_orders") -> None:
    live.store.add_subscription(
        WebhookSubscription(
            live.receiver.url("/hook"), ["order.*"], SECRET, id=sub_id, description="Orders service"
        )
    )


def dead_lettered(live: Live, count: int = 1, payload: Any = None) -> list[str]:
    """Deliveries that really failed: the receiver answers 500 and the worker (one attempt each)
    dead-letters them."""
    live.receiver.respond("/hook", 500, "boom", times=count)
    ids = [dispatch(live.app, "order.created", payload or {"n": n})[0] for n in range(count)]
    for delivery_id in ids:
        live.wait_state(delivery_id, DeliveryState.DLQ)
    return ids


def test_every_page_is_refused_without_sign_in(browser: WebDriver, live: Live) -> None:
    subscribe(live)
    [delivery_id] = dead_lettered(live)
    pages = [
        "/",
        "/webhooks/subscriptions",
        "/webhooks/subscriptions/sub_orders",
        "/webhooks/deliveries",
        f"/webhooks/deliveries/{delivery_id}",
        "/webhooks/replay",
    ]
    for path in pages:
        browser.get(live.page(PREFIX + path))
        assert "/sign-in" in browser.current_url, path
        # The sign-in form, and nothing of the page asked for (its path is only in "next").
        assert browser.find_element(By.TAG_NAME, "h1").text == "Sign in"
        assert not browser.find_elements(By.CSS_SELECTOR, "table, nav a")
    shot(browser, live, "sign-in")
    sign_in(browser, live, token="not-the-token-at-all")
    assert "That is not the token." in by_id(browser, "sign-in-error").text
    sign_in(browser, live)
    browser.get(live.page(f"{PREFIX}/webhooks/deliveries/{delivery_id}"))
    assert delivery_id in browser.find_element(By.TAG_NAME, "h1").text
    # Sign out: the pages are closed again.
    submit_and_wait(browser, browser.find_element(By.CSS_SELECTOR, "form.sign-out button"))
    browser.get(live.page(f"{PREFIX}/"))
    assert "/sign-in" in browser.current_url


def test_see_a_dead_letter_replay_it_and_watch_it_delivered(browser: WebDriver, live: Live) -> None:
    subscribe(live)
    [delivery_id] = dead_lettered(live, payload=SCRIPT_PAYLOAD)
    dispatch(live.app, "order.paid", {"n": 2})  # and one that goes through
    sign_in(browser, live)
    browser.get(live.page(f"{PREFIX}/"))
    assert by_id(browser, "dlq-size").text.startswith("1")
    assert browser.find_elements(By.CSS_SELECTOR, "svg.chart")
    wait_until(lambda: len(live.receiver.requests) >= 2, 30, "the second delivery")
    browser.refresh()
    shot(browser, live, "overview")

    browser.get(live.page(f"{PREFIX}/webhooks/deliveries?state=dlq"))
    assert delivery_id in by_id(browser, "deliveries").text
    shot(browser, live, "deliveries")
    submit_and_wait(browser, browser.find_element(By.LINK_TEXT, delivery_id))
    assert by_id(browser, "delivery-state").text == "dlq"
    # The <script> in the payload is text on the page, never a script: no script element, the
    # title untouched.
    assert "<script>document.title='pwned'</script>" in by_id(browser, "payload").text
    assert browser.find_elements(By.TAG_NAME, "script") == []
    assert "pwned" not in browser.title
    assert "500" in by_id(browser, "attempts").text
    shot(browser, live, "delivery")

    submit_and_wait(browser, by_id(browser, "replay"))
    assert "Replayed" in by_id(browser, "notice").text
    live.wait_state(delivery_id, DeliveryState.DELIVERED)
    browser.refresh()
    assert by_id(browser, "delivery-state").text == "delivered"
    assert not browser.find_elements(By.ID, "replay")
    assert [r.webhook_id for r in live.receiver.requests].count(delivery_id) == 2  # same id again


def test_bulk_replay_counts_first(browser: WebDriver, live: Live) -> None:
    subscribe(live)
    ids = dead_lettered(live, 3)
    sign_in(browser, live)
    browser.get(live.page(f"{PREFIX}/webhooks/replay"))
    by_id(browser, "r-sub").send_keys("sub_orders")
    submit_and_wait(browser, by_id(browser, "dry-run"))
    assert by_id(browser, "dry-run-count").text.startswith("3 dead-lettered deliveries match")
    assert all(live.store.get_delivery(i).state is DeliveryState.DLQ for i in ids)  # type: ignore[union-attr]
    shot(browser, live, "bulk-replay")
    submit_and_wait(browser, by_id(browser, "confirm-replay"))
    assert by_id(browser, "replayed-count").text.startswith("Replayed 3")
    for delivery_id in ids:
        live.wait_state(delivery_id, DeliveryState.DELIVERED)


def test_rotate_a_secret_and_see_it_once(browser: WebDriver, live: Live) -> None:
    subscribe(live)
    subscribe(live, "sub_billing")
    live.store.set_subscription_status("sub_billing", WebhookSubscriptionStatus.DISABLED)
    sign_in(browser, live)
    browser.get(live.page(f"{PREFIX}/webhooks/subscriptions"))
    assert "sub_billing" in by_id(browser, "subscriptions").text
    shot(browser, live, "subscriptions")
    submit_and_wait(browser, browser.find_element(By.LINK_TEXT, "sub_orders"))
    assert SECRET not in browser.page_source
    submit_and_wait(browser, by_id(browser, "rotate"))
    shown = by_id(browser, "new-secret").text
    stored = live.store.get_subscription("sub_orders")
    assert stored is not None and shown == stored.secret != SECRET
    shot(browser, live, "subscription-rotated")
    browser.get(live.page(f"{PREFIX}/webhooks/subscriptions/sub_orders"))
    assert shown not in browser.page_source and not browser.find_elements(By.ID, "new-secret")
    browser.back()  # the answer was no-store: going back does not show it from a cache either
    assert shown not in browser.page_source


def test_a_post_without_the_csrf_token_is_refused(browser: WebDriver, live: Live) -> None:
    subscribe(live)
    sign_in(browser, live)
    browser.get(live.page(f"{PREFIX}/webhooks/subscriptions/sub_orders"))
    # Take the token out of the real form, then submit it as the operator would.
    browser.execute_script("document.querySelectorAll('input[name=csrf_token]').forEach(e => e.remove());")
    submit_and_wait(browser, by_id(browser, "disable"))
    assert "CSRF token is missing" in by_id(browser, "error-message").text
    stored = live.store.get_subscription("sub_orders")
    assert stored is not None and stored.status is WebhookSubscriptionStatus.ACTIVE


def test_create_a_subscription_with_a_filter_headers_and_a_rate_limit(browser: WebDriver, live: Live) -> None:
    sign_in(browser, live)
    browser.get(live.page(f"{PREFIX}/webhooks/subscriptions/new"))
    by_id(browser, "s-target").send_keys(live.receiver.url("/opts"))
    by_id(browser, "s-topics").send_keys("order.*")
    by_id(browser, "s-id").send_keys("sub_opts")
    by_id(browser, "s-filter").send_keys('{"type": "Eq", "data": {"path": "region", "value": "EU"}}')
    by_id(browser, "s-headers").send_keys("Connection: close")
    by_id(browser, "s-rate").send_keys("5")
    by_id(browser, "s-burst").send_keys("2")
    submit_and_wait(browser, by_id(browser, "create-subscription"))
    # Refused in the form, with what was typed kept; nothing written.
    assert "headers" in by_id(browser, "form-error").text
    assert by_id(browser, "s-burst").get_attribute("value") == "2"
    assert live.store.get_subscription("sub_opts") is None
    headers = by_id(browser, "s-headers")
    headers.clear()
    headers.send_keys("X-Tenant: acme")
    submit_and_wait(browser, by_id(browser, "create-subscription"))
    assert by_id(browser, "new-secret").text
    stored = live.store.get_subscription("sub_opts")
    assert stored is not None and stored.headers == {"X-Tenant": "acme"}
    assert stored.rate_limit is not None and stored.rate_limit.burst == 2
    browser.get(live.page(f"{PREFIX}/webhooks/subscriptions/sub_opts"))
    assert "X-Tenant: acme" in by_id(browser, "custom-headers").text
    assert "5 per second, bursts of 2" in by_id(browser, "rate-limit").text
    assert "region" in by_id(browser, "payload-filter").text
