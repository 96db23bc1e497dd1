"""A live dashboard for the browser tests: the app served by werkzeug on 127.0.0.1, on PostgreSQL
with the RQ backend, a ``flask harvest worker`` subprocess, a real receiver, and headless chromium.

Nothing is downloaded: the browser and its driver are Debian's (``apt-get install chromium
chromium-driver``; ``.ci/run`` does it). Without them the tests are skipped, and under ``CI=true``
they fail.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis
import sqlalchemy as sa
from flask import Flask

from flask_harvest import DeliveryState, OutboundWebhookPlugin, get_engine
from flask_harvest.testing import CapturingReceiver
from flask_harvest.webhooks.stores.sql import SqlOutboundWebhookStore

from ..dashboard_client import SECRET_KEY, TOKEN
from ..live_server import LiveServer
from ..pipeline import close_later
from ..worker_process import start_worker, stop
from .workflow_live_app import create_app as create_workflow_app

#: The worker of :func:`live_workflows` loads the same app module as the test.
WORKFLOW_APP_SPEC = "tests.browser.workflow_live_app:create_app"
CHROMIUM = os.environ.get("HARVEST_CHROMIUM", "/usr/bin/chromium")
CHROMEDRIVER = os.environ.get("HARVEST_CHROMEDRIVER", "/usr/bin/chromedriver")
ROOT = Path(__file__).resolve().parents[2]
#: Where the docs' screenshots live; the tests write there with HARVEST_UPDATE_SCREENSHOTS=1.
SCREENSHOTS = ROOT / "docs" / "_static" / "screenshots"
#: npm's axe-core (``npm install --prefix tests/browser/node_modules_axe axe-core@4``; ``.ci/run``
#: does it when missing), run through WebDriver: the pages' policy does not govern it.
AXE = Path(__file__).parent / "node_modules_axe" / "node_modules" / "axe-core" / "axe.min.js"
#: The axe-core impacts that fail a page.
SERIOUS = ("serious", "critical")

#: The settings of the web app and the worker alike: one attempt, so a failure dead-letters at once.
SETTINGS = {
    "HARVEST_JOBS_BACKEND": "rq",
    "HARVEST_WEBHOOKS_MAX_ATTEMPTS": 1,
    "HARVEST_WEBHOOKS_CONNECT_TIMEOUT_SECONDS": 1,
    "HARVEST_SWEEP_INTERVAL_SECONDS": 0.5,
    "HARVEST_WEBHOOKS_ALLOW_PRIVATE_TARGETS": True,  # the receiver is on 127.0.0.1
}


def _missing(what: str) -> None:
    message = f"{what} is not installed: apt-get install -y chromium chromium-driver"
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"CI=true and {message}", pytrace=False)
    pytest.skip(message)


@pytest.fixture(scope="session")
def browser() -> Iterator[Any]:
    """A headless chromium driven by Selenium, with Debian's chromedriver (never downloaded)."""
    for path in (CHROMIUM, CHROMEDRIVER):
        if not (os.path.exists(path) and os.access(path, os.X_OK)):
            _missing(path)
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        _missing("selenium (the test extra)")
    # Never let Selenium Manager look for, or fetch, a browser or a driver.
    os.environ["SE_OFFLINE"] = "true"
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for argument in (
        "--headless=new",
        "--no-sandbox",  # CI containers run as root
        "--disable-dev-shm-usage",
        "--window-size=1280,900",
        "--disable-gpu",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
    ):
        options.add_argument(argument)
    driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)
    driver.set_page_load_timeout(30)
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture(scope="session")
def axe_source() -> str:
    """axe-core's script; without it the tests that use it are skipped, and under ``CI=true`` they fail."""
    if not AXE.exists():
        message = f"axe-core is not installed: npm install --prefix {AXE.parents[2]} axe-core@4"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"CI=true and {message}", pytrace=False)
        pytest.skip(message)
    return AXE.read_text(encoding="utf-8")


def violations(browser: Any, axe_source: str) -> list[dict[str, Any]]:
    """axe-core's serious and critical violations on the current page."""
    found: dict[str, Any] = browser.execute_async_script(
        axe_source
        + "\nconst done = arguments[arguments.length - 1];"
        + "axe.run(document, {resultTypes: ['violations']})"
        + ".then(r => done(r), e => done({error: String(e)}));"
    )
    assert "error" not in found, found
    return [
        {"id": v["id"], "impact": v["impact"], "nodes": [n["target"] for n in v["nodes"]][:5]}
        for v in found["violations"]
        if v["impact"] in SERIOUS
    ]


@dataclass
class Live:
    """The running dashboard and what it talks to."""

    app: Flask
    url: str
    store: SqlOutboundWebhookStore
    receiver: CapturingReceiver
    screenshots: Path

    def page(self, path: str) -> str:
        return self.url + path

    def wait_state(self, delivery_id: str, state: DeliveryState, timeout: float = 30.0) -> None:
        """Wait until the worker has moved ``delivery_id`` to ``state`` (a deadline, not a timing
        assertion: the test fails only if it never happens)."""
        wait_until(
            lambda: _state(self.store, delivery_id) is state, timeout, f"{delivery_id} to be {state.value}"
        )


def _state(store: SqlOutboundWebhookStore, delivery_id: str) -> DeliveryState | None:
    delivery = store.get_delivery(delivery_id)
    return delivery.state if delivery else None


def wait_until(check: Callable[[], bool], timeout: float, what: str) -> None:
    end = time.monotonic() + timeout
    while not check():
        if time.monotonic() > end:
            raise TimeoutError(f"waited {timeout} s for {what}")
        time.sleep(0.1)


@pytest.fixture
def live(
    postgres_engine: sa.Engine,
    redis_url: str,
    redis_conn: redis.Redis,
    receiver: CapturingReceiver,
    tmp_path: Path,
    browser: Any,
) -> Iterator[Live]:
    store = SqlOutboundWebhookStore(postgres_engine)
    app = Flask("dashboard_live")
    app.config.update(
        SETTINGS,
        HARVEST_REDIS_URL=redis_url,
        HARVEST_DASHBOARD=True,
        HARVEST_ACTUATOR_TOKEN=TOKEN,
        SECRET_KEY=SECRET_KEY,
    )
    OutboundWebhookPlugin(store, app)
    # The worker runs the same settings as the app.
    with serving(app, tmp_path, browser, store, redis_url, config=SETTINGS) as url:
        yield Live(app=app, url=url, store=store, receiver=receiver, screenshots=_screenshots(tmp_path))


@pytest.fixture
def live_workflows(
    postgres_engine: sa.Engine,
    redis_url: str,
    redis_conn: redis.Redis,
    receiver: CapturingReceiver,
    tmp_path: Path,
    browser: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[Live]:
    """The workflow app of :mod:`.workflow_live_app` with the dashboard, served like :func:`live`,
    with a worker subprocess on the same app module."""
    environment = {
        "TEST_REDIS_URL": redis_url,
        "TEST_DATABASE_URL": postgres_engine.url.render_as_string(hide_password=False),
    }
    for name, value in environment.items():
        monkeypatch.setenv(name, value)
    app = create_workflow_app(HARVEST_DASHBOARD=True, HARVEST_ACTUATOR_TOKEN=TOKEN, SECRET_KEY=SECRET_KEY)
    store = get_engine(app).store
    assert isinstance(store, SqlOutboundWebhookStore)
    with serving(app, tmp_path, browser, store, redis_url, app_spec=WORKFLOW_APP_SPEC) as url:
        yield Live(app=app, url=url, store=store, receiver=receiver, screenshots=_screenshots(tmp_path))


def _screenshots(tmp_path: Path) -> Path:
    """Where a test saves its screenshots: ``HARVEST_SCREENSHOTS_DIR`` (set by
    ``python -m tests.browser.screenshots``), the docs' folder with ``HARVEST_UPDATE_SCREENSHOTS=1``,
    else the test's own temporary folder."""
    chosen = os.environ.get("HARVEST_SCREENSHOTS_DIR")
    if chosen:
        return Path(chosen)
    return SCREENSHOTS if os.environ.get("HARVEST_UPDATE_SCREENSHOTS") == "1" else tmp_path


@contextmanager
def serving(
    app: Flask,
    tmp_path: Path,
    browser: Any,
    store: SqlOutboundWebhookStore,
    redis_url: str,
    *,
    config: dict[str, Any] | None = None,
    app_spec: str = "worker_app:create_app",
) -> Iterator[str]:
    """Serve ``app`` on 127.0.0.1 with a ``flask harvest worker`` subprocess (on ``app_spec``, or
    the worker app of :mod:`tests.worker_process` with ``config``); yield the app's URL. The
    browser starts with no cookies."""
    close_later(app)
    server = LiveServer(app)
    worker = start_worker(tmp_path, store, redis_url, config=config, app=app_spec)
    browser.delete_all_cookies()
    try:
        yield server.url
    finally:
        try:
            stop(worker, signal.SIGTERM)  # fails the test if the worker had to be killed
        finally:
            server.close()
            if worker.returncode not in (0, -signal.SIGTERM):
                print((tmp_path / "worker.log").read_text())


def dispatch(app: Flask, topic: str, payload: Any) -> list[str]:
    """Dispatch an event through the app, as the app's own code would."""
    with app.app_context():
        return get_engine().manager.dispatch(topic, payload)
