"""Shared helpers of the dashboard tests: an app with the dashboard on, and a signed-in client."""

from __future__ import annotations

import re
from typing import Any

from flask import Flask
from flask.testing import FlaskClient
from werkzeug.test import TestResponse

from flask_harvest import OutboundWebhookHandler

from .pipeline import make_app

TOKEN = "dashboard-test-token-0123456789"
PREFIX = "/harvest"
SECRET_KEY = "dashboard-test-secret-key-0123456789abcdef"
_CSRF = re.compile(r'name="csrf_token" value="([^"]+)"')


def dashboard_app(store: OutboundWebhookHandler, **config: Any) -> Flask:
    """An app on ``store`` with the dashboard enabled by its one setting and the actuator token."""
    return make_app(
        store, HARVEST_DASHBOARD=True, HARVEST_ACTUATOR_TOKEN=TOKEN, SECRET_KEY=SECRET_KEY, **config
    )


def csrf_of(response: TestResponse) -> str:
    """The CSRF token a rendered page carries."""
    found = _CSRF.search(response.get_data(as_text=True))
    assert found, "the page has no CSRF token"
    return found.group(1)


def signed_in(client: FlaskClient, token: str = TOKEN) -> str:
    """Sign ``client`` in through the form; return the session's CSRF token."""
    page = client.get(f"{PREFIX}/sign-in")
    response = client.post(f"{PREFIX}/sign-in", data={"token": token, "csrf_token": csrf_of(page)})
    assert response.status_code == 303, response.get_data(as_text=True)
    return csrf_of(client.get(f"{PREFIX}/"))


def text(response: TestResponse) -> str:
    return response.get_data(as_text=True)
