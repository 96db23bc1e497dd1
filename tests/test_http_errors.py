"""Errors become HTTP answers in one place: every admin API answers every error as JSON, with the
status the error carries, and the dashboard shows the same status on its page; never Flask's HTML
page, never a traceback, and a server fault's cause only in the log."""

from __future__ import annotations

import html
import logging
from pathlib import Path
from typing import Any

import pytest
from flask import Flask, request
from flask_sqlalchemy import SQLAlchemy
from marshmallow import ValidationError

from flask_harvest import (
    ConfigurationError,
    DuplicateSubscriptionError,
    Harvest,
    InvalidFieldError,
    NotFoundError,
    StoreError,
    get_engine,
)
from flask_harvest.callbacks.targets import CallbackTargetRejected
from flask_harvest.errors import HarvestError
from flask_harvest.http.admin import ApiError
from flask_harvest.workflows.errors import ExecutionEndedError, InputTooLargeError, WorkflowIdReusedError

from .pipeline import close_later

TOKEN = "http-errors-token-0123456789"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
#: What an authorizer's exception may quote; no answer and no log line may show it.
CREDENTIAL = "Bearer sk_live_do-not-show-0123456789"
#: The cause of a server fault: in the log, never in an answer.
CAUSE = "the-cause-for-the-log-only"

#: A route of each admin API, and a path under each prefix that no route takes.
ADMIN_PATHS = {
    "actuator": "/actuator/webhooks/stats",
    "workflows API": "/api/harvest/workflows",
    "completion callbacks API": "/api/harvest/workflows/x/completion-deliveries",
    "completion-trigger admin": "/api/harvest/admin/completion-triggers",
}
UNROUTED_PATHS = ["/actuator/webhooks/nothing", "/api/harvest/nothing"]
DASHBOARD = "/harvest/"


@pytest.fixture
def app(tmp_path: Path) -> Flask:
    """Every surface in one app: the actuator, the workflow, callback and trigger APIs, the
    dashboard and the metrics route; exceptions propagate as under ``flask run --debug``."""
    app = Flask("http_errors")
    app.config.update(
        SQLALCHEMY_DATABASE_URI=f"sqlite:///{tmp_path / 'errors.db'}",
        HARVEST_ACTUATOR_TOKEN=TOKEN,
        HARVEST_DASHBOARD=True,
        HARVEST_METRICS=True,
        SECRET_KEY="http-errors-secret-key-0123456789abcdef",
        HARVEST_SWEEP_INTERVAL_SECONDS=3600,
        PROPAGATE_EXCEPTIONS=True,
    )
    db = SQLAlchemy(app)
    Harvest(app, db)
    return close_later(app)


def raise_from_every_request(app: Flask, error: Exception) -> None:
    """Raise ``error`` in every request, after routing: the blueprint that owns the path answers."""

    @app.before_request
    def _raise() -> None:
        if request.blueprint is not None:
            raise error


#: Each kind of error, the status and code every surface answers it with.
ERRORS: list[tuple[Exception, int, str]] = [
    (ApiError(400, "bad_json", "the body is not JSON"), 400, "bad_json"),
    (InvalidFieldError("workflow_id", "must be text"), 422, "validation_error"),
    (ValidationError({"limit": ["Must be between 1 and 500."]}), 422, "validation_error"),
    (CallbackTargetRejected(0, message="refused by the policy"), 422, "callback_target_rejected"),
    (InputTooLargeError("input", 300_000, 262_144), 413, "input_too_large"),
    (NotFoundError("no such thing"), 404, "not_found"),
    (DuplicateSubscriptionError("sub_1"), 409, "conflict"),
    (ExecutionEndedError("e1", "Completed", "cancel"), 409, "execution_ended"),
    (WorkflowIdReusedError("order-1", "RejectDuplicate", "e0", "Completed"), 409, "workflow_id_reused"),
    (StoreError(f"the database failed: {CAUSE}"), 503, "store_unavailable"),
    (ConfigurationError(f"HARVEST_SOMETHING is wrong: {CAUSE}"), 500, "configuration_error"),
    (HarvestError(f"a library fault: {CAUSE}"), 500, "internal_error"),
]


@pytest.mark.parametrize(("error", "status", "code"), ERRORS, ids=[type(e[0]).__name__ for e in ERRORS])
def test_every_error_gets_its_status_from_every_admin_api_and_the_dashboard(
    app: Flask, error: Exception, status: int, code: str, caplog: pytest.LogCaptureFixture
) -> None:
    raise_from_every_request(app, error)
    client = app.test_client()
    answers = {name: client.get(path, headers=AUTH) for name, path in ADMIN_PATHS.items()}
    page = client.get(DASHBOARD)
    for name, response in answers.items():
        assert response.status_code == status, (name, response.get_data(as_text=True)[:300])
        assert response.is_json, (name, response.get_data(as_text=True)[:300])
        assert response.get_json()["error"]["code"] == code, name
    assert page.status_code == status, page.get_data(as_text=True)[:300]
    assert page.mimetype == "text/html" and "Traceback" not in page.get_data(as_text=True)
    message = answers["actuator"].get_json()["error"]["message"]
    assert message in html.unescape(page.get_data(as_text=True))
    if status >= 500:  # a server fault: its cause is logged, never sent
        assert CAUSE in caplog.text
        assert all(CAUSE not in r.get_data(as_text=True) for r in [page, *answers.values()])
    else:
        expected = str(error) if isinstance(error, HarvestError) else "the request has invalid fields"
        assert message == expected


def test_an_error_without_a_status_is_a_json_500_with_a_generic_message(app: Flask) -> None:
    raise_from_every_request(app, ConfigurationError(f"set HARVEST_SOMETHING: {CAUSE}"))
    client = app.test_client()
    for name, path in ADMIN_PATHS.items():
        response = client.get(path, headers=AUTH)
        assert response.status_code == 500 and response.is_json, name
        assert response.get_json()["error"] == {
            "code": "configuration_error",
            "message": ConfigurationError.public_message,
        }


def _raising_authorizer(_: Any) -> bool:
    raise RuntimeError(f"could not check {CREDENTIAL}")


@pytest.mark.parametrize("path", [*ADMIN_PATHS.values(), *UNROUTED_PATHS, "/actuator/webhooks/metrics"])
@pytest.mark.parametrize("method", ["GET", "PROPFIND"])
def test_an_authorizer_that_raises_is_a_json_500_and_its_message_is_never_shown(
    app: Flask, path: str, method: str, caplog: pytest.LogCaptureFixture
) -> None:
    get_engine(app).access.authorizer = _raising_authorizer
    with caplog.at_level(logging.INFO):
        response = app.test_client().open(path, method=method, headers={"Authorization": CREDENTIAL})
    assert response.status_code == 500, response.get_data(as_text=True)[:300]
    assert response.get_json()["error"]["code"] == "authorizer_failed"
    assert CREDENTIAL not in response.get_data(as_text=True)
    assert "RuntimeError" in caplog.text and "_raising_authorizer" in caplog.text
    assert CREDENTIAL not in caplog.text


def test_the_dashboard_answers_an_authorizer_that_raises_with_a_500_page(
    app: Flask, caplog: pytest.LogCaptureFixture
) -> None:
    get_engine(app).access.authorizer = _raising_authorizer
    client = app.test_client()
    for method, path in (("GET", DASHBOARD), ("GET", "/harvest/sign-in"), ("GET", "/harvest/nothing")):
        response = client.open(path, method=method)
        text = response.get_data(as_text=True)
        assert response.status_code == 500 and response.mimetype == "text/html", (path, text[:300])
        assert CREDENTIAL not in text and "Traceback" not in text
    assert "RuntimeError" in caplog.text and CREDENTIAL not in caplog.text


def test_one_status_convention_on_every_api(app: Flask) -> None:
    """400 a malformed body, 422 a field's (or query parameter's) value, 413 too large: the same on
    the actuator, the workflow API and the trigger admin."""
    client = app.test_client()

    def status(method: str, path: str, **kw: Any) -> int:
        return client.open(path, method=method, headers=AUTH, **kw).status_code

    not_an_object = {"data": "[1, 2]", "content_type": "application/json"}
    assert status("POST", "/actuator/webhooks/subscriptions", **not_an_object) == 400
    assert status("POST", "/api/harvest/workflows/nope/start", **not_an_object) == 400
    assert status("POST", "/api/harvest/admin/completion-triggers", **not_an_object) == 400
    for path in (
        "/actuator/webhooks/dlq?limit=x",
        "/api/harvest/workflows?limit=x",
        "/api/harvest/admin/completion-triggers?limit=x",
    ):
        assert status("GET", path) == 422, path
    assert status("POST", "/actuator/webhooks/subscriptions", json={"bogus": 1}) == 422
    assert status("POST", "/api/harvest/workflows/nope/start", json={"bogus": 1}) == 422
    too_large = {"data": b"{" + b" " * (2 * 1024 * 1024), "content_type": "application/json"}
    assert status("POST", "/actuator/webhooks/subscriptions", **too_large) == 413
    assert status("POST", "/api/harvest/workflows/nope/start", **too_large) == 413
