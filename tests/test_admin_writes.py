"""Every write route of every admin API (webhooks, workflows, completion callbacks, completion
triggers) takes only a body sent as ``application/json``: with an authorizer that trusts a cookie,
a cross-site form or ``text/plain`` post must change nothing (415)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from flask import Flask
from flask.testing import FlaskClient

from flask_harvest import get_engine, trigger_service, workflow_service

from .test_triggers_api import build_app, seed_body

#: The bodies a cross-site page can send without a preflight, each a valid body if it were JSON.
CROSS_SITE = [
    ("text/plain", json.dumps(seed_body())),
    ("application/x-www-form-urlencoded", "a=1"),
    (
        "multipart/form-data; boundary=x",
        '--x\r\nContent-Disposition: form-data; name="a"\r\n\r\n1\r\n--x--\r\n',
    ),
    (None, "{}"),
]


@pytest.fixture
def app(tmp_path: Path) -> Flask:
    app = build_app(f"sqlite:///{tmp_path / 'writes.db'}")
    # A cookie-trusting authorizer: what a cross-site request rides on.
    get_engine(app).access.authorizer = lambda request: request.cookies.get("session") == "trusted"
    return app


@pytest.fixture
def client(app: Flask) -> FlaskClient:
    client = app.test_client()
    client.set_cookie("session", "trusted")
    return client


def write_routes(app: Flask) -> list[tuple[str, str]]:
    """Every (method, path) of an admin route that changes state, path variables filled in."""
    found = []
    for rule in app.url_map.iter_rules():
        endpoint = rule.endpoint
        if not endpoint.startswith("harvest_") or endpoint.startswith("harvest_dashboard"):
            continue
        if endpoint.endswith(".unknown_route"):
            continue
        for method in sorted((rule.methods or set()) & {"POST", "PUT", "PATCH"}):
            found.append((method, re.sub(r"<(?:\w+:)?(\w+)>", r"\1", rule.rule)))
    return found


def test_every_admin_write_route_is_listed(app: Flask) -> None:
    routes = write_routes(app)
    assert ("POST", "/api/harvest/admin/completion-triggers") in routes
    assert (
        "POST",
        "/api/harvest/workflows/execution_id/completion-deliveries/delivery_id/redrive",
    ) in routes
    assert len(routes) >= 9


@pytest.mark.parametrize(("content_type", "body"), CROSS_SITE)
def test_a_write_not_sent_as_json_is_a_415_and_changes_nothing(
    app: Flask, client: FlaskClient, content_type: str | None, body: str
) -> None:
    headers = {}
    if content_type is not None:
        headers["Content-Type"] = content_type
    for method, path in write_routes(app):
        response = client.open(path, method=method, data=body, headers=headers)
        assert response.status_code == 415, (method, path, response.get_data(as_text=True))
        assert response.get_json()["error"]["code"] == "unsupported_media_type"
    with app.app_context():
        assert trigger_service().list_triggers() == []
        assert workflow_service().list_executions(limit=10)[0] == []
