"""The consumer portal in headless chromium: a customer's whole visit, from the link the app makes
to a deleted endpoint, against a live app on PostgreSQL with the local job backend and a real
receiver on 127.0.0.1; axe-core on every page the visit shows; and the portal framed by a page of
another origin, allowed or refused. Screenshots are saved like the console's (into the docs with
``HARVEST_UPDATE_SCREENSHOTS=1``)."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import sqlalchemy as sa
from flask import Flask
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support.ui import Select, WebDriverWait

from flask_harvest import Harvest, WebhookSubscription, generate_secret
from flask_harvest.outbound.signing import verify_standard
from flask_harvest.portal import portal, portal_url
from flask_harvest.testing import CapturingReceiver
from flask_harvest.webhooks.stores.sql import SqlOutboundWebhookStore

from ..dashboard_client import SECRET_KEY
from ..live_server import LiveServer
from ..pipeline import close_later
from .conftest import Live, _screenshots, violations
from .test_dashboard_browser import by_id, submit_and_wait

pytestmark = [pytest.mark.postgres, pytest.mark.slow]

TENANT = "acme"
PREFIX = "/portal"
#: The app's settings: the local job backend, one attempt (a failure dead-letters at once), and
#: the receiver's loopback network allowed as a target, as an app allows its own test receivers.
SETTINGS = {
    "HARVEST_JOBS_BACKEND": "local",
    "HARVEST_WEBHOOKS_MAX_ATTEMPTS": 1,
    "HARVEST_WEBHOOKS_CONNECT_TIMEOUT_SECONDS": 1,
    "HARVEST_WEBHOOKS_TENANT_ALLOW_CIDRS": "127.0.0.1/32",
    "HARVEST_PORTAL_NAME": "Acme Webhooks",
    "HARVEST_PORTAL_ACCENT_COLOR": "#0f766e",
}
#: The catalog: (name, description, example); each example is also its schema's only shape.
EVENT_TYPES = [
    ("order.created", "An order was placed.", {"order_id": "ord_1001", "total": "49.90", "currency": "EUR"}),
    ("invoice.paid", "An invoice was paid in full.", {"invoice_id": "inv_2001", "amount": "120.00"}),
]
TIMEOUT = 30.0


def _schema(example: dict[str, str]) -> dict[str, Any]:
    return {
        "type": "object",
        "required": sorted(example),
        "properties": {name: {"type": "string"} for name in example},
    }


def link(live: Live) -> str:
    """The link the app hands its signed-in customer (made inside a request, as an app does)."""
    with live.app.test_request_context(base_url=live.url):
        return portal_url(TENANT)


@pytest.fixture
def serve_portal(
    postgres_engine: sa.Engine, receiver: CapturingReceiver, tmp_path: Path, browser: WebDriver
) -> Iterator[Callable[..., Live]]:
    """Start the portal's app with these ``HARVEST_*`` settings (beside :data:`SETTINGS`); every app
    started is stopped after the test. The browser starts with no cookies."""
    store = SqlOutboundWebhookStore(postgres_engine)
    browser.delete_all_cookies()
    with ExitStack() as stack:

        def start(**config: Any) -> Live:
            app = Flask("portal_live")
            app.config.update(SETTINGS, SECRET_KEY=SECRET_KEY, **config)
            harvest = Harvest(app, store=store, workflows=False)
            for name, description, example in EVENT_TYPES:
                harvest.event_type(name, description=description, schema=_schema(example), example=example)
            app.register_blueprint(portal, url_prefix=PREFIX)
            close_later(app)
            server = LiveServer(app)
            stack.callback(server.close)
            return Live(
                app=app, url=server.url, store=store, receiver=receiver, screenshots=_screenshots(tmp_path)
            )

        yield start


@dataclass
class Visit:
    """A customer's walk through the portal: each page it shows is checked with axe-core, and the
    violations are gathered by page (asserted once, at the end, so one run lists them all)."""

    browser: WebDriver
    axe_source: str
    site: Live
    found: dict[str, Any] = field(default_factory=dict)

    def checked(self) -> None:
        parts = urlsplit(self.browser.current_url)
        if bad := violations(self.browser, self.axe_source):
            self.found[f"{parts.path}?{parts.query}" if parts.query else parts.path] = bad

    def open(self, path: str) -> None:
        self.browser.get(self.site.url + PREFIX + path)
        self.checked()

    def click(self, element: Any) -> None:
        submit_and_wait(self.browser, element)
        self.checked()

    def shot(self, name: str) -> None:
        """A screenshot of the page's content, without the empty window below it (smaller files
        for the docs): the window grows to hold the whole page, and the body is shot."""
        size = self.browser.get_window_size()
        page, inner = self.browser.execute_script(
            "return [document.documentElement.scrollHeight, window.innerHeight];"
        )
        # The window's own bars take part of its height: without them counted, a scroll bar
        # would narrow the page.
        self.browser.set_window_size(size["width"], max(size["height"], size["height"] - inner + page + 20))
        try:
            body = self.browser.find_element(By.TAG_NAME, "body")
            body.screenshot(str(self.site.screenshots / f"{name}.png"))
        finally:
            self.browser.set_window_size(size["width"], size["height"])

    def heading(self) -> str:
        [text] = _headings(self.browser)
        return text

    def add_endpoint(
        self, url: str, description: str, topic: str, *, shots: tuple[str, str] | None = None
    ) -> tuple[str, str]:
        """Add an endpoint through the form, receiving ``topic``; return its id and its secret.
        ``shots`` names the screenshots of the filled form and of the secret's page."""
        self.click(by_id(self.browser, "add-endpoint"))
        assert self.heading() == "Add an endpoint"
        by_id(self.browser, "target_url").send_keys(url)
        by_id(self.browser, "description").send_keys(description)
        self.browser.find_element(By.CSS_SELECTOR, f"input[name=event_types][value='{topic}']").click()
        if shots:
            self.shot(shots[0])
        self.click(by_id(self.browser, "create"))
        assert self.heading() == "Endpoint added"
        if shots:
            self.shot(shots[1])
        secret: str = by_id(self.browser, "new-secret").text
        self.click(by_id(self.browser, "endpoint-link"))
        endpoint_id = urlsplit(self.browser.current_url).path.rsplit("/", 1)[-1]
        return endpoint_id, secret

    def send_test(self, event_type: str) -> None:
        """From an endpoint's page, send it the example of ``event_type``."""
        self.click(by_id(self.browser, "send-test"))
        Select(by_id(self.browser, "event_type")).select_by_value(event_type)
        self.click(by_id(self.browser, "send-test-confirm"))
        assert "A test event was queued" in by_id(self.browser, "notice").text

    def wait_listed(self, path: str, what: str, check: Callable[[str], bool]) -> None:
        """Reload ``path`` until ``check`` holds of its deliveries table (a deadline, not a timing
        assertion: it fails only if the worker never gets there)."""

        def reloaded(browser: WebDriver) -> bool:
            browser.get(self.site.url + PREFIX + path)
            return check(by_id(browser, "deliveries").text)

        WebDriverWait(self.browser, TIMEOUT, poll_frequency=0.2).until(reloaded, f"waited for {what}")
        self.checked()


def _window_input(browser: WebDriver, element_id: str, when: datetime) -> None:
    """Fill a ``datetime-local`` field. Chromium types into it in the locale's format, field by
    field, so the value is set as the form sends it instead (the format the page documents)."""
    browser.execute_script(
        "arguments[0].value = arguments[1];", by_id(browser, element_id), when.strftime("%Y-%m-%dT%H:%M")
    )


def _headings(browser: WebDriver) -> list[str]:
    return [h.text for h in browser.find_elements(By.TAG_NAME, "h1")]


def _row_of(table_text: str, delivery_id: str) -> str:
    return next((line for line in table_text.splitlines() if line.startswith(delivery_id)), "")


def test_a_customer_manages_its_endpoints_and_deliveries(
    browser: WebDriver, serve_portal: Callable[..., Live], receiver: CapturingReceiver, axe_source: str
) -> None:
    site = serve_portal()
    visit = Visit(browser, axe_source, site)
    orders_url, billing_url = receiver.url("/acme/orders"), receiver.url("/acme/billing")

    # The link opens a session and leaves the address bar for the index.
    browser.get(link(site))
    visit.checked()
    assert urlsplit(browser.current_url).path == f"{PREFIX}/" and "token" not in browser.current_url
    assert visit.heading() == "Endpoints"
    assert browser.find_element(By.CSS_SELECTOR, "header .brand").text == "Acme Webhooks"

    # An endpoint for orders: the secret is shown once, and the test event is signed with it.
    orders_id, secret = visit.add_endpoint(
        orders_url, "Order service", "order.created", shots=("portal-new-endpoint", "portal-secret")
    )
    stored = site.store.get_subscription(orders_id)
    assert stored is not None and stored.secret == secret and stored.tenant == TENANT
    assert list(stored.event_topics) == ["order.created"]
    assert secret not in browser.page_source and not browser.find_elements(By.ID, "new-secret")
    visit.send_test("order.created")
    [received] = receiver.wait_for(1, timeout=TIMEOUT, path="/acme/orders")
    verify_standard(secret, received.headers, received.body)
    assert json.loads(received.body) == EVENT_TYPES[0][2]
    test_id = received.webhook_id
    assert test_id is not None
    visit.wait_listed(
        f"/deliveries?endpoint_id={orders_id}",
        "the test event delivered",
        lambda t: "delivered" in _row_of(t, test_id),
    )
    visit.click(browser.find_element(By.LINK_TEXT, test_id))
    assert by_id(browser, "delivery-state").text == "delivered"
    assert "200" in by_id(browser, "attempts").text

    # An endpoint whose receiver fails twice: both test events are dead-lettered (one attempt each).
    visit.open("/")
    receiver.respond("/acme/billing", 500, "billing is down", times=2)
    billing_id, _ = visit.add_endpoint(billing_url, "Billing", "invoice.paid")
    visit.send_test("invoice.paid")
    visit.send_test("invoice.paid")
    failed_list = f"/deliveries?endpoint_id={billing_id}&state=dlq"
    visit.wait_listed(failed_list, "two dead letters", lambda t: t.count("dlq") == 2)
    first, second = (
        row.text.split()[0] for row in browser.find_elements(By.CSS_SELECTOR, "#deliveries tbody tr")
    )

    # Replay one from its page: the receiver answers again, and it is delivered.
    visit.click(browser.find_element(By.LINK_TEXT, first))
    assert by_id(browser, "delivery-state").text == "dlq"
    assert "500" in by_id(browser, "attempts").text
    visit.click(by_id(browser, "replay"))
    assert "Replayed" in by_id(browser, "notice").text
    visit.wait_listed(
        f"/deliveries?endpoint_id={billing_id}",
        "the replay delivered",
        lambda t: "delivered" in _row_of(t, first),
    )
    visit.click(browser.find_element(By.LINK_TEXT, first))
    attempts = by_id(browser, "attempts").text
    assert "500" in attempts and "200" in attempts and not browser.find_elements(By.ID, "replay")
    visit.shot("portal-delivery")
    visit.open("/deliveries")
    assert by_id(browser, "deliveries").text.count("dlq") == 1
    visit.shot("portal-deliveries")
    visit.open(f"/endpoints/{billing_id}")
    assert by_id(browser, "health-success").text.startswith("33.3%")  # two 500s, one 200
    visit.shot("portal-endpoint")

    # Replay by window: count first (nothing moves), then replay what the window holds.
    now = datetime.now(timezone.utc)
    visit.open("/replay")
    _window_input(browser, "since", now - timedelta(hours=1))
    _window_input(browser, "until", now + timedelta(hours=1))
    Select(by_id(browser, "endpoint")).select_by_value(billing_id)
    visit.click(by_id(browser, "count"))
    assert by_id(browser, "notice").text.startswith("1 failed delivery in this window would be sent again")
    delivery = site.store.get_delivery(second)
    assert delivery is not None and delivery.state.value == "dlq"
    # The count's form is the replay's: the same window, the same endpoint.
    assert Select(by_id(browser, "endpoint")).first_selected_option.get_attribute("value") == billing_id
    visit.shot("portal-replay")
    visit.click(by_id(browser, "replay-window"))
    assert by_id(browser, "notice").text.startswith("1 delivery was sent again")
    visit.wait_listed(
        f"/deliveries?endpoint_id={billing_id}",
        "the window's replay delivered",
        lambda t: t.count("delivered") == 2,
    )
    visit.open("/")
    assert [row.text.split()[0] for row in browser.find_elements(By.CSS_SELECTOR, "#endpoints tbody tr")] == [
        orders_url,
        billing_url,
    ]
    rates = [cell.text for cell in browser.find_elements(By.CSS_SELECTOR, "#endpoints tbody td.num")]
    assert rates == ["100.0%", "50.0%"]  # billing: two 500s, then two 200s
    visit.shot("portal-endpoints")

    # Rotate the orders endpoint's secret: a new one, shown once.
    visit.click(browser.find_element(By.LINK_TEXT, orders_url))
    visit.click(by_id(browser, "rotate"))
    by_id(browser, "confirm").click()
    visit.click(by_id(browser, "rotate-confirm"))
    assert visit.heading() == "New signing secret"
    rotated = by_id(browser, "new-secret").text
    stored = site.store.get_subscription(orders_id)
    assert stored is not None and rotated == stored.secret != secret
    visit.click(by_id(browser, "endpoint-link"))
    assert rotated not in browser.page_source

    # Disable, enable, delete (refused until the box is ticked).
    visit.click(by_id(browser, "disable"))
    assert by_id(browser, "notice").text == "Disabled."
    assert by_id(browser, "endpoint-status").text == "disabled"
    visit.click(by_id(browser, "enable"))
    assert by_id(browser, "notice").text == "Enabled."
    assert by_id(browser, "endpoint-status").text == "active"
    visit.click(by_id(browser, "delete"))
    visit.click(by_id(browser, "delete-confirm"))
    assert "Tick the box" in by_id(browser, "form-error").text
    assert site.store.get_subscription(orders_id) is not None
    by_id(browser, "confirm").click()
    visit.click(by_id(browser, "delete-confirm"))
    assert "was deleted" in by_id(browser, "notice").text
    assert orders_url not in by_id(browser, "endpoints").text
    assert site.store.get_subscription(orders_id) is None

    # The pages not on the way: the catalog, and another tenant's endpoint (a 404, as for an id that
    # does not exist).
    visit.open("/event-types")
    assert "order.created" in browser.page_source
    theirs = WebhookSubscription(receiver.url("/globex"), ["*"], generate_secret(), tenant="globex")
    site.store.add_subscription(theirs)
    visit.open(f"/endpoints/{theirs.id}")
    assert visit.heading() == "Not found" and theirs.target_url not in browser.page_source
    assert not visit.found, json.dumps(visit.found, indent=2)


#: The page of another origin that frames the portal (its link is filled in once the portal runs).
FRAME_PAGE = (
    '<!doctype html><html lang="en"><title>Account</title>'
    '<iframe id="portal" title="Webhooks" src="{src}" width="1000" height="600"></iframe></html>'
)


@pytest.mark.parametrize("allowed", [True, False], ids=["allowed", "refused"])
def test_the_portal_in_a_frame_of_another_origin(
    browser: WebDriver, serve_portal: Callable[..., Live], allowed: bool
) -> None:
    """With ``HARVEST_PORTAL_FRAME_ANCESTORS`` naming the parent's origin the frame shows the
    portal; without it the browser shows nothing of the portal in the frame."""
    frame_src: dict[str, str] = {}
    parent = Flask("account_page")
    parent.add_url_rule("/", "account", lambda: FRAME_PAGE.format(src=frame_src["src"]))
    parent_server = LiveServer(parent)  # 127.0.0.1 too, on another port: another origin
    try:
        site = serve_portal(HARVEST_PORTAL_FRAME_ANCESTORS=parent_server.url if allowed else "")
        frame_src["src"] = link(site)
        browser.get(parent_server.url + "/")
        frame = by_id(browser, "portal")
        browser.switch_to.frame(frame)
        try:
            if allowed:
                WebDriverWait(browser, TIMEOUT).until(lambda b: _headings(b) == ["Endpoints"])
                assert browser.find_element(By.CSS_SELECTOR, "header .brand").text == "Acme Webhooks"
                # The session holds inside the frame: its pages open from its own links.
                submit_and_wait(browser, browser.find_element(By.LINK_TEXT, "Deliveries"))
                assert _headings(browser) == ["Deliveries"]
            else:
                # Chromium puts its own error page in a refused frame: nothing of the portal.
                url = browser.execute_script("return document.URL")
                assert not url.startswith(site.url), url
                assert not browser.find_elements(By.CSS_SELECTOR, "header .brand")
        finally:
            browser.switch_to.default_content()
        # The same link opened as a page of its own shows the portal: only the frame was refused.
        browser.get(link(site))
        assert _headings(browser) == ["Endpoints"]
    finally:
        parent_server.close()
