"""What every admin blueprint shares (the actuator, the workflow API): who may call it, how a
request body is read, and how an error is answered.

Deny by default: a request passes with ``Authorization: Bearer <HARVEST_ACTUATOR_TOKEN>``, or when
the authorizer registered on the extension returns ``True``; with neither configured every route
answers 403. Errors are JSON, ``{"error": {"code", "message", "fields"}}``, never an HTML page.
"""

from __future__ import annotations

import hmac
import logging
from collections.abc import Callable
from typing import Any

from flask import Blueprint, Response, jsonify, request
from marshmallow import Schema, ValidationError
from werkzeug.exceptions import HTTPException

from ._app import get_engine
from .errors import (
    DuplicateSubscriptionError,
    HarvestError,
    InvalidFieldError,
    InvalidStateError,
    NotFoundError,
    StoreError,
)

log = logging.getLogger(__name__)

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


def json_error(
    status: int, code: str, message: str, fields: dict[str, Any] | None = None
) -> tuple[Response, int]:
    """Return the JSON error response every admin route answers with."""
    body: dict[str, Any] = {"code": code, "message": message}
    if fields:
        body["fields"] = fields
    return jsonify(error=body), status


def authorize_admin(realm: str) -> tuple[Response, int] | None:
    """Return the refusal for the current request, or ``None`` if it may use the admin routes."""
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
        return json_error(403, "forbidden", "the admin authorizer refused this request")
    if token:
        response, status = json_error(
            401, "unauthorized", "send 'Authorization: Bearer <HARVEST_ACTUATOR_TOKEN>'"
        )
        response.headers["WWW-Authenticate"] = f'Bearer realm="{realm}"'
        return response, status
    return json_error(
        403,
        "actuator_disabled",
        "the admin API is closed: set HARVEST_ACTUATOR_TOKEN or register an authorizer",
    )


def load_body(schema: Schema) -> dict[str, Any]:
    """Return the request's JSON object loaded through ``schema``.

    :raises ApiError: the body is not a JSON object.
    :raises ValidationError: the object does not fit the schema.
    """
    if not request.is_json:
        raise ApiError(415, "unsupported_media_type", "send a JSON body with Content-Type: application/json")
    data = request.get_json(silent=True)
    if data is None:
        raise ApiError(400, "bad_json", "the body is not valid JSON")
    if not isinstance(data, dict):
        raise ApiError(400, "bad_json", "the body must be a JSON object")
    loaded: dict[str, Any] = schema.load(data)
    return loaded


def load_query(schema: Schema) -> dict[str, Any]:
    """Return the query string loaded through ``schema``."""
    loaded: dict[str, Any] = schema.load(request.args.to_dict())
    return loaded


def error_status(exc: BaseException, default: int) -> int:
    """Return the 4xx status ``exc`` asks for in an ``http_status`` attribute, else ``default``.

    An error class of any subsystem maps itself to a status this way (``InputTooLargeError`` is a
    413, a refused completion callback a 422), so this module need not know every class.
    """
    status = getattr(exc, "http_status", None)
    if isinstance(status, int) and not isinstance(status, bool) and 400 <= status < 500:
        return status
    return default


def _error_code(exc: BaseException, default: str) -> str:
    code = getattr(exc, "error_code", None)
    return code if isinstance(code, str) and code else default


def install_admin_api(
    blueprint: Blueprint,
    *,
    realm: str,
    invalid_status: int = 422,
    max_body_bytes: Callable[[], int] | None = None,
) -> None:
    """Guard every route of ``blueprint`` with :func:`authorize_admin` and answer its errors as JSON.

    :param invalid_status: the status of a request whose fields do not validate (the actuator's
        422; the workflow API's 400).
    :param max_body_bytes: the largest request body, read per request (default
        :data:`MAX_BODY_BYTES`).
    """

    @blueprint.before_request
    def _authorize() -> tuple[Response, int] | None:
        request.max_content_length = max_body_bytes() if max_body_bytes is not None else MAX_BODY_BYTES
        return authorize_admin(realm)

    @blueprint.errorhandler(ApiError)
    def _api_error(exc: ApiError) -> tuple[Response, int]:
        return json_error(exc.status, exc.code, exc.message, exc.fields)

    @blueprint.errorhandler(ValidationError)
    def _validation_error(exc: ValidationError) -> tuple[Response, int]:
        messages = exc.messages if isinstance(exc.messages, dict) else {"_schema": exc.messages}
        return json_error(invalid_status, "validation_error", "the request has invalid fields", messages)

    @blueprint.errorhandler(InvalidFieldError)
    def _invalid_field(exc: InvalidFieldError) -> tuple[Response, int]:
        return json_error(
            error_status(exc, invalid_status),
            _error_code(exc, "validation_error"),
            str(exc),
            {exc.field: [exc.message]},
        )

    @blueprint.errorhandler(NotFoundError)
    def _not_found(exc: NotFoundError) -> tuple[Response, int]:
        return json_error(error_status(exc, 404), _error_code(exc, "not_found"), str(exc))

    @blueprint.errorhandler(DuplicateSubscriptionError)
    @blueprint.errorhandler(InvalidStateError)
    def _conflict(exc: HarvestError) -> tuple[Response, int]:
        return json_error(error_status(exc, 409), _error_code(exc, "conflict"), str(exc))

    @blueprint.errorhandler(HarvestError)
    def _declared(exc: HarvestError) -> tuple[Response, int]:
        # Any other flask-harvest error that declares its status (http_status); the rest are bugs
        # or misconfiguration, and propagate to Flask's 500 with their traceback in the log.
        status = error_status(exc, 0)
        if not status:
            raise exc
        return json_error(status, _error_code(exc, "rejected"), str(exc))

    @blueprint.errorhandler(StoreError)
    def _store_down(exc: StoreError) -> tuple[Response, int]:
        log.error("harvest %s: %s", realm, exc)
        return json_error(503, "store_unavailable", "the store is unavailable; try again")

    @blueprint.errorhandler(HTTPException)
    def _http_error(exc: HTTPException) -> tuple[Response, int]:
        code = exc.code or 500
        return json_error(code, (exc.name or "error").lower().replace(" ", "_"), exc.description or "")
