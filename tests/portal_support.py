"""Shared helpers of the portal tests: an app with the portal mounted and an event catalog, a client
signed in through a link, and the portal's routes from the URL map."""

from __future__ import annotations

import re
from typing import Any

from flask import Flask
from flask.testing import FlaskClient
from werkzeug.test import TestResponse

from flask_harvest import OutboundWebhookHandler, OutboundWebhookPlugin
from flask_harvest.portal import portal, portal_url

from .pipeline import FAST, close_later

PREFIX = "/portal"
SECRET_KEY = "portal-test-secret-key-0123456789abcdef"
PORTAL_KEY = "portal-test-portal-key-0123456789abcdef"
#: The catalog's one type, and its example payload.
EVENT_TYPE = "order.created"
EXAMPLE = {"order_id": "ord_example_1", "total": 12.5}
_CSRF = re.compile(r'name="csrf_token" value="([^"]+)"')
_SECRET = re.compile(r'id="new-secret">([^<]+)<')


def portal_app(store: OutboundWebhookHandler, *, delegate: Any = None, **config: Any) -> Flask:
    """An app on ``store`` with the portal at :data:`PREFIX` and a catalog of one type. Targets on
    127.0.0.1 are allowed by a network (the receivers' address), not by turning the SSRF policy off,
    so the portal's refusals of other private addresses are real."""
    app = Flask("harvest_portal_test")
    app.config.update(FAST)
    app.config.update(
        SECRET_KEY=SECRET_KEY,
        HARVEST_PORTAL_SECRET_KEY=PORTAL_KEY,
        HARVEST_WEBHOOKS_ALLOW_PRIVATE_TARGETS=False,
        HARVEST_WEBHOOKS_ALLOW_CIDRS="127.0.0.1/32",
    )
    app.config.update(config)
    harvest = OutboundWebhookPlugin(store, app, delegate=delegate)
    harvest.event_type(
        EVENT_TYPE,
        description="An order was placed.",
        schema={"type": "object", "required": ["order_id"]},
        example=EXAMPLE,
    )
    app.register_blueprint(portal, url_prefix=PREFIX)
    return close_later(app)


def link(app: Flask, tenant: str, **options: Any) -> str:
    """A portal link for ``tenant``, made as the app makes it (in a request)."""
    with app.test_request_context():
        return portal_url(tenant, **options)


def signed_in(app: Flask, tenant: str) -> tuple[FlaskClient, str]:
    """A client that opened ``tenant``'s link, and its session's CSRF token."""
    client = app.test_client()
    opened = client.get(link(app, tenant))
    assert opened.status_code == 303, text(opened)
    return client, csrf_of(client.get(f"{PREFIX}/replay"))  # a page with a form


def csrf_of(response: TestResponse) -> str:
    found = _CSRF.search(text(response))
    assert found, "the page has no CSRF token"
    return found.group(1)


def secret_of(response: TestResponse) -> str:
    """The secret a page shows once (``id="new-secret"``)."""
    found = _SECRET.search(text(response))
    assert found, text(response)
    return found.group(1)


def text(response: TestResponse) -> str:
    return response.get_data(as_text=True)


def portal_routes(app: Flask) -> list[tuple[str, str, list[str]]]:
    """Every (method, rule, path variables) of the portal, from the app's URL map: a route added
    later is covered without a change here."""
    found = []
    for rule in app.url_map.iter_rules():
        if not rule.endpoint.startswith(f"{portal.name}."):
            continue
        for method in sorted((rule.methods or set()) - {"HEAD", "OPTIONS"}):
            found.append((method, rule.rule, sorted(rule.arguments)))
    return found
