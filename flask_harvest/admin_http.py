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

from flask import Blueprint, Flask, Response, current_app, g, jsonify, request
from marshmallow import Schema, ValidationError
from werkzeug.exceptions import HTTPException, MethodNotAllowed, NotFound, RequestEntityTooLarge
from werkzeug.routing import PathConverter

from ._app import get_engine
from ._input import check_json_value, check_text, id_problem, parse_json, read_limited
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
_CHUNK = 16 * 1024


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
    # surrogatepass: a header no server could send (a lone surrogate, from a test client or an
    # ASGI bridge) must fail to match, not raise.
    sent = credentials.encode("utf-8", "surrogatepass")
    if (
        token
        and scheme.lower() == "bearer"
        and hmac.compare_digest(sent, token.encode("utf-8", "surrogatepass"))
    ):
        return None
    authorizer = engine.access.authorizer
    if authorizer is not None:
        # Exactly True: a truthy "denied" string or a forgotten return value must not open the API.
        if authorizer(request) is True:
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


def read_body(limit: int) -> bytes:
    """Return the request body, refusing one over ``limit`` bytes without reading past it.

    A declared length is checked up front; a chunked body (no length) is read one byte past the
    limit at most. Every body the admin APIs and the dashboard read comes through here.

    :raises RequestEntityTooLarge: the body is larger (a 413, answered by each blueprint's own
        error handler: JSON ``request_entity_too_large`` in the admin APIs, a page in the
        dashboard).
    """
    body = read_limited(request.stream, request.content_length, limit, chunk_size=_CHUNK)
    if body is None:
        raise RequestEntityTooLarge(f"the body is larger than {limit} bytes")
    return body


def read_json() -> Any:
    """Return the request body parsed as JSON; every admin write reads its body here.

    Only a body sent as ``Content-Type: application/json``: a cross-site form or ``text/plain``
    post (which a browser sends without asking) never reaches a route that changes state.

    :raises ApiError: the content type is not JSON (415), checked first; the body is not JSON in
        UTF-8, or nested past :data:`~flask_harvest._input.MAX_JSON_DEPTH` (400 ``bad_json``).
    :raises RequestEntityTooLarge: the body is over the blueprint's limit (default
        :data:`MAX_BODY_BYTES`; 413).
    """
    if not request.is_json:
        raise ApiError(415, "unsupported_media_type", "send a JSON body with Content-Type: application/json")
    try:
        return parse_json(read_body(g.get("harvest_body_limit", MAX_BODY_BYTES)))
    except InvalidFieldError as exc:
        raise ApiError(400, "bad_json", f"the body {exc.message}") from None


def load_body(schema: Schema) -> dict[str, Any]:
    """Return the request's JSON object loaded through ``schema``.

    The body is refused before the schema sees it when it is not sent as JSON (415), over
    :data:`MAX_BODY_BYTES` (413), not a JSON object in UTF-8 or nested past
    :data:`~flask_harvest._input.MAX_JSON_DEPTH` (400), or holds a string with a NUL character or
    a lone surrogate (422 naming the field).

    :raises ApiError: the body is not a JSON object.
    :raises ValidationError: the object does not fit the schema.
    """
    data = read_json()
    if not isinstance(data, dict):
        raise ApiError(400, "bad_json", "the body must be a JSON object")
    for key, value in data.items():
        check_text(key, "body")
        check_json_value(value, key)
    loaded: dict[str, Any] = schema.load(data)
    return loaded


def load_query(schema: Schema) -> dict[str, Any]:
    """Return the query string loaded through ``schema``; a NUL or undecodable character is refused
    (422 naming the parameter) before the schema sees it."""
    for key, values in request.args.lists():
        check_text(key, "query")
        for value in values:
            check_text(value, key)
    loaded: dict[str, Any] = schema.load(request.args.to_dict())
    return loaded


def _options() -> Response | tuple[Response, int] | None:
    """Answer ``OPTIONS`` with the methods the path's own routes take. Flask's automatic answer
    would add those of the catch-all route, which takes every method only to refuse it."""
    if request.method != "OPTIONS":
        return None
    allowed = _allowed_methods()
    if not allowed:
        return no_such_route()
    response = current_app.response_class(status=200)
    response.headers["Allow"] = ", ".join(sorted(allowed))
    return response


def _bad_path_id() -> tuple[Response, int] | None:
    """A path id no object can have (NUL, a control character, undecodable) is answered 404
    before any store sees it."""
    for name, value in (request.view_args or {}).items():
        problem = id_problem(value) if isinstance(value, str) else None
        if problem is not None:
            return json_error(404, "not_found", f"no object has this {name}: {problem}")
    return None


def _allowed_methods() -> set[str]:
    """The methods the request's path takes: those of its own routes, not of a catch-all."""
    adapter = current_app.url_map.bind_to_environ(request.environ)
    # A method the path's own route refuses falls through to a catch-all (an ``anypath`` route):
    # that does not make the method allowed.
    catch_alls = {rule.endpoint for rule in current_app.url_map.iter_rules() if "<anypath:" in rule.rule}
    allowed: set[str] = set()
    for method in ("GET", "POST", "PUT", "PATCH", "DELETE"):
        try:
            rule, _ = adapter.match(method=method, return_rule=True)
        except HTTPException:
            continue
        if rule.endpoint not in catch_alls:
            allowed |= set(rule.methods or ())
    return allowed


def no_such_route() -> tuple[Response, int]:
    """The answer of a blueprint's catch-all route: ``405`` with ``Allow`` when the path exists for
    other methods, else ``404``; JSON either way."""
    allowed = _allowed_methods()
    if not allowed:
        return json_error(404, "not_found", f"no route {request.method} {request.path}")
    response, status = json_error(
        405, "method_not_allowed", f"{request.path} takes {', '.join(sorted(allowed))}"
    )
    response.headers["Allow"] = ", ".join(sorted(allowed))
    return response, status


#: Where :func:`_guard_unrouted` keeps, per app, each admin prefix and its realm.
_PREFIXES_KEY = "harvest_admin_prefixes"


def _guard_unrouted(app: Flask, prefix: str, realm: str) -> None:
    """Answer a request under ``prefix`` that matches no route (a method no rule takes, such as
    ``PROPFIND`` or ``FOO``, or a path outside every blueprint's routes) like the blueprint's own:
    after the access check, as a JSON ``404``/``405``.

    Werkzeug refuses such a request while routing, before any blueprint is chosen, so neither the
    blueprint's ``before_request`` nor its error handlers see it: without this it would get Flask's
    HTML page. Only paths under an admin prefix are touched; the app's other pages keep its own
    handlers.
    """
    prefixes: dict[str, str] | None = app.extensions.get(_PREFIXES_KEY)
    if prefixes is None:
        prefixes = app.extensions[_PREFIXES_KEY] = {}
        app.before_request(_unrouted_admin_request)
    prefixes.setdefault(prefix.rstrip("/"), realm)


def _unrouted_admin_request() -> tuple[Response, int] | None:
    exc = request.routing_exception
    if not isinstance(exc, NotFound | MethodNotAllowed):
        return None
    prefixes: dict[str, str] = current_app.extensions.get(_PREFIXES_KEY, {})
    # The longest prefix first: its realm is the one of the API the path belongs to.
    for prefix in sorted(prefixes, key=len, reverse=True):
        if request.path == prefix or request.path.startswith(prefix + "/"):
            return authorize_admin(prefixes[prefix]) or no_such_route()
    return None


class AnyPathConverter(PathConverter):
    """``<anypath:path>``: like ``<path:...>``, but also across newlines (``%0A``), so that a
    blueprint's catch-all route answers every path under its prefix in JSON, after the access
    check."""

    regex = "(?s:[^/].*?)"


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

    Call it before the blueprint's routes are declared: it registers the ``anypath`` converter
    their catch-all route uses.

    :param invalid_status: the status of a request whose fields do not validate (the actuator's
        422; the workflow API's 400).
    :param max_body_bytes: the largest request body, read per request (default
        :data:`MAX_BODY_BYTES`).
    """

    @blueprint.record_once
    def _converter(state: Any) -> None:
        state.app.url_map.converters.setdefault("anypath", AnyPathConverter)

    @blueprint.record
    def _prefix(state: Any) -> None:
        _guard_unrouted(state.app, state.url_prefix or "", realm)

    @blueprint.before_request
    def _authorize() -> Response | tuple[Response, int] | None:
        # What read_json() reads at most: this blueprint's limit (the workflow API's follows the
        # workflow input limit), never Flask's max_content_length, which has no setter before 3.1.
        g.harvest_body_limit = max_body_bytes() if max_body_bytes is not None else MAX_BODY_BYTES
        return authorize_admin(realm) or _bad_path_id() or _options()

    @blueprint.errorhandler(ApiError)
    def _api_error(exc: ApiError) -> tuple[Response, int]:
        return json_error(exc.status, exc.code, exc.message, exc.fields)

    @blueprint.errorhandler(ValidationError)
    def _validation_error(exc: ValidationError) -> tuple[Response, int]:
        messages = exc.messages if isinstance(exc.messages, dict) else {"_schema": exc.messages}
        return json_error(invalid_status, "validation_error", "the request has invalid fields", messages)

    # Each handler below answers an error's own http_status and error_code when it declares them
    # (InputTooLargeError is an InvalidFieldError answered 413).
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

    @blueprint.errorhandler(StoreError)
    def _store_down(exc: StoreError) -> tuple[Response, int]:
        log.error("harvest %s: %s", realm, exc)
        return json_error(503, "store_unavailable", "the store is unavailable; try again")

    @blueprint.errorhandler(HarvestError)
    def _typed_error(exc: HarvestError) -> tuple[Response, int]:
        # An error that names its own status (``http_status``, e.g. a refused callback target:
        # 422) is answered with it, its ``error_code`` and whatever ``error_details()`` adds.
        status = getattr(exc, "http_status", None)
        if not isinstance(status, int):
            raise exc
        body: dict[str, Any] = {"code": getattr(exc, "error_code", "error"), "message": str(exc)}
        details = getattr(exc, "error_details", None)
        if callable(details):
            body.update(details())
        return jsonify(error=body), status

    @blueprint.errorhandler(HTTPException)
    def _http_error(exc: HTTPException) -> tuple[Response, int]:
        code = exc.code or 500
        return json_error(code, (exc.name or "error").lower().replace(" ", "_"), exc.description or "")
