"""What every admin blueprint shares (the actuator, the workflow API): who may call it, how a
request body is read, and how an error is answered.

Deny by default: a request passes with ``Authorization: Bearer <HARVEST_ACTUATOR_TOKEN>``, or when
the authorizer registered on the extension returns ``True``; with neither configured every route
answers 403. Errors are JSON, ``{"error": {"code", "message", "fields"}}``, never an HTML page.

:func:`error_answer` is the one mapping of an error to its HTTP answer, for every admin blueprint
and the dashboard. Its status convention: 400 a malformed body (not JSON, not an object), 422 a
field's value, 413 too large, 404 no such object, 409 a conflict, 503 a store down, 500 a fault
of the server (its cause logged, never sent).
"""

from __future__ import annotations

import hmac
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from flask import Blueprint, Flask, Response, current_app, g, jsonify, request
from marshmallow import Schema, ValidationError
from werkzeug.exceptions import HTTPException, MethodNotAllowed, NotFound, RequestEntityTooLarge
from werkzeug.routing import PathConverter
from werkzeug.wrappers import Response as BaseResponse

from .._app import get_engine
from .._input import check_json_value, check_text, id_problem, parse_json, read_limited
from ..errors import AuthorizerError, HarvestError, InvalidFieldError

log = logging.getLogger(__name__)

#: Request bodies larger than this are refused with 413 before they are read.
MAX_BODY_BYTES = 64 * 1024
_CHUNK = 16 * 1024


class ApiError(HarvestError):
    """An error of the HTTP edge itself (a body that is not JSON, a bad query), answered as
    ``{"error": {"code", "message", "fields"}}`` with ``status``."""

    def __init__(self, status: int, code: str, message: str, fields: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.http_status = status
        self.error_code = code
        self.message = message
        self.fields = fields

    def error_details(self) -> dict[str, Any]:
        return {"fields": self.fields} if self.fields else {}


@dataclass(frozen=True)
class ErrorAnswer:
    """How an error is answered: ``status``, and the JSON body's ``code``, ``message`` and extra
    keys (``details``: ``fields``, a callback target's ``rejection``)."""

    status: int
    code: str
    message: str
    details: Mapping[str, Any] = field(default_factory=dict)

    def json(self) -> tuple[Response, int]:
        """The JSON response every admin route answers an error with."""
        return jsonify(error={"code": self.code, "message": self.message, **self.details}), self.status


def error_answer(exc: Exception, where: str) -> ErrorAnswer:
    """Return the answer to ``exc``: the one mapping of errors to HTTP for every admin API and the
    dashboard.

    A :class:`~flask_harvest.errors.HarvestError` carries its own status and code; a 5xx one is
    logged as ``<where>: <message>`` (``where``: the surface, such as ``harvest actuator``) and
    answered with its class's ``public_message``, never its own. A marshmallow ``ValidationError``
    is a field's value (422); a werkzeug ``HTTPException`` keeps its code.
    """
    if isinstance(exc, HarvestError):
        status = exc.http_status
        if status >= 500:
            # Our messages hold no secret, but a 5xx is the server's fault: the caller can do
            # nothing with its cause, and the operator finds it in the log.
            log.error("%s: %s", where, exc)
            return ErrorAnswer(status, exc.error_code, exc.public_message)
        return ErrorAnswer(status, exc.error_code, str(exc), exc.error_details())
    if isinstance(exc, ValidationError):
        messages = exc.messages if isinstance(exc.messages, dict) else {"_schema": exc.messages}
        return ErrorAnswer(422, "validation_error", "the request has invalid fields", {"fields": messages})
    if isinstance(exc, HTTPException):
        name = exc.name or "error"
        return ErrorAnswer(exc.code or 500, name.lower().replace(" ", "_"), exc.description or "")
    log.error("%s: unexpected %s", where, type(exc).__name__)
    return ErrorAnswer(500, "internal_error", HarvestError.public_message)


def _log_name(realm: str) -> str:
    """How the log names an admin API: ``harvest actuator`` for the realm ``harvest-actuator``."""
    return realm.replace("-", " ", 1)


def authorizer_allows(authorizer: Callable[[Any], object]) -> bool:
    """Whether ``authorizer`` allows the current request: it must return exactly ``True``, so a
    truthy "denied" string or a forgotten return value never opens anything.

    :raises AuthorizerError: the authorizer raised; the request is refused.
    """
    try:
        answer = authorizer(request)
    except Exception as exc:
        # from None: the original's message may quote a credential, and nothing that prints
        # this error's chain should show it. AuthorizerError says where it was raised.
        raise AuthorizerError(exc) from None
    return answer is True


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
        try:
            allowed = authorizer_allows(authorizer)
        except AuthorizerError as exc:
            # Answered here, not raised: the metrics route and unrouted paths have no blueprint
            # whose error handler would answer it in JSON.
            return error_answer(exc, _log_name(realm)).json()
        if allowed:
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


def install_admin_api(
    blueprint: Blueprint,
    *,
    realm: str,
    max_body_bytes: Callable[[], int] | None = None,
) -> None:
    """Guard every route of ``blueprint`` with :func:`authorize_admin` and answer its errors as JSON
    through :func:`error_answer`.

    Call it before the blueprint's routes are declared: it registers the ``anypath`` converter
    their catch-all route uses.

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

    @blueprint.errorhandler(HarvestError)
    @blueprint.errorhandler(ValidationError)
    @blueprint.errorhandler(HTTPException)
    def _error(exc: Exception) -> BaseResponse | tuple[Response, int]:
        if isinstance(exc, HTTPException) and exc.code is not None and exc.code < 400:
            return exc.get_response()  # a redirect stays one
        return error_answer(exc, _log_name(realm)).json()
