"""The completion-trigger admin API, under the workflow API prefix (``HARVEST_WORKFLOW_API_PREFIX``).

``GET /admin/completion-triggers``, ``POST /admin/completion-triggers`` (full-replacement upsert,
201), ``GET`` and ``DELETE /admin/completion-triggers/<id>``, ``GET .../<id>/fires``. Guarded like
every admin blueprint (:mod:`flask_harvest.http.admin`). The POST body must be sent as
``application/json`` (415 otherwise, as on every admin write); it is decoded by
:func:`~flask_harvest.triggers.definitions.trigger_from_json` itself, so every invalid shape gets
the same 400 JSON error naming the field.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from flask import Blueprint, Response, jsonify, request

from .._app import trigger_service
from ..errors import InvalidFieldError
from ..http.admin import ApiError, install_admin_api, read_json
from .definitions import trigger_from_json, trigger_to_json
from .service import MAX_LIST_LIMIT, TriggerService, fire_to_json, stored_to_json

__all__ = ["trigger_admin"]

T = TypeVar("T")
trigger_admin = Blueprint("harvest_completion_triggers", __name__)
install_admin_api(trigger_admin, realm="harvest-completion-triggers")

_ROOT = "/admin/completion-triggers"


def _service() -> TriggerService:
    return trigger_service()


def _bad_request(exc: InvalidFieldError) -> ApiError:
    # 400, not the 422 a field's value gets elsewhere: the definition is decoded as a whole, and
    # the trigger API is specified to answer every invalid shape of it with the same 400.
    return ApiError(400, "invalid_trigger", str(exc), {exc.field: [exc.message]})


@trigger_admin.get(_ROOT)
def list_triggers() -> Response:
    """Every registered trigger, oldest first; ``condition`` is always present (``null``: none).

    With ``?limit=`` (1 to 500) or ``?cursor=``, one page of them (50 by default), and
    ``X-Next-Cursor`` continues the listing.
    """
    service = _service()
    if "limit" not in request.args and "cursor" not in request.args:
        return jsonify([stored_to_json(stored) for stored in service.list_triggers()])
    cursor = request.args.get("cursor") or None
    page, next_cursor = _query(lambda: service.triggers_page(limit=_limit(50), cursor=cursor))
    response = jsonify([stored_to_json(stored) for stored in page])
    if next_cursor:
        response.headers["X-Next-Cursor"] = next_cursor
    return response


@trigger_admin.post(_ROOT)
def register_trigger() -> tuple[Response, int]:
    """Register or replace a trigger (every field: an omitted ``condition`` clears the stored one).

    A source or target name that no workflow of this app is registered under is refused, unless
    ``?allow_unknown_workflows=true`` (workflows that only other processes register).
    """
    data = read_json()
    allow_unknown = _flag("allow_unknown_workflows")
    try:
        trigger = trigger_from_json(data)
        stored = _service().register(trigger, allow_unknown_workflows=allow_unknown)
    except InvalidFieldError as exc:
        raise _bad_request(exc) from None
    return jsonify(trigger_to_json(stored)), 201


@trigger_admin.get(f"{_ROOT}/<trigger_id>")
def show_trigger(trigger_id: str) -> Response:
    return jsonify(stored_to_json(_service().get(trigger_id)))


@trigger_admin.delete(f"{_ROOT}/<trigger_id>")
def delete_trigger(trigger_id: str) -> tuple[str, int]:
    """Delete a trigger and its fires rows."""
    _service().delete(trigger_id)
    return "", 204


@trigger_admin.get(f"{_ROOT}/<trigger_id>/fires")
def list_fires(trigger_id: str) -> Response:
    """The trigger's fires-ledger rows, newest first (``?limit=``, 1 to 500, default 100)."""
    service = _service()
    trigger_id = service.get(trigger_id).id
    fires = _query(lambda: service.fires(trigger_id=trigger_id, limit=_limit(100)))
    return jsonify([fire_to_json(fire) for fire in fires])


def _flag(name: str) -> bool:
    """A boolean query parameter: ``true`` or ``false`` (absent: false)."""
    raw = request.args.get(name, "false")
    if raw not in ("true", "false"):
        raise ApiError(
            422, "invalid_query", f"{name} must be true or false", {name: ["must be true or false"]}
        )
    return raw == "true"


def _limit(default: int) -> int:
    raw = request.args.get("limit", str(default))
    try:
        return int(raw)
    except ValueError:
        wanted = f"must be an integer between 1 and {MAX_LIST_LIMIT}"
        raise ApiError(422, "invalid_query", f"limit {wanted}", {"limit": [wanted]}) from None


def _query(read: Callable[[], T]) -> T:
    """``read()``, its query's invalid value (a limit, a cursor) answered 422 ``invalid_query``."""
    try:
        return read()
    except InvalidFieldError as exc:
        raise ApiError(exc.http_status, "invalid_query", str(exc), {exc.field: [exc.message]}) from None
