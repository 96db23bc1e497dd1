"""The ``/actuator/webhooks`` blueprint: JSON endpoints for on-call operators.

Deny by default: with no ``HARVEST_ACTUATOR_TOKEN`` and no authorizer registered with
:meth:`~flask_harvest.extension.OutboundWebhookPlugin.actuator_authorizer`, every route
answers 403. Secrets appear only in the responses that create a subscription or rotate its secret.
"""

from __future__ import annotations

import hmac
import logging
from typing import Any

from flask import Blueprint, Response, jsonify, request
from marshmallow import Schema, ValidationError
from werkzeug.exceptions import HTTPException

from .._app import get_engine
from ..errors import (
    DuplicateSubscriptionError,
    HarvestError,
    InvalidFieldError,
    InvalidStateError,
    NotFoundError,
    StoreError,
)
from .models import WebhookSubscriptionStatus
from .schemas import (
    DlqQuerySchema,
    ReplaySchema,
    RotateSecretSchema,
    SubscriptionCreateSchema,
    SubscriptionPatchSchema,
)

log = logging.getLogger(__name__)
actuator = Blueprint("harvest_actuator", __name__)

#: Request bodies larger than this are refused with 413 before they are read.
MAX_BODY_BYTES = 64 * 1024


class ApiError(Exception):
    """An error answered as ``{"error": {"code", "message", "fields"}}`` with ``status``."""

    def __init__(self, status: int, code: str, message: str, fields: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.fields = fields


def _error(
    status: int, code: str, message: str, fields: dict[str, Any] | None = None
) -> tuple[Response, int]:
    body: dict[str, Any] = {"code": code, "message": message}
    if fields:
        body["fields"] = fields
    return jsonify(error=body), status


# -- auth ------------------------------------------------------------------------------------------


@actuator.before_request
def _authorize() -> tuple[Response, int] | None:
    request.max_content_length = MAX_BODY_BYTES
    engine = get_engine()
    token = engine.settings.actuator_token
    given = request.headers.get("Authorization", "")
    scheme, _, credentials = given.partition(" ")
    if token and scheme.lower() == "bearer" and hmac.compare_digest(credentials.encode(), token.encode()):
        return None
    authorizer = engine.access.authorizer
    if authorizer is not None:
        if authorizer(request):
            return None
        return _error(403, "forbidden", "the actuator authorizer refused this request")
    if token:
        response, status = _error(
            401, "unauthorized", "send 'Authorization: Bearer <HARVEST_ACTUATOR_TOKEN>'"
        )
        response.headers["WWW-Authenticate"] = 'Bearer realm="harvest-actuator"'
        return response, status
    return _error(
        403,
        "actuator_disabled",
        "the actuator is closed: set HARVEST_ACTUATOR_TOKEN or register an authorizer",
    )


# -- errors ----------------------------------------------------------------------------------------


@actuator.errorhandler(ApiError)
def _api_error(exc: ApiError) -> tuple[Response, int]:
    return _error(exc.status, exc.code, exc.message, exc.fields)


@actuator.errorhandler(ValidationError)
def _validation_error(exc: ValidationError) -> tuple[Response, int]:
    messages = exc.messages if isinstance(exc.messages, dict) else {"_schema": exc.messages}
    return _error(422, "validation_error", "the request has invalid fields", messages)


@actuator.errorhandler(InvalidFieldError)
def _invalid_field(exc: InvalidFieldError) -> tuple[Response, int]:
    return _error(422, "validation_error", str(exc), {exc.field: [exc.message]})


@actuator.errorhandler(NotFoundError)
def _not_found(exc: NotFoundError) -> tuple[Response, int]:
    return _error(404, "not_found", str(exc))


@actuator.errorhandler(DuplicateSubscriptionError)
@actuator.errorhandler(InvalidStateError)
def _conflict(exc: HarvestError) -> tuple[Response, int]:
    return _error(409, "conflict", str(exc))


@actuator.errorhandler(StoreError)
def _store_down(exc: StoreError) -> tuple[Response, int]:
    log.error("harvest actuator: %s", exc)
    return _error(503, "store_unavailable", "the webhook store is unavailable; try again")


@actuator.errorhandler(HTTPException)
def _http_error(exc: HTTPException) -> tuple[Response, int]:
    code = exc.code or 500
    return _error(code, (exc.name or "error").lower().replace(" ", "_"), exc.description or "")


# -- input -----------------------------------------------------------------------------------------


def _body(schema: Schema) -> dict[str, Any]:
    """Return the request's JSON object loaded through ``schema``."""
    if not request.is_json:
        raise ApiError(415, "unsupported_media_type", "send a JSON body with Content-Type: application/json")
    data = request.get_json(silent=True)
    if data is None:
        raise ApiError(400, "bad_json", "the body is not valid JSON")
    if not isinstance(data, dict):
        raise ApiError(400, "bad_json", "the body must be a JSON object")
    loaded: dict[str, Any] = schema.load(data)
    return loaded


def _query(schema: Schema) -> dict[str, Any]:
    loaded: dict[str, Any] = schema.load(request.args.to_dict())
    return loaded


# -- deliveries ------------------------------------------------------------------------------------


@actuator.get("/dlq")
def list_dlq() -> Response:
    """Dead-lettered deliveries, newest first; ``X-Next-Cursor`` continues the listing."""
    query = _query(DlqQuerySchema())
    page, next_cursor = get_engine().operations.dlq_page(**query)
    response = jsonify([d.to_dict() for d in page])
    if next_cursor:
        response.headers["X-Next-Cursor"] = next_cursor
    return response


@actuator.post("/replay")
def replay() -> tuple[Response, int]:
    """Replay one dead-lettered delivery (``log_id``) or many (subscription and/or window)."""
    body = _body(ReplaySchema())
    engine = get_engine()
    if "log_id" in body:
        result = engine.operations.replay(body["log_id"])
    else:
        result = engine.operations.replay_many(
            subscription_id=body.get("subscription_id"),
            since=body.get("since"),
            until=body.get("until"),
            limit=body["limit"],
            dry_run=body["dry_run"],
        )
    payload = {
        "dry_run": result.dry_run,
        "count": len(result.delivery_ids),
        "delivery_ids": result.delivery_ids,
    }
    if result.enqueue_error:
        payload["warning"] = f"replayed, but not queued ({result.enqueue_error}); the sweeper will send them"
    return jsonify(payload), 202 if result.enqueue_error else 200


@actuator.get("/deliveries/<delivery_id>")
def show_delivery(delivery_id: str) -> Response:
    return jsonify(get_engine().operations.delivery_with_attempts(delivery_id))


@actuator.get("/stats")
def stats() -> Response:
    return jsonify(get_engine().operations.stats())


# -- subscriptions ---------------------------------------------------------------------------------


@actuator.get("/subscriptions")
def list_subscriptions() -> Response:
    return jsonify([s.to_dict() for s in get_engine().operations.list_subscriptions()])


@actuator.post("/subscriptions")
def create_subscription() -> tuple[Response, int]:
    body = _body(SubscriptionCreateSchema())
    created = get_engine().operations.create_subscription(
        target_url=body["target_url"],
        event_topics=body["event_topics"],
        secret=body.get("secret"),
        subscription_id=body.get("id"),
        description=body["description"],
    )
    # The one response that shows the secret: the caller must store it now.
    return jsonify({**created.subscription.to_dict(), "secret": created.secret}), 201


@actuator.get("/subscriptions/<subscription_id>")
def show_subscription(subscription_id: str) -> Response:
    return jsonify(get_engine().operations.get_subscription(subscription_id).to_dict())


@actuator.patch("/subscriptions/<subscription_id>")
def update_subscription(subscription_id: str) -> Response:
    body = _body(SubscriptionPatchSchema())
    status = body.get("status")
    updated = get_engine().operations.update_subscription(
        subscription_id,
        target_url=body.get("target_url"),
        event_topics=body.get("event_topics"),
        description=body.get("description"),
        status=WebhookSubscriptionStatus(status) if status else None,
    )
    return jsonify(updated.to_dict())


@actuator.delete("/subscriptions/<subscription_id>")
def remove_subscription(subscription_id: str) -> tuple[str, int]:
    get_engine().operations.remove_subscription(subscription_id)
    return "", 204


@actuator.post("/subscriptions/<subscription_id>/rotate-secret")
def rotate_secret(subscription_id: str) -> Response:
    # A JSON body is required, even if empty ({}): a cross-site form cannot send one, so a
    # cookie-trusting authorizer cannot be tricked into rotating a secret.
    body = _body(RotateSecretSchema())
    rotated = get_engine().operations.rotate_secret(
        subscription_id, new_secret=body.get("secret"), grace_seconds=body.get("grace_seconds")
    )
    # The one response that shows the new secret.
    return jsonify({**rotated.subscription.to_dict(), "secret": rotated.secret})


@actuator.route("/", defaults={"path": ""}, methods=["GET", "POST", "PUT", "PATCH", "DELETE"])
@actuator.route("/<path:path>", methods=["GET", "POST", "PUT", "PATCH", "DELETE"])
def unknown_route(path: str) -> tuple[Response, int]:
    """Anything else under the prefix: a JSON 404, after the auth check like every route."""
    return _error(404, "not_found", f"no actuator route {request.method} {request.path}")
